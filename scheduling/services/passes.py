"""The scheduling pass: load one snapshot → the engine decides → apply in one transaction.

One pass runs at a time cluster-wide: under a non-blocking PostgreSQL advisory lock (released if
the worker dies with its connection), or an in-process lock on SQLite. A request that arrives
while a pass runs sets a flag, so exactly one more pass follows. Decisions made on stale state
(a node's version moved since the snapshot) are dropped, never double-booked.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from scheduling.choices import EventType, JobState
from scheduling.engine.config import EngineConfig
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import Binding, Decisions
from scheduling.models import Allocation, Device, Job, Node, SchedulerState
from scheduling.services import live
from scheduling.services.jobs import allocations_payload, begin_stop, do_transition
from scheduling.services.snapshot import LoadedSnapshot, load_snapshot

log = logging.getLogger("tessera.pass")

PASS_LOCK_KEY = 0x7E55E7A  # the advisory lock's key, arbitrary but fixed
_local_lock = threading.Lock()
_again = threading.Event()


@dataclass
class PassResult:
    seconds: float = 0.0
    bound: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    pending: int = 0


@contextmanager
def pass_lock() -> Iterator[bool]:
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s)", [PASS_LOCK_KEY])
            got = bool(cur.fetchone()[0])
        try:
            yield got
        finally:
            if got:
                with connection.cursor() as cur:
                    cur.execute("SELECT pg_advisory_unlock(%s)", [PASS_LOCK_KEY])
    else:
        got = _local_lock.acquire(blocking=False)
        try:
            yield got
        finally:
            if got:
                _local_lock.release()


def _set_again() -> None:
    _again.set()
    if settings.REDIS_URL:
        from scheduling.services.redis_flags import set_flag

        set_flag("pass-again")


def _take_again() -> bool:
    flagged = _again.is_set()
    _again.clear()
    if settings.REDIS_URL:
        from scheduling.services.redis_flags import take_flag

        flagged = take_flag("pass-again") or flagged
    return flagged


def run_pass(now: datetime | None = None, max_rounds: int = 3) -> PassResult | None:
    """Run a pass unless one is running (then ask it to run once more). Returns the last result."""
    with pass_lock() as got:
        if not got:
            _set_again()
            return None
        result = None
        for _ in range(max_rounds):
            _take_again()
            result = _one_pass(now)
            if not _take_again():
                break
            now = None
        return result


def make_policy(loaded: LoadedSnapshot) -> TesseraScheduler:
    return TesseraScheduler.from_snapshot(loaded.snapshot, engine_config())


def engine_config() -> EngineConfig:
    return EngineConfig(max_starts_per_pass=settings.TESSERA["MAX_STARTS_PER_PASS"])


def _one_pass(now: datetime | None) -> PassResult:
    started = time.perf_counter()
    now = now or timezone.now()
    loaded = load_snapshot(now)
    decisions: Decisions = make_policy(loaded).decide(loaded.snapshot.now)
    result = apply_decisions(loaded, decisions, now)
    result.seconds = time.perf_counter() - started
    from monitoring.exporter import observe_pass

    observe_pass(result.seconds)
    SchedulerState.objects.update_or_create(
        id=1,
        defaults={
            "last_pass_at": now,
            "last_pass_seconds": result.seconds,
            "last_pass_decisions": {
                "bound": len(result.bound),
                "dropped": len(result.dropped),
                "preempted": len(result.preempted),
                "pending": result.pending,
            },
        },
    )
    return result


def apply_decisions(loaded: LoadedSnapshot, decisions: Decisions, now: datetime) -> PassResult:
    result = PassResult(pending=len(decisions.pending))
    max_starts = settings.TESSERA["MAX_STARTS_PER_PASS"]
    for binding in decisions.bindings[:max_starts]:
        if _apply_binding(loaded, binding, now):
            result.bound.append(binding.job_id)
        else:
            result.dropped.append(binding.job_id)
    for preemption in decisions.preemptions:
        with transaction.atomic():
            job = Job.objects.select_for_update().select_related("tenant").filter(
                pk=int(preemption.job_id), state=JobState.RUNNING
            ).first()
            if job is not None and job.preemptible:
                begin_stop(job, f"preempted: {preemption.reason}"[:64], now)
                result.preempted.append(preemption.job_id)
    _store_pending_reasons(decisions, loaded)
    return result


def _apply_binding(loaded: LoadedSnapshot, binding: Binding, now: datetime) -> bool:
    """Bind one job, all replicas or none, if nothing it touches moved since the snapshot."""
    node_names = sorted({p.node for p in binding.placements})
    with transaction.atomic():
        job = Job.objects.select_for_update().select_related("tenant").filter(
            pk=int(binding.job_id), state=JobState.PENDING
        ).first()
        if job is None:
            return False
        nodes = {n.name: n for n in Node.objects.select_for_update().filter(name__in=node_names)}
        if any(
            name not in nodes or nodes[name].version != loaded.node_versions.get(name)
            for name in node_names
        ):
            log.info("dropping stale binding of job %s", binding.job_id)
            return False
        devices = {
            (d.node.name, d.index): d
            for d in Device.objects.filter(node__in=nodes.values()).select_related("node")
        }
        wanted: list[tuple[Node, Device | None, int, int]] = []
        for p in binding.placements:
            share = round(p.share * 1000)
            if not p.gpus:  # a CPU-only replica: a place on the node, no GPU
                wanted.append((nodes[p.node], None, p.replica, 0))
            for index in p.gpus:
                device = devices.get((p.node, index))
                if device is None or not device.healthy:
                    return False
                wanted.append((nodes[p.node], device, p.replica, share))
        # Defence in depth: the capacity the database already holds must leave room.
        gpu_rows = [w for w in wanted if w[1] is not None]
        used: dict[int, int] = {}
        for a in Allocation.objects.filter(
            device__in=[w[1] for w in gpu_rows], released_at__isnull=True
        ):
            used[a.device_id] = used.get(a.device_id, 0) + a.share_milli
        for _, device, _, share in gpu_rows:
            used[device.pk] = used.get(device.pk, 0) + share
            if used[device.pk] > 1000:
                log.error("refusing binding of job %s: device over-committed", binding.job_id)
                return False
        allocs = Allocation.objects.bulk_create(
            Allocation(job=job, node=n, device=d, replica=r, share_milli=s, attempt=job.attempts)
            for n, d, r, s in wanted
        )
        for a, (n, d, _, _) in zip(allocs, wanted, strict=True):
            a.node, a.device = n, d
        Node.objects.filter(pk__in=[n.pk for n in nodes.values()]).update(version=F("version") + 1)
        do_transition(
            job, JobState.SCHEDULED, EventType.SCHEDULED, allocations=allocations_payload(allocs),
            at=now,
        )
        from scheduling.services.inventory import device_rows

        live.publish_devices(device_rows({a.device for a in allocs if a.device is not None}))
        for node in nodes.values():
            live.wake_agent(node.pk)
    return True


def _store_pending_reasons(decisions: Decisions, loaded: LoadedSnapshot) -> None:
    changed = []
    for job_id, reason in decisions.pending.items():
        job = loaded.jobs.get(job_id)
        if job is None or job.state != JobState.PENDING:
            continue
        estimated = (
            datetime.fromtimestamp(reason.estimated_start, tz=UTC)
            if reason.estimated_start is not None
            else None
        )
        if (job.pending_code, job.pending_reason, job.estimated_start) != (
            reason.code, reason.message, estimated
        ):
            job.pending_code, job.pending_reason = reason.code, reason.message
            job.estimated_start = estimated
            changed.append(job)
    for job_id, why in decisions.rejections.items():
        # The live cluster keeps such jobs pending (nodes may join later): say why.
        job = loaded.jobs.get(job_id)
        if job is not None and job.state == JobState.PENDING and job.pending_reason != why:
            job.pending_code, job.pending_reason, job.estimated_start = "capacity", why, None
            changed.append(job)
    if changed:
        with transaction.atomic():
            Job.objects.filter(state=JobState.PENDING).bulk_update(
                changed, ["pending_code", "pending_reason", "estimated_start"]
            )
            for job in changed:
                live.publish_job(job)
