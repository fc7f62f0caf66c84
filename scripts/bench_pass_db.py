"""A scheduling pass's cost on PostgreSQL, with and without server-side prepared reads.

The cluster of ``make bench-e2e`` (16 nodes of 8 GPUs), mostly full: ``--running`` jobs hold
GPUs (half of them half a GPU each), ``--waiting`` jobs wait for a GPU model no node has,
``--history`` jobs have finished (the runtime history the pass reads; ``--names`` job names
across 8 users, ``--tenants`` tenants and ``--kinds`` kinds: the more of them, the more rows the
history read returns; ``make bench-e2e`` has one tenant, one kind and a name per job: ``--tenants 1
--kinds 1 --names 1000000``). Then ``--passes`` rounds,
each run twice, once per code path, alternating which goes first
(``TESSERA_SERVER_PREPARED_READS`` switched in process, the cleanest A/B): a pass after
``--bind`` new one-GPU jobs were submitted (it binds them, as after a submit in the e2e
benchmark), and the snapshot read alone (``load_snapshot``). Between rounds, unmeasured, the
bound jobs end and release their GPUs.

Measured per pass: the wall time, this process's CPU (``time.process_time``), the PostgreSQL
backend's CPU (``/proc/<pid>/stat`` of the session's backend: ticks of 10 ms, so only its mean
over many passes means anything; needs the server on this host), and the pass's number of
executes (round trips). The same for the snapshot read alone (``read_*``). Prints one JSON line
per path and the ratios prepared ÷ client-side.

    createdb -h 127.0.0.1 -U postgres tessera_passbench
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tessera_passbench \\
        nice -n 10 .venv/bin/python scripts/bench_pass_db.py [--passes 200]

Another checkout's pass (``--paths prepared``: the default path alone), by its own interpreter,
with this script, from that checkout's directory (run from this one, it imported this one's
``scheduling``): ``cd OTHER && PYTHONPATH=OTHER OTHER/.venv/bin/python THIS/scripts/bench_pass_db.py
--paths prepared`` (a checkout from before the prepared reads ignores the switch).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH (scripts/bench_db.py)
from scripts.bench_db import fresh_postgres  # noqa: E402

PATHS = {"prepared": True, "client": False}


def _backend_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14 and 15 of stat)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--passes", type=int, default=200, help="measured rounds (each path once per round)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--running", type=int, default=200)
    p.add_argument("--waiting", type=int, default=20)
    p.add_argument("--history", type=int, default=600)
    p.add_argument("--names", type=int, default=20, help="job names the history's runs are spread over")
    p.add_argument(
        "--tenants", type=int, default=4, help="tenants the jobs are spread over (1: as in make bench-e2e)"
    )
    p.add_argument(
        "--kinds", type=int, default=3, help="job kinds the jobs are spread over (1: as in make bench-e2e)"
    )
    p.add_argument("--bind", type=int, default=4, help="jobs submitted before each measured pass")
    p.add_argument(
        "--paths",
        default=",".join(PATHS),
        help="the read paths to measure, by turns (one: the pass of this code as it runs by default, "
        "to compare with another checkout's, PYTHONPATH=<checkout>)",
    )
    args = p.parse_args()
    if not fresh_postgres():
        return 2

    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from scheduling.choices import JobState
    from scheduling.models import Allocation, Device, Job, Node, Tenant
    from scheduling.services import passes
    from scheduling.services.snapshot import load_snapshot

    now = timezone.now()
    tenants = [Tenant.objects.create(name=f"t{i}") for i in range(args.tenants)]
    users = [get_user_model().objects.create(username=f"u{i}") for i in range(8)]
    nodes = [
        Node.objects.create(
            name=f"n{i:02d}",
            rack=f"r{i // 4}",
            nvlink_domain=4,
            cpus=128,
            memory_gib=1024,
            last_heartbeat=now,
        )
        for i in range(16)
    ]
    devices = Device.objects.bulk_create(
        Device(node=n, index=i, uuid=f"GPU-{n.name}-{i}", model="A100", memory_gib=80, nvlink_island=i // 4)
        for n in nodes
        for i in range(8)
    )

    def job(i: int, **fields: Any) -> Job:
        return Job(
            tenant=tenants[i % args.tenants],
            owner=users[i % 8],
            name=f"train-{i % args.names}",
            kind=("training", "inference", "batch")[i % args.kinds],
            command=["true"],
            preemptible=False,
            **fields,
        )

    ago = now - timedelta(hours=6)
    Job.objects.bulk_create(
        job(
            i,
            state=(JobState.SUCCEEDED, JobState.FAILED)[i % 5 == 0],
            submitted_at=ago,
            started_at=ago,
            finished_at=ago + timedelta(seconds=60 + 7 * i),
        )
        for i in range(args.history)
    )
    # The running jobs fill all but the last node: half of them two to a GPU.
    slots = [(d, 500) for d in devices[:-8] for _ in range(2)][: args.running // 2]
    slots += [(d, 1000) for d in devices[len(slots) // 2 : -8]][: args.running - len(slots)]
    running = Job.objects.bulk_create(
        job(i, gpus=share / 1000, state=JobState.RUNNING, started_at=now, submitted_at=now)
        for i, (_, share) in enumerate(slots)
    )
    Allocation.objects.bulk_create(
        Allocation(job=j, node=d.node, device=d, replica=0, share_milli=share, attempt=0)
        for j, (d, share) in zip(running, slots, strict=True)
    )
    # Waiting for a model no node has: never bound (nor reserved for), their reasons unchanged.
    Job.objects.bulk_create(
        job(i, gpus=8, accelerators=["H100"], state=JobState.PENDING) for i in range(args.waiting)
    )
    with connection.cursor() as cur:
        cur.execute("ANALYZE")
        cur.execute("SELECT pg_backend_pid()")
        backend = cur.fetchone()[0]

    executes = [0]
    # Checkouts between 509bd9a and the queue-first read took whether a pass was asked for.
    asked = {"expect_pending": True} if "expect_pending" in passes._one_pass.__code__.co_varnames else {}

    def count(execute, sql, params, many, context):
        executes[0] += 1
        return execute(sql, params, many, context)

    samples: dict[str, dict[str, list[float]]] = {
        path: {k: [] for k in ("pass_wall", "pass_cpu", "read_wall", "read_cpu", "executes")}
        for path in PATHS
    }
    ticks = {(path, what): 0 for path in PATHS for what in ("pass", "read")}
    n = 0

    def measure(path: str, record: bool) -> None:
        nonlocal n
        settings.TESSERA["SERVER_PREPARED_READS"] = PATHS[path]
        at = timezone.now()
        Node.objects.update(last_heartbeat=at)
        Job.objects.bulk_create(job(n + i, gpus=1, state=JobState.PENDING) for i in range(args.bind))
        n += args.bind
        t0, w0, e0 = _backend_ticks(backend), time.perf_counter(), executes[0]
        c0 = time.process_time()
        result = passes._one_pass(at, **asked)
        c1, w1, e1 = time.process_time(), time.perf_counter(), executes[0]
        t1 = _backend_ticks(backend)
        c_read, w_read = time.process_time(), time.perf_counter()
        loaded = load_snapshot(at)
        c2, w2, t2 = time.process_time(), time.perf_counter(), _backend_ticks(backend)
        assert len(result.bound) == args.bind, result
        assert len(loaded.snapshot.pending) == args.waiting
        # The bound jobs end (unmeasured): their GPUs free for the next round.
        bound = [int(j) for j in result.bound]
        Allocation.objects.filter(job_id__in=bound).update(released_at=at)
        Job.objects.filter(pk__in=bound).update(state=JobState.SUCCEEDED, started_at=at, finished_at=at)
        if record:
            s = samples[path]
            s["pass_wall"].append((w1 - w0) * 1000)
            s["pass_cpu"].append((c1 - c0) * 1000)
            s["read_wall"].append((w2 - w_read) * 1000)
            s["read_cpu"].append((c2 - c_read) * 1000)
            s["executes"].append(e1 - e0)
            if t0 is not None and t1 is not None and t2 is not None:
                ticks[(path, "pass")] += t1 - t0
                ticks[(path, "read")] += t2 - t1

    order = [path for path in args.paths.split(",") if path in PATHS]
    samples = {path: samples[path] for path in order}
    with connection.execute_wrapper(count):
        for r in range(args.warmup + args.passes):
            for path in order if r % 2 else order[::-1]:
                measure(path, r >= args.warmup)
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    out: dict[str, dict[str, float]] = {}
    for path, s in samples.items():
        out[path] = {
            f"{k}_ms_median" if k != "executes" else k: round(statistics.median(v), 3) for k, v in s.items()
        }
        for what in ("pass", "read"):
            out[path][f"{what}_pg_cpu_ms_mean"] = round(ticks[(path, what)] * tick_ms / args.passes, 3)
        print(json.dumps({"path": path, "passes": args.passes, **out[path]}))
    if len(out) == len(PATHS):
        a, b = out["prepared"], out["client"]
        print(json.dumps({"ratio": "prepared / client", **{k: round(a[k] / b[k], 3) for k in a if b[k]}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
