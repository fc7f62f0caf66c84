"""Write paths of the node agent protocol: join tokens, registration, heartbeats and job reports.

Every function here is called by the agent API (``scheduling/api/agents.py``) or the
``create_join_token`` command; job state changes go through ``scheduling.services.jobs``
(``do_mark_running``, ``do_record_exit``, ``begin_stop``) with the job row locked.

Replicas: a job's replicas may lie on several nodes. A replica that exits is marked
(``Allocation.exited_at``) and keeps its GPUs; the job settles (``do_record_exit``, which frees
them all) when its last replica has exited. A
replica that fails while others still run puts the job in ``terminating`` with the reason
``exit N`` (or ``lost``), so the others get stop orders and the job ends failed (or retries; a
``lost`` one is requeued as its node's loss, using no retry).

Attempts: every allocation carries the job's attempt number; reports of another attempt than the
job's current one are stale (:class:`Stale`) and the agent drops them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max
from django.db.models.functions import Length
from django.utils import timezone

from scheduling.choices import HOLDING_STATES, TERMINAL_STATES, EventType, JobState, NodeState
from scheduling.models import (
    Allocation,
    Device,
    Job,
    JobEvent,
    JoinToken,
    LogChunk,
    Node,
    hash_secret,
    new_secret,
)
from scheduling.services import audit, checkpoints, live
from scheduling.services.bulk import riding_transaction
from scheduling.services.inventory import device_rows
from scheduling.services.jobs import (
    AGENT_STOPS,
    LOCK_JOBS,
    Settlement,
    SettlementReads,
    active_allocations_of,
    begin_stop,
    device_index,
    do_mark_running,
    failed_code,
    jobs_from_rows,
    locked_jobs,
    requeue_unstarted,
    settled_with,
    settlement_reads,
)
from scheduling.services.rendezvous import Placed, rendezvous
from scheduling.services.resizes import can_resize, leave_alone, leaves_alone
from scheduling.services.snapshot import DEVICE_FIELDS, PreparedRead, read_together
from scheduling.services.triggers import request_pass_on_commit
from scheduling.services.utilisation import GpuReport, do_record_utilisation, reports_wanted

log = logging.getLogger("tessera.agents")

# The server stops a job this long after its time limit if its agent has not (the agent's own
# timer is the precise one; this is the safety net for an agent that missed it).
TIME_LIMIT_SLACK_S = 5.0
MAX_DB_INT = 2**63 - 1


class NotYours(Exception):
    """The job does not exist or never had a replica on the calling node (answered 404)."""


class Stale(Exception):
    """A report about an attempt or a replica that is no longer bound to the node (answered 409)."""


class NameTaken(Exception):
    """A node tried to re-register under another node's name (answered 403)."""


class JoinRefused(Exception):
    """The join token may not register this node: used up, expired, revoked, or the name is not
    among its patterns (answered 403)."""


class NameInUse(Exception):
    """A join token was presented for a name whose node exists and is active, or not yet past its
    lease and fence margin, or for which the token was not made (answered 409)."""


# --- Join tokens -------------------------------------------------------------------------------


def do_create_join_token(
    name: str = "",
    expires_hours: float | None = None,
    max_nodes: int | None = None,
    names: str = "",
    created_by=None,
) -> tuple[JoinToken, str]:
    """A fresh join token: returns the row (holding only the hash) and the secret, shown once.

    ``max_nodes``: how many registrations it allows (None: any number); ``names``: the node names
    it may register, comma-separated patterns (empty: any new name; see :class:`JoinToken`).
    """
    raw = new_secret()
    expires_at = timezone.now() + timedelta(hours=expires_hours) if expires_hours else None
    with transaction.atomic():
        token = JoinToken.objects.create(
            name=name[:64],
            token_hash=hash_secret(raw),
            expires_at=expires_at,
            max_nodes=max_nodes,
            names=names,
            created_by=created_by,
        )
        after = audit.fields_of(token, ("name", "max_nodes", "names", "expires_at"))
        audit.record("join_token.create", token, by=created_by, after=after)
    return token, raw


def _still_fenced(node: Node, now: datetime) -> bool:
    """The node heartbeated within its lease and fence margin: its jobs may still be running."""
    window = timedelta(seconds=settings.TESSERA["LEASE_S"] + settings.TESSERA["FENCE_MARGIN_S"])
    return node.last_heartbeat is not None and now - node.last_heartbeat < window


def _claim_join_token(token: JoinToken, name: str, node: Node | None, now: datetime) -> None:
    """Check, under the token's row lock, that it may register ``name`` now, and count the use."""
    token = JoinToken.objects.select_for_update().get(pk=token.pk)
    if token.revoked or (token.expires_at is not None and token.expires_at <= now) or token.used_up:
        raise JoinRefused("the join token is revoked, expired or used up")
    if not token.covers(name):
        raise JoinRefused(f"the join token does not cover the name {name!r} (it covers {token.names})")
    if node is not None and _still_fenced(node, now):
        raise NameInUse(
            f"node {name!r} is registered and was active within its lease: only its own credential "
            "re-registers it"
        )
    if node is not None and not token.names_node(name):
        raise NameInUse(
            f"node {name!r} is registered: registering a new machine under its name needs a join token "
            f"made for that name (manage.py create_join_token --names {name}), or its old credential"
        )
    JoinToken.objects.filter(pk=token.pk).update(registrations=F("registrations") + 1)


def _inventory_of(node: Node) -> dict[int, tuple[str, float]]:
    return {d.index: (d.model, float(d.memory_gib)) for d in node.devices.all()}


def _inventory(devices) -> dict[int, tuple[str, float]]:
    return {d["index"]: (d["model"], float(d["memory_gib"])) for d in devices}


