"""The idle policy of the dynamic-adjustment pass: pure, the same code live and in the simulator.

In: each running job's facts (:class:`JobFacts`), its GPUs' utilisation as per-step maxima
(:class:`GpuSeries`, newest last), the policy's settings (:class:`IdleSettings`) and ``now``. Out:
one :class:`Adjustment` per job that needs one — a warning, a shrink to fewer GPUs, a requeue —
carrying the per-GPU evidence (idle time, highest utilisation seen, points read) that caused it.

A GPU is *idle* while its utilisation (SM active where the driver has it, else GPU utilisation, as
a fraction 0..1) stays under ``threshold``. Its idle time is the span, ending now, of consecutive
points all under the threshold with no gap: a point missing (a hole wider than ``max_gap_s``,
or no recent point at all) ends the span, so a window with missing samples is never idle.
A job is idle when all its GPUs are (its idle time is the least of theirs), partly idle when some
are (the most of theirs). Warnings come at ``warn_after_s`` (15 and 45 min), each once per idle
spell (a spell idle through the whole window read began before it: its warnings are all those of
the attempt, or since its last shrink, so a job idle for hours is not warned again); at
``act_after_s`` (60 min) an elastic job shrinks to its busy GPUs or its minimum, a preemptible idle
job is requeued (after a checkpoint where the driver can ask for one), and a
non-preemptible job, elastic or not, is only warned unless its owner allowed reclaiming it. Jobs
in their first ``exempt_s`` and interactive jobs are never touched.

A requeue is made only when a waiting job could use what it frees (:func:`could_use`, when the
driver says what waits): requeued with nothing else able to start there, the idle job is
placed back at once, so the requeue only costs it its grace period (and its idle work is still to
do). Until something that fits waits, the job stays warned.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

WARN = "warn"
SHRINK = "shrink"
REQUEUE = "requeue"
NONE = "none"
ACTIONS = (WARN, SHRINK, REQUEUE)
IDLE_RECLAIM = ("never", "allow")  # a job body's ``idle_reclaim``; "never" is the default


@dataclass(frozen=True, slots=True)
class IdleSettings:
    """The idle policy's knobs (operator defaults; a tenant may override within bounds)."""

    threshold: float = 0.05  # a GPU under this utilisation (0..1) is idle
    exempt_s: float = 600.0  # a job's first minutes are never judged
    warn_after_s: tuple[float, ...] = (900.0, 2700.0)  # warnings, once each per idle spell
    act_after_s: float = 3600.0  # then shrink or requeue
    step_s: float = 60.0  # the resolution of the utilisation points (one max per step)

    @property
    def max_gap_s(self) -> float:
        """Points further apart than this (or the newest older than this) leave a hole."""
        return 2 * self.step_s

    def check(self) -> None:
        if not 0 < self.threshold <= 1:
            raise ValueError("threshold: must be in (0, 1]")
        if self.step_s <= 0 or self.exempt_s < 0:
            raise ValueError("step_s must be positive and exempt_s not negative")
        if list(self.warn_after_s) != sorted(self.warn_after_s) or any(w <= 0 for w in self.warn_after_s):
            raise ValueError("warn_after_s: positive, in increasing order")
        if self.warn_after_s and self.act_after_s <= self.warn_after_s[-1]:
            raise ValueError("act_after_s: must come after the last warning")


# Overridable per tenant: a field's override must lie within the operator's [low, high].
OVERRIDABLE = ("threshold", "exempt_s", "act_after_s")


@dataclass(frozen=True, slots=True)
class Bounds:
    """What an operator lets tenants set: each overridable field's lowest and highest value."""

    threshold: tuple[float, float] = (0.01, 0.2)
    exempt_s: tuple[float, float] = (300.0, 7200.0)
    act_after_s: tuple[float, float] = (1800.0, 4 * 3600.0)


