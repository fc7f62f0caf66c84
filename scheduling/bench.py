"""Scheduling-pass benchmark: ``python -m scheduling.bench`` prints one JSON line per scenario.

A pass is what the live system does each time: build the engine from a snapshot (index build
included, database excluded) and decide, with every feature on (quotas, fair share, backfill,
preemption, topology, fragmentation-aware placement). Request sizes are drawn from the openb pod
list when one is given (``--sizes PATH``, or ``$TESSERA_TRACES/openb/jobs.csv``), from a built-in
mix like it otherwise, plus multi-node gangs. Method and figures: docs/benchmarks/scheduling-pass.md.

Scenarios: ``cold`` (1,000 nodes x 8 GPUs, empty, 10,000 pending), ``saturated`` (the same cluster
90% allocated by several tenants, some over guarantee, 10,000 pending with gangs and inference that
must preempt) and ``growth`` (100, 1,000 and 5,000 nodes, 10 pending per node). Each scenario
runs ``--repeat`` passes (3) and reports the median, the fastest and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from scheduling.engine.collector import collector_paused
from scheduling.engine.config import EngineConfig
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import JobRequest, NodeSpec, Placement, QuotaSpec, RunningJob, Snapshot
from scheduling.sim.traces import read_jobs

FEATURES = [
    "quotas",
    "fair-share",
    "backfill",
    "preemption",
    "topology",
    "fragmentation",
    "elastic",
    "reasons",
]
TENANTS = ("vision", "nlp", "speech", "recsys", "search", "ads")
MODELS = (("H100", 8, 3.9), ("A100", 8, 2.2), ("L40S", 4, 1.1))  # model, island size, price
FALLBACK = (
    [(1.0, 8.0, 16.0)] * 30
    + [(0.5, 4.0, 8.0)] * 25
    + [(0.25, 2.0, 4.0)] * 10
    + [(2.0, 16.0, 32.0)] * 8
    + [(4.0, 32.0, 64.0)] * 5
    + [(8.0, 64.0, 128.0)] * 4
    + [(0.0, 8.0, 16.0)] * 13
)


def sizes_path(given: str | None) -> Path | None:
    """The pod list to draw request sizes from: ``given``, else ``$TESSERA_TRACES/openb/jobs.csv``
    when that variable is set, else None (the built-in mix)."""
    if given:
        return Path(given)
    traces = os.environ.get("TESSERA_TRACES")
    return Path(traces) / "openb" / "jobs.csv" if traces else None


def request_sizes(path: Path | None) -> list[tuple[float, float, float]]:
    """(gpus, cpus, memory_gib) of each pod of the list at ``path``, or the built-in mix."""
    if path is None:
        return FALLBACK

    return [(t.request.gpus, t.request.cpus, t.request.memory_gib) for t in read_jobs(path)]


def cluster(n_nodes: int, racks: int = 32) -> list[NodeSpec]:
    nodes = []
    per_rack = max(1, -(-n_nodes // racks))
    for i in range(n_nodes):
        model, island, price = MODELS[(i // per_rack) % len(MODELS)]
        rack = f"rack-{i // per_rack:02d}"
        nodes.append(
            NodeSpec(
                f"node-{i:04d}",
                rack,
                model,
                8,
                nvlink_domain=island,
                cpus=128,
                memory_gib=1024,
                price_per_gpu_hour=price,
                labels=(("rack", rack),),
            )
        )
    return nodes


def quotas(total_gpus: int) -> list[QuotaSpec]:
    g = total_gpus / len(TENANTS)
    return [QuotaSpec(t, "*", round(g), round(g * 2.5), 1.0 + (k % 2)) for k, t in enumerate(TENANTS)]


def pending_jobs(
    n: int, rng: random.Random, sizes: list, start: int = 0, inference_share: float = 0.1
) -> list[JobRequest]:
    out = []
    for k in range(n):
        i = start + k
        tenant = TENANTS[rng.randrange(len(TENANTS))]
        if rng.random() < 0.03:  # a multi-node gang
            replicas = rng.choice([2, 4, 8])
            per = 8
            topo = rng.choice(["any", "rack"])
            elastic = rng.random() < 0.3
            out.append(
                JobRequest(
                    f"g{i}",
                    tenant,
                    "training",
                    per * replicas,
                    replicas=replicas,
                    topology=topo,
                    cpus=32.0 * replicas,
                    memory_gib=128.0 * replicas,
                    submitted_at=float(i),
                    time_limit_s=rng.choice([None, 3600.0, 86400.0]),
                    priority=rng.randint(0, 2),
                    elastic_min_gpus=per * max(1, replicas // 2) if elastic else None,
                    elastic_max_gpus=per * replicas if elastic else None,
                )
            )
            continue
        gpus, cpus, mem = sizes[rng.randrange(len(sizes))]
        kind = (
            "inference" if rng.random() < inference_share else rng.choice(["training", "finetune", "batch"])
        )
        topo = "nvlink" if gpus >= 2 and rng.random() < 0.3 else "any"
        accel = rng.choice([(), (), (), ("H100",), ("A100", "H100"), ("L40S",)]) if gpus else ()
        out.append(
            JobRequest(
                f"j{i}",
                tenant,
                kind,
                gpus,
                accelerators=accel,
                topology=topo,
                cpus=cpus,
                memory_gib=mem,
                submitted_at=float(i),
                priority=rng.randint(0, 3),
                preemptible=kind != "inference",
                time_limit_s=rng.choice([None, 1800.0, 7200.0]),
                checkpoint_s=rng.choice([None, 600.0]),
            )
        )
    return out


def saturate(nodes: list[NodeSpec], fill: float, rng: random.Random, now: float) -> list[RunningJob]:
    """Running jobs filling ``fill`` of the GPUs, whole and fractional, several tenants."""
    running = []
    k = 0
    for node in nodes:
        g = 0
        while g < node.gpus and rng.random() < fill + 0.068:
            size = min(rng.choice([1, 1, 2, 4, 8]), node.gpus - g)
            size = 1 << (size.bit_length() - 1)
            if g % size:
                size = 1
            tenant = TENANTS[0] if rng.random() < 0.35 else TENANTS[rng.randrange(len(TENANTS))]
            kind = rng.choice(["training", "finetune", "batch", "batch"])
            job = JobRequest(
                f"r{k}",
                tenant,
                kind,
                float(size),
                cpus=4.0 * size,
                memory_gib=16.0 * size,
                submitted_at=now - 7200,
                time_limit_s=rng.choice([None, 3600.0 * 6]),
            )
            running.append(
                RunningJob(
                    job,
                    (Placement(0, node.name, tuple(range(g, g + size))),),
                    started_at=now - rng.uniform(600, 7200),
                    last_checkpoint_at=now - rng.uniform(0, 600),
                )
            )
            g += size
            k += 1
    return running


def one_pass(snapshot: Snapshot, config: EngineConfig) -> tuple[float, float, int, int]:
    t0 = time.perf_counter()
    c0 = time.process_time()
    with collector_paused():  # as the live pass does (scheduling/services/passes.py)
        engine = TesseraScheduler.from_snapshot(snapshot, config)
        d = engine.decide(snapshot.now)
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - c0
    assert len(d.bindings) + len(d.pending) + len(d.rejections) == len(snapshot.pending)
    return elapsed, cpu, len(d.bindings), len(d.preemptions)


def scenario(
    name: str,
    n_nodes: int,
    n_pending: int,
    fill: float,
    seed: int = 0,
    repeat: int = 1,
    sizes: list[tuple[float, float, float]] = FALLBACK,
) -> dict:
    rng = random.Random(seed)
    nodes = cluster(n_nodes)
    now = 100_000.0
    running = saturate(nodes, fill, rng, now) if fill > 0 else []
    pending = pending_jobs(n_pending, rng, sizes, inference_share=0.15 if fill else 0.1)
    pending = [
        JobRequest(
            **{
                **{f: getattr(j, f) for f in j.__dataclass_fields__},
                "submitted_at": now - 600 + j.submitted_at * 0.01,
            }
        )
        for j in pending
    ]
    snap = Snapshot(now, tuple(nodes), tuple(running), tuple(pending), tuple(quotas(8 * n_nodes)))
    config = EngineConfig()
    runs = sorted(one_pass(snap, config) for _ in range(max(1, repeat)))
    elapsed, cpu, placed, preempted = runs[len(runs) // 2]  # the median pass
    gpus = sum(n.gpus for n in nodes)
    held = sum(len(p.gpus) for r in running for p in r.placements)
    return {
        "scenario": name,
        "nodes": n_nodes,
        "gpus": gpus,
        "running": len(running),
        "allocated_before": round(held / gpus, 3),
        "pending": n_pending,
        "pass_s": round(elapsed, 3),
        "pass_s_min": round(runs[0][0], 3),
        "cpu_s": round(cpu, 3),  # process CPU time: less sensitive to a busy machine
        "repeat": len(runs),
        "load_1m": round(os.getloadavg()[0], 2),  # the machine's load: read wall times with it
        "placements": placed,
        "preemptions": preempted,
        "placements_per_s": round(placed / elapsed, 1) if elapsed else None,
        "features": FEATURES,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scheduling.bench", description=__doc__)
    p.add_argument("--only", choices=["cold", "saturated", "growth"], action="append")
    p.add_argument(
        "--repeat", type=int, default=3, help="passes per scenario; the median is reported (default 3)"
    )
    p.add_argument(
        "--sizes",
        metavar="JOBS_CSV",
        help="a pod list (the simulator's jobs.csv) to draw request sizes from; default "
        "$TESSERA_TRACES/openb/jobs.csv if that variable is set, else a built-in mix",
    )
    args = p.parse_args(argv)
    path = sizes_path(args.sizes)
    if path is not None and not path.is_file():
        p.error(
            f"no pod list at {path} (README.md, 'Traces', says where to get one; without --sizes "
            "or TESSERA_TRACES the built-in mix is used)"
        )
    sizes = request_sizes(path)
    which = args.only or ["cold", "saturated", "growth"]
    rep = args.repeat
    if "cold" in which:
        print(json.dumps(scenario("cold", 1000, 10_000, 0.0, repeat=rep, sizes=sizes)), flush=True)
    if "saturated" in which:
        print(json.dumps(scenario("saturated", 1000, 10_000, 0.9, repeat=rep, sizes=sizes)), flush=True)
    if "growth" in which:
        for n in (100, 1000, 5000):
            print(json.dumps(scenario("growth", n, 10 * n, 0.0, repeat=rep, sizes=sizes)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
