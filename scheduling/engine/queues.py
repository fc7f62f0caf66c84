"""Multi-level queues: the order in which pending jobs are considered.

Level by kind (inference above training above fine-tune and batch, configurable); a job that
waited past the aging bound is promoted to level 0 (and gets a reservation, see
:mod:`.backfill`). Within a level: priority (higher first), then the tenant's weighted fair share
at the start of the pass (lower first), then arrival, then id (so equal inputs give equal orders).
At level 0 the level's own jobs (inference) come first, then promoted jobs past the starvation
bound, oldest first, then the other promoted jobs.
Before all of these within a level, jobs their tenant's guarantee covers come before jobs that
would borrow: capacity reclaimed for an owner goes to the owner, so a reclaim is never undone by
the borrower starting again in the next pass.
"""

from __future__ import annotations

from collections.abc import Iterable

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


def order(jobs: Iterable[JobRequest], now: float, config: EngineConfig,
          quotas: Quotas) -> list[JobRequest]:
    shares: dict[str, float] = {}

    def key(j: JobRequest) -> tuple:
        lv = level(j, now, config)
        if lv == 0 and config.level_of(j.kind) != 0 and starving(j, now, config):
            # promoted and past the starvation bound: after the level's own jobs, before the
            # other promoted ones, oldest first (the order seniority preemption follows)
            return (0, 1, j.submitted_at, j.id)
        share = shares.get(j.tenant)
        if share is None:
            share = shares[j.tenant] = quotas.share(j.tenant)
        borrow = quotas.would_borrow(j.tenant, j.gpus)
        sub = 0 if lv != 0 or config.level_of(j.kind) == 0 else 2
        return (lv, sub, borrow, -j.priority, share, j.submitted_at, j.id)

    return sorted(jobs, key=key)


def rank(job: JobRequest, config: EngineConfig) -> tuple[int, int]:
    """(kind's level, -priority): a job may preempt only jobs strictly behind it by this rank.
    Aging is left out on purpose: a promoted job gets a reservation, not the right to preempt, so
    two aged jobs can never take turns preempting each other."""
    return (config.level_of(job.kind), -job.priority)
