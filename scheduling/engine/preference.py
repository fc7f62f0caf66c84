"""γ, the expected-wait term of placement: start now on a less-preferred model, or wait for the
preferred one?

A job that ranks its models (its ``accelerators`` list, or the kind's preferred accelerators) is
placed on the most preferred model that has room now. When that is not its first choice, each
step down its list costs 1, and waiting ``W`` hours for a better model costs ``γ · W``. The job
waits (pending, code ``model``) when some model it prefers more would save more steps than its
wait costs: ``steps saved > γ · W``. So a large γ starts the job now wherever it fits, a small γ
lets it wait for its first choice when that frees soon, and ``γ = ∞`` (the default) never waits.

``W`` is the start a reservation would get on that model alone (:func:`.backfill.reserve`: its
holders leave at their time limits or predicted runtimes). An estimate of "now" for a model that
has no room now means its holders overran their estimates: the wait is unknown and never worth
waiting for, so a job can never wait on an estimate that keeps slipping.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .backfill import reserve
from .placement import Constraints
from .state import Alloc
from .types import JobRequest, PendingReason

if TYPE_CHECKING:
    from .geometry import Geometry
    from .policy import TesseraScheduler


def wait_for_preferred(
    s: TesseraScheduler, job: JobRequest, geo: Geometry, allocs: list[Alloc], now: float
) -> PendingReason | None:
    """If ``job`` should wait for a model it prefers over where ``allocs`` put it, give the
    allocations back and return its pending reason; else None (bind them)."""
    gamma = s.config.gamma
    if math.isinf(gamma) or not allocs or not geo.req.count:
        return None
    models, ranked = s.models_for(job)
    got = s.nodes[allocs[0].node].model
    if not ranked or got not in models or models.index(got) == 0:
        return None
    k = models.index(got)
    holders = s.holders(now)
    for j, m in enumerate(models[:k]):
        if not s.admits(job, m, geo.charge * geo.need):
            continue  # its quota refuses the model: waiting for capacity there does not help
        c = Constraints((m,), job.node_selector, job.tolerations, True)
        r = reserve(s.placer, job, geo.req, geo.need, c, holders, set(), now)
        if r is None or r.start <= now:
            continue  # never, or an estimate already overrun: the wait is unknown
        wait_h = (r.start - now) / 3600.0
        if k - j > gamma * wait_h:
            for a in allocs:
                s.state.release_replica(job.id, a)
            return PendingReason(
                "model",
                f"model: waiting for {m} (choice {j + 1} of its models), expected free "
                f"in ~{max(1, round(wait_h * 60))} min, rather than starting now on "
                f"{got} (choice {k + 1})",
                r.start,
            )
    return None
