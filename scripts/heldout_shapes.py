"""Write a held-out workload shape that ``sim generate`` never makes: one scarce GPU model.

``python scripts/heldout_shapes.py OUT [--seed 1] [--load 1.0] [--hours 24]
[--nodes H100=3,A100=18,T4=5] [--scarce H100:0.7]`` writes ``OUT/nodes.csv``, ``OUT/jobs.csv``
and ``OUT/quotas.csv`` (docs/formats.md) for ``python -m scheduling.sim replay``. The shape is
the ``scarce`` row of docs/benchmarks/eval-matrix.md (2026-12-07, workloads2): a cluster of
8-GPU H100 and A100 nodes and 4-GPU T4 nodes (``--nodes``, GPUs and sizes from
:data:`scheduling.sim.generate.MODELS`), the five tenants of the generator with guarantees = each
model's GPUs split by weight and limits 2.5× the guarantee, Poisson arrivals over ``--hours``, and
``--scarce MODEL:SHARE``: that share of the GPU jobs may run only on MODEL, the others on any model
but it. Job shapes (kinds, GPUs, durations, checkpoints, time limits) are the generator's
(:func:`~scheduling.sim.generate.draw_job`); gangs are at most half the scarce model's GPUs. Load is
Σ(GPUs × duration) over the whole cluster's GPUs × the arrival span, so the scarce pool's load is
about ``load`` × SHARE × cluster GPUs ÷ its GPUs (5.5× with the defaults at load 1.0).
Everything is drawn from ``random.Random(seed)``: the same arguments write the same files.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import sys
from pathlib import Path

from scheduling.sim.generate import (
    MODELS,
    TENANTS,
    Cluster,
    Job,
    _time_limit,
    draw_job,
    node_row,
    realised_load,
    size_host_share,
    write_workload,
)
from scheduling.sim.traces import QUOTA_COLUMNS

LIMIT_FACTOR = 2.5


def parse_nodes(text: str) -> dict[str, int]:
    """``H100=3,A100=18,T4=5`` -> {model: node count}."""
    out: dict[str, int] = {}
    for part in text.split(","):
        model, _, count = part.partition("=")
        if model not in MODELS or not count.isdigit() or int(count) < 1:
            raise argparse.ArgumentTypeError(
                f"--nodes: {part!r} is not MODEL=COUNT with a model of {list(MODELS)}"
            )
        out[model] = int(count)
    return out


def parse_scarce(text: str) -> tuple[str, float]:
    """``H100:0.7`` -> (model, share of GPU jobs that need it)."""
    model, _, share = text.partition(":")
    try:
        value = float(share)
    except ValueError:
        value = -1.0
    if model not in MODELS or not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"--scarce: {text!r} is not MODEL:SHARE with SHARE in [0, 1]")
    return model, value


def make_cluster(nodes: dict[str, int]) -> Cluster:
    rows: list[dict[str, object]] = []
    for rack, (model, count) in enumerate(nodes.items(), 1):
        rows += [node_row(model, i, rack) for i in range(count)]
    return Cluster(rows, {m: c * MODELS[m][0] for m, c in nodes.items()})


def build(
    seed: int, load: float, hours: float, nodes: dict[str, int], scarce: tuple[str, float]
) -> tuple[Cluster, list[Job]]:
    model, share = scarce
    if model not in nodes:
        raise ValueError(f"--scarce: {model} has no nodes in --nodes")
    others = [m for m in nodes if m != model]
    rng = random.Random(seed)
    cluster = make_cluster(nodes)
    span = hours * 3600
    target = load * cluster.gpus * span
    max_gang = min(64, cluster.gpus_by_model[model] // 2)
    jobs: list[Job] = []
    work = 0.0
    while work < target:
        job = draw_job(rng, max_gang)
        if job.gpus * job.duration + work > target and job.gpus > 0:
            job.duration = max(60.0, (target - work) / job.gpus)
        if job.gpus > 0:
            if rng.random() < share or not others:
                job.model = model
            else:
                allowed = [m for m in job.model.split("|") if m and m != model and m in nodes]
                job.model = "|".join(allowed or others)
            if job.selector == "net:ib" and job.model != "H100":
                job.selector = ""
            if job.topology == "nvlink" and max(MODELS[m][1] for m in job.model.split("|")) < job.gpus:
                job.topology = ""  # no NVLink island of its size on the models it may use
        work += job.gpus * job.duration
        jobs.append(job)
    t = 0.0
    rate = len(jobs) / span
    weights = [(name, w) for name, _, w in TENANTS]
    total_w = sum(w for _, w in weights)
    for job in jobs:
        t += rng.expovariate(rate)
        job.submit = round(min(t, span), 1)
        x, acc = rng.random() * total_w, 0.0
        for name, w in weights:
            acc += w
            if x < acc:
                job.tenant = name
                break
        else:
            job.tenant = weights[-1][0]
    scale = load / realised_load(jobs, cluster.gpus)
    for job in jobs:
        job.duration = min(7 * 86_400.0, max(1.0, round(job.duration * scale, 1)))
        job.limit = _time_limit(rng, job)
        size_host_share(rng, job)
    return cluster, jobs


def write_quotas(out: Path, cluster: Cluster) -> None:
    """Guarantees: each model's GPUs split by the tenants' weights; limits 2.5× (at most all)."""
    total_w = sum(w for _, _, w in TENANTS)
    with open(out / "quotas.csv", "w", newline="", encoding="utf-8") as fh:
        rows = csv.writer(fh)
        rows.writerow(QUOTA_COLUMNS)
        for name, _, weight in TENANTS:
            for model, gpus in cluster.gpus_by_model.items():
                guaranteed = round(gpus * weight / total_w, 2)
                limit = min(float(gpus), round(guaranteed * LIMIT_FACTOR, 2))
                rows.writerow([name, model, f"{guaranteed:g}", f"{limit:g}", f"{weight:g}"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/heldout_shapes.py", description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--load", type=float, default=1.0)
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--nodes", type=parse_nodes, default=parse_nodes("H100=3,A100=18,T4=5"))
    p.add_argument("--scarce", type=parse_scarce, default=parse_scarce("H100:0.7"))
    args = p.parse_args(argv)
    if args.load <= 0 or args.hours <= 0 or not math.isfinite(args.load):
        p.error("--load and --hours must be positive")
    try:
        cluster, jobs = build(args.seed, args.load, args.hours, args.nodes, args.scarce)
    except ValueError as e:
        p.error(str(e))
    facts = write_workload(args.out, cluster, jobs)
    write_quotas(args.out, cluster)  # by weight, over write_workload's by share
    print(f"{facts['jobs']} jobs on {facts['gpus']} GPUs, load {facts['load']:.2f} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
