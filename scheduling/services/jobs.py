"""Write paths of a job's life: submit, cancel, and every state change with its event.

A job's state changes only through code here, and every change is checked against the state
machine, recorded as an event and published after commit: ``do_transition`` for one job;
``transition_writes`` for many moving to one state (the pass binding a chunk of jobs);
``Settlement`` for the changes an agent's reports make (starts, exits, stops), written together.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from scheduling.choices import HOLDING_STATES, QUEUE_LEVELS, TERMINAL_STATES, EventType, JobState
from scheduling.models import Allocation, Device, IdempotencyKey, Job, JobEvent, Tenant
from scheduling.services import audit, checkpoints, live, webhooks
from scheduling.services.bulk import COMMIT, InsertWithChildren, RowsInsert, RowsUpdate, Write, write_together
from scheduling.services.inventory import HOLDERS_OF_JOBS, Holder, device_rows
from scheduling.services.quotas import admission_params, admission_sql, check_job_admissible
from scheduling.services.snapshot import ESTIMATE_FIELDS, NO_ESTIMATE, PreparedRead
from scheduling.services.triggers import ANY_PENDING, request_pass, request_pass_on_commit
from scheduling.states import check_transition


class IdempotencyConflict(Exception):
    """The same Idempotency-Key was used with another body."""


class NotAdmissible(Exception):
    """No quota of the job's tenant could ever admit it (answered 400 naming ``accelerators``)."""


# The limits an agent stops a job at (the exit report's reason): the job fails with it, no retry.
AGENT_STOPS = ("time-limit", "disk-limit")


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


def gpu_sharing(job: Job, allocs) -> dict[int, tuple[int, bool]]:
    """For ``job``'s active fractional allocations ``allocs``: device id -> (how many other
    active allocations hold a share of that GPU, whether any of them is another tenant's). No
    names: a tenant learns that it shares a GPU, never with whom. One query, none for a job
    holding only whole GPUs."""
    mine = [a for a in allocs if a.device_id is not None and a.share_milli < 1000]
    if not mine:
        return {}
    out = {a.device_id: (0, False) for a in mine}
    rows = (
        Allocation.objects.filter(device_id__in=list(out), released_at__isnull=True)
        .exclude(pk__in=[a.pk for a in mine])
        .values_list("device_id", "job__tenant_id")
    )
    for device, tenant in rows:
        n, other = out[device]
        out[device] = (n + 1, other or tenant != job.tenant_id)
    return out


def device_index(allocation) -> int:
    return allocation.device.index if allocation.device is not None else -1


def active_allocations_of(job: Job):
    return job.allocations.filter(released_at__isnull=True).select_related("node", "device")


def record_event(
    job: Job,
    type_: str,
    reason: str = "",
    allocations=None,
    at: datetime | None = None,
    details: dict[str, Any] | None = None,
):
    event = JobEvent.objects.create(
        job=job,
        type=type_,
        at=at or timezone.now(),
        reason=reason[:256],
        allocations=allocations,
        details=details,
    )
    webhooks.queue_for_events([event])
    return event


def _moved(job: Job, target: str, fields: dict[str, Any]) -> None:
    """``job`` moved to ``target`` in memory (the state machine checked; ``fields`` set; a job no
    longer pending loses its pending reason): what every transition writes, however it writes."""
    check_transition(job.pk, job.state, target)
    job.state = target
    for name, value in fields.items():
        setattr(job, name, value)
    if target != JobState.PENDING:
        job.pending_reason = job.pending_code = job.estimated_start = None
        clear_estimate(job)


# What a waiting job says until a pass has judged it (submitted, or released from a hold).
AWAITING_PASS = ("priority", "waiting for the next scheduling pass")


def clear_estimate(job: Job) -> None:
    """``job`` no longer has a start estimate's band, basis or place in the queue (in memory)."""
    for name, value in zip(ESTIMATE_FIELDS, NO_ESTIMATE, strict=True):
        setattr(job, name, value)


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
    _moved(job, target, fields)
    # Only the columns a transition writes (the job is locked): a full save compiled every column.
    job.save(
        update_fields=[
            "state",
            "pending_reason",
            "pending_code",
            "estimated_start",
            *ESTIMATE_FIELDS,
            *fields,
        ]
    )
    record_event(job, event, reason, allocations, at)
    live.publish_job(job)
    return job


