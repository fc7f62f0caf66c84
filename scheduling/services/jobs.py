"""Write paths of a job's life: submit, cancel, and every state change with its event.

``do_transition`` is the one function that changes a job's state: it checks the state machine,
records the event and publishes the change after commit. ``do_transition_many`` does the same for
many jobs moving to one state in a few queries (the pass binding a chunk of jobs).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from scheduling.choices import HOLDING_STATES, QUEUE_LEVELS, TERMINAL_STATES, EventType, JobState
from scheduling.models import Allocation, IdempotencyKey, Job, JobEvent
from scheduling.services import live
from scheduling.states import check_transition


class IdempotencyConflict(Exception):
    """The same Idempotency-Key was used with another body."""


class NotAdmissible(Exception):
    """No quota of the job's tenant could ever admit it (answered 400 naming ``accelerators``)."""


def allocations_payload(allocs) -> list[dict[str, Any]]:
    """Allocation rows → the contract's ``[{"node", "gpus", "share", "replica"}]``."""
    grouped: dict[tuple[int, str, int], list[int]] = {}
    for a in sorted(allocs, key=lambda a: (a.replica, a.node.name, device_index(a))):
        gpus = grouped.setdefault((a.replica, a.node.name, a.share_milli), [])
        if a.device is not None:
            gpus.append(a.device.index)
    return [
        # A CPU-only replica: no GPUs; its share is reported as 1.0, the contract's default.
        {"node": node, "gpus": gpus, "share": share / 1000 if gpus else 1.0, "replica": replica}
        for (replica, node, share), gpus in grouped.items()
    ]


def device_index(allocation) -> int:
    return allocation.device.index if allocation.device is not None else -1


def active_allocations_of(job: Job):
    return job.allocations.filter(released_at__isnull=True).select_related("node", "device")


def record_event(job: Job, type_: str, reason: str = "", allocations=None, at: datetime | None = None):
    return JobEvent.objects.create(
        job=job, type=type_, at=at or timezone.now(), reason=reason[:256], allocations=allocations
    )


def do_transition(
    job: Job,
    target: str,
    event: str,
    reason: str = "",
    allocations: list[dict[str, Any]] | None = None,
    at: datetime | None = None,
    **fields: Any,
) -> Job:
    """Move ``job`` (locked by the caller) to ``target``, recording ``event``."""
    check_transition(job.pk, job.state, target)
    job.state = target
    for name, value in fields.items():
        setattr(job, name, value)
    if target != JobState.PENDING:
        job.pending_reason = None
        job.pending_code = None
        job.estimated_start = None
    # Only the columns a transition writes (the job is locked): a full save compiled every column.
    job.save(update_fields=["state", "pending_reason", "pending_code", "estimated_start", *fields])
    record_event(job, event, reason, allocations, at)
    live.publish_job(job)
    return job


def do_transition_many(
    jobs: list[Job], target: str, event: str, allocations: dict[int, list[dict[str, Any]]], at: datetime
) -> None:
    """:func:`do_transition` for ``jobs`` (locked by the caller) all moving to ``target`` at ``at``:
    one UPDATE and one INSERT for all of them. ``allocations``: each job's event allocations."""
    if not jobs:
        return
    for job in jobs:
        check_transition(job.pk, job.state, target)
        job.state = target
        if target != JobState.PENDING:
            job.pending_reason = job.pending_code = job.estimated_start = None
    cleared = {} if target == JobState.PENDING else {
        "pending_reason": None, "pending_code": None, "estimated_start": None}
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(state=target, **cleared)
    JobEvent.objects.bulk_create(
        JobEvent(job=job, type=event, at=at, allocations=allocations.get(job.pk)) for job in jobs
    )
    for job in jobs:
        live.publish_job(job)


