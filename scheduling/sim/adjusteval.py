"""The adjustment pass measured: ``replay --adjust on`` against ``off`` on generated workloads.

``python -m scheduling.sim.adjusteval OUT --seeds 1,2 --loads 1.0,1.2 [--policy tessera]
[--processes N] [--gpus 600] [--days 2]`` generates ``OUT/workload-LOAD-SEED`` (as
:mod:`.seedmatrix` does), replays it with the adjustment pass off and on into
``OUT/LOAD-SEED/off|on`` (runs already there are kept) and writes ``OUT/compare.md``: both runs
of every workload, then each workload's verdict on the issue's goals — busy utilisation up at
least 30% relative to off, average JCT down, extra lost work at most 1% of the allocated
GPU-hours, no non-preemptible job touched without its owner's opt-in. ``make eval`` runs it
(docs/evaluation.md, "The adjustment pass").
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from scheduling.sim.runner import _fmt, run_replay
from scheduling.sim.seedmatrix import ensure_workload, ensure_workloads, parse_seeds

BUSY_GAIN = 0.30  # busy utilisation up at least this much, relative to off
EXTRA_LOST = 0.01  # extra lost work at most this share of the allocated GPU-hours
MODES = ("off", "on")


def _run(args: tuple[Path, str, int, str, str, float, int]) -> tuple[str, int, str]:
    out, load, seed, policy, mode, days, gpus = args
    work = ensure_workload((out, load, seed, days, gpus))
    run = out / f"{load}-{seed}" / mode
    if not (run / "summary.json").exists():
        run_replay(
            work / "nodes.csv", work / "jobs.csv", work / "quotas.csv", policy, run,
            show_progress=False, adjust=mode == "on",
        )  # fmt: skip
    return load, seed, mode


def _load(out: Path, load: str, seed: int, mode: str) -> dict[str, Any] | None:
    path = out / f"{load}-{seed}" / mode / "summary.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def _pct(x: float | None, digits: int = 1) -> str:
    return _fmt(x, pct=True, digits=digits)


def _gh(x: float | None) -> str:
    return "–" if x is None else f"{x:.0f}"


def _actions(s: dict[str, Any]) -> str:
    a = s.get("adjustments") or {}
    return f"{a.get('warn', 0)} / {a.get('shrink', 0)} / {a.get('requeue', 0)}"


def verdicts(off: dict[str, Any], on: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Each goal: (the measured value, met)."""
    gain = on["busy_utilisation"] / off["busy_utilisation"] - 1 if off["busy_utilisation"] else 0.0
    jct = on["avg_jct_s"] / off["avg_jct_s"] - 1 if off["avg_jct_s"] else 0.0
    allocated = off["allocated_gpu_seconds"] or 1.0
    extra = (on["lost_gpu_seconds"] - off["lost_gpu_seconds"]) / allocated
    return {
        "busy utilisation": (f"{100 * gain:+.1f}%", gain >= BUSY_GAIN),
        "avg JCT": (f"{100 * jct:+.1f}%", jct < 0),
        "extra lost work": (f"{100 * extra:.2f}% of GPU-h", extra <= EXTRA_LOST),
        "non-preemptible touched": (str(on["touched_non_preemptible"]), on["touched_non_preemptible"] == 0),
        "checker": ("OK" if on["check"]["ok"] and off["check"]["ok"] else "violations", on["check"]["ok"]),
    }


def table(out: Path, seeds: list[int], loads: list[str]) -> str:
    head = [
        "load", "seed", "adjust", "busy util.", "busy ceiling", "alloc. while arriving", "avg JCT (h)",
        "p99 JCT (h)", "lost (GPU-h)", "reclaimed (GPU-h)", "warn / shrink / requeue", "unfinished", "check",
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    goals: list[str] = []
    for load in loads:
        for seed in seeds:
            runs = {mode: _load(out, load, seed, mode) for mode in MODES}
            for mode, s in runs.items():
                if s is None:
                    continue
                cells = [
                    load, str(seed), mode, _pct(s["busy_utilisation"]), _pct(s["busy_utilisation_ceiling"]),
                    _pct(s["gpu_allocation_rate_while_arriving"]), _fmt(s["avg_jct_s"], 3600, 2),
                    _fmt(s["p99_jct_s"], 3600, 1), _gh(s["lost_gpu_hours"]), _gh(s["reclaimed_gpu_hours"]),
                    _actions(s), str(s["unfinished"]), "OK" if s["check"]["ok"] else "violations",
                ]  # fmt: skip
                lines.append("| " + " | ".join(cells) + " |")
            off, on = runs["off"], runs["on"]
            if off and on:
                marks = ", ".join(
                    f"{goal} {value} ({'met' if ok else '**missed**'})"
                    for goal, (value, ok) in verdicts(off, on).items()
                )
                goals.append(f"- load {load}, seed {seed}: {marks}")
    return "\n".join(lines) + "\n\nOn against off, per workload:\n\n" + "\n".join(goals) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduling.sim.adjusteval", description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seeds", default="1,2", help="workload seeds: 1-5 or 1,3 (default 1,2)")
    parser.add_argument("--loads", default="1.0,1.2")
    parser.add_argument("--policy", default="tessera")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=600)
    parser.add_argument("--days", type=float, default=2.0)
    args = parser.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError:
        print(f"error: --seeds {args.seeds!r}: expected 1-5 or 1,3", file=sys.stderr)
        return 2
    loads = [x.strip() for x in args.loads.split(",") if x.strip()]
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = [
        (args.out, load, seed, args.policy, mode, args.days, args.gpus)
        for load in loads
        for seed in seeds
        for mode in MODES
    ]
    with ProcessPoolExecutor(max_workers=max(1, args.processes)) as pool:
        ensure_workloads(
            pool, args.out, [(load, seed) for load in loads for seed in seeds], args.days, args.gpus
        )
        for load, seed, mode in pool.map(_run, jobs):
            print(f"adjust {mode}: load {load} seed {seed} done", file=sys.stderr)
    text = f"## replay --adjust on / off ({args.policy})\n\n{table(args.out, seeds, loads)}"
    (args.out / "compare.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