def _gpus_grew(node: Node, desc: dict[str, Any]) -> str:
    """What the node now advertises beyond what it had: a GPU index it did not have, another model
    or more memory on one, another NVLink island size ('' if nothing). Fewer GPUs (a failed
    device) are taken as they come."""
    old = _inventory_of(node)
    new = _inventory(desc["devices"])
    changed = [
        i for i, (model, memory) in new.items() if i not in old or old[i][0] != model or memory > old[i][1]
    ]
    if not changed and desc["nvlink_domain"] == node.nvlink_domain:
        return ""
    islands = f"NVLink {node.nvlink_domain} → {desc['nvlink_domain']}"
    return f"its GPUs changed at re-registration ({_summary(old)} → {_summary(new)}, {islands})"


def _summary(inventory: dict[int, tuple[str, float]]) -> str:
    counts: dict[str, int] = {}
    for model, _ in inventory.values():
        counts[model] = counts.get(model, 0) + 1
    return ", ".join(f"{n}×{m}" for m, n in sorted(counts.items())) or "no GPUs"


# --- Registration ------------------------------------------------------------------------------


def do_register_node(
    desc: dict[str, Any], as_node: Node | None = None, join_token: JoinToken | None = None
) -> tuple[Node, str, bool]:
    """Create or update the node and its devices; issue a new credential (the old one stops working).

    ``desc``: validated fields (name, rack, labels, kind, cpus, memory_gib, nvlink_domain,
    metrics_url, devices [{index, uuid, model, memory_gib}]). Exactly one of ``as_node`` (the
    caller authenticated with a node credential: it may only re-register itself, else
    :class:`NameTaken`) and ``join_token`` (a new name within the token's bounds, else
    :class:`JoinRefused`; an existing name only as :func:`_claim_join_token` allows, else
    :class:`NameInUse`). Returns (node, credential, created).

    A node whose GPUs grew or changed at a re-registration, and (with ``TESSERA_APPROVE_NODES``) a
    new node, is registered cordoned with a ``held_reason``: it gets no jobs until an operator
    uncordons it.

    A re-registering node has restarted its agent: the processes of its running replicas are gone,
    so those replicas are settled as lost with the node (the job is requeued without using a
    retry, up to ``TESSERA["MAX_NODE_LOSSES"]``); replicas
    bound but not yet started stay, and the new agent starts them, but for jobs bound to a GPU it
    no longer reports: those are requeued as with a lost node.
    """
    now = timezone.now()
    credential = new_secret()
    with transaction.atomic():
        # Lock order as everywhere else (jobs, then nodes), so a concurrent exit report, which
        # locks its job and then bumps the node's version, cannot deadlock with this.
        previous = Node.objects.filter(name=desc["name"]).first()
        before = {"gpus": _summary(_inventory_of(previous)), "state": previous.state} if previous else None
        gone_bound: list[int] = []
        if previous is not None:
            gone_bound = _bound_to_gone_devices(previous, desc["devices"])
            locking = set(_started_job_ids(previous)) | set(gone_bound)
            list(Job.objects.select_for_update().filter(pk__in=locking).order_by("pk"))
        node = Node.objects.select_for_update().filter(name=desc["name"]).first()
        if as_node is not None and (node is None or node.pk != as_node.pk):
            raise NameTaken(desc["name"])
        if as_node is None:
            if join_token is None:
                raise JoinRefused("no join token")
            _claim_join_token(join_token, desc["name"], node, now)
        created = node is None
        held = ""
        if node is None:
            node = Node(name=desc["name"], state=NodeState.READY)
            if settings.TESSERA["APPROVE_NODES"]:
                held = "a new node: waiting for an operator's approval"
        else:
            held = _gpus_grew(node, desc)
            if node.state == NodeState.NOT_READY:
                node.state = NodeState.READY
        if held:
            node.state, node.held_reason = NodeState.CORDONED, held[:256]
            log.warning("node %s registered cordoned: %s", desc["name"], held)
        for field in (
            "rack",
            "labels",
            "kind",
            "cpus",
            "memory_gib",
            "nvlink_domain",
            "metrics_url",
            "address",
            "checkpoint_root",
        ):
            setattr(node, field, desc[field])
        if desc.get("price_per_gpu_hour") is not None:  # else the price an operator set stays
            node.price_per_gpu_hour = desc["price_per_gpu_hour"]
        node.last_heartbeat = now
        node.credential_hash = hash_secret(credential)
        node.version = (node.version or 0) + 1
        node.save()
        _sync_devices(node, desc["devices"])
        after = {
            "gpus": _summary(_inventory(desc["devices"])),
            "state": node.state,
            "held_reason": node.held_reason,
        }
        audit.record("node.register", node, by=as_node or join_token, before=before, after=after)
        if not created:
            _settle_lost_replicas(node, now)
            for job_id in gone_bound:
                job = locked_jobs().get(pk=job_id)
                if job.state == JobState.SCHEDULED:
                    requeue_unstarted(job, now)  # its binding names a GPU the node no longer has
        live.publish_devices(device_rows(node.devices.select_related("node")))
        request_pass_on_commit()
    log.info("node %s registered (%d devices)", node.name, len(desc["devices"]))
    return node, credential, created


def _bound_to_gone_devices(node: Node, devices: list[dict[str, Any]]) -> list[int]:
    """Jobs bound, not started, to a device of ``node`` its re-registering agent no longer has.

    The new agent cannot start them (their bindings name GPUs it does not have: it would run
    them on no GPU, or on another job's); they go back to the queue as with a lost node."""
    kept = {spec["index"] for spec in devices}
    return sorted(
        set(
            Allocation.objects.filter(
                node=node, released_at__isnull=True, device__isnull=False, job__state=JobState.SCHEDULED
            )
            .exclude(device__index__in=kept)
            .values_list("job_id", flat=True)
        )
    )


