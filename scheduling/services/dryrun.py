"""A dry run of a submit: whether and where a job would start now, or why it would wait.

The pass's own policy decides over the pass's own snapshot with the job added at the back of its
queue (submitted now); nothing is stored, locked or published. The answer is what the next pass
would do if nothing else changed meanwhile — a forecast, not a reservation.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from django.utils import timezone

from scheduling.models import Job
from scheduling.services.jobs import NotAdmissible
from scheduling.services.passes import estimate_at, make_policy
from scheduling.services.quotas import check_job_admissible
from scheduling.services.snapshot import REQUEST_FIELDS, load_snapshot, request_of

# The hypothetical job's id in the engine (stored jobs' ids start at 1).
DRY_RUN_ID = "0"


def dry_run(tenant: Any, cleaned: dict[str, Any], now: datetime | None = None) -> dict[str, Any]:
    """What the scheduler would do with ``cleaned`` (a validated body's model fields) for
    ``tenant`` now. Raises :class:`NotAdmissible` as a submit would.

    Returns ``would_start`` and, if it would, ``allocations`` and ``preemptions`` (how many running
    jobs it would stop first: their number only, since they may be another tenant's); otherwise
    ``pending_code``, ``pending_reason`` and ``estimated_start``, as a stored job would show them.
    """
    why = check_job_admissible(tenant, cleaned)
    if why:
        raise NotAdmissible(why)
    now = now or timezone.now()
    job = Job(**cleaned)  # unsaved: the model's defaults fill in what the body left out
    fields = {name: getattr(job, name) for name in REQUEST_FIELDS}
    fields.update(id=DRY_RUN_ID, submitted_at=now, not_before=None)
    loaded = load_snapshot(now)
    snapshot = replace(loaded.snapshot, pending=(*loaded.snapshot.pending, request_of(tenant.name, fields)))
    decisions = make_policy(replace(loaded, snapshot=snapshot)).decide(snapshot.now)
    out: dict[str, Any] = {"dry_run": True, "would_start": False}
    binding = next((b for b in decisions.bindings if b.job_id == DRY_RUN_ID), None)
    if binding is not None:
        out["would_start"] = True
        out["allocations"] = [
            {"node": p.node, "gpus": list(p.gpus), "share": p.share, "replica": p.replica}
            for p in binding.placements
        ]
        out["preemptions"] = 0
        return out
    preempting = [p for p in decisions.preemptions if p.for_job == DRY_RUN_ID]
    reason = decisions.pending.get(DRY_RUN_ID)
    rejected = decisions.rejections.get(DRY_RUN_ID)
    if preempting:
        out["preemptions"] = len(preempting)
    if reason is not None:
        out["pending_code"], out["pending_reason"] = reason.code, reason.message
        out["estimated_start"] = estimate_at(reason.estimated_start)
    elif rejected is not None:
        out["pending_code"], out["pending_reason"], out["estimated_start"] = "capacity", rejected, None
    else:  # not reached within the pass's bound on starts: it waits behind the others
        out["pending_code"] = "priority"
        out["pending_reason"] = "other jobs are ahead of it in the queue"
        out["estimated_start"] = None
    return out
