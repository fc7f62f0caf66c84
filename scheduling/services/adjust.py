"""The dynamic-adjustment pass: running jobs' GPU utilisation in, the idle policy's actions out.

``run_adjust_pass(read)`` loads every running job holding GPUs, asks ``read`` (the driver's
utilisation source: Prometheus, or the agents' own reports where none is configured,
``monitoring/adjust.py``) for each GPU's per-step maxima over the
policy's window, calls the pure policy (``scheduling.engine.adjust``, the code the simulator
runs), with what waits (the pending jobs' models and replica sizes: a job is requeued only when
one of them could use its GPUs), and applies what it decides through the job services:

- ``warn``: an ``idle-warning`` event on the job, its inputs (GPUs, idle times, windows,
  utilisation) in the event's ``details``;
- ``requeue``: an ``idle-reclaim`` event with its inputs, then the stop signal
  (``begin_stop``, reason ``preempted: idle``): the job keeps its GPUs through its grace
  period, is requeued from its last checkpoint when it exits, and the scheduling pass places
  what was freed;
- ``shrink``: an ``idle-reclaim`` event with its inputs, then the shrink itself through
  ``resizes.request_shrink`` (the live resizes' path): the job's highest replicas get stop orders
  (reason ``resize``, the job's grace), their GPUs are released as they exit and a pass places
  what was freed; the ``resized`` event recorded then carries the same inputs. The job is not
  grown back past that size in this attempt (``Job.size_cap``), and is judged again only after
  another full window. A shrink that cannot be made now (one of the pass's under way) is left
  for a later pass.

When utilisation cannot be read (Prometheus or the reports' Redis down) the pass acts on
nothing, logs why, and records it in ``AdjustmentState`` (``/metrics``:
``tessera_adjustment_metrics_available`` 0).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import cast

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from scheduling.choices import EventType, JobState
from scheduling.engine.adjust import (
    REQUEUE,
    SHRINK,
    WARN,
    Adjustment,
    GpuSeries,
    IdleSettings,
    JobFacts,
    Waiting,
    decide,
    idle_span,
)
from scheduling.models import AdjustmentState, Allocation, Job, JobEvent
from scheduling.services import gpu_looks, idle_policy, passes
from scheduling.services.jobs import begin_stop, locked_jobs, record_event
from scheduling.services.resizes import CannotShrink, request_shrink

log = logging.getLogger("tessera.adjust")

IDLE_STOP_REASON = "preempted: idle"


class UtilisationUnavailable(RuntimeError):
    """The utilisation source cannot answer (its message says why)."""


@dataclass(frozen=True)
class HeldGpus:
    """A running job's GPUs, as the metrics name them."""

    job_id: int
    gpus: tuple[tuple[str, int], ...]  # (node name, device index)
    started_at: float = 0.0  # the attempt's start (epoch seconds): older points are not its own


# (jobs, window_s, step_s) -> job id -> its GPUs' series (GpuSeries.gpu = "node/index")
Reader = Callable[[Sequence[HeldGpus], float, float], dict[int, list[GpuSeries]]]


@dataclass
class AdjustResult:
    metrics_ok: bool = True
    problem: str = ""
    jobs: int = 0
    idle_gpus: int = 0
    actions: list[Adjustment] = field(default_factory=list)
    gpus: gpu_looks.Looks = field(default_factory=dict)  # for the dashboard
    skipped: bool = False  # another pass held the lock: this one read, did and recorded nothing


def run_adjust_pass(read: Reader, now: datetime | None = None) -> AdjustResult:
    """One adjustment pass, one at a time cluster-wide (a non-blocking advisory lock, as the
    scheduling pass's): two that overlap (two beats, or a pass slower than its interval on a
    worker with several processes) judged every job on the same marks, and each recorded the
    same warning, so the job's next warning counted as given and was never sent. A pass that
    finds the lock taken returns at once, ``skipped``; the next one on the schedule does the work.
    Every action still re-checks its job under its row lock."""
    if not passes.try_lock(passes.ADJUST_LOCK_KEY):
        log.info("adjustment pass skipped: another one is running")
        return AdjustResult(skipped=True)
    try:
        return _adjust(read, now)
    finally:
        passes.unlock(passes.ADJUST_LOCK_KEY)


