"""The simulator's commands as functions: replay and pack one policy or several side by side.

Each writes its files into an output directory and returns its summary; :mod:`.cli` only parses
arguments and reports errors. ``--compare`` runs each policy into ``OUT/<policy>/`` and writes
``OUT/compare.md`` (one markdown table) and ``OUT/compare.png`` (all policies on the same axes).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduling.engine.adjust import ACTIONS
from scheduling.engine.types import KINDS, NodeSpec
from scheduling.sim import policies
from scheduling.sim.adjusting import AdjustOptions
from scheduling.sim.check import check
from scheduling.sim.eta_score import ETA_KEYS, eta_table
from scheduling.sim.eta_score import score as score_estimates
from scheduling.sim.events import read_events, write_events
from scheduling.sim.metrics import summarize
from scheduling.sim.pack import run_pack
from scheduling.sim.plots import plot_compare, plot_pack_compare, plot_run
from scheduling.sim.progress import ProgressBar
from scheduling.sim.replay import ReplayResult, replay
from scheduling.sim.traces import TraceJob, read_jobs, read_nodes, read_quotas
from scheduling.sim.utilisation import Demand, busy_ceiling, profile_of

PACK_SEED0 = 42


def _label(jobs_csv: str | Path) -> str:
    """``workload-1.0/jobs.csv`` or ``openb/jobs_gpushare100.csv``: enough to tell inputs apart."""
    path = Path(jobs_csv)
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def run_replay(
    nodes_csv: str | Path,
    jobs_csv: str | Path,
    quotas_csv: str | Path | None,
    policy: str,
    out: str | Path,
    seed: int = 0,
    *,
    factory: policies.SchedulerFactory | None = None,
    show_progress: bool = True,
    tick_s: float = 300.0,
    estimates: bool = False,
    adjust: bool = False,
    exclusive_gpu_shares: bool = False,
    plots: bool = True,
    bounds: WorkloadBounds | None = None,
) -> dict[str, Any]:
    """Replay one policy; write events.jsonl, summary.json, series.json and the plots.
    ``adjust``: run the adjustment pass (``--adjust on``, :mod:`.adjusting`);
    ``exclusive_gpu_shares``: tessera's option of that name (``EngineConfig``), checked;
    ``plots``: False draws none (a batch that reads only the summaries);
    ``bounds``: the workload's :func:`workload_bounds`, when already computed (they are the same
    for every policy on it: the scenario matrix computes them once per workload)."""
    out = Path(out)
    nodes = read_nodes(nodes_csv)
    jobs = read_jobs(jobs_csv)
    quotas = read_quotas(quotas_csv) if quotas_csv else []
    out.mkdir(parents=True, exist_ok=True)
    if exclusive_gpu_shares:
        scheduler = policies.make(policy, nodes, quotas, seed, exclusive_gpu_shares=True)
    else:
        scheduler = (factory or policies.make)(policy, nodes, quotas, seed)
    bar = ProgressBar(f"replay {policy}", stream=sys.stderr if show_progress else None)
    try:
        result = replay(
            nodes, jobs, scheduler, tick_s=tick_s, progress=bar, estimates=estimates,
            adjust=AdjustOptions() if adjust else None,
        )  # fmt: skip
    finally:
        bar.close()
    write_events(out / "events.jsonl", result.events)
    began = time.perf_counter()
    summary, series = summarize(nodes, jobs, result.events, quotas)
    report = check(
        nodes, jobs, read_events(out / "events.jsonl"), quotas if quotas_csv else None, adjust=adjust,
        exclusive_gpu_shares=exclusive_gpu_shares,
    )  # fmt: skip
    summary = {
        "policy": policy,
        "seed": seed,
        "nodes": str(nodes_csv),
        "jobs_file": str(jobs_csv),
        "quotas": str(quotas_csv) if quotas_csv else None,
        **summary,
        **utilisation_summary(nodes, jobs, result, summary, adjust, bounds),
        "check": {"ok": report.ok, "violations": len(report.violations)},
        **report.avoidable,
        **(score_estimates(result.events, result.first_estimates) if estimates else dict.fromkeys(ETA_KEYS)),
        "wall_s": result.wall_s,
        "cpu_s": result.cpu_s,
        "policy_s": result.decide_s,
        "driver_s": result.wall_s - result.decide_s,
        "decide_calls": result.decide_calls,
        "pending_reasons": result.pending_codes,
        "metrics_s": time.perf_counter() - began,
    }
    write_json(out / "summary.json", summary)
    (out / "series.json").write_text(json.dumps(series, separators=(",", ":")), encoding="utf-8")
    if report.violations:
        (out / "check.txt").write_text("\n".join(report.violations) + "\n", encoding="utf-8")
    if plots:
        plot_run(out, series, policy)
    return summary


@dataclass(frozen=True)
class WorkloadBounds:
    """What summary.json says of a workload whatever the policy (computed once, reused)."""

    busy_utilisation_ceiling: float | None


def workload_bounds(nodes: Sequence[NodeSpec], jobs: Sequence[TraceJob]) -> WorkloadBounds:
    capacity = float(sum(n.gpus for n in nodes)) or 1.0
    demands = {tj.request.id: Demand(profile_of(tj), tj.request.id, tj.request.gpus) for tj in jobs}
    return WorkloadBounds(busy_ceiling(jobs, demands, capacity))


def utilisation_summary(
    nodes: Sequence[NodeSpec],
    jobs: Sequence[TraceJob],
    result: ReplayResult,
    summary: dict[str, Any],
    adjust: bool,
    bounds: WorkloadBounds | None = None,
) -> dict[str, Any]:
    """The utilisation keys of summary.json (docs/formats.md, "Utilisation and ``--adjust``")."""
    capacity = float(sum(n.gpus for n in nodes)) or 1.0
    window = result.window_s
    if bounds is None:
        bounds = workload_bounds(nodes, jobs)
    return {
        "adjust": "on" if adjust else "off",
        "busy_utilisation": result.busy_gpu_seconds_while_arriving / (capacity * window)
        if window > 0
        else None,
        "busy_utilisation_ceiling": bounds.busy_utilisation_ceiling,
        "reclaimed_gpu_hours": result.reclaimed_gpu_seconds / 3600,
        "lost_gpu_hours": summary["lost_gpu_seconds"] / 3600,
        "adjustments": {a: result.adjustments.get(a, 0) for a in ACTIONS},
        "touched_non_preemptible": len(set(result.touched_non_preemptible)),
    }


def _fmt(value: Any, scale: float = 1.0, digits: int = 1, pct: bool = False) -> str:
    if value is None:
        return "–"
    if pct:
        return f"{100 * value:.{digits}f}%"
    return f"{value / scale:.{digits}f}"


def _avoidable(s: dict[str, Any]) -> str:
    if "avoidable_wait_total_h" not in s:
        return "–"
    return f"{s['avoidable_wait_total_h']:.1f} / {s['avoidable_wait_max_h']:.1f}"


REPLAY_COLUMNS = (
    ("alloc. while arriving", lambda s: _fmt(s["gpu_allocation_rate_while_arriving"], pct=True)),
    ("alloc. overall", lambda s: _fmt(s["gpu_allocation_rate"], pct=True)),
    ("avg JCT (h)", lambda s: _fmt(s["avg_jct_s"], 3600, 2)),
    ("p99 JCT (h)", lambda s: _fmt(s["p99_jct_s"], 3600, 1)),
    ("avg queue (h)", lambda s: _fmt(s["avg_queue_s"], 3600, 2)),
    ("max queue (h)", lambda s: _fmt(s["max_queue_s"], 3600, 1)),
    ("inference p99 queue (s)", lambda s: _fmt(s["by_kind"].get("inference", {}).get("p99_queue_s"), 1, 0)),
    ("frag.", lambda s: _fmt(s["avg_fragmentation_rate"], pct=True)),
    ("preempt.", lambda s: str(s["preemptions"])),
    ("lost work", lambda s: _fmt(s["lost_work_fraction"], pct=True, digits=2)),
    ("rejected", lambda s: str(s["rejected"])),
    ("unfinished", lambda s: str(s["unfinished"])),
    ("avoidable wait total / max (h)", lambda s: _avoidable(s)),
    ("check", lambda s: "OK" if s["check"]["ok"] else f"{s['check']['violations']} violations"),
    (
        "wall / CPU (s)",
        lambda s: f"{s['wall_s']:.0f} / {s['cpu_s']:.0f}" if "cpu_s" in s else f"{s['wall_s']:.0f}",
    ),
)


def replay_table(summaries: dict[str, dict[str, Any]]) -> str:
    head = ["policy", *(name for name, _ in REPLAY_COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for policy, s in summaries.items():
        lines.append("| " + " | ".join([policy, *(f(s) for _, f in REPLAY_COLUMNS)]) + " |")
    return "\n".join(lines) + "\n"


def wait_by_kind_table(summaries: dict[str, dict[str, Any]]) -> str:
    """Longest and p99 wait per kind (hours), one row per policy."""
    head = ["policy", *(f"{k} max / p99 wait (h)" for k in KINDS)]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for policy, s in summaries.items():
        cells = []
        for k in KINDS:
            b = s["by_kind"].get(k, {})
            cells.append(f"{_fmt(b.get('max_queue_s'), 3600, 2)} / {_fmt(b.get('p99_queue_s'), 3600, 2)}")
        lines.append("| " + " | ".join([policy, *cells]) + " |")
    return "\n".join(lines) + "\n"


def compare_replay(
    nodes_csv: str | Path,
    jobs_csv: str | Path,
    quotas_csv: str | Path | None,
    names: Sequence[str],
    out: str | Path,
    seed: int = 0,
    *,
    factory: policies.SchedulerFactory | None = None,
    show_progress: bool = True,
    adjust: bool = False,
    exclusive_gpu_shares: bool = False,
) -> dict[str, dict[str, Any]]:
    out = Path(out)
    for name in names:
        run_replay(
            nodes_csv, jobs_csv, quotas_csv, name, out / name, seed,
            factory=factory, show_progress=show_progress, adjust=adjust,
            exclusive_gpu_shares=exclusive_gpu_shares,
        )  # fmt: skip
    return write_replay_compare(out, names, f"replay {_label(jobs_csv)}")


def write_replay_compare(out: str | Path, names: Sequence[str], title: str) -> dict[str, dict[str, Any]]:
    """``compare.md`` and ``compare.png`` from the runs already in ``OUT/<policy>/``."""
    out = Path(out)
    summaries: dict[str, dict[str, Any]] = {}
    runs: dict[str, Any] = {}
    for name in names:
        summaries[name] = json.loads((out / name / "summary.json").read_text(encoding="utf-8"))
        runs[name] = json.loads((out / name / "series.json").read_text(encoding="utf-8"))
    text = f"## {title}\n\n{replay_table(summaries)}\n{wait_by_kind_table(summaries)}"
    estimates = eta_table(summaries)
    if estimates:
        text += f"\n{estimates}"
    (out / "compare.md").write_text(text, encoding="utf-8")
    plot_compare(out / "compare.png", runs, title)
    return summaries


def run_pack_policy(
    nodes_csv: str | Path,
    jobs_csv: str | Path,
    policy: str,
    out: str | Path,
    seeds: int = 10,
    processes: int = 2,
    show_progress: bool = True,
) -> dict[str, Any]:
    read_nodes(nodes_csv)  # fail early, with the file's line, on a bad input
    read_jobs(jobs_csv)
    bar = ProgressBar(f"pack {policy}", stream=sys.stderr if show_progress else None)
    began = time.perf_counter()
    try:
        summary = run_pack(
            nodes_csv, jobs_csv, policy, out, list(range(PACK_SEED0, PACK_SEED0 + seeds)),
            progress=bar, processes=processes,
        )  # fmt: skip
    finally:
        bar.close()
    summary["wall_s"] = time.perf_counter() - began
    write_json(Path(out) / "summary.json", summary)
    return summary


def pack_table(results: dict[str, dict[str, Any]]) -> str:
    head = ["policy", "alloc. at 100% arrived", "alloc. at 130% arrived", "frag. at 90%", "seeds", "wall (s)"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for policy, s in results.items():
        row = [
            policy,
            _fmt(s.get("gpu_allocation_rate_at_100"), pct=True, digits=2),
            _fmt(s.get("gpu_allocation_rate_at_130"), pct=True, digits=2),
            _fmt(s.get("fragmentation_rate_at_90"), pct=True, digits=1),
            str(len(s.get("seeds", []))),
            f"{s.get('wall_s', 0.0):.0f}",
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def compare_pack(
    nodes_csv: str | Path,
    jobs_csv: str | Path,
    names: Sequence[str],
    out: str | Path,
    seeds: int = 10,
    processes: int = 2,
    show_progress: bool = True,
) -> dict[str, dict[str, Any]]:
    out = Path(out)
    results = {
        name: run_pack_policy(nodes_csv, jobs_csv, name, out / name, seeds, processes, show_progress)
        for name in names
    }
    title = f"pack {_label(jobs_csv)} ({seeds} seeds)"
    (out / "compare.md").write_text(f"## {title}\n\n{pack_table(results)}", encoding="utf-8")
    plot_pack_compare(out / "compare.png", results, title)
    return results
