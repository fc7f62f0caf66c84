"""What a pass costs when many waiting jobs' reasons change: ``_store_pending_reasons`` alone.

A queue waiting for capacity gets new reasons pass after pass (a capacity reason names the GPUs
free, which move as jobs start and end); each changed job's row is written, read back and
published to its tenant's and the operators' dashboards. This builds ``--jobs`` pending jobs,
then ``--rounds`` times reads the snapshot and stores a reason that differs from the stored one
for every job, and prints one JSON line: the median CPU and wall milliseconds of the store.

The channel layer is the one the settings give: the in-memory layer of the embedded default
(``REDIS_URL`` unset), or Redis's (set). PostgreSQL only (``DATABASE_URL``)::

    createdb -h 127.0.0.1 -U postgres tessera_reasons
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tessera_reasons \\
        .venv/bin/python scripts/bench_reasons.py [--jobs 300] [--rounds 40]

Another checkout: ``cd OTHER && PYTHONPATH=OTHER OTHER/.venv/bin/python THIS/scripts/bench_reasons.py``.
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
    p.add_argument("--jobs", type=int, default=300, help="pending jobs, each with a new reason per round")
    p.add_argument("--rounds", type=int, default=40, help="measured rounds (after 5 unmeasured)")
    args = p.parse_args()
    if not fresh_postgres():
        return 2

    from channels.layers import get_channel_layer
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from scheduling.choices import JobState
    from scheduling.engine.types import Decisions, PendingReason
    from scheduling.models import Job, Tenant
    from scheduling.services import passes
    from scheduling.services.snapshot import load_snapshot

    tenant = Tenant.objects.create(name="t0")
    owner = get_user_model().objects.create(username="u0")
    Job.objects.bulk_create(
        Job(
            tenant=tenant,
            owner=owner,
            name=f"wait-{i}",
            kind="batch",
            command=["true"],
            gpus=1,
            state=JobState.PENDING,
            pending_code="capacity",
            pending_reason="capacity: needs 1 GPU, 0 free",
        )
        for i in range(args.jobs)
    )

    def store(k: int) -> tuple[float, float]:
        loaded = load_snapshot(timezone.now())
        decisions = Decisions()
        for job in loaded.snapshot.pending:  # a free count unlike the stored one: every row changes
            decisions.pending[job.id] = PendingReason("capacity", f"capacity: needs 1 GPU, {1 + k % 7} free")
        c0, w0 = time.process_time(), time.perf_counter()
        passes._store_pending_reasons(decisions, loaded, None)
        return (time.process_time() - c0) * 1000, (time.perf_counter() - w0) * 1000

    for k in range(5):
        store(k)
    got = [store(k) for k in range(5, 5 + args.rounds)]
    layer = get_channel_layer()
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "rounds": args.rounds,
                "layer": type(layer).__name__ if layer is not None else None,
                "store_cpu_ms_median": round(statistics.median(c for c, _ in got), 2),
                "store_wall_ms_median": round(statistics.median(w for _, w in got), 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
