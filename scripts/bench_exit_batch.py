"""CPU and wall time of one agent exit batch (``do_report_exits``), in process, on PostgreSQL.

The web process's largest cost in ``make bench-e2e`` that grew since b7f674b (py-spy) was the
agents' exit reports. This settles ``--batches`` batches of ``--size`` exits (each job holding
one GPU of one node, running, ending with code 0), measuring only the service call: the
process's CPU time (``time.process_time``) and the wall time, and prints one JSON line with the
medians and means in milliseconds per batch. Setting up each batch's jobs (ORM, unmeasured)
comes between batches. ``--webhook``: the jobs' tenant has a webhook (deliveries queued);
``--pending``: a job that never fits stays pending (the exit asks for a pass).

Run it against another checkout's code with ``PYTHONPATH=<checkout>`` (the same database
schema): docs/benchmarks/e2e.md, session 14.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tessera_exitbench \\
        nice -n 19 .venv/bin/python scripts/bench_exit_batch.py [--batches 200] [--size 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH (scripts/bench_db.py)
from scripts.bench_db import fresh_postgres  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--size", type=int, default=4)
    p.add_argument("--warmup", type=int, default=20, help="batches settled first, not counted")
    p.add_argument("--webhook", action="store_true")
    p.add_argument("--pending", action="store_true")
    args = p.parse_args()
    if not fresh_postgres():
        return 2

    from django.utils import timezone

    from scheduling.choices import JobState
    from scheduling.models import Allocation, Device, Job, Node, Tenant, Webhook
    from scheduling.services import agents
    from scheduling.services.agents import ExitReport, do_report_exits

    print(f"code: {agents.__file__}", file=sys.stderr)

    tenant = Tenant.objects.create(name="bench")
    node = Node.objects.create(name="bench-01", rack="r1", nvlink_domain=4, cpus=64, memory_gib=512)
    devices = [
        Device.objects.create(node=node, index=i, uuid=f"GPU-bench-{i}", model="A100", memory_gib=80)
        for i in range(args.size)
    ]
    if args.webhook:
        Webhook.objects.create(tenant=tenant, url="https://example.com/hook", secret="s" * 64, events=[])
    common = {"tenant": tenant, "kind": "training", "command": ["true"]}
    if args.pending:
        Job.objects.create(name="never-fits", gpus=10_000, state=JobState.PENDING, **common)

    def batch() -> list[ExitReport]:
        now = timezone.now()
        jobs = Job.objects.bulk_create(
            [
                Job(name=f"j{i}", gpus=1, state=JobState.RUNNING, started_at=now, **common)
                for i in range(args.size)
            ]
        )
        Allocation.objects.bulk_create(
            [
                Allocation(job=job, node=node, device=device, replica=0, share_milli=1000, attempt=0)
                for job, device in zip(jobs, devices, strict=True)
            ]
        )
        return [ExitReport(job.pk, 0, 0, 0) for job in jobs]

    cpu: list[float] = []
    wall: list[float] = []
    for n in range(args.warmup + args.batches):
        reports = batch()
        c0, w0 = time.process_time(), time.perf_counter()
        results = do_report_exits(node, reports)
        c1, w1 = time.process_time(), time.perf_counter()
        assert all(isinstance(r, tuple) and r[0].state == JobState.SUCCEEDED for r in results), results
        if n >= args.warmup:
            cpu.append((c1 - c0) * 1000)
            wall.append((w1 - w0) * 1000)
    print(
        json.dumps(
            {
                "batches": args.batches,
                "size": args.size,
                "webhook": args.webhook,
                "pending": args.pending,
                "cpu_ms_median": round(statistics.median(cpu), 3),
                "cpu_ms_mean": round(statistics.fmean(cpu), 3),
                "wall_ms_median": round(statistics.median(wall), 3),
                "wall_ms_mean": round(statistics.fmean(wall), 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