def _body_hash(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def do_submit_job(
    user, tenant, cleaned: dict[str, Any], body: dict[str, Any], idempotency_key: str | None = None,
    check_quota: bool = False,
) -> tuple[Job, bool]:
    """Store a validated job (``cleaned``: model field values). Returns (job, created).

    With an idempotency key, a retry of the same body within the TTL returns the first job (even
    if quotas changed since); the same key with another body raises :class:`IdempotencyConflict`.
    ``check_quota``: a new job that no quota of ``tenant`` could ever admit raises
    :class:`NotAdmissible`. All in one transaction, so a web process killed mid-submit leaves
    nothing half-stored.
    """
    digest = _body_hash(body)
    if check_quota:
        from scheduling.services.quotas import check_job_admissible

        why = check_job_admissible(tenant, cleaned)
        if why:
            existing = _find_idempotent(user, idempotency_key) if idempotency_key else None
            if existing is None:
                raise NotAdmissible(why)
            return _retried(existing, digest)
    # The key is not looked up first: a first submit (the common case) inserts it with its job,
    # and a retry's insert fails on the key's unique constraint, which rolls back the job too.
    for _ in range(2):  # once more if the key found had outlived its TTL (deleted, then free)
        try:
            with transaction.atomic():
                job = Job.objects.create(
                    tenant=tenant,
                    owner=user,
                    queue_level=QUEUE_LEVELS.get(cleaned["kind"], 2),
                    pending_code="priority",
                    pending_reason="waiting for the next scheduling pass",
                    **cleaned,
                )
                if idempotency_key:
                    IdempotencyKey.objects.create(user=user, key=idempotency_key, body_hash=digest, job=job)
                record_event(job, EventType.SUBMITTED, at=job.submitted_at)
                live.publish_job(job)
                transaction.on_commit(_pass_for_new_job)
            return job, True
        except IntegrityError:
            existing = _find_idempotent(user, idempotency_key) if idempotency_key else None
            if existing is None and idempotency_key and _expired_removed(user, idempotency_key):
                continue
            if existing is None:
                raise
            return _retried(existing, digest)
    raise IntegrityError(f"idempotency key {idempotency_key!r} could not be stored")


def _retried(existing: IdempotencyKey, digest: str) -> tuple[Job, bool]:
    if existing.body_hash != digest:
        raise IdempotencyConflict()
    return existing.job, False


def _pass_for_new_job() -> None:
    from scheduling.services.triggers import request_pass

    request_pass(pending=True)  # the job just stored is pending: no need to ask the database


def _ttl_cutoff() -> datetime:
    return timezone.now() - timedelta(seconds=settings.TESSERA["IDEMPOTENCY_TTL_S"])


def _find_idempotent(user, key: str) -> IdempotencyKey | None:
    """The user's key, unless it has outlived its TTL (then it is treated as unused)."""
    row = IdempotencyKey.objects.filter(user=user, key=key).select_related("job").first()
    if row is None or row.created_at < _ttl_cutoff():
        return None
    return row


def _expired_removed(user, key: str) -> bool:
    """Delete the user's key if it has outlived its TTL; whether one was."""
    return IdempotencyKey.objects.filter(user=user, key=key, created_at__lt=_ttl_cutoff()).delete()[0] > 0


def locked_jobs():
    """Jobs read to be changed: ``FOR UPDATE OF`` the job row only, its tenant read alongside.

    Locking the tenant too (a plain ``select_related`` + ``FOR UPDATE``) serialised every exit
    report and pass of one tenant behind each other; call inside a transaction."""
    return Job.objects.select_for_update(of=("self",)).select_related("tenant")


def do_cancel_job(job_id: int) -> Job:
    """Cancel: pending/scheduled-but-not-started jobs at once; running ones get the stop signal.

    Idempotent for cancelled jobs; a succeeded or failed job raises InvalidTransition (409).
    """
    with transaction.atomic():
        job = locked_jobs().get(pk=job_id)
        if job.state == JobState.CANCELLED or (
            job.state == JobState.TERMINATING and job.stop_reason == "cancelled"
        ):
            return job
        if job.state in (JobState.PENDING, JobState.SCHEDULED):
            released = release_allocations(job)
            do_transition(job, JobState.CANCELLED, EventType.CANCELLED, "cancelled by user",
                          finished_at=timezone.now())
            if released:
                request_pass_on_commit()
            return job
        if job.state == JobState.RUNNING:
            return begin_stop(job, "cancelled")
        if job.state == JobState.TERMINATING:
            job.stop_reason = "cancelled"
            job.save(update_fields=["stop_reason"])
            return job
        check_transition(job.pk, job.state, JobState.CANCELLED)  # raises for finished jobs
        return job


def begin_stop(job: Job, reason: str, now: datetime | None = None) -> Job:
    """Send the stop signal: state ``terminating``; the job keeps its GPUs through its grace."""
    now = now or timezone.now()
    do_transition(
        job, JobState.TERMINATING, EventType.TERMINATING, reason,
        stop_reason=reason, stop_deadline=now + timedelta(seconds=job.grace_seconds),
    )
    for node_id in set(active_allocations_of(job).values_list("node_id", flat=True)):
        live.wake_agent(node_id)
    return job


def release_allocations(job: Job, at: datetime | None = None, active=None) -> list[dict[str, Any]]:
    """Free a job's GPUs (its process has exited, or its node is fenced). Returns device rows.

    ``active``: the job's unreleased allocations (with node and device) when the caller, holding
    the job's lock, has just read them; read here otherwise."""
    at = at or timezone.now()
    allocs = list(active_allocations_of(job)) if active is None else list(active)
    if not allocs:
        return []
    Allocation.objects.filter(pk__in=[a.pk for a in allocs]).update(released_at=at)
    # The nodes' versions are not bumped: capacity freed since a pass's snapshot never makes its
    # decisions wrong (the pass checks each device's allocations again under the node's lock),
    # and bumping them made a pass drop every binding onto a node where a job had just ended.
    from scheduling.services.inventory import device_rows

    devices = {}
    for a in allocs:
        if a.device is not None:
            a.device.node = a.node  # the allocation's node is its device's: no second read
            devices[a.device_id] = a.device
    rows = device_rows(devices.values())
    live.publish_devices(rows)
    return rows


def do_record_exit(job: Job, exit_code: int | None, at: datetime | None = None, active=None) -> Job:
    """The job's process ended (all replicas): settle its final or next state and free its GPUs.

    ``job`` must be locked by the caller; ``active``: as for :func:`release_allocations`.
    """
    at = at or timezone.now()
    if job.state in TERMINAL_STATES or job.state == JobState.PENDING:
        return job
    release_allocations(job, at, active)
    stop = job.stop_reason if job.state == JobState.TERMINATING else ""
    common = {"exit_code": exit_code, "stop_deadline": None}
    if stop == "cancelled":
        do_transition(job, JobState.CANCELLED, EventType.CANCELLED, "cancelled by user",
                      at=at, finished_at=at, **common)
    elif stop.startswith("preempt"):
        do_transition(job, JobState.PENDING, EventType.PREEMPTED, stop, at=at,
                      attempts=job.attempts + 1, stop_reason="", **common)
        record_event(job, EventType.REQUEUED, "from last checkpoint", at=at)
    elif stop == "time-limit":
        do_transition(job, JobState.FAILED, EventType.FAILED, "time-limit", at=at,
                      finished_at=at, **common)
    elif exit_code == 0:
        do_transition(job, JobState.SUCCEEDED, EventType.SUCCEEDED, "", at=at,
                      finished_at=at, **common)
    elif (used := retries_used(job)) < job.max_retries:
        why = f"exit {exit_code}" if exit_code is not None else "lost"
        do_transition(job, JobState.PENDING, EventType.RETRYING, why, at=at,
                      attempts=job.attempts + 1, not_before=at + retry_backoff(used),
                      stop_reason="", **common)
    else:
        reason = f"exit {exit_code}" if exit_code is not None else "lost"
        do_transition(job, JobState.FAILED, EventType.FAILED, reason, at=at, finished_at=at, **common)
    request_pass_on_commit()
    return job


def retries_used(job: Job) -> int:
    """Failed attempts that were retried: only failures consume ``max_retries`` (CONTRACTS.md);
    preemptions and requeues of never-started jobs do not (``attempts`` counts those too)."""
    return job.events.filter(type=EventType.RETRYING).count()


def retry_backoff(used: int) -> timedelta:
    """Exponential: ``RETRY_BACKOFF_S`` × 2^retries used, at most an hour."""
    return timedelta(seconds=min(3600.0, settings.TESSERA["RETRY_BACKOFF_S"] * (2 ** min(used, 20))))


def do_mark_running(job: Job, at: datetime | None = None) -> Job:
    """The agent started the job's process (every replica it holds). ``job`` locked by caller."""
    if job.state != JobState.SCHEDULED:
        return job
    at = at or timezone.now()
    return do_transition(job, JobState.RUNNING, EventType.STARTED, at=at, started_at=at)


def holding_jobs():
    return Job.objects.filter(state__in=list(HOLDING_STATES))


def request_pass_on_commit() -> None:
    from scheduling.services.triggers import request_pass

    transaction.on_commit(request_pass)