def _sync_devices(node: Node, devices: list[dict[str, Any]]) -> None:
    domain = max(1, node.nvlink_domain)
    existing = {d.index: d for d in node.devices.all()}
    for spec in devices:
        device = existing.pop(spec["index"], None) or Device(node=node, index=spec["index"])
        device.uuid, device.model, device.memory_gib = spec["uuid"], spec["model"], spec["memory_gib"]
        device.nvlink_island = spec["index"] // domain
        device.healthy = True
        device.save()
    for gone in existing.values():
        # A device the node no longer reports: drop it, unless history (PROTECT) holds it.
        if gone.allocations.exists():
            Device.objects.filter(pk=gone.pk).update(healthy=False)
        else:
            gone.delete()


def _started_replicas(node: Node) -> set[tuple[int, int]]:
    """(job, replica) pairs on ``node`` whose processes were started (running or stopping)."""
    return set(
        Allocation.objects.filter(
            node=node,
            released_at__isnull=True,
            exited_at__isnull=True,
            job__state__in=[JobState.RUNNING, JobState.TERMINATING],
        ).values_list("job_id", "replica")
    )


def _started_job_ids(node: Node) -> list[int]:
    return sorted({job_id for job_id, _ in _started_replicas(node)})


def _settle_lost_replicas(node: Node, now: datetime) -> None:
    for job_id, replica in sorted(_started_replicas(node)):
        job = locked_jobs().get(pk=job_id)
        if job.state in (JobState.RUNNING, JobState.TERMINATING):
            _settle_alone(job, node.pk, replica, "lost", now)


# --- Heartbeats --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reported:
    """One process the agent says is running."""

    job_id: int
    attempt: int
    replica: int
    pid: int


def checkpoint_jobs(node: Node, job_ids: list[int]) -> list[dict[str, Any]]:
    """Of ``job_ids`` (jobs whose checkpoints the node holds), those that ever had a replica on
    ``node``, each with when it ended (epoch seconds), or null while it can still run again (not
    terminal: it may resume from its checkpoint). A job that never ran there is not answered
    for: a node learns nothing of other nodes' jobs."""
    ids = sorted({i for i in job_ids if 0 < i <= MAX_DB_INT})
    if not ids:
        return []
    rows = (
        Job.objects.filter(pk__in=ids, allocations__node=node)
        .distinct()
        .order_by("pk")
        .values_list("pk", "state", "finished_at")
    )
    return [
        {
            "job_id": pk,
            "ended_at": (finished.timestamp() if finished else 0.0) if state in TERMINAL_STATES else None,
        }
        for pk, state, finished in rows
    ]


def do_heartbeat(
    node: Node,
    running: list[Reported],
    utilisation: list[GpuReport] | None = None,
    checkpoints: list[int] | None = None,
) -> dict[str, Any]:
    """Renew the node's lease; answer with the bindings to start and the processes to stop.

    ``utilisation``: how busy the node's held GPUs are (kept for the adjustment pass where it
    reads the agents' reports: ``scheduling/services/utilisation.py``); the answer's
    ``report_utilisation`` says whether to send it. ``checkpoints``: jobs whose checkpoints the
    node holds past their retention; the answer's ``checkpoints`` says which can still resume
    (:func:`checkpoint_jobs`)."""
    now = timezone.now()
    # A node that was ready renews its lease in one statement; one the sweep marked not ready
    # (health.sweep_nodes) comes back in a transaction that also asks for a pass.
    if not Node.objects.filter(pk=node.pk).exclude(state=NodeState.NOT_READY).update(last_heartbeat=now):
        with transaction.atomic():
            Node.objects.filter(pk=node.pk).update(last_heartbeat=now)
            if Node.objects.filter(pk=node.pk, state=NodeState.NOT_READY).update(state=NodeState.READY):
                request_pass_on_commit()  # capacity came back
                live.publish_nodes(pk=node.pk)
    reported = {(r.job_id, r.attempt, r.replica): r for r in running}
    held = _held_replicas(node)
    if utilisation:
        holders: dict[int, set[int]] = {}
        for rep in held.values():
            for index in rep.gpus:
                holders.setdefault(index, set()).add(rep.job.pk)
        do_record_utilisation(node, utilisation, holders)
    to_start: list[tuple[int, int, HeldReplica]] = []
    whole: dict[int, Job] = {}  # jobs locked on the way: read whole already
    stop: list[dict[str, Any]] = []
    for (job_id, replica), rep in sorted(held.items()):
        job: HeldJob | Job = rep.job
        attempt = rep.attempt
        is_running = (job_id, attempt, replica) in reported
        if rep.leaving_at is not None and job.state in HOLDING_STATES:
            # A shrink removed it: stopped within the job's grace, released once it has exited.
            if is_running:
                deadline = rep.leaving_at + timedelta(seconds=rep.job.grace_seconds)
                stop.append(_stop_order(job_id, attempt, replica, "resize", deadline, now))
                continue
            with transaction.atomic():
                locked = locked_jobs().get(pk=job_id)
                if locked.state in HOLDING_STATES and locked.attempts == attempt:
                    _settle_alone(locked, node.pk, replica, "", now)
            continue
        if (checked := _check_started_and_time_limit(rep.job, attempt, is_running, now)) is not None:
            job = whole[job_id] = checked
        if job.state in (JobState.SCHEDULED, JobState.RUNNING) and not is_running:
            to_start.append((job_id, attempt, rep))
        elif job.state == JobState.TERMINATING and is_running:
            stop.append(_stop_order(job_id, attempt, replica, job.stop_reason, job.stop_deadline, now))
        elif job.state == JobState.TERMINATING:
            # Stopping, and its process is not running here (never started, or gone): settle it.
            with transaction.atomic():
                locked = locked_jobs().get(pk=job_id)
                if locked.state == JobState.TERMINATING and locked.attempts == attempt:
                    _settle_alone(locked, node.pk, replica, "", now)
    for (job_id, attempt, replica), seen in sorted(reported.items()):
        bound = held.get((job_id, replica))
        if bound is None or bound.attempt != attempt:
            # Not (or no longer) bound here: a stale attempt, a cancelled or a lost job. Stop now.
            stop.append(_stop_order(seen.job_id, seen.attempt, seen.replica, "not bound", now, now))
    told = _told_worlds(held, reported)
    starting = sorted({job_id for job_id, _, _ in to_start})
    # One query for the rendezvous of every binding and every world told (none if neither).
    meets = _meetings(sorted({*starting, *(key[0] for key, _ in told)}))
    ends = _log_ends(starting)  # one query for every binding
    jobs = _whole_jobs(starting, whole)
    start = [
        _binding(
            jobs[job_id],
            attempt,
            rep.replica,
            list(rep.gpus),
            rep.share,
            ends.get((job_id, rep.replica), 0),
            meets[job_id].get(rep.replica, {}),
        )
        for job_id, attempt, rep in to_start
        if job_id in jobs
    ]
    worlds = []
    for (job_id, replica), attempt in told:
        meet = meets.get(job_id, {}).get(replica)
        if meet is not None:
            worlds.append({"job_id": job_id, "attempt": attempt, "replica": replica, **meet})
    answer = {
        "node": node.name,
        "lease_seconds": settings.TESSERA["LEASE_S"],
        "report_utilisation": reports_wanted(node.pk),
        "start": start,
        "stop": stop,
        "worlds": worlds,
    }
    if checkpoints:
        answer["checkpoints"] = checkpoint_jobs(node, checkpoints)
    return answer