class OverrideRefused(ValueError):
    """A tenant's override names an unknown field or lies outside the operator's bounds."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def with_overrides(base: IdleSettings, overrides: Mapping[str, Any], bounds: Bounds) -> IdleSettings:
    """``base`` with a tenant's ``overrides`` applied; raises :class:`OverrideRefused` naming the
    first field that is unknown, not a number, or outside ``bounds``. Warnings scale with
    ``act_after_s`` (they stay at the same fractions of it)."""
    changes: dict[str, Any] = {}  # float fields of IdleSettings (OVERRIDABLE), by name
    for name, value in overrides.items():
        if name not in OVERRIDABLE:
            raise OverrideRefused(name, f"not overridable (one of {', '.join(OVERRIDABLE)})")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise OverrideRefused(name, "must be a number")
        low, high = getattr(bounds, name)
        if not low <= value <= high:
            raise OverrideRefused(name, f"must be between {low:g} and {high:g} (the operator's bounds)")
        changes[name] = float(value)
    out = replace(base, **changes)
    if "act_after_s" in changes and base.act_after_s > 0:
        scale = out.act_after_s / base.act_after_s
        out = replace(out, warn_after_s=tuple(w * scale for w in base.warn_after_s))
    return out


@dataclass(frozen=True, slots=True)
class GpuSeries:
    """One GPU of a job: its utilisation points ``(t, max over the step ending at t)``, oldest
    first, each a fraction 0..1."""

    gpu: str  # "node/index"
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What the policy needs to know of a running job."""

    id: str
    tenant: str
    gpus: int  # whole GPUs held now
    started_at: float  # the current attempt's start
    preemptible: bool = True
    interactive: bool = False
    idle_reclaim: str = "never"
    elastic_min_gpus: int | None = None  # elastic when set
    per_replica_gpus: int = 1
    warned_at: tuple[float, ...] = ()  # this attempt's idle warnings
    acted_at: float | None = None  # this attempt's last shrink: idle time counts from there
    held: tuple[tuple[str, int], ...] = ()  # (GPU model, whole GPUs) on each node it holds


@dataclass(frozen=True, slots=True)
class Waiting:
    """A pending job, as far as the requeue rule needs: the GPU models it accepts (empty: any)
    and the GPUs one of its replicas needs."""

    models: tuple[str, ...] = ()
    replica_gpus: float = 1.0


def could_use(job: JobFacts, waiting: Iterable[Waiting]) -> bool:
    """Whether a waiting job could start on the GPUs requeuing ``job`` frees: it accepts their
    model and one of its replicas fits in what ``job`` holds on one node."""
    return any(
        (not w.models or model in w.models) and 0 < w.replica_gpus <= gpus
        for w in waiting
        for model, gpus in job.held
    )


@dataclass(frozen=True, slots=True)
class GpuEvidence:
    gpu: str
    idle_s: float  # how long it has been under the threshold, without a hole
    window_s: float  # the span the points cover
    max_util: float  # the highest point in the window
    points: int


@dataclass(frozen=True, slots=True)
class Adjustment:
    job_id: str
    action: str  # warn | shrink | requeue | none
    reason: str
    idle_s: float  # the idle time that triggered it
    to_gpus: int | None = None  # shrink: the size to go to
    release: tuple[str, ...] = ()  # shrink: the idle GPUs to give back
    level: int = 0  # warn: 1 = first warning, 2 = second...
    evidence: tuple[GpuEvidence, ...] = ()

    def inputs(self, settings: IdleSettings) -> dict[str, Any]:
        """The metric values and windows behind it, as JSON for the job's event."""
        return {
            "action": self.action,
            "idle_s": round(self.idle_s, 1),
            "threshold": settings.threshold,
            "step_s": settings.step_s,
            "to_gpus": self.to_gpus,
            "release": list(self.release),
            "gpus": [
                {
                    "gpu": e.gpu,
                    "idle_s": round(e.idle_s, 1),
                    "window_s": round(e.window_s, 1),
                    "max_util": round(e.max_util, 4),
                    "points": e.points,
                }
                for e in self.evidence
            ],
        }


def idle_span(series: GpuSeries, settings: IdleSettings, now: float) -> GpuEvidence:
    """How long ``series`` has been idle up to ``now``: consecutive points under the threshold,
    newest back, no hole wider than ``max_gap_s`` (and the newest no older than that)."""
    points = [p for p in series.points if p[0] <= now]
    window = (now - points[0][0] + settings.step_s) if points else 0.0
    top = max((u for _, u in points), default=0.0)
    start: float | None = None
    later = now
    for t, util in reversed(points):
        if later - t > settings.max_gap_s or util >= settings.threshold:
            break
        start = t - settings.step_s  # each point covers the step before it
        later = t
    idle = max(0.0, now - start) if start is not None else 0.0
    return GpuEvidence(series.gpu, idle, window, top, len(points))


