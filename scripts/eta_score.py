"""Score the start estimates on generated workloads: the four goals of the estimates, per workload.

``python scripts/eta_score.py [--loads 1.0,1.2] [--seeds 1,2,3] [--days 1] [--processes 2]
[--work DIR] [--dump DIR] [--json FILE] [--oracle]``

For each load and seed it generates a workload with quotas (``python -m scheduling.sim generate
--days DAYS --load LOAD --seed SEED``, kept in ``--work`` and reused), replays it under tessera
with the estimates on (as ``sim replay --eta``) and scores the estimate each job got at the first
pass that left it pending (:mod:`scheduling.sim.eta_score`). It prints one row per workload: the
median wait, coverage, the share started inside its band, and the median band and median error
as multiples of the median wait, each with its goal (≥ 90%, ≥ 80%, ≤ 1, ≤ 0.25) and ``*`` where
it is met. ``--dump DIR`` writes, per workload, one JSON line per job that waited over a minute
or got an estimate (submit, the pass of its first estimate and its pending code there, the
estimate, its band and basis, its start, its shape), for looking into the misses.
``--oracle`` plays the estimates with every job's true runtime (its work, at full speed from its
attempt's start) in place of the predicted ones: what is left of the error is the queue's own
doing (jobs submitted later going ahead, preemptions), which no runtime prediction can remove;
the pass's decisions are the same either way.
Method and history: docs/benchmarks/eta.md.

Exit status: 0 (a scorer, not a gate).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduling.engine import eta as eta_engine  # noqa: E402
from scheduling.engine.runtimes import Prediction, Predictor  # noqa: E402
from scheduling.engine.types import Estimate, JobRequest  # noqa: E402
from scheduling.sim import policies  # noqa: E402
from scheduling.sim.eta_score import WAITED_S, score, submits_and_starts  # noqa: E402
from scheduling.sim.generate import generate  # noqa: E402
from scheduling.sim.replay import replay  # noqa: E402
from scheduling.sim.traces import read_jobs, read_nodes, read_quotas  # noqa: E402

GOALS = {"coverage": 0.9, "in_band": 0.8, "band": 1.0, "error": 0.25}


def workload(work: Path, days: float, load: float, seed: int) -> Path:
    """The generated workload's folder (written once, then reused: generation is deterministic)."""
    out = work / f"d{days:g}-l{load:g}-s{seed}"
    if not (out / "quotas.csv").exists():
        generate(out, seed, days, load)
    return out


def oracle(durations: Mapping[str, float]) -> type[Predictor]:
    """A predictor that knows every job's runtime (``--oracle``)."""

    class Oracle(Predictor):
        def predict(self, job: JobRequest) -> Prediction:
            d = durations.get(job.id)
            return super().predict(job) if d is None else Prediction(d, d, d, "its true runtime")

        def remaining_end(self, job: JobRequest, started_at: float, now: float, which: str) -> float:
            d = durations.get(job.id)
            if d is None:
                return super().remaining_end(job, started_at, now, which)
            return max(now, started_at + d)

    return Oracle


def run_one(folder: Path, dump: Path | None, known_runtimes: bool = False) -> dict[str, Any]:
    nodes = read_nodes(folder / "nodes.csv")
    jobs = read_jobs(folder / "jobs.csv")
    if known_runtimes:
        eta_engine.Predictor = oracle({j.request.id: j.duration_s for j in jobs if j.duration_s})  # type: ignore[attr-defined]
    quotas = read_quotas(folder / "quotas.csv")
    sched = policies.make("tessera", nodes, quotas)
    asked_at: dict[str, float] = {}
    codes: dict[str, str] = {}
    estimate = sched.estimate  # type: ignore[attr-defined]

    def recorded(d: Any, now: float, wanted: Any = None) -> dict[str, Estimate]:
        for job_id in wanted or ():
            asked_at.setdefault(job_id, now)
            reason = d.pending.get(job_id)
            codes.setdefault(job_id, reason.code if reason is not None else "")
        return estimate(d, now, wanted)

    sched.estimate = recorded  # type: ignore[attr-defined]
    began = time.process_time()
    result = replay(nodes, jobs, sched, estimates=True)
    cpu = time.process_time() - began
    s = score(result.events, result.first_estimates)
    if dump is not None:
        _dump(dump / f"{folder.name}.jsonl", jobs, result.events, result.first_estimates, asked_at, codes)
    return {"workload": folder.name, "cpu_s": round(cpu, 1), **s}


