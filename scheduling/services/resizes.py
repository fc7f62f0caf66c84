"""Live resizes: replicas added to a running job (grow) and removed from it (shrink).

The pass applies the engine's resizes (:func:`apply_resizes`); the adjustment loop asks for a
shrink of its own (:func:`request_shrink`). The agent protocol is the one bindings and stops
already use, per replica (docs/agent.md):

- **grow**: new allocations of the job's current attempt (``joining`` until the agent reports
  the replica started); the agent's next heartbeat — the pass wakes it — lists them under
  ``start``, with the new world in their rendezvous. A joining replica that exits non-zero is
  a failed replica (the job stops with ``exit N``, as for any replica); one whose node is lost
  before it started is released alone and the job falls back to the size it had.
- **shrink**: the removed replicas' allocations get ``leaving_at``; the agent gets stop orders
  for them (reason ``resize``, the job's grace period) and reports their exits; their GPUs stay
  held until then (invariant 8), or until their node is fenced. Each is then released alone,
  and when the last has gone the job records ``resized`` and a pass is asked for (it places
  the job the shrink made room for). The engine neither shrinks nor grows a job again while a
  shrink of it is under way.

Running replicas are told the new world in place, not restarted: every heartbeat answer carries
the current world of each job that can change size (``worlds``; :func:`can_resize`), which the
agent writes to the job's ``TESSERA_WORLD_FILE``. Ranks stay put (a shrink removes the highest
replicas, a grow appends), so no work is lost to a resize (``resized`` events say
``lost_work_s: 0``), as the simulator counts it.

A running job below its full size says why in ``Job.size_reason``.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import QuerySet, Sum
from django.utils import timezone

from scheduling.choices import EventType, JobState
from scheduling.engine.geometry import geometry
from scheduling.engine.types import Resize
from scheduling.models import Allocation, Device, Job, Node
from scheduling.services import live
from scheduling.services.bulk import RowsUpdate, Write
from scheduling.services.inventory import device_rows
from scheduling.services.jobs import (
    active_allocations_of,
    allocations_payload,
    locked_jobs,
    record_event,
    release_allocations,
)
from scheduling.services.snapshot import LoadedSnapshot, PreparedRead, job_request
from scheduling.services.triggers import request_pass_on_commit

log = logging.getLogger("tessera.resizes")


class CannotShrink(Exception):
    """The job cannot be shrunk to that size now (the message says why)."""


def full_replicas(job: Job) -> int:
    """How many replicas the job runs at its full size (an elastic job: at its maximum)."""
    if job.elastic_max_gpus is None:  # all its replicas, as geometry counts them (no request built)
        return max(1, job.replicas)
    return geometry(job_request(job)).replicas


def can_resize(
    replicas: int, min_available: int | None, elastic_min_gpus: int | None, elastic_max_gpus: int | None
) -> bool:
    """Can a running job of this shape change size (its world: docs/agent.md, "Resizes")? An
    elastic job is shrunk and grown; a gang that may start with ``min_available`` of its
    ``replicas`` grows to them (the engine's ``geometry``: fewer needed than its most). Any other
    job runs with the replicas it started with, all placed at once, until it ends: no resize
    adds or removes one (``apply_resizes``, ``request_shrink``)."""
    elastic = elastic_min_gpus is not None or elastic_max_gpus is not None
    return elastic or (min_available or replicas) < replicas


def _per_replica(job: Job) -> float:
    return job.gpus / max(1, job.replicas)


def _gpus(job: Job, replicas: int) -> float:
    return round(replicas * _per_replica(job), 3)


def size_reason(job: Job, replicas: int, why: str) -> str:
    """``Job.size_reason`` for ``job`` running ``replicas`` replicas ('' at its full size)."""
    full = full_replicas(job)
    if replicas >= full:
        return ""
    if job.elastic_max_gpus is not None:
        text = f"elastic: {_gpus(job, replicas):g} of at most {job.elastic_max_gpus:g} GPUs: {why}"
    else:
        text = f"{replicas} of {full} replicas placed: {why}"
    return text[:256]


def bound_sizes(jobs: list[Job], allocs: list[Allocation]) -> Write | None:
    """As a pass binds ``jobs``: those started below their full size say so (the write, for the
    pass to send with its own; None if no job's size reason changed)."""
    placed: dict[int, set[int]] = {}
    for a in allocs:
        placed.setdefault(a.job_id, set()).add(a.replica)
    changed = []
    for job in jobs:
        why = size_reason(job, len(placed.get(job.pk, ())), "the rest join as capacity frees")
        if why != job.size_reason:
            job.size_reason = why
            changed.append(job)
    return _WRITE_SIZE_REASONS.write(changed)


_WRITE_SIZE_REASONS = RowsUpdate(Job, ("size_reason",))


def _growable() -> QuerySet:
    below = Job.objects.filter(state=JobState.RUNNING).exclude(size_reason="")
    leaving = Allocation.objects.filter(released_at__isnull=True, leaving_at__isnull=False)
    return below.exclude(pk__in=leaving.values("job_id")).order_by().values_list("id")[:1]


# A running job below its full size with no shrink under way (a pass may grow it): one id, or
# none. Read by every pass with the queue, in one round trip (``passes._one_pass``).
GROWABLE = PreparedRead(_growable)


def _replicas(allocs: list[Allocation]) -> set[int]:
    return {a.replica for a in allocs}


def _details(job: Job, before: int, after: int, why: str, **more: Any) -> dict[str, Any]:
    return {
        "from_replicas": before,
        "to_replicas": after,
        "from_gpus": _gpus(job, before),
        "to_gpus": _gpus(job, after),
        "reason": why,
        # The running replicas are told the new world in place (docs/agent.md): no restart.
        "world": "in-place",
        "lost_work_s": 0,
        **more,
    }


def apply_resizes(
    loaded: LoadedSnapshot, resizes: list[Resize], bound: dict[str, set[int]], now: datetime
) -> list[str]:
    """Apply a pass's resizes, each in its own transaction; returns the ids of the jobs resized.
    ``bound``: the replicas of the jobs this pass bound (a job may start and grow in one pass).

    A resize is dropped (the next pass decides again) if the job is no longer running at the
    size the snapshot read, a shrink of it is under way, or a node it grows onto changed since."""
    final: dict[str, Resize] = {}
    for r in resizes:
        final[r.job_id] = r  # several resizes of one job in one pass: the last is its new set
    held_then = {run.job.id: _replicas_of(run.placements) for run in loaded.snapshot.running}
    held_then.update(bound)
    done = []
    for job_id, r in final.items():
        state = JobState.SCHEDULED if job_id in bound else JobState.RUNNING
        with transaction.atomic():
            job = locked_jobs().filter(pk=int(job_id), state=state).first()
            if job is None:
                continue
            active = list(active_allocations_of(job))
            if any(a.leaving_at is not None for a in active):
                continue
            current = [a for a in active if a.exited_at is None]
            have = _replicas(current)
            if have != held_then.get(job_id) or len(have) != len(_replicas(active)):
                log.info("dropping stale resize of job %s", job_id)
                continue
            want = {p.replica for p in r.placements}
            gone, added = have - want, want - have
            if gone and not added:
                _shrink(job, [a for a in current if a.replica in gone], len(have), r.reason, now)
            elif added and not gone:
                if not _grow(loaded, job, r, added, len(have), now):
                    continue
            else:
                continue
            done.append(job_id)
    return done


def _replicas_of(placements) -> set[int]:
    return {p.replica for p in placements}


def _shrink(job: Job, leaving: list[Allocation], before: int, why: str, now: datetime) -> None:
    """Mark ``leaving`` (the job locked): their agents stop them; their GPUs stay held."""
    Allocation.objects.filter(pk__in=[a.pk for a in leaving]).update(leaving_at=now)
    after = before - len(_replicas(leaving))
    job.size_reason = size_reason(job, after, why or "shrunk")
    Job.objects.filter(pk=job.pk).update(size_reason=job.size_reason)
    live.publish_jobs([job])
    for node_id in sorted({a.node_id for a in leaving}):
        live.wake_agent(node_id)


def _grow(loaded: LoadedSnapshot, job: Job, r: Resize, added: set[int], before: int, now: datetime) -> bool:
    """Add the replicas ``added`` of ``r`` (the job locked), if their nodes did not change since
    the snapshot and their devices have room (checked again under the nodes' locks)."""
    new = [p for p in r.placements if p.replica in added]
    names = sorted({p.node for p in new})
    nodes = {n.name: n for n in Node.objects.select_for_update().filter(name__in=names).order_by("pk")}
    if any(
        nodes.get(name) is None or nodes[name].version != loaded.node_versions.get(name) for name in names
    ):
        log.info("dropping stale grow of job %s", job.pk)
        return False
    devices = {
        (d.node.name, d.index): d
        for d in Device.objects.filter(node__name__in=names).select_related("node")
        if any(p.node == d.node.name and d.index in p.gpus for p in new)
    }
    used = dict(
        Allocation.objects.filter(device__in=list(devices.values()), released_at__isnull=True)
        .values_list("device_id")
        .annotate(total=Sum("share_milli"))
        .order_by()
    )
    rows = []
    for p in new:
        share = round(p.share * 1000) if p.gpus else 0
        if not p.gpus:
            rows.append(
                Allocation(job=job, node=nodes[p.node], device=None, replica=p.replica, share_milli=0)
            )
        for index in p.gpus:
            device = devices.get((p.node, index))
            if device is None or not device.healthy or used.get(device.pk, 0) + share > 1000:
                log.error("refusing grow of job %s: device %s/%s over-committed", job.pk, p.node, index)
                return False
            used[device.pk] = used.get(device.pk, 0) + share
            rows.append(
                Allocation(job=job, node=nodes[p.node], device=device, replica=p.replica, share_milli=share)
            )
    for a in rows:
        a.attempt, a.joining = job.attempts, True
    Allocation.objects.bulk_create(rows)
    for node in nodes.values():
        node.version += 1
        node.save(update_fields=["version"])
        loaded.node_versions[node.name] = node.version
    after = before + len(added)
    job.size_reason = size_reason(job, after, "grows as capacity frees")
    Job.objects.filter(pk=job.pk).update(size_reason=job.size_reason)
    current = list(active_allocations_of(job))
    record_event(
        job,
        EventType.RESIZED,
        f"grown from {before} to {after} replicas",
        allocations_payload(current),
        at=max(now, timezone.now()),
        details=_details(job, before, after, r.reason or "grown"),
    )
    live.publish_jobs([job])
    live.publish_devices(device_rows(a.device for a in rows if a.device is not None))
    # Every node of the job: the new replicas' agents start them, the others learn the new world.
    for node_id in sorted({a.node_id for a in current}):
        live.wake_agent(node_id)
    return True


def leave_alone(job: Job, these: list[Allocation], held: list[Allocation], now: datetime, lost: bool) -> None:
    """Release one replica's allocations (``these``; ``held``: the job's unreleased ones, the job
    locked) without ending the job: a replica a shrink removed has exited (or its node was
    fenced), or a replica a grow added was lost with its node before it started. When no
    replica of a shrink is left, the job records ``resized``; a pass is asked for."""
    release_allocations(job, now, these)
    rest = [a for a in held if a.released_at is None and a not in these]
    alive = [a for a in rest if a.exited_at is None]
    after = len(_replicas(alive))
    left = {a.replica for a in these}
    if any(a.leaving_at is not None for a in these):
        if any(a.leaving_at is not None for a in rest):
            request_pass_on_commit()
            return  # more of the shrink to come
        removed = set(
            Allocation.objects.filter(job=job, attempt=job.attempts, leaving_at__isnull=False).values_list(
                "replica", flat=True
            )
        )
        why = job.size_reason or "shrunk"
        before = after + len(removed)
        reason = f"shrunk from {before} to {after} replicas"
        extra = {"inputs": job.shrink_details} if job.shrink_details else {}
        if job.shrink_details:
            Job.objects.filter(pk=job.pk).update(shrink_details=None)
    else:  # a joining replica lost with its node: back to the size it had
        before = after + len(left)
        why = "its node was lost before the replica started: back to the size it had"
        reason = f"fell back from {before} to {after} replicas"
        job.size_reason = size_reason(job, after, why)
        Job.objects.filter(pk=job.pk).update(size_reason=job.size_reason)
        extra = {}
    record_event(
        job,
        EventType.RESIZED,
        reason,
        allocations_payload(alive),
        at=max(now, timezone.now()),
        details=_details(job, before, after, why, lost=lost, **extra),
    )
    live.publish_jobs([job])
    request_pass_on_commit()


def leaves_alone(these: list[Allocation], held: list[Allocation], reason: str, exit_code: int | None) -> bool:
    """Does this replica's end (``these``: its allocations) release it alone, the job going on?
    A replica a shrink removed: whatever its exit; a replica a grow added: only if it was lost
    with its node before it started (one that fails is a failed replica). Not when it is the
    job's last running replica (the job then settles as a whole)."""
    if not these:
        return False
    others = any(a.exited_at is None for a in held if a not in these)
    leaving = all(a.leaving_at is not None for a in these)
    lost_joining = reason == "lost" and all(a.joining for a in these)
    return others and (leaving or lost_joining)


def request_shrink(job: Job | int, to_gpus: float, reason: str, details: dict[str, Any] | None = None) -> Job:
    """Shrink a running elastic job to ``to_gpus`` (at least its ``min_gpus``, a multiple of its
    per-replica size): its highest replicas are stopped through their agents and their GPUs
    freed once they have exited, as for a shrink the pass decides. For the adjustment loop (an
    idle job's reclaim): ``reason`` and ``details`` (its inputs) go on the ``resized`` event the
    shrink records when it is done (under ``inputs``), and its reason on ``size_reason``. The
    pass does not grow the job back past ``to_gpus`` in this attempt (``Job.size_cap``). Raises
    :class:`CannotShrink` when the job is not running, not elastic, already shrinking, or
    ``to_gpus`` is not a size it may run at below its current one."""
    job_id = job.pk if isinstance(job, Job) else int(job)
    now = timezone.now()
    with transaction.atomic():
        locked = locked_jobs().filter(pk=job_id).first()
        if locked is None or locked.state != JobState.RUNNING:
            raise CannotShrink(f"job {job_id} is not running")
        if locked.elastic_min_gpus is None:
            raise CannotShrink(f"job {job_id} is not elastic")
        active = list(active_allocations_of(locked))
        if any(a.leaving_at is not None for a in active):
            raise CannotShrink(f"job {job_id} is already shrinking")
        current = [a for a in active if a.exited_at is None]
        have = sorted(_replicas(current))
        per = _per_replica(locked)
        keep = round(to_gpus / per) if per > 0 else len(have)
        if (
            per <= 0
            or abs(keep * per - to_gpus) > 1e-6
            or to_gpus < locked.elastic_min_gpus
            or keep >= len(have)
        ):
            raise CannotShrink(
                f"job {job_id} runs {_gpus(locked, len(have)):g} GPUs in replicas of {per:g}: "
                f"cannot shrink to {to_gpus:g} (at least {locked.elastic_min_gpus:g})"
            )
        gone = set(have[keep:])
        # Not grown back by the next pass: at most this size for the rest of the attempt.
        locked.size_cap = {"attempt": locked.attempts, "gpus": round(keep * per)}
        locked.shrink_details = details or None
        Job.objects.filter(pk=job_id).update(size_cap=locked.size_cap, shrink_details=locked.shrink_details)
        _shrink(locked, [a for a in current if a.replica in gone], len(have), reason, now)
    return locked