def _told_worlds(
    held: dict[tuple[int, int], HeldReplica], reported: dict[tuple[int, int, int], Reported]
) -> list[tuple[tuple[int, int], int]]:
    """The replicas running here whose world the answer tells ((job, replica), attempt), in order:
    those of jobs that can change size (docs/agent.md, "Resizes"). Any other job's world is the
    one its replicas started with (their binding's rendezvous), and stays so: it is not read
    again every second."""
    return [
        ((job_id, replica), rep.attempt)
        for (job_id, replica), rep in sorted(held.items())
        if rep.job.resizable and rep.leaving_at is None and (job_id, rep.attempt, replica) in reported
    ]


def _spanning(allocs: list[Allocation]) -> set[int]:
    """The nodes of the jobs among ``allocs`` whose replicas lie on more than one node."""
    nodes: dict[int, set[int]] = {}
    for a in allocs:
        nodes.setdefault(a.job_id, set()).add(a.node_id)
    return {n for ids in nodes.values() if len(ids) > 1 for n in ids}


def _gpu(alloc: Allocation) -> int | None:
    return alloc.device.index if alloc.device is not None else None


def _meetings(job_ids: list[int]) -> dict[int, dict[int, dict[str, Any]]]:
    """Each job's rendezvous, per replica, from all of its held allocations (on every node), in
    one query (none if empty)."""
    if not job_ids:
        return {}
    rows = (
        Allocation.objects.filter(job_id__in=job_ids, released_at__isnull=True, leaving_at__isnull=True)
        .order_by("job_id", "replica", "device__index")
        .values_list(
            "job_id", "replica", "node_id", "node__address", "node__name", "device__index", "share_milli"
        )
    )
    placed: dict[int, list[Placed]] = {job_id: [] for job_id in job_ids}
    for job_id, replica, node_id, address, name, gpu, share in rows:
        placed[job_id].append(Placed(replica, node_id, address or name, gpu, share))
    return {job_id: rendezvous(job_id, rows) for job_id, rows in placed.items()}


@dataclass(frozen=True, slots=True)
class HeldJob:
    """What a heartbeat reads of a held replica's job: its state and limits, not its command,
    environment and the rest (read whole, in one query, only for the replicas it starts)."""

    pk: int
    state: str
    grace_seconds: int
    time_limit_seconds: int | None
    started_at: datetime | None
    stop_reason: str
    stop_deadline: datetime | None
    resizable: bool  # its world can change while it runs (resizes.can_resize)


@dataclass(frozen=True, slots=True)
class HeldReplica:
    """One replica bound to the node, not exited: its job, attempt, GPUs and share of each."""

    job: HeldJob
    replica: int
    attempt: int
    leaving_at: datetime | None
    gpus: tuple[int, ...]  # device indices ((): CPU-only)
    share: float  # of each GPU (1.0 for CPU-only, as a binding says)


_HELD_JOB_COLUMNS = (
    "state",
    "grace_seconds",
    "time_limit_seconds",
    "started_at",
    "stop_reason",
    "stop_deadline",
    "replicas",
    "min_available",
    "elastic_min_gpus",
    "elastic_max_gpus",
)
# A node's replicas that are bound and not exited (one that exited while its job's other replicas
# still run is neither started again nor stopped: it only waits for its job to settle), with the
# columns of their jobs a heartbeat reads, its SQL built once (see PreparedRead).
_HELD = PreparedRead(
    lambda node_ids: (
        Allocation.objects.filter(node_id__in=node_ids, released_at__isnull=True, exited_at__isnull=True)
        .order_by("job_id", "replica", "device__index")
        .values_list(
            "job_id",
            "replica",
            "attempt",
            "leaving_at",
            "share_milli",
            "device__index",
            *(f"job__{f}" for f in _HELD_JOB_COLUMNS),
        )
    )
)


def _held_replicas(node: Node) -> dict[tuple[int, int], HeldReplica]:
    """The node's held replicas by (job, replica), in one query."""
    rows: dict[tuple[int, int], list[Sequence[Any]]] = {}
    for row in _HELD.rows([node.pk]):
        rows.setdefault((row[0], row[1]), []).append(row)
    jobs: dict[int, HeldJob] = {}
    held: dict[tuple[int, int], HeldReplica] = {}
    for (job_id, replica), group in rows.items():
        _, _, attempt, leaving_at, share_milli, index, *job_columns = group[0]
        job = jobs.get(job_id)
        if job is None:
            state, grace, limit, started, stop_reason, deadline, replicas, least, low, high = job_columns
            resizable = can_resize(replicas, least, low, high)
            job = jobs[job_id] = HeldJob(
                job_id, state, grace, limit, started, stop_reason, deadline, resizable
            )
        gpus = tuple(row[5] for row in group if row[5] is not None)
        held[(job_id, replica)] = HeldReplica(
            job, replica, attempt, leaving_at, gpus, _share(share_milli, index is not None)
        )
    return held


