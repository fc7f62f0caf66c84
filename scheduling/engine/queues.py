"""Multi-level queues: the order in which pending jobs are considered.

Level by kind (inference above training above fine-tune and batch, configurable); a job that
waited past the aging bound is promoted to level 0 (and gets a reservation, see
:mod:`.backfill`). Within a level: priority (higher first), then the tenant's weighted fair share
as it stands now (lower first), then arrival, then id (so equal inputs give equal orders).
The share is live within a pass: :func:`order` is a generator, and once the caller is done with
a job (started it or not) its tenant's share is read again before that tenant's next job of the
same group is ranked, so one tenant's backlog does not all go before another's.
At level 0 the level's own jobs (inference) come first, then promoted jobs past the starvation
bound, oldest first, then the other promoted jobs.
Before all of these within a level, jobs their tenant's guarantee covers come before jobs that
would borrow: capacity reclaimed for an owner goes to the owner, so a reclaim is never undone by
the borrower starting again in the next pass.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import Any

from .config import EngineConfig
from .quota import Quotas
from .types import JobRequest


def is_aged(job: JobRequest, now: float, config: EngineConfig) -> bool:
    return now - job.submitted_at >= config.aging_s


def starving(job: JobRequest, now: float, config: EngineConfig) -> bool:
    """Waited past the starvation bound (``config.starve_s``; 0 = never)."""
    return 0 < config.starve_s <= now - job.submitted_at


def level(job: JobRequest, now: float, config: EngineConfig) -> int:
    return 0 if is_aged(job, now, config) else config.level_of(job.kind)


def order(
    jobs: Iterable[JobRequest], now: float, config: EngineConfig, quotas: Quotas
) -> Iterator[JobRequest]:
    """Pending jobs in queue order, chosen one at a time. Jobs are grouped by all that comes
    before the fair share (level, the starvation rule, borrowing, priority); inside a group a
    heap holds one entry per tenant, keyed by (its share, its oldest job's arrival and id), and
    the tenant just yielded from is re-keyed with its share read again once the caller has
    handled the job (a start has charged it by then)."""
    groups: dict[tuple[Any, ...], dict[str, list[JobRequest]]] = {}
    for j in jobs:
        lv = level(j, now, config)
        if lv == 0 and config.level_of(j.kind) != 0 and starving(j, now, config):
            # promoted and past the starvation bound: after the level's own jobs, before the
            # other promoted ones, oldest first (the order seniority preemption follows)
            prefix: tuple[Any, ...] = (0, 1)
            tenant = ""  # one queue: oldest first, whatever the tenant's share
        else:
            borrow = quotas.would_borrow(j.tenant, j.gpus)
            sub = 0 if lv != 0 or config.level_of(j.kind) == 0 else 2
            prefix = (lv, sub, borrow, -j.priority)
            tenant = j.tenant
        groups.setdefault(prefix, {}).setdefault(tenant, []).append(j)
    total = quotas.total  # usage per tenant, live: a start charges it
    scale: dict[str, float] = {}
    for prefix in sorted(groups):
        by_tenant = groups[prefix]
        heap = []
        for tenant, queue in by_tenant.items():
            queue.sort(key=lambda j: (j.submitted_at, j.id), reverse=True)  # oldest last: pop()
            if tenant not in scale:
                scale[tenant] = quotas.share_per_milli(tenant) if tenant else 0.0
            head = queue[-1]
            heap.append((total.get(tenant, 0) * scale[tenant], head.submitted_at, head.id, tenant))
        heapq.heapify(heap)
        while heap:
            tenant = heap[0][3]
            queue = by_tenant[tenant]
            yield queue.pop()
            if queue:  # re-key the tenant with its share now
                head = queue[-1]
                heapq.heapreplace(
                    heap, (total.get(tenant, 0) * scale[tenant], head.submitted_at, head.id, tenant)
                )
            else:
                heapq.heappop(heap)


def rank(job: JobRequest, config: EngineConfig) -> tuple[int, int]:
    """(kind's level, -priority): a job may preempt only jobs strictly behind it by this rank.
    Aging is left out on purpose: a promoted job gets a reservation, not the right to preempt, so
    two aged jobs can never take turns preempting each other."""
    return (config.level_of(job.kind), -job.priority)
