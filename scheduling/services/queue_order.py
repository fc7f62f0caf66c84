"""The pending queue in the order the scheduler considers it (the dashboard's queue, top first).

The pass's own policy is built over the pass's own snapshot, and the engine's queue order
(:func:`scheduling.engine.queues.order`: level and aging, borrowing, priority, the tenants' fair
shares as they stand, arrival) is read off it. It is the order in which the next pass would try to
start the jobs; a job further down may still start first when it fits where an earlier one does
not (backfill), which its pending reason then says. Read-only.
"""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from scheduling.engine import queues
from scheduling.services.passes import make_policy
from scheduling.services.snapshot import load_snapshot


def queue_order(now: datetime | None = None) -> list[int]:
    """Every pending job's id, in queue order."""
    loaded = load_snapshot(now or timezone.now())
    if not loaded.snapshot.pending:
        return []
    policy = make_policy(loaded)
    ordered = queues.order(loaded.snapshot.pending, loaded.snapshot.now, policy.config, policy.quotas)
    return [int(job.id) for job in ordered]