def _share(share_milli: int, on_gpu: bool) -> float:
    """What a binding says of a replica's share of each GPU (1.0 for a CPU-only replica)."""
    return share_milli / 1000 if on_gpu else 1.0


def _whole_jobs(job_ids: list[int], whole: dict[int, Job]) -> dict[int, Job]:
    """``job_ids`` read whole (what a binding says), in one query for those not in ``whole``."""
    missing = [i for i in job_ids if i not in whole]
    read = {job.pk: job for job in Job.objects.filter(pk__in=missing)} if missing else {}
    return {i: whole[i] if i in whole else read[i] for i in job_ids if i in whole or i in read}


def _check_started_and_time_limit(job: HeldJob, attempt: int, is_running: bool, now: datetime) -> Job | None:
    """Catch up a lost ``started`` report; stop a job its agent let run past its time limit.
    Returns the job, locked and read again, when it did either (None: nothing to do)."""
    late = (
        job.state == JobState.RUNNING
        and job.time_limit_seconds
        and job.started_at is not None
        and now > job.started_at + timedelta(seconds=job.time_limit_seconds + TIME_LIMIT_SLACK_S)
    )
    if not (late or (is_running and job.state == JobState.SCHEDULED)):
        return None
    with transaction.atomic():
        locked = locked_jobs().get(pk=job.pk)
        if locked.attempts != attempt:
            return locked
        if is_running and locked.state == JobState.SCHEDULED:
            do_mark_running(locked, now)
        elif late and locked.state == JobState.RUNNING:
            begin_stop(locked, "time-limit", now)
        return locked


def _binding(
    job: Job,
    attempt: int,
    replica: int,
    gpus: list[int],
    share: float,
    log_offset: int,
    meet: dict[str, Any],
) -> dict[str, Any]:
    """What the agent needs to start one replica (docs/agent.md, "binding"): ``gpus``, the device
    indices it holds ([] for CPU-only), ``share`` of each; ``meet``: its rendezvous
    (:mod:`scheduling.services.rendezvous`)."""
    return {
        "job_id": job.pk,
        "attempt": attempt,
        "replica": replica,
        "replicas": job.replicas,
        "name": job.name,
        "command": list(job.command),
        "env": dict(job.env or {}),
        "gpus": gpus,
        "share": share,
        "grace_seconds": job.grace_seconds,
        "time_limit_seconds": job.time_limit_seconds,
        "checkpoint_seconds": job.checkpoint_seconds,
        # The job's CPUs and memory are for all its replicas, spread evenly (docs/api.md).
        "cpus": job.cpus / max(1, job.replicas),
        "memory_gib": job.memory_gib / max(1, job.replicas),
        # Offsets continue across attempts, so a retry's output follows the first's.
        "log_offset": log_offset,
        # Whether an earlier attempt checkpointed: an agent without its checkpoint says so.
        "last_checkpoint_at": job.last_checkpoint_at.timestamp() if job.last_checkpoint_at else None,
        "rendezvous": meet,
        # Whether its world can change while it runs: only then does the agent keep a world file.
        "resizable": can_resize(job.replicas, job.min_available, job.elastic_min_gpus, job.elastic_max_gpus),
    }


def bindings_by_node(jobs: list[Job], allocs: list[Allocation]) -> dict[int, list[dict[str, Any]]]:
    """The bindings a pass just made (``allocs``: their rows, node and device set), per node id:
    what the wake carries to each agent. Three queries at most, whatever their number (the third
    only for jobs across nodes: their master nodes' addresses)."""
    by_job = {j.pk: j for j in jobs}
    grouped: dict[tuple[int, int, int], list[Allocation]] = {}
    for a in sorted(allocs, key=lambda a: (a.job_id, a.replica, device_index(a))):
        grouped.setdefault((a.node_id, a.job_id, a.replica), []).append(a)
    # Only a job across nodes needs its master node's address: read then, in one query.
    spans = _spanning(allocs)
    addresses = dict(Node.objects.filter(pk__in=spans).values_list("pk", "address")) if spans else {}
    placed: dict[int, list[Placed]] = {}
    for a in allocs:
        where = addresses.get(a.node_id) or a.node.name
        placed.setdefault(a.job_id, []).append(Placed(a.replica, a.node_id, where, _gpu(a), a.share_milli))
    meets = {job_id: rendezvous(job_id, rows) for job_id, rows in placed.items()}
    # A first attempt has no output yet; a retry's continues where the last one stopped.
    ends = _log_ends([j.pk for j in jobs if j.attempts > 0])
    out: dict[int, list[dict[str, Any]]] = {}
    for (node_id, job_id, replica), rows in grouped.items():
        job = by_job[job_id]
        gpus = [a.device.index for a in rows if a.device is not None]
        share = _share(rows[0].share_milli, rows[0].device is not None)
        out.setdefault(node_id, []).append(
            _binding(
                job,
                rows[0].attempt,
                replica,
                gpus,
                share,
                ends.get((job_id, replica), 0),
                meets[job_id][replica],
            )
        )
    return out


def _log_ends(job_ids: list[int]) -> dict[tuple[int, int], int]:
    """Where each (job, replica)'s stored output ends, for ``job_ids``, in one query (none if empty);
    a replica with no output is absent (its output starts at 0)."""
    if not job_ids:
        return {}
    rows = (
        LogChunk.objects.filter(job_id__in=job_ids)
        .values_list("job_id", "replica")
        .annotate(end=Max(F("offset") + Length("data")))
        .order_by()
    )
    return {(job_id, replica): end for job_id, replica, end in rows}