def _adjust(read: Reader, now: datetime | None) -> AdjustResult:
    now = now or timezone.now()
    jobs, held, policies = _running_jobs(now)
    step = idle_policy.defaults().step_s
    result = AdjustResult(jobs=len(jobs))
    window = max((p.act_after_s for p in policies.values()), default=0.0) + step
    try:
        series = read(held, window, step) if held else {}
    except UtilisationUnavailable as exc:
        return _unavailable(result, str(exc), now)
    by_id = {str(job_id): s for job_id, s in series.items()}
    ts = now.timestamp()
    tenant_of = {facts.id: facts.tenant for facts, _ in jobs}
    for job_id, gpus in by_id.items():
        policy = policies[tenant_of[job_id]]
        warn = policy.warn_after_s[0] if policy.warn_after_s else math.inf
        result.idle_gpus += sum(1 for s in gpus if idle_span(s, policy, ts).idle_s >= warn)
    result.gpus = gpu_looks.looks_of(by_id, {j: policies[tenant_of[j]] for j in by_id}, ts)
    decided = decide([facts for facts, _ in jobs], by_id, policies, ts, _waiting(now))
    attempts = {facts.id: attempt for facts, attempt in jobs}
    for adjustment in decided:
        policy = policies[tenant_of[adjustment.job_id]]
        if _apply(adjustment, attempts[adjustment.job_id], policy, now):
            result.actions.append(adjustment)
    _record(result, now)
    return result


def _running_jobs(
    now: datetime,
) -> tuple[list[tuple[JobFacts, int]], list[HeldGpus], dict[str, IdleSettings]]:
    """The running jobs' facts (and attempts), their GPUs, and their tenants' idle settings."""
    rows = list(
        Allocation.objects.filter(
            released_at__isnull=True,
            leaving_at__isnull=True,  # a shrink's removed replicas are no longer the job's
            device__isnull=False,
            job__state=JobState.RUNNING,
        ).values_list("job_id", "node__name", "device__index", "device__model")
    )
    gpus: dict[int, list[tuple[str, int]]] = {}
    by_node: dict[int, dict[tuple[str, str], int]] = {}  # job -> (node, model) -> GPUs
    for job_id, node, index, model in rows:
        gpus.setdefault(job_id, []).append((node, index))
        on_node = by_node.setdefault(job_id, {})
        on_node[(node, model)] = on_node.get((node, model), 0) + 1
    running = Job.objects.filter(pk__in=gpus, state=JobState.RUNNING, started_at__isnull=False)
    jobs = list(running.select_related("tenant"))
    marks = _past_marks(jobs)
    out = []
    for job in jobs:
        warned, acted = marks.get(job.pk, ((), None))
        per_replica = max(1, round(job.gpus / job.replicas)) if job.replicas else 1
        facts = JobFacts(
            id=str(job.pk),
            tenant=job.tenant.name,
            gpus=len(gpus[job.pk]),
            started_at=cast(datetime, job.started_at).timestamp(),  # read: started_at__isnull=False
            preemptible=job.preemptible,
            interactive=job.interactive,
            idle_reclaim=job.idle_reclaim,
            elastic_min_gpus=job.elastic_min_gpus,
            per_replica_gpus=per_replica,
            warned_at=warned,
            acted_at=acted,
            held=tuple((model, n) for (_, model), n in sorted(by_node[job.pk].items())),
        )
        out.append((facts, job.attempts))
    held = [
        HeldGpus(job.pk, tuple(sorted(gpus[job.pk])), cast(datetime, job.started_at).timestamp())
        for job in jobs
    ]
    return out, held, idle_policy.for_tenants({job.tenant_id: job.tenant for job in jobs}.values())


def _waiting(now: datetime) -> list[Waiting]:
    """What the pending jobs that may start now need: the models each accepts, one replica's
    GPUs (a job held, or backing off until later, could not use what a requeue frees)."""
    rows = (
        Job.objects.filter(state=JobState.PENDING, held=False, gpus__gt=0)
        .filter(Q(not_before__isnull=True) | Q(not_before__lte=now))
        .values_list("accelerators", "gpus", "replicas")
    )
    shapes = {(tuple(models or ()), gpus / replicas) for models, gpus, replicas in rows if replicas}
    return [Waiting(models, gpus) for models, gpus in sorted(shapes)]


def held_gpus(job: Job) -> HeldGpus | None:
    """The GPUs ``job`` holds while it runs (None when it does not run, or holds none)."""
    if job.state != JobState.RUNNING or job.started_at is None:
        return None
    gpus = tuple(
        sorted(
            Allocation.objects.filter(
                job=job, released_at__isnull=True, leaving_at__isnull=True, device__isnull=False
            ).values_list("node__name", "device__index")
        )
    )
    return HeldGpus(job.pk, gpus, job.started_at.timestamp()) if gpus else None