def decide_job(
    job: JobFacts,
    series: Sequence[GpuSeries],
    settings: IdleSettings,
    now: float,
    waiting: Sequence[Waiting] | None = None,
) -> Adjustment | None:
    """The adjustment for one job, or None. ``waiting``: the pending jobs (None: not known, a
    requeue is made whatever waits)."""
    if job.interactive or now - job.started_at < settings.exempt_s or not series:
        return None
    evidence = tuple(idle_span(s, settings, now) for s in series)
    # Judged only on what happened since the attempt began, or since its last shrink.
    since = max(job.started_at, job.acted_at or job.started_at)
    idle = {e.gpu: min(e.idle_s, now - since) for e in evidence}
    covered = len(series) >= job.gpus  # a GPU with no series at all is not idle
    whole = min(idle.values()) if covered else 0.0
    part = max(idle.values())
    # Idle through every point read: the spell began before the window, maybe long before.
    open_ended = any(e.points and e.idle_s >= e.window_s - 1e-6 and idle[e.gpu] >= part for e in evidence)
    spell_start = since if open_ended else now - part
    elastic = job.elastic_min_gpus is not None
    # A non-preemptible job is only warned, elastic or not, unless its owner allowed reclaiming.
    reclaimable = job.preemptible or job.idle_reclaim == "allow"
    if elastic and reclaimable and part >= settings.act_after_s:
        shrink = _shrink(job, idle, settings, whole, evidence)
        if shrink is not None:
            return shrink
    if whole >= settings.act_after_s and reclaimable and (waiting is None or could_use(job, waiting)):
        return Adjustment(
            job.id,
            REQUEUE,
            f"{_all_gpus(job.gpus)} idle for {_minutes(whole)} (under {settings.threshold:.0%})",
            whole,
            evidence=evidence,
        )
    return _warning(job, part, whole, settings, spell_start, evidence)


def _shrink(
    job: JobFacts,
    idle: Mapping[str, float],
    settings: IdleSettings,
    whole: float,
    evidence: tuple[GpuEvidence, ...],
) -> Adjustment | None:
    per = max(1, job.per_replica_gpus)
    idle_gpus = sorted(g for g, s in idle.items() if s >= settings.act_after_s)
    busy = job.gpus - len(idle_gpus)
    floor = job.elastic_min_gpus or per
    target = max(floor, math.ceil(busy / per) * per)
    if target >= job.gpus:
        return None
    # Give back the GPUs idle longest first (ties by name), as many as the shrink frees.
    release = tuple(sorted(idle_gpus, key=lambda g: (-idle[g], g))[: job.gpus - target])
    why = "its busy GPUs" if target > floor or busy == floor else f"its minimum ({floor})"
    return Adjustment(
        job.id,
        SHRINK,
        f"{len(idle_gpus)} of {job.gpus} GPUs idle for {_minutes(max(idle[g] for g in idle_gpus))}:"
        f" shrink to {why}",
        max(idle[g] for g in idle_gpus),
        to_gpus=target,
        release=release,
        evidence=evidence,
    )


def _warning(
    job: JobFacts,
    spell: float,
    whole: float,
    settings: IdleSettings,
    spell_start: float,
    evidence: tuple[GpuEvidence, ...],
) -> Adjustment | None:
    due = sum(1 for w in settings.warn_after_s if spell >= w)
    if due == 0:
        return None
    given = sum(1 for t in job.warned_at if t >= spell_start)  # warnings of this idle spell
    if given >= due:
        return None
    what = _all_gpus(job.gpus) if whole >= spell else "some of its GPUs"
    return Adjustment(
        job.id,
        WARN,
        f"{what} idle for {_minutes(spell)} (under {settings.threshold:.0%}): warning {given + 1}",
        spell,
        level=given + 1,
        evidence=evidence,
    )


def decide(
    jobs: Iterable[JobFacts],
    series: Mapping[str, Sequence[GpuSeries]],
    settings: IdleSettings | Mapping[str, IdleSettings],
    now: float,
    waiting: Sequence[Waiting] | None = None,
) -> list[Adjustment]:
    """Every running job's adjustment, in job order. ``settings``: one for all, or per tenant
    (a tenant without its own gets ``IdleSettings()``); ``waiting``: as for :func:`decide_job`."""
    out = []
    for job in jobs:
        chosen = settings if isinstance(settings, IdleSettings) else settings.get(job.tenant, IdleSettings())
        adjustment = decide_job(job, series.get(job.id, ()), chosen, now, waiting)
        if adjustment is not None:
            out.append(adjustment)
    return out


def _all_gpus(count: int) -> str:
    return "its GPU" if count == 1 else f"all {count} GPUs"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min"