def _stop_order(
    job_id: int, attempt: int, replica: int, reason: str, deadline: datetime | None, now: datetime
) -> dict[str, Any]:
    deadline = deadline or now
    return {
        "job_id": job_id,
        "attempt": attempt,
        "replica": replica,
        "reason": reason,
        "deadline": deadline.isoformat(),
        # Relative too, so an agent whose clock is off still keeps the grace period.
        "grace_left_seconds": max(0.0, (deadline - now).total_seconds()),
    }


# --- Job reports -------------------------------------------------------------------------------

_ALLOC_COLUMNS = (
    "id",
    "job_id",
    "node_id",
    "device_id",
    "replica",
    "share_milli",
    "attempt",
    "created_at",
    "released_at",
    "exited_at",
    "leaving_at",
    "joining",
)
# Every allocation a report's jobs ever had, with the node's name and the device (what settling
# needs: ownership, bound replicas, device rows), its SQL built once (see PreparedRead).
_JOB_ALLOCATIONS = PreparedRead(
    lambda ids: (
        Allocation.objects.filter(job_id__in=ids)
        .order_by("job_id", "replica", "id")
        .values_list(*_ALLOC_COLUMNS, "node__name", *(f"device__{f}" for f in DEVICE_FIELDS))
    )
)


@dataclass
class Owned:
    """The jobs of a report that ever had a replica on the node (locked), and their allocations."""

    jobs: dict[int, Job]
    allocations: dict[int, list[Allocation]]
    # What a settlement of these jobs reads to write (``settling``), read with them.
    settling: SettlementReads | None = None


def _owned(node: Node, job_ids: list[int], settling: bool = False, begin: bool = False) -> Owned:
    """Lock ``job_ids`` (in id order, as everywhere) and read their allocations: one round trip.

    ``settling``: and what a :class:`Settlement` of them reads to write, in the same round trip.
    ``begin``: the transaction's BEGIN rides on it (``bulk.riding_transaction``)."""
    ids = sorted({i for i in job_ids if 0 < i <= MAX_DB_INT})
    job_rows, alloc_rows, *more = read_together(
        (LOCK_JOBS, ids), (_JOB_ALLOCATIONS, ids), *(settlement_reads(ids) if settling else ()), begin=begin
    )
    jobs = {job.pk: job for job in jobs_from_rows(job_rows)}
    allocations: dict[int, list[Allocation]] = {}
    nodes: dict[int, Node] = {}
    width = len(_ALLOC_COLUMNS)
    for row in alloc_rows:
        fields = dict(zip(_ALLOC_COLUMNS, row[:width], strict=True))
        if fields["job_id"] not in jobs:
            continue
        where = nodes.setdefault(fields["node_id"], Node(id=fields["node_id"], name=row[width]))
        device = None
        if fields["device_id"] is not None:
            device = Device(node=where, **dict(zip(DEVICE_FIELDS, row[width + 1 :], strict=True)))
        alloc = Allocation(**fields)
        alloc.node, alloc.device = where, device
        allocations.setdefault(alloc.job_id, []).append(alloc)
    mine = {job_id for job_id, allocs in allocations.items() if any(a.node_id == node.pk for a in allocs)}
    reads = settled_with(more, allocations) if settling else None
    return Owned({i: j for i, j in jobs.items() if i in mine}, allocations, reads)


def _owned_job(node: Node, job_id: int) -> tuple[Job, list[Allocation]]:
    """The job, locked, if it ever had a replica on ``node`` (else :class:`NotYours`), and its
    allocations."""
    owned = _owned(node, [job_id])
    if job_id not in owned.jobs:
        raise NotYours(job_id)
    return owned.jobs[job_id], owned.allocations[job_id]


def _clamped(seen: float | None, job: Job, allocs: list[Allocation], now: datetime) -> datetime:
    """The agent's process start (``seen``, epoch seconds, its clock), kept between the job's
    binding and now, so that a skewed agent clock cannot reorder its history. The binding's time
    is its allocations' ``created_at`` (the pass writes them after stamping the ``scheduled``
    event: never before it), so no event is read."""
    if seen is None:
        return now
    at = datetime.fromtimestamp(seen, tz=UTC)
    bound = [a.created_at for a in allocs if a.attempt == job.attempts and a.created_at is not None]
    return min(now, max([at, *bound]))


def _bound_here(allocs: list[Allocation], node_id: int, replica: int, attempt: int) -> bool:
    """``replica`` of ``attempt`` runs on the node: an allocation neither released nor exited."""
    return any(
        _is_replica(a, node_id, replica) and a.attempt == attempt and a.released_at is None for a in allocs
    )


def do_report_started(
    node: Node, job_id: int, attempt: int, replica: int, started_at: float | None = None
) -> Job:
    """The agent started a replica's process. Stale if that replica is no longer bound here.

    ``started_at`` (epoch seconds, the agent's clock) becomes the job's start time, clamped
    between its ``scheduled`` event and now, so a skewed agent clock cannot reorder its history.
    """
    now = timezone.now()
    with transaction.atomic():
        job, allocs = _owned_job(node, job_id)
        bound = attempt == job.attempts and _bound_here(allocs, node.pk, replica, attempt)
        if not bound or job.state not in HOLDING_STATES:
            raise Stale(f"job {job_id} attempt {attempt} replica {replica} is not bound to {node.name}")
        if job.state == JobState.SCHEDULED:
            settlement = Settlement()
            settlement.mark_running(job, _clamped(started_at, job, allocs, now))
            settlement.write()
        joined = [
            a.pk for a in allocs if a.joining and a.released_at is None and _is_replica(a, node.pk, replica)
        ]
        if joined:  # a replica a grow added has joined: a loss of its node now loses the job
            Allocation.objects.filter(pk__in=joined).update(joining=False)
        return job