def _past_marks(jobs: list[Job]) -> dict[int, tuple[tuple[float, ...], float | None]]:
    """Each job's idle warnings in its current attempt, and its last shrink (applied or not)."""
    if not jobs:
        return {}
    starts = {job.pk: cast(datetime, job.started_at) for job in jobs}  # running: started_at is set
    events = JobEvent.objects.filter(
        job_id__in=starts,
        type__in=[EventType.IDLE_WARNING, EventType.IDLE_RECLAIM],
        at__gte=min(starts.values()),
    ).values_list("job_id", "type", "at", "details")
    warned: dict[int, list[float]] = {}
    acted: dict[int, float] = {}
    for job_id, type_, at, details in events:
        if at < starts[job_id]:
            continue
        action = (details or {}).get("action")
        if action == SHRINK:
            acted[job_id] = max(acted.get(job_id, 0.0), at.timestamp())
        elif type_ == EventType.IDLE_WARNING:
            warned.setdefault(job_id, []).append(at.timestamp())
    return {pk: (tuple(sorted(warned.get(pk, ()))), acted.get(pk)) for pk in starts}


def _apply(adjustment: Adjustment, attempt: int, policy: IdleSettings, now: datetime) -> bool:
    """Apply one adjustment to its job, if it still runs the attempt that was judged."""
    inputs = adjustment.inputs(policy)
    with transaction.atomic():
        same = {"pk": int(adjustment.job_id), "state": JobState.RUNNING, "attempts": attempt}
        job = locked_jobs().filter(**same).first()
        if job is None:
            return False  # it ended, or moved on, since it was read
        if adjustment.action == WARN:
            record_event(job, EventType.IDLE_WARNING, adjustment.reason, at=now, details=inputs)
        elif adjustment.action == SHRINK:
            inputs["applied"] = True
            try:
                request_shrink(
                    job, float(adjustment.to_gpus or 0), f"idle-reclaim: {adjustment.reason}", inputs
                )
            except CannotShrink as exc:
                log.info("job %s: idle shrink left for a later pass: %s", adjustment.job_id, exc)
                return False
            inputs["removed"] = _leaving(job)
            record_event(job, EventType.IDLE_RECLAIM, adjustment.reason, at=now, details=inputs)
        elif adjustment.action == REQUEUE:
            inputs["applied"] = True
            record_event(job, EventType.IDLE_RECLAIM, adjustment.reason, at=now, details=inputs)
            begin_stop(job, IDLE_STOP_REASON, now)
    log.info("job %s: %s (%s)", adjustment.job_id, adjustment.action, adjustment.reason)
    return True


def _leaving(job: Job) -> list[str]:
    """The GPUs of the replicas a shrink of ``job`` removes (its highest: ranks stay stable, so
    they may differ from the idle GPUs the policy named under ``release``)."""
    rows = Allocation.objects.filter(
        job=job, released_at__isnull=True, leaving_at__isnull=False, device__isnull=False
    ).values_list("node__name", "device__index")
    return sorted(f"{node}/{index}" for node, index in rows)


def _state() -> AdjustmentState:
    state, _ = AdjustmentState.objects.select_for_update().get_or_create(id=1)
    return state


def _unavailable(result: AdjustResult, problem: str, now: datetime) -> AdjustResult:
    # Said once per outage (each pass of it is in AdjustmentState and on /metrics).
    said = AdjustmentState.objects.filter(id=1, metrics_ok=False, problem=problem[:512]).exists()
    (log.debug if said else log.warning)("adjustment pass acts on nothing: %s", problem)
    result.metrics_ok, result.problem = False, problem
    _record(result, now)
    return result


def _record(result: AdjustResult, now: datetime) -> None:
    with transaction.atomic():
        state = _state()
        state.last_pass_at = now
        state.passes += 1
        state.metrics_ok = result.metrics_ok
        state.problem = result.problem[:512]
        state.idle_gpus = result.idle_gpus
        gpu_looks.publish_changed(state.gpus or {}, result.gpus)  # none while metrics are out
        state.gpus = result.gpus
        totals = dict(state.actions_total or {})
        for adjustment in result.actions:
            totals[adjustment.action] = totals.get(adjustment.action, 0) + 1
        state.actions_total = totals
        state.save()
