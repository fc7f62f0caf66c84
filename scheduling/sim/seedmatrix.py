"""Replay's targets on several generated workloads, not one: a policy is judged on each seed.

``python -m scheduling.sim.seedmatrix OUT --seeds 1-5 --loads 1.0,1.2 [--policies tessera,fcfs-device]
[--processes N] [--gpus 600] [--days 2]`` generates ``OUT/workload-LOAD-SEED`` for every seed and
load, replays every policy into ``OUT/LOAD-SEED/POLICY`` (runs already there are kept), and writes
``OUT/compare.md``: per seed and load, the first policy's allocation while arriving beside the most
any policy could reach (:mod:`.ceiling`), its longest wait (by kind at the highest load), inference
p99 queueing, work lost, and its average JCT over the second policy's (the baseline); then the mean
and the worst over the seeds. ``make eval`` runs it for seeds 1–5 (docs/evaluation.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from scheduling.engine.types import KINDS
from scheduling.sim.generate import generate
from scheduling.sim.runner import _fmt, run_replay


def parse_seeds(text: str) -> list[int]:
    """``1-5`` or ``1,3,7``."""
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-", 1))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",") if x.strip()]


def workload_dir(out: Path, load: str, seed: int) -> Path:
    return out / f"workload-{load}-{seed}"


def ensure_workload(args: tuple[Path, str, int, float, int]) -> Path:
    """``OUT/workload-LOAD-SEED``, generated unless it is there: into a scratch folder renamed
    into place once whole, so a run never reads a half-written workload (two replays of one
    workload in a pool both found it missing, and one read ``jobs.csv`` while the other wrote it)."""
    out, load, seed, days, gpus = args
    work = workload_dir(out, load, seed)
    if not (work / "jobs.csv").exists():
        scratch = work.with_name(f"{work.name}.tmp-{os.getpid()}")
        shutil.rmtree(scratch, ignore_errors=True)
        generate(scratch, seed=seed, days=days, load=float(load), gpus=gpus)
        shutil.rmtree(work, ignore_errors=True)
        os.replace(scratch, work)
    return work


def ensure_workloads(
    pool: ProcessPoolExecutor, out: Path, pairs: list[tuple[str, int]], days: float, gpus: int
) -> None:
    """Every (load, seed) workload, each generated once, before any replay starts."""
    list(pool.map(ensure_workload, [(out, load, seed, days, gpus) for load, seed in dict.fromkeys(pairs)]))


def _run(args: tuple[Path, str, int, str, float, int]) -> tuple[str, int, str]:
    out, load, seed, policy, days, gpus = args
    work = ensure_workload((out, load, seed, days, gpus))
    run = out / f"{load}-{seed}" / policy
    if not (run / "summary.json").exists():
        quotas = work / "quotas.csv"
        run_replay(work / "nodes.csv", work / "jobs.csv", quotas, policy, run, show_progress=False)
    return load, seed, policy


def _h(x: float | None) -> str:
    return _fmt(x, 3600)


def _pct(x: float | None) -> str:
    return _fmt(x, pct=True)


def _ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}×"


def table(out: Path, seeds: list[int], loads: list[str], policies: list[str]) -> str:
    """The markdown table of the first policy's results (the second is the JCT baseline)."""
    baseline = policies[1] if len(policies) > 1 else "–"
    head = ["load", "seed", "alloc. while arriving", "ceiling", "longest wait (h)",
            "by kind: inf / train / ft / batch (h)", "inference p99 queue (s)", "lost work",
            f"avg JCT vs {baseline}", "check"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for load in loads:
        rows: list[dict[str, Any]] = []
        for seed in seeds:
            s = _summary(out, load, seed, policies[0])
            base = _summary(out, load, seed, policies[1]) if len(policies) > 1 else None
            ratio = None
            if base and base["avg_jct_s"] and s["avg_jct_s"]:
                ratio = s["avg_jct_s"] / base["avg_jct_s"]
            by = s["by_kind"]
            rows.append({
                "alloc": s["gpu_allocation_rate_while_arriving"],
                "ceiling": s.get("gpu_allocation_ceiling_while_arriving"),
                "wait": s["max_queue_s"],
                "kinds": " / ".join(_h(by.get(k, {}).get("max_queue_s")) for k in KINDS),
                "inf_p99": by.get("inference", {}).get("p99_queue_s"),
                "lost": s["lost_work_fraction"],
                "ratio": ratio,
                "check": "OK" if s["check"]["ok"] else f"{s['check']['violations']} violations",
            })  # fmt: skip
            r = rows[-1]
            cells = [load, str(seed), _pct(r["alloc"]), _pct(r["ceiling"]), _h(r["wait"]), r["kinds"],
                     _fmt(r["inf_p99"], digits=0), _pct(r["lost"]), _ratio(r["ratio"]),
                     r["check"]]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
        lines.append(_aggregate(load, "mean", rows, lambda xs: sum(xs) / len(xs)))
        lines.append(_aggregate(load, "worst", rows, None))
    return "\n".join(lines) + "\n"


def _aggregate(load: str, label: str, rows: list[dict[str, Any]], mean) -> str:
    def pick(key: str, worst_is_max: bool) -> float | None:
        xs = [r[key] for r in rows if r[key] is not None]
        if not xs:
            return None
        if mean is not None:
            return mean(xs)
        return max(xs) if worst_is_max else min(xs)

    cells = [load, f"**{label}**", _pct(pick("alloc", False)), _pct(pick("ceiling", False)),
             _h(pick("wait", True)), "", _fmt(pick("inf_p99", True), digits=0), _pct(pick("lost", True)),
             _ratio(pick("ratio", True)), ""]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def _summary(out: Path, load: str, seed: int, policy: str) -> dict[str, Any]:
    return json.loads((out / f"{load}-{seed}" / policy / "summary.json").read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scheduling.sim.seedmatrix", description=__doc__.split(".")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--seeds", default="1-5", type=parse_seeds)
    p.add_argument("--loads", default="1.0,1.2")
    p.add_argument("--policies", default="tessera,greedy-quota,fcfs-device")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--days", type=float, default=2.0)
    p.add_argument("--gpus", type=int, default=600)
    args = p.parse_args(argv)
    loads = [x.strip() for x in args.loads.split(",") if x.strip()]
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    if not args.seeds or not loads or not policies:
        p.error("--seeds, --loads and --policies must each name at least one")
    jobs = [(args.out, load, seed, pol, args.days, args.gpus) for load in loads for seed in args.seeds
            for pol in policies]  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(max(1, args.processes)) as pool:
        pairs = [(load, seed) for load in loads for seed in args.seeds]
        ensure_workloads(pool, args.out, pairs, args.days, args.gpus)
        for done, (load, seed, policy) in enumerate(pool.map(_run, jobs), 1):
            say = f"seed matrix: {done}/{len(jobs)} load {load} seed {seed} {policy}"
            print(say, file=sys.stderr, flush=True)
    title = f"## {policies[0]} on generated workloads, seeds {', '.join(map(str, args.seeds))}\n\n"
    text = title + table(args.out, args.seeds, loads, policies)
    (args.out / "compare.md").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