# A ``checkpointed`` event at most this often per job (each agent also reports at most once a
# minute per replica; a gang's replicas on several nodes would otherwise each add one).
CHECKPOINT_EVENT_EVERY_S = 55.0


def do_report_checkpoint(
    node: Node, job_id: int, attempt: int, at: float | None = None, line: str = "", replica: int | None = None
) -> Job:
    """The job saved a checkpoint (``at``: epoch seconds, the agent's clock, kept between its
    binding and now; ``line``: what the job wrote to its marker). The engine counts the work since
    its last checkpoint as what a preemption would lose, and reclaims a borrower only within
    ``reclaim_checkpoint_window_s`` of one. Records a ``checkpointed`` event (at most one per
    :data:`CHECKPOINT_EVENT_EVERY_S`, but always the first of an attempt and one made while the
    job is stopping: the "checkpoint now" before a preemption), and where the checkpoint is
    (``Job.checkpoint_place``: this node and its checkpoint root, services/checkpoints.py); an
    older report than the last one recorded changes nothing but that place (another replica's).
    Stale if that attempt (``replica``: that replica) no longer runs here."""
    now = timezone.now()
    with transaction.atomic():
        job, allocs = _owned_job(node, job_id)
        held = [
            a
            for a in allocs
            if a.released_at is None
            and a.attempt == attempt
            and a.node_id == node.pk
            and (replica is None or a.replica == replica)
        ]
        if attempt != job.attempts or job.state not in HOLDING_STATES or not held:
            raise Stale(f"job {job_id} attempt {attempt} does not run on {node.name}")
        when = _clamped(at, job, held, now)
        last = job.last_checkpoint_at
        older = last is not None and when <= last
        # Where it is: the next binding's event says whether that attempt's nodes can reach it.
        before, root = job.checkpoint_place, node.checkpoint_root
        place = checkpoints.recorded(before, attempt, node.name, root, None if older else line[:256])
        if older:  # another replica's (a gang's, on its own node): that node holds one too
            if place != before:
                Job.objects.filter(pk=job.pk).update(checkpoint_place=place)
                job.checkpoint_place = place
            return job
        Job.objects.filter(pk=job.pk).update(last_checkpoint_at=when, checkpoint_place=place)
        if (
            last is None
            or (when - last).total_seconds() >= CHECKPOINT_EVENT_EVERY_S
            or job.state == JobState.TERMINATING  # the checkpoint a stop asked for: always shown
            or _first_of_attempt(job)
        ):
            JobEvent.objects.create(job=job, type=EventType.CHECKPOINTED, at=when, reason=line[:256])
        job.last_checkpoint_at, job.checkpoint_place = when, place
    return job


def _first_of_attempt(job: Job) -> bool:
    """No ``checkpointed`` event since the job's current attempt was bound."""
    bound = job.events.filter(type=EventType.SCHEDULED).order_by("-at").values_list("at", flat=True).first()
    return not job.events.filter(type=EventType.CHECKPOINTED, at__gte=bound or job.submitted_at).exists()


@dataclass(frozen=True)
class ExitReport:
    """One replica's process ended (``started_at``: set when no ``started`` report was sent)."""

    job_id: int
    attempt: int
    replica: int
    exit_code: int | None
    reason: str = ""
    started_at: float | None = None


def do_report_exit(
    node: Node,
    job_id: int,
    attempt: int,
    replica: int,
    exit_code: int | None,
    reason: str = "",
    started_at: float | None = None,
) -> tuple[Job, bool]:
    """A replica's process ended. Returns (job, recorded); a repeated report is not recorded again.

    ``started_at``: the process's start (epoch seconds), sent when no ``started`` report was (a
    process that ended at once): the job is marked running at that time first.
    """
    (result,) = do_report_exits(node, [ExitReport(job_id, attempt, replica, exit_code, reason, started_at)])
    if isinstance(result, Exception):
        raise result
    return result


def do_report_exits(node: Node, reports: list[ExitReport]) -> list[tuple[Job, bool] | NotYours | Stale]:
    """Several exit reports of one node, settled in one transaction and a fixed handful of queries
    (the jobs locked in one, their allocations read in one, every change written by one
    :class:`Settlement`). Each report is answered on its own, in order: (job, recorded), or the
    :class:`NotYours` or :class:`Stale` it would raise alone.

    Two round trips where the transaction's BEGIN and COMMIT ride (``bulk.riding_transaction``):
    the jobs locked with everything the settlement reads, then its writes with the COMMIT."""
    now = timezone.now()
    with riding_transaction() as rides:
        owned = _owned(node, [r.job_id for r in reports], settling=True, begin=rides)
        settlement = Settlement()
        results: list[tuple[Job, bool] | NotYours | Stale] = []
        for report in reports:
            try:
                results.append(_exit_one(node, owned, settlement, report, now))
            except (NotYours, Stale) as exc:
                results.append(exc)
        settlement.write(owned.settling, commit=rides)
    return results


def _exit_one(
    node: Node, owned: Owned, settlement: Settlement, r: ExitReport, now: datetime
) -> tuple[Job, bool]:
    job = owned.jobs.get(r.job_id)
    if job is None:
        raise NotYours(r.job_id)
    allocs = owned.allocations[job.pk]
    # The job's unreleased allocations: whether this replica is bound here, whether others still
    # run, and what to free if it was the last.
    held = [a for a in allocs if a.released_at is None] if r.attempt == job.attempts else []
    if _bound_here(held, node.pk, r.replica, r.attempt):
        if r.started_at is not None and job.state == JobState.SCHEDULED:
            settlement.mark_running(job, _clamped(r.started_at, job, held, now))
        _settle_replica(settlement, job, node.pk, r.replica, r.exit_code, r.reason, now, held)
        return job, True
    if any(
        a.node_id == node.pk
        and a.replica == r.replica
        and a.attempt == r.attempt
        and (a.released_at is not None or a.exited_at is not None)
        for a in allocs
    ):
        return job, False  # a retried report: the first one counted
    raise Stale(f"job {r.job_id} attempt {r.attempt} replica {r.replica} is not bound to {node.name}")


