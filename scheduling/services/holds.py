"""Holding a waiting job back from starting, and releasing it (``tessera hold`` / ``release``).

A held job stays ``pending`` with the pending code ``held`` until it is released; the pass
passes it over (the engine reads ``held``), and a pass that decided on a snapshot read before
the hold does not bind it (``passes.py`` reads the job again under its lock). Only a waiting job
can be held: one that is already bound or running is the cancel's business (409). Both are
idempotent: holding a held job, or releasing one that is not held, changes nothing and records
nothing. Cancelling a held job lets go of the hold with it.
"""

from __future__ import annotations

from django.db import transaction

from scheduling.choices import EventType, JobState, PendingCode
from scheduling.engine.types import HELD_REASON
from scheduling.models import Job
from scheduling.services import live
from scheduling.services.jobs import (
    AWAITING_PASS,
    clear_estimate,
    locked_jobs,
    record_event,
    request_pass_on_commit,
)
from scheduling.services.snapshot import ESTIMATE_FIELDS
from scheduling.states import InvalidTransition


def do_hold_job(job_id: int) -> Job:
    """Keep a pending job from starting. InvalidTransition (409) for a job not waiting."""
    with transaction.atomic():
        job = locked_jobs().get(pk=job_id)
        if job.held:
            return job
        if job.state != JobState.PENDING:
            raise InvalidTransition(job.pk, job.state, "held")
        job.held = True
        job.pending_code, job.pending_reason, job.estimated_start = PendingCode.HELD, HELD_REASON, None
        clear_estimate(job)
        job.save(
            update_fields=["held", "pending_code", "pending_reason", "estimated_start", *ESTIMATE_FIELDS]
        )
        record_event(job, EventType.HELD)
        live.publish_job(job)
        request_pass_on_commit()  # what it would have started on may start another job now
        return job


def do_release_job(job_id: int) -> Job:
    """Let a held job start again; the next pass (asked for now) places it or says why it waits,
    and until then it says it waits for that pass. A job that no longer waits is returned as it
    is: nothing is recorded after its end."""
    with transaction.atomic():
        job = locked_jobs().get(pk=job_id)
        if not job.held or job.state != JobState.PENDING:
            return job
        job.held = False
        if job.pending_code == PendingCode.HELD:
            job.pending_code, job.pending_reason = AWAITING_PASS
        job.save(update_fields=["held", "pending_code", "pending_reason"])
        record_event(job, EventType.RELEASED)
        live.publish_job(job)
        request_pass_on_commit()
        return job