def transition_writes(
    jobs: list[Job],
    target: str,
    event: str,
    allocations: dict[int, list[dict[str, Any]]],
    at: datetime,
    reasons: dict[int, str] | None = None,
) -> list[Write | None]:
    """:func:`do_transition` for ``jobs`` (locked by the caller) all moving to ``target`` at ``at``
    (``allocations``, ``reasons``: each job's event allocations and reason, if any), as two
    statements for all of them — their
    rows' UPDATE and their events' INSERT — for the caller to send with its own
    (:func:`~scheduling.services.bulk.write_together`). The checks, the jobs' new state in memory
    and their live updates (after commit) are done here."""
    if not jobs:
        return []
    for job in jobs:
        _moved(job, target, {})
    live.publish_jobs(jobs)
    why = reasons or {}
    events = [
        JobEvent(job=job, type=event, at=at, reason=why.get(job.pk, ""), allocations=allocations.get(job.pk))
        for job in jobs
    ]
    webhooks.queue_for_events(events)
    return [_WRITE_STATES.write(jobs), _WRITE_EVENTS.write(events)]


def _body_hash(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def _canonical(value: Any) -> Any:
    """``value`` with every whole number one type (``2`` and ``2.0`` are one number)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return value


def request_hash(tenant, cleaned: dict[str, Any]) -> str:
    """What an Idempotency-Key remembers of its submit: the job as validated (``cleaned``: the
    model's values) and its tenant — not the body's text, so that a retry whose client wrote
    ``2`` as ``2.0`` or reordered the keys is the same request, and a different job (or another
    tenant's, for an operator) is not."""
    request = {"tenant": getattr(tenant, "pk", tenant), "job": _canonical(cleaned)}
    return hashlib.sha256(json.dumps(request, sort_keys=True, default=str).encode()).hexdigest()


def do_submit_job(
    user,
    tenant,
    cleaned: dict[str, Any],
    body: dict[str, Any],
    idempotency_key: str | None = None,
    check_quota: bool = False,
) -> tuple[Job, bool]:
    """Store a validated job (``cleaned``: model field values). Returns (job, created).

    With an idempotency key, a retry of the same body within the TTL returns the first job (even
    if quotas changed since); the same key with another body raises :class:`IdempotencyConflict`.
    ``check_quota``: a new job that no quota of ``tenant`` could ever admit raises
    :class:`NotAdmissible`. The job and what goes with it are stored in one statement, so a web
    process killed mid-submit leaves nothing half-stored.
    """
    digest = request_hash(tenant, cleaned)
    # A key stored before keys remembered the validated job (at most a TTL ago) holds the hash
    # of the body's text: a retry of the same text still matches it.
    legacy = _body_hash(body)
    # On PostgreSQL the quota check is a condition of the submit's own statement (one round trip);
    # elsewhere it runs first.
    in_statement = check_quota and connection.vendor == "postgresql"
    if check_quota and not in_statement:
        retried = _refuse_inadmissible(user, tenant, cleaned, idempotency_key, digest, legacy)
        if retried is not None:
            return retried
    # The key is not looked up first: a first submit (the common case) inserts it with its job,
    # and a retry's insert fails on the key's unique constraint, which rolls back the job too.
    for _ in range(3):  # again if a found key had outlived its TTL, or the quotas changed meanwhile
        try:
            # One statement (see _INSERT_SUBMIT): atomic by itself; a savepoint only inside a
            # caller's transaction, so that a failed insert leaves that transaction usable.
            with transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext():
                job = _store_new(user, tenant, cleaned, idempotency_key, digest, in_statement)
        except IntegrityError:
            existing = _find_idempotent(user, idempotency_key) if idempotency_key else None
            if existing is None and idempotency_key and _expired_removed(user, idempotency_key):
                continue
            if existing is None:
                raise
            return _retried(existing, digest, legacy)
        if job is not None:
            return job, True
        # No quota admitted it: why (and a retry of an earlier submit gets that submit's job).
        # If they admit it now (changed since), store it.
        retried = _refuse_inadmissible(user, tenant, cleaned, idempotency_key, digest, legacy)
        if retried is not None:
            return retried
    raise IntegrityError(f"job could not be stored (idempotency key {idempotency_key!r})")


def _refuse_inadmissible(
    user, tenant, cleaned: dict[str, Any], idempotency_key: str | None, digest: str, legacy: str
) -> tuple[Job, bool] | None:
    """Raise :class:`NotAdmissible` if no quota of ``tenant`` could admit the job, unless the key
    names an earlier submit (then its job, as a retry gets it, even if quotas changed since)."""
    why = check_job_admissible(tenant, cleaned)
    if not why:
        return None
    existing = _find_idempotent(user, idempotency_key) if idempotency_key else None
    if existing is None:
        raise NotAdmissible(why)
    return _retried(existing, digest, legacy)


def _store_new(
    user, tenant, cleaned: dict[str, Any], idempotency_key: str | None, digest: str, check_quota: bool
) -> Job | None:
    """Insert the job, its idempotency key and its ``submitted`` event (one statement; with
    ``check_quota``, only if a quota could admit the job, else None); its live update and a pass
    request follow the commit."""
    job = Job(
        tenant=tenant,
        owner=user,
        queue_level=QUEUE_LEVELS.get(cleaned["kind"], 2),
        pending_code=AWAITING_PASS[0],
        pending_reason=AWAITING_PASS[1],
        **cleaned,
    )
    key = IdempotencyKey(user=user, key=idempotency_key, body_hash=digest) if idempotency_key else None
    # The event's time is the job's, known once its values are final (``submitted_at`` is set then).
    children = lambda: [key, JobEvent(type=EventType.SUBMITTED, at=job.submitted_at)]  # noqa: E731
    if check_quota:
        if not _INSERT_ADMITTED.run(job, children, admission_params(tenant, cleaned)):
            return None
    else:
        _INSERT_SUBMIT.run(job, children)
    live.publish_job(job)
    transaction.on_commit(_pass_for_new_job)
    return job


_UNSET_AT_SUBMIT = (
    "checkpoint_place",
    "size_reason",
    "shrink_details",
    "size_cap",
    "estimated_start_earliest",
    "estimated_start_latest",
    "estimate_basis",
    "queue_position",
    "jobs_ahead",
)

# A submit's rows (the job, its idempotency key, its "submitted" event) in one statement, its SQL
# built once (services/bulk.py).
# (A "submitted" event has no allocations nor details: they stay NULL, unsent; nor has a new job
# a size reason, a shrink's details, a size cap or a start estimate: their database defaults.)
_INSERT_SUBMIT = InsertWithChildren(
    Job,
    [(IdempotencyKey, "job"), (JobEvent, "job")],
    null_columns=("allocations", "details"),
    unset_columns=_UNSET_AT_SUBMIT,
)


# The same, stored only if a quota of the tenant could admit the job.
_INSERT_ADMITTED = InsertWithChildren(
    Job,
    [(IdempotencyKey, "job"), (JobEvent, "job")],
    where=admission_sql,
    null_columns=("allocations", "details"),
    unset_columns=_UNSET_AT_SUBMIT,
)


def _retried(existing: IdempotencyKey, digest: str, legacy: str) -> tuple[Job, bool]:
    if existing.body_hash not in (digest, legacy):
        raise IdempotencyConflict()
    return existing.job, False


def _pass_for_new_job() -> None:
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


JOB_COLUMNS = tuple(f.attname for f in Job._meta.concrete_fields)
# What ``locked_jobs()`` reads, by id, with SQL built once (see PreparedRead) for the paths every
# job crosses (the pass binding it, its agent's reports): rows of ``JOB_COLUMNS`` and the
# tenant's name, in id order (the lock order), whatever their state. ``jobs_from_rows`` builds them.
LOCK_JOBS = PreparedRead(
    lambda ids: locked_jobs().filter(pk__in=ids).order_by("pk").values_list(*JOB_COLUMNS, "tenant__name")
)


def jobs_from_rows(rows, columns: tuple[str, ...] = JOB_COLUMNS) -> list[Job]:
    """Jobs from rows of ``columns`` (the rest deferred) followed by their tenant's name (the
    tenant built from it)."""
    jobs = []
    for row in rows:
        job = Job.from_db("default", columns, row[:-1])
        job.tenant = Tenant(id=job.tenant_id, name=row[-1])
        jobs.append(job)
    return jobs


def locked_jobs():
    """Jobs read to be changed: ``FOR UPDATE OF`` the job row only, its tenant read alongside.

    Locking the tenant too (a plain ``select_related`` + ``FOR UPDATE``) serialised every exit
    report and pass of one tenant behind each other; call inside a transaction."""
    return Job.objects.select_for_update(of=("self",)).select_related("tenant")


def do_cancel_job(job_id: int, by: Any = None) -> Job:
    """Cancel: a pending job at once; a bound or running one gets the stop signal (``terminating``,
    its GPUs held until its agent says its process has exited, or never started).

    A bound job (``scheduled``) may already run: its binding was pushed to its agent, whose
    ``started`` report comes later. Its GPUs are freed when the agent's next heartbeat (the stop
    wakes it) shows no process for it, or when that process has exited — never at once.
    Idempotent for cancelled jobs; a succeeded or failed job raises InvalidTransition (409).
    ``by``: who cancels; a cancel by anyone but the job's owner goes to the audit log.
    """
    with transaction.atomic():
        job = locked_jobs().get(pk=job_id)
        if job.state == JobState.CANCELLED or (
            job.state == JobState.TERMINATING and job.stop_reason == "cancelled"
        ):
            return job  # a repeat changes nothing, and is not logged again
        if by is not None and getattr(by, "pk", None) != job.owner_id and job.state not in TERMINAL_STATES:
            audit.record("job.cancel", job, by=by, before={"state": job.state}, note=f"owner {job.owner_id}")
        if job.state == JobState.PENDING:
            do_transition(  # a held job is let go with its end: nothing holds it back any more
                job,
                JobState.CANCELLED,
                EventType.CANCELLED,
                "cancelled by user",
                finished_at=timezone.now(),
                held=False,
            )
            request_pass_on_commit()  # it may have held a reservation or the head of its queue
            return job
        if job.state in (JobState.SCHEDULED, JobState.RUNNING):
            return begin_stop(job, "cancelled")
        if job.state == JobState.TERMINATING:
            job.stop_reason = "cancelled"
            job.save(update_fields=["stop_reason"])
            return job
        check_transition(job.pk, job.state, JobState.CANCELLED)  # raises for finished jobs
        return job


def begin_stop(job: Job, reason: str, now: datetime | None = None) -> Job:
    """Send the stop signal: state ``terminating``; the job keeps its GPUs through its grace."""
    settlement = Settlement()
    settlement.stop(
        job, reason, now or timezone.now(), set(active_allocations_of(job).values_list("node_id", flat=True))
    )
    settlement.write()
    return job


def requeue_unstarted(job: Job, now: datetime) -> None:
    """``job`` (locked, ``scheduled``: bound, never started) cannot start where it is bound (its
    node was lost, or no longer has the GPUs): free them and send it back to the queue
    (``requeued``, ``node-lost``; no retry used, a new attempt)."""
    release_allocations(job, now, list(active_allocations_of(job)))
    do_transition(
        job,
        JobState.PENDING,
        EventType.REQUEUED,
        "node-lost",
        at=now,
        attempts=job.attempts + 1,
        stop_reason="",
    )
    request_pass_on_commit()


def release_allocations(job: Job, at: datetime | None = None, active=None) -> list[dict[str, Any]]:
    """Free a job's GPUs (its process has exited, or its node is fenced). Returns device rows.

    ``active``: the job's unreleased allocations (with node and device) when the caller, holding
    the job's lock, has just read them; read here otherwise."""
    allocs = list(active_allocations_of(job)) if active is None else list(active)
    if not allocs:
        return []
    at = at or timezone.now()
    for a in allocs:
        a.released_at = at
    _WRITE_RELEASED.run(allocs)
    return _publish_freed(allocs)


def _publish_freed(allocs: list[Allocation]) -> list[dict[str, Any]]:
    """Publish the rows of the devices ``allocs`` (just released) held; return them."""
    # The nodes' versions are not bumped: capacity freed since a pass's snapshot never makes its
    # decisions wrong (the pass checks each device's allocations again under the node's lock),
    # and bumping them made a pass drop every binding onto a node where a job had just ended.
    rows = device_rows(_freed_devices(allocs))
    live.publish_devices(rows)
    return rows


def _freed_devices(allocs: list[Allocation]) -> list[Device]:
    """The devices ``allocs`` held, each once, with its node set from the allocation's (the
    allocation's node is its device's: no second read)."""
    devices = {}
    for a in allocs:
        if a.device is not None:
            a.device.node = a.node
            devices[a.device_id] = a.device
    return list(devices.values())


# What a settlement may change of a job: every column any of its transitions writes.
_SETTLED_FIELDS = (
    "state",
    "pending_reason",
    "pending_code",
    "estimated_start",
    *ESTIMATE_FIELDS,
    "exit_code",
    "stop_deadline",
    "finished_at",
    "attempts",
    "node_losses",
    "not_before",
    "stop_reason",
    "started_at",
)
_WRITE_JOBS = RowsUpdate(Job, _SETTLED_FIELDS)
_WRITE_EVENTS = RowsInsert(JobEvent, ("job", "type", "at", "reason", "allocations"))
_WRITE_RELEASED = RowsUpdate(Allocation, ("released_at",))
_WRITE_STATES = RowsUpdate(
    Job, ("state", "pending_reason", "pending_code", "estimated_start", *ESTIMATE_FIELDS)
)
_WRITE_EXITED = RowsUpdate(Allocation, ("exited_at",))


class Settlement:
    """Transitions of locked jobs made in memory, then written together: one UPDATE of the jobs,
    one INSERT of their events and one UPDATE of the allocations freed, whatever their number
    (an agent's exit report settles a batch of jobs this way; a single exit is a batch of one).
    Every transition is checked against the state machine as :func:`do_transition` checks it.
    """

    def __init__(self) -> None:
        self.jobs: dict[int, Job] = {}
        self.events: list[JobEvent] = []
        self.freed: list[Allocation] = []  # each with its released_at set
        self.exited: list[Allocation] = []  # replicas ended while others of their job run
        self.woken: set[int] = set()  # nodes whose agents have stop orders to fetch
        self.ask_pass = False

    def move(
        self, job: Job, target: str, event: str, reason: str = "", at: datetime | None = None, **fields: Any
    ) -> None:
        if not set(fields) <= set(_SETTLED_FIELDS):
            raise ValueError(f"a settlement does not write {sorted(set(fields) - set(_SETTLED_FIELDS))}")
        _moved(job, target, fields)
        self.jobs[job.pk] = job
        self.events.append(JobEvent(job=job, type=event, at=at or timezone.now(), reason=reason[:256]))

    def mark_running(self, job: Job, at: datetime) -> None:
        """:func:`do_mark_running`, in this settlement."""
        if job.state == JobState.SCHEDULED:
            self.move(job, JobState.RUNNING, EventType.STARTED, at=at, started_at=at)

    def stop(self, job: Job, reason: str, at: datetime, node_ids: set[int]) -> None:
        """:func:`begin_stop`, in this settlement (``node_ids``: where the job's replicas run)."""
        self.move(
            job,
            JobState.TERMINATING,
            EventType.TERMINATING,
            reason,
            at=at,
            stop_reason=reason,
            stop_deadline=at + timedelta(seconds=job.grace_seconds),
        )
        self.woken |= node_ids

    def replica_exited(self, allocs: list[Allocation], at: datetime) -> None:
        """A replica's process ended while others of its job still run: it keeps its GPUs."""
        for a in allocs:
            a.exited_at = at
        self.exited.extend(allocs)

    def exit(
        self, job: Job, exit_code: int | None, at: datetime, active: list[Allocation], lost: bool = False
    ) -> None:
        """:func:`do_record_exit`, in this settlement (``active``: the job's unreleased allocations).

        ``lost``: the attempt ended because its node was lost (the agent fenced it, restarted, or
        went silent past its lease), not through any fault of its own: unless it was stopping for
        a reason of its own, it is requeued without using a retry (:meth:`node_lost`)."""
        if job.state in TERMINAL_STATES or job.state == JobState.PENDING:
            return
        self.freed.extend(active)
        for a in active:
            a.released_at = at  # (written with the rest): a repeated report finds it released
        self.ask_pass = True
        stop = job.stop_reason if job.state == JobState.TERMINATING else ""
        common = {"exit_code": exit_code, "stop_deadline": None}
        if stop == "cancelled":
            self.move(
                job,
                JobState.CANCELLED,
                EventType.CANCELLED,
                "cancelled by user",
                at=at,
                finished_at=at,
                **common,
            )
        elif stop.startswith("preempt"):
            self.move(
                job,
                JobState.PENDING,
                EventType.PREEMPTED,
                stop,
                at=at,
                attempts=job.attempts + 1,
                stop_reason="",
                **common,
            )
            # Whether the next attempt resumes depends on the node it gets: its ``scheduled``
            # event says (services/checkpoints.py).
            resume = (
                checkpoints.REQUEUED_WITH_CHECKPOINT
                if job.last_checkpoint_at
                else checkpoints.REQUEUED_WITHOUT
            )
            self.events.append(JobEvent(job=job, type=EventType.REQUEUED, at=at, reason=resume))
        elif stop in AGENT_STOPS:  # its agent stopped it at a limit: it fails, no retry
            self.move(job, JobState.FAILED, EventType.FAILED, stop, at=at, finished_at=at, **common)
        elif lost and not stop.startswith("exit "):
            self.node_lost(job, at, **common)
        elif exit_code == 0:
            self.move(job, JobState.SUCCEEDED, EventType.SUCCEEDED, "", at=at, finished_at=at, **common)
        elif job.max_retries and (used := retries_used(job)) < job.max_retries:  # (no retry: no read)
            why = f"exit {exit_code}" if exit_code is not None else "lost"
            self.move(
                job,
                JobState.PENDING,
                EventType.RETRYING,
                why,
                at=at,
                attempts=job.attempts + 1,
                not_before=at + retry_backoff(used),
                stop_reason="",
                **common,
            )
        else:
            reason = f"exit {exit_code}" if exit_code is not None else "lost"
            self.move(job, JobState.FAILED, EventType.FAILED, reason, at=at, finished_at=at, **common)

    def node_lost(self, job: Job, at: datetime, **fields: Any) -> None:
        """The attempt was lost with its node: back to the queue at once (``requeued``,
        ``node-lost``; no retry used, no backoff), up to ``TESSERA["MAX_NODE_LOSSES"]`` times; the
        next loss fails the job with that reason."""
        if job.node_losses < settings.TESSERA["MAX_NODE_LOSSES"]:
            self.move(
                job,
                JobState.PENDING,
                EventType.REQUEUED,
                "node-lost",
                at=at,
                attempts=job.attempts + 1,
                node_losses=job.node_losses + 1,
                stop_reason="",
                **fields,
            )
        else:
            self.move(job, JobState.FAILED, EventType.FAILED, "node-lost", at=at, finished_at=at, **fields)

    def write(self, read: SettlementReads | None = None, commit: bool = False) -> None:
        """Write it all (inside the caller's transaction); live updates and a pass after commit.

        ``read``: what writing needs to read (the webhooks, the freed devices' holders, whether a
        job is pending), read by the caller before (:func:`settlement_reads`, with its jobs'
        lock): one round trip in all, the deliveries sent with the other writes. Without it
        those are read here. ``commit``: the caller's transaction's COMMIT rides on these writes
        (``bulk.riding_transaction``; ``read`` given, so that nothing is read after it)."""
        if read is None:
            assert not commit, "a settlement that reads cannot carry its transaction's COMMIT"
            write_together(*self._writes())  # one round trip
            webhooks.queue_for_events(self.events)
            if self.freed:
                _publish_freed(self.freed)
            self._publish()
            if self.ask_pass:
                request_pass_on_commit()
            return
        writes = [*self._writes(), webhooks.delivery_write(self.events, read.hooks)]
        if self.freed:
            live.publish_devices(_rows_after_release(self.freed, read))
        self._publish()
        if self.ask_pass:
            made_pending = any(job.state == JobState.PENDING for job in self.jobs.values())
            request_pass_on_commit(pending=read.pending or made_pending)
        # Every read is done: the writes (and the COMMIT, where it rides), one round trip.
        write_together(*writes, COMMIT if commit else None)

    def _writes(self) -> list[Write | None]:
        return [
            _WRITE_JOBS.write(list(self.jobs.values())),
            _WRITE_EVENTS.write(self.events),
            _WRITE_EXITED.write(self.exited),
            _WRITE_RELEASED.write(self.freed),
        ]

    def _publish(self) -> None:
        live.publish_jobs(list(self.jobs.values()))
        for node_id in sorted(self.woken):
            live.wake_agent(node_id)


@dataclass
class SettlementReads:
    """What :meth:`Settlement.write` reads, read before it with its jobs' lock (see
    :func:`settlement_reads`)."""

    hooks: dict[int, list[webhooks.HookRow]]  # the jobs' tenants' webhooks, per tenant id
    # The active holders of every device the jobs' active allocations hold, per device id, each
    # with its allocation's id, as read (before the settlement released any).
    held: dict[int, list[tuple[Holder, int]]]
    pending: bool  # a job was pending when read
    # The jobs' allocations (as read, then changed in memory: those released carry their time).
    allocations: dict[int, list[Allocation]]


def settlement_reads(job_ids: list[int]) -> list[tuple[Any, ...]]:
    """The reads a :class:`Settlement` of (some of) ``job_ids`` needs, for ``read_together`` after
    the reads that lock those jobs; their rows go to :func:`settled_with`."""
    return [(webhooks.HOOKS_OF_JOBS, job_ids), (HOLDERS_OF_JOBS, job_ids), (ANY_PENDING,)]


def settled_with(rows: list[list[Any]], allocations: dict[int, list[Allocation]]) -> SettlementReads:
    """:func:`settlement_reads`'s rows, and the locked jobs' ``allocations`` (all of them: a
    settlement releases some, and a resize may release others before it writes)."""
    hook_rows, holder_rows, pending_rows = rows
    held: dict[int, list[tuple[Holder, int]]] = {}
    for device_id, job_id, tenant_id, tenant, share, replica, alloc_id in holder_rows:
        held.setdefault(device_id, []).append(((job_id, tenant_id, tenant, share, replica), alloc_id))
    return SettlementReads(webhooks.hooks_by_tenant(hook_rows), held, bool(pending_rows), allocations)


def _rows_after_release(freed: list[Allocation], read: SettlementReads) -> list[dict[str, Any]]:
    """The rows of the devices ``freed`` held: their holders as read, less every allocation of
    the read jobs released since (what :func:`_publish_freed` reads after the release)."""
    gone = {a.pk for allocs in read.allocations.values() for a in allocs if a.released_at is not None}
    gone.update(a.pk for a in freed)
    devices = _freed_devices(freed)
    held = {
        d.pk: [holder for holder, alloc_id in read.held.get(d.pk, []) if alloc_id not in gone]
        for d in devices
    }
    return device_rows(devices, held)


def do_record_exit(job: Job, exit_code: int | None, at: datetime | None = None, active=None) -> Job:
    """The job's process ended (all replicas): settle its final or next state and free its GPUs.

    ``job`` must be locked by the caller; ``active``: as for :func:`release_allocations`.
    """
    if job.state in TERMINAL_STATES or job.state == JobState.PENDING:
        return job
    settlement = Settlement()
    settlement.exit(
        job,
        exit_code,
        at or timezone.now(),
        list(active_allocations_of(job)) if active is None else list(active),
    )
    settlement.write()
    return job


def failed_code(stop_reason: str) -> int | None:
    """The exit code in a stop reason ``exit N`` (a replica failed; the others were stopped)."""
    try:
        return int(stop_reason[5:]) if stop_reason.startswith("exit ") else None
    except ValueError:
        return None


def retries_used(job: Job) -> int:
    """Failed attempts that were retried: only failures consume ``max_retries`` (docs/api.md);
    preemptions and requeues of never-started jobs do not (``attempts`` counts those too)."""
    return job.events.filter(type=EventType.RETRYING).count()


def retry_backoff(used: int) -> timedelta:
    """Exponential: ``RETRY_BACKOFF_S`` × 2^retries used, at most an hour."""
    return timedelta(seconds=min(3600.0, settings.TESSERA["RETRY_BACKOFF_S"] * (2 ** min(used, 20))))


def do_mark_running(job: Job, at: datetime | None = None) -> Job:
    """The agent started the job's process (every replica it holds). ``job`` locked by caller."""
    settlement = Settlement()
    settlement.mark_running(job, at or timezone.now())
    settlement.write()
    return job


def holding_jobs():
    return Job.objects.filter(state__in=list(HOLDING_STATES))