def _is_replica(alloc: Allocation, node_id: int, replica: int) -> bool:
    """``alloc`` is a still-running allocation of ``replica`` on the node."""
    return alloc.exited_at is None and alloc.node_id == node_id and alloc.replica == replica


def _settle_alone(job: Job, node_id: int, replica: int, reason: str, now: datetime) -> None:
    """:func:`_settle_replica` for one replica whose process is gone without an exit code."""
    settlement = Settlement()
    _settle_replica(settlement, job, node_id, replica, None, reason, now, list(active_allocations_of(job)))
    settlement.write()


def _settle_replica(
    settlement: Settlement,
    job: Job,
    node_id: int,
    replica: int,
    exit_code: int | None,
    reason: str,
    now: datetime,
    held: list[Allocation],
) -> None:
    """One replica's process is gone (``job`` locked): free its GPUs; settle the job if it was the last.

    ``reason``: ``time-limit`` or ``disk-limit`` when the agent stopped it at that limit;
    ``lost`` when its process vanished with the agent; empty otherwise. ``held``: the job's
    unreleased allocations. The changes go into ``settlement``, which the caller writes.
    """
    settlement.mark_running(job, now)  # its ``started`` report was lost; keep the history in order
    this = [a for a in held if (a.node_id, a.replica) == (node_id, replica)]
    if leaves_alone(this, held, reason, exit_code):
        # A replica a shrink removed, or one a grow added lost before it started: the job goes on.
        leave_alone(job, this, held, now, lost=reason == "lost")
        return
    others = any(a.exited_at is None for a in held if a not in this)
    if this and not others and all(a.leaving_at is not None for a in this) and job.state == JobState.RUNNING:
        exit_code, reason = 0, ""  # its last replica, stopped by a shrink: the others ended well
    if job.state == JobState.RUNNING:
        where = {a.node_id for a in held}
        if reason in AGENT_STOPS:
            settlement.stop(job, reason, now, where)
        elif others and (exit_code != 0 or reason == "lost"):
            settlement.stop(job, "lost" if exit_code is None else f"exit {exit_code}", now, where)
    if others:
        # Its GPUs stay held until the job settles: all of a job's GPUs are freed together, so
        # the history (export_trace) is exact and a gang's place is not taken piecemeal.
        settlement.replica_exited(this, now)
        return
    code = None if reason == "lost" else exit_code  # killed by its agent's fencing: not its own code
    lost = reason == "lost"
    if job.state == JobState.TERMINATING and job.stop_reason.startswith("exit "):
        code = failed_code(job.stop_reason)
    elif job.state == JobState.TERMINATING and job.stop_reason == "lost":
        code, lost = None, True
    # Stamped now, not at ``now``: a ``terminating`` event just recorded must stay before it.
    settlement.exit(job, code, timezone.now(), held, lost=lost)


# --- Logs --------------------------------------------------------------------------------------


CAP_NOTE = "[tessera] output past the job's log cap of {cap} bytes dropped"


def _cap_note(cap: int, kept: bytes, last: bytes) -> bytes:
    """The line that marks where a replica's output was cut at the cap (on a line of its own,
    after ``kept``, the output it follows); b"" when ``last`` (its last chunk) is that line."""
    line = CAP_NOTE.format(cap=cap).encode()
    if last.lstrip(b"\n").startswith(line):
        return b""
    return (b"\n" if kept and not kept.endswith(b"\n") else b"") + line + b"\n"


def _log_last(job_id: int, replica: int) -> tuple[int, bytes]:
    """Where the replica's stored output ends, and its last chunk's bytes (b"": none yet)."""
    last = LogChunk.objects.filter(job_id=job_id, replica=replica).order_by("-offset").first()
    if last is None:
        return 0, b""
    data = bytes(last.data)
    return last.offset + len(data), data


def do_append_log(
    node: Node, job_id: int, attempt: int, replica: int, offset: int, data: bytes
) -> dict[str, Any]:
    """Store a chunk of a replica's output at byte ``offset``.

    Idempotent on (job, replica, offset): a chunk already stored (a retry) is skipped, an
    overlapping one keeps only its new tail. Output past the job's cap
    (``TESSERA["LOG_CAP_BYTES"]``) is dropped and the job marked ``log_truncated``; where a
    replica's output is first cut, a line saying so (:data:`CAP_NOTE`) is stored after what was
    kept, so every reader of the log sees the cut (not counted in ``log_bytes``).
    """
    cap = settings.TESSERA["LOG_CAP_BYTES"]
    with transaction.atomic():
        job, _ = _owned_job(node, job_id)
        if attempt != job.attempts:
            raise Stale(f"job {job_id} is at attempt {job.attempts}, not {attempt}")
        end, last = _log_last(job.pk, replica)
        if offset + len(data) <= end:
            return {"stored": 0, "next_offset": end, "truncated": job.log_truncated}
        if offset < end:
            data, offset = data[end - offset :], end
        room = max(0, cap - job.log_bytes)
        note = b""
        if len(data) > room:
            data = data[:room]
            job.log_truncated = True
            note = _cap_note(cap, data or last, last)
        if data:
            LogChunk.objects.create(job=job, replica=replica, offset=offset, data=data)
            Job.objects.filter(pk=job.pk).update(log_bytes=F("log_bytes") + len(data))
        if note:
            LogChunk.objects.create(job=job, replica=replica, offset=offset + len(data), data=note)
        if data or note:
            live.publish_log(job.pk)
        if job.log_truncated:
            Job.objects.filter(pk=job.pk).update(log_truncated=True)
        return {"stored": len(data), "next_offset": offset + len(data), "truncated": job.log_truncated}