def _dump(
    path: Path,
    jobs: Sequence[Any],
    events: Sequence[Mapping[str, Any]],
    first: Mapping[str, Estimate | None],
    asked_at: Mapping[str, float],
    codes: Mapping[str, str],
) -> None:
    by_id = {j.request.id: j for j in jobs}
    submitted, started = submits_and_starts(events)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for job_id, t in started.items():
            sub = submitted.get(job_id, t)
            est = first.get(job_id)
            if t - sub <= WAITED_S and est is None:
                continue
            req = by_id[job_id].request
            row: dict[str, Any] = {
                "job": job_id, "submit": sub, "start": t, "asked": asked_at.get(job_id),
                "code": codes.get(job_id),
                "kind": req.kind, "tenant": req.tenant, "gpus": req.gpus, "replicas": req.replicas,
                "preemptible": req.preemptible, "priority": req.priority,
                "time_limit": req.time_limit_s, "duration": by_id[job_id].duration_s,
            }  # fmt: skip
            if est is not None:
                row.update(
                    est=est.start, lo=est.earliest, hi=est.latest, basis=est.basis, position=est.position
                )
            fh.write(json.dumps(row) + "\n")


def row(s: Mapping[str, Any]) -> str:
    wait = s["median_wait_s"]
    if not wait or s["eta_coverage"] is None:
        return f"| {s['workload']} | {wait} | – | – | – | – | {s['cpu_s']} |"
    figures = [
        (s["eta_coverage"], GOALS["coverage"], True, f"{100 * s['eta_coverage']:.0f}%"),
        (s["eta_within_band"], GOALS["in_band"], True, f"{100 * s['eta_within_band']:.0f}%"),
        (s["eta_median_band_s"] / wait, GOALS["band"], False, f"{s['eta_median_band_s'] / wait:.2f}"),
        (s["eta_median_error_s"] / wait, GOALS["error"], False, f"{s['eta_median_error_s'] / wait:.2f}"),
    ]
    cells = [
        text + (" *" if (v >= goal if higher else v <= goal) else "") for v, goal, higher, text in figures
    ]
    return f"| {s['workload']} | {wait:,.0f} s | " + " | ".join(cells) + f" | {s['cpu_s']} |"


def table(results: Sequence[Mapping[str, Any]]) -> str:
    head = [
        "| workload | median wait | coverage (≥ 90%) | in band (≥ 80%) | band ÷ median wait (≤ 1) "
        "| error ÷ median wait (≤ 0.25) | replay CPU s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    return "\n".join([*head, *(row(s) for s in results)]) + "\n(* goal met)"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/eta_score.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--loads", default="1.0,1.2", help="offered loads, comma-separated (default 1.0,1.2)")
    p.add_argument("--seeds", default="1,2,3", help="generator seeds, comma-separated (default 1,2,3)")
    p.add_argument("--days", type=float, default=1.0, help="arrival span in days (default 1)")
    p.add_argument("--processes", type=int, default=2, help="replays at once (default 2)")
    p.add_argument("--work", type=Path, default=Path("/tmp/eta_score"), help="generated workloads")
    p.add_argument("--dump", type=Path, help="write each workload's per-job estimates here")
    p.add_argument("--json", type=Path, help="write the scores here")
    p.add_argument("--oracle", action="store_true", help="estimates played with the true runtimes")
    args = p.parse_args(argv)
    try:
        loads = [float(x) for x in args.loads.split(",")]
        seeds = [int(x) for x in args.seeds.split(",")]
    except ValueError:
        print(
            f"error: --loads {args.loads!r} / --seeds {args.seeds!r}: comma-separated numbers",
            file=sys.stderr,
        )
        return 2
    if args.days <= 0 or args.processes < 1 or any(x <= 0 for x in loads):
        print("error: --days, --loads and --processes must be positive", file=sys.stderr)
        return 2
    folders = [workload(args.work, args.days, load, seed) for load in loads for seed in seeds]
    with ProcessPoolExecutor(args.processes) as pool:
        n = len(folders)
        results = list(pool.map(run_one, folders, [args.dump] * n, [args.oracle] * n))
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
