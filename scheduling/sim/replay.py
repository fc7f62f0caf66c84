"""Discrete-event replay: drive a :class:`~scheduling.engine.types.Scheduler` through simulated time.

The driver owns everything the engine does not decide: when jobs arrive, how much work they have
done, when they checkpoint, finish, hit their time limit, and when a preempted job's grace period
ends. The policy only sees what the live system would tell it (submit, release, requeue,
checkpoint) and answers ``decide(now)`` — so the simulator measures the same code that runs online.

Rules (docs/formats.md describes the files):

1. Jobs arrive at ``submit_s``. Events at one time are handled together, releases first, and then
   the policy decides once (one ``decide`` per distinct event time; checkpoints alone trigger none).
   While jobs are pending, ``tick_s`` of quiet (no decision) also brings a ``decide``, as the live
   periodic pass would, so that aging and reservations can act in a quiet cluster.
2. A started job does work at rate k/g on k of its g GPUs (1 for a job given all it asked for) and
   finishes when ``duration_s`` of work is done. Checkpoints fall at every ``checkpoint_s`` of work.
3. A preemption is marked at decision time: the job stops doing work at once (the signal), keeps
   its GPUs for ``grace_s`` and is then released (``preempt`` event) and requeued from its last
   checkpoint. Lost work = work since that checkpoint × the GPUs asked for.
   A shrink is the same for the replicas it removes: at decision time the job goes on at the rate
   of the replicas it keeps, the removed ones keep their GPUs for ``grace_s`` (as live, until
   their processes have exited) and are then released (``resize`` event, the kept set) and the
   policy is told (``release_leaving``). A grow takes effect at once (``resize``, the new set).
   Running replicas are told the new world in place: a resize loses no work.
4. ``time_limit_s`` is a hard per-attempt limit: a job still running at its limit fails
   (``fail``, reason ``time-limit``).
5. Rejections become ``reject`` events. At one time, releases come before binds in the output.
6. Every job runs a utilisation profile (:mod:`.utilisation`); the replay counts the busy
   GPU-seconds done while jobs arrive. With ``adjust`` (``--adjust on``) a job progresses at
   ``min(1, k / demand)`` on ``k`` GPUs instead of ``k/g``, and every ``interval_s`` the
   adjustment pass (:mod:`.adjusting`) may warn a job (``idle-warning`` event), shrink an elastic
   one through the engine's shrink, as a shrink of rule 3 (its removed replicas' GPUs held for
   ``grace_s``, then the ``resize`` with a ``reason``) or checkpoint-now then requeue one
   (``preempt``, reason ``idle-reclaim: …``, after ``grace_s``); what it frees goes to the queue
   as soon as it is released. The policy is told of the requeue's stop signal (``stopping``,
   where it has one): through the grace period the job is terminating, as the live snapshot
   shows it, and its run, ended by the signal, is not a runtime the policy learns from (live,
   it ends ``preempted``).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from scheduling.engine.adjust import REQUEUE, SHRINK, WARN, Adjustment, Waiting
from scheduling.engine.types import Decisions, Estimate, NodeSpec, Placement, Scheduler
from scheduling.sim.adjusting import Adjuster, AdjustOptions, held_by_node
from scheduling.sim.traces import TraceJob
from scheduling.sim.utilisation import Demand, can_idle_safely, profile_of, wholly_idle

# Internal event kinds, in the order they are handled at one time (releases first).
_FINISH, _LIMIT, _GRACE, _LEAVE, _CKPT, _ARRIVE, _TICK, _ADJUST = range(8)
_EPS = 1e-9
PENDING_SAMPLE_EVERY = 10  # tally pending reasons on every 10th decision (cheap, representative)

Progress = Callable[[float, float], None]


class ReplayError(ValueError):
    """The inputs cannot be replayed (e.g. a job without ``duration_s``)."""


@dataclass
class ReplayResult:
    """What a replay produced: the event log and the driver's own accounting."""

    events: list[dict[str, Any]]
    preemptions: int = 0
    lost_gpu_seconds: float = 0.0
    decide_calls: int = 0
    decide_s: float = 0.0  # wall time spent inside the policy
    wall_s: float = 0.0  # wall time of the whole replay
    cpu_s: float = 0.0  # CPU time of the whole replay (what a shared machine cannot inflate)
    unfinished: list[str] = field(default_factory=list)  # jobs that never ended
    #: pending reason code -> mean number of jobs pending with it, over sampled decisions
    pending_codes: dict[str, float] = field(default_factory=dict)
    #: job -> the start estimate the policy gave at the first pass that left it pending
    #: (None: it gave none); only for a policy that estimates (``estimate(decisions, now)``)
    first_estimates: dict[str, Estimate | None] = field(default_factory=dict)
    #: GPU-seconds its jobs kept busy (utilisation × GPUs) from the first submit to the last
    busy_gpu_seconds_while_arriving: float = 0.0
    window_s: float = 0.0  # first submit to last submit
    #: --adjust on: GPU-seconds the pass took back (GPUs released × the time the job would
    #: still have held them), and its actions by kind
    reclaimed_gpu_seconds: float = 0.0
    adjustments: dict[str, int] = field(default_factory=dict)
    #: jobs shrunk or requeued for idleness though not preemptible and without the opt-in
    touched_non_preemptible: list[str] = field(default_factory=list)


class _Job:
    """The simulator's view of one job: progress, rate, and the attempt it is in."""

    __slots__ = (
        "tj", "id", "gpus", "state", "work", "ckpt_work", "rate", "since", "epoch",
        "attempt", "attempt_start", "placements", "allocated", "stop_reason", "demand", "meter",
        "reclaims", "requeued", "kept", "kept_reason",
    )  # fmt: skip

    def __init__(self, tj: TraceJob, meter: _Meter | None = None) -> None:
        self.tj = tj
        self.id = tj.request.id
        self.gpus = tj.request.gpus
        self.state = "future"  # future | pending | running | terminating | done
        self.work = 0.0  # work done (seconds at full rate) as of `since`
        self.ckpt_work = 0.0  # work saved by the last checkpoint
        self.rate = 0.0
        self.since = 0.0
        self.epoch = 0  # bumped whenever the rate changes: stale finish/checkpoint events die
        self.attempt = 0  # bumped per start and per stop: stale limit/grace events die
        self.attempt_start = 0.0
        self.placements: tuple[Placement, ...] = ()
        self.allocated = 0.0
        self.stop_reason = ""
        self.demand = Demand(profile_of(tj), tj.request.id, tj.request.gpus)
        self.meter = meter
        self.reclaims: list[tuple[float, float]] = []  # (when, GPUs) the adjustment pass took
        self.requeued: tuple[float, float] | None = None  # (when, GPUs) of an idle requeue
        self.kept: tuple[Placement, ...] | None = None  # a shrink's replicas, until the others leave
        self.kept_reason = ""  # an idle shrink's reason, for its ``resize`` event

    def advance(self, now: float) -> None:
        if self.rate:
            w0 = self.work
            self.work += self.rate * (now - self.since)
            if self.meter is not None:
                self.meter.add(self, w0, now)
        self.since = now


class _Meter:
    """Busy GPU-seconds done within [t0, t1] (the first and last submit)."""

    __slots__ = ("t0", "t1", "busy")

    def __init__(self, t0: float, t1: float) -> None:
        self.t0, self.t1, self.busy = t0, t1, 0.0

    def add(self, job: _Job, w0: float, now: float) -> None:
        lo, hi = max(job.since, self.t0), min(now, self.t1)
        if hi <= lo:
            return
        rate = job.rate
        self.busy += job.demand.busy(w0 + (lo - job.since) * rate, w0 + (hi - job.since) * rate)


def allocations(placements: Sequence[Placement]) -> list[dict[str, Any]]:
    """Placements as the events file lists them."""
    return [
        {"node": p.node, "gpus": list(p.gpus), "share": p.share, "replica": p.replica} for p in placements
    ]


def _gpu_set(placements: Sequence[Placement]) -> set[tuple[str, int, float]]:
    return {(p.node, g, p.share) for p in placements for g in p.gpus}


def _capacity(placements: Sequence[Placement]) -> float:
    return sum(len(p.gpus) * p.share for p in placements)


class Replay:
    """One replay of ``jobs`` on ``nodes`` under ``scheduler``. Call :meth:`run` once."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        jobs: Sequence[TraceJob],
        scheduler: Scheduler,
        *,
        tick_s: float = 300.0,
        progress: Progress | None = None,
        estimates: bool = False,
        adjust: AdjustOptions | None = None,
    ) -> None:
        self.estimates = estimates
        missing = [tj.request.id for tj in jobs if tj.duration_s is None]
        if missing:
            raise ReplayError(
                f"{len(missing)} job(s) have no duration_s (first: {missing[0]}); "
                "replay needs the work of every job (pack does not)"
            )
        dups = [i for i, n in Counter(tj.request.id for tj in jobs).items() if n > 1]
        if dups:
            raise ReplayError(f"job id {dups[0]!r} appears more than once")
        self.nodes = nodes
        self.models = {n.name: n.model for n in nodes}
        t0 = min((tj.submit_s for tj in jobs), default=0.0)
        t1 = max((tj.submit_s for tj in jobs), default=0.0)
        self.meter = _Meter(t0, t1)
        self.jobs = {tj.request.id: _Job(tj, self.meter) for tj in jobs}
        self.adjuster = Adjuster(adjust) if adjust is not None else None
        if self.adjuster is not None:
            _check_idle_profiles(self.jobs.values(), self.adjuster)
        self.running: dict[str, _Job] = {}  # running or terminating, in start order
        self._adjust_at: float | None = None  # the next adjustment pass
        self.sched = scheduler
        self.tick_s = tick_s
        self.progress = progress
        self.events: list[dict[str, Any]] = []
        self.heap: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        self.pending = 0
        self.active = 0  # running or terminating
        self.arrivals_left = len(jobs)
        self.ended = 0
        self.tick_no = 0
        self.result = ReplayResult(self.events, window_s=t1 - t0)
        self._pending_counts: Counter[str] = Counter()
        self._pending_samples = 0

    # -- the event queue ----------------------------------------------------------------------

    def _push(self, t: float, kind: int, job_id: str, tag: int) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, kind, self._seq, job_id, tag))

    def _emit(self, t: float, event: str, job: str, **extra: Any) -> None:
        record: dict[str, Any] = {"t": t, "event": event, "job": job}
        record.update(extra)
        self.events.append(record)

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> ReplayResult:
        began, began_cpu = time.perf_counter(), time.process_time()
        for j in self.jobs.values():
            self._push(j.tj.submit_s, _ARRIVE, j.id, 0)
        total = len(self.jobs)
        heap = self.heap
        while heap:
            now = heap[0][0]
            need_decision = ticked = False
            while heap and heap[0][0] <= now:
                _, kind, _, job_id, tag = heapq.heappop(heap)
                if kind == _TICK:
                    if tag == self.tick_no:  # older ticks were overtaken by a decision
                        need_decision = ticked = True
                elif kind == _CKPT:
                    self._checkpoint(now, job_id, tag)
                elif kind == _ADJUST:
                    need_decision |= self._adjust(now)
                else:
                    need_decision |= self._handle(now, kind, job_id, tag)
            if need_decision:
                changed = self._decide(now)
                if (
                    not changed
                    and ticked
                    and self.active == 0
                    and self.arrivals_left == 0
                    and self.pending
                    and not any(k not in (_TICK, _ADJUST) for _, k, *_ in heap)
                ):
                    break  # a quiet tick changed nothing and nothing else will: the rest is stuck
            if need_decision and self.pending and self.tick_s > 0:
                self.tick_no += 1  # the next tick comes tick_s after this decision
                self._push(now + self.tick_s, _TICK, "", self.tick_no)
            if self.progress is not None:
                self.progress(self.ended, total)
        self.result.unfinished = [j.id for j in self.jobs.values() if j.state != "done"]
        self.result.busy_gpu_seconds_while_arriving = self.meter.busy
        samples = max(1, self._pending_samples)
        self.result.pending_codes = {
            code: n / samples for code, n in sorted(self._pending_counts.items(), key=lambda kv: -kv[1])
        }
        self.result.wall_s = time.perf_counter() - began
        self.result.cpu_s = time.process_time() - began_cpu
        return self.result

    def _handle(self, now: float, kind: int, job_id: str, tag: int) -> bool:
        """One arrival or release. Returns whether the policy must decide afterwards."""
        job = self.jobs[job_id]
        if kind == _ARRIVE:
            job.state = "pending"
            self.pending += 1
            self.arrivals_left -= 1
            self._emit(now, "submit", job_id)
            self.sched.submit(job.tj.request)
            return True
        if kind == _FINISH:
            if job.state != "running" or tag != job.epoch:
                return False
            self._stop(now, job)
            self._emit(now, "finish", job_id)
            self._end(job)
            return True
        if kind == _LIMIT:
            if job.state != "running" or tag != job.attempt:
                return False
            job.advance(now)
            if job.work >= (job.tj.duration_s or 0.0) - _EPS:  # done at the very same moment
                self._stop(now, job)
                self._emit(now, "finish", job_id)
            else:
                self._stop(now, job)
                self._emit(now, "fail", job_id, reason="time-limit")
            self._end(job)
            return True
        if kind == _GRACE:
            if job.state != "terminating" or tag != job.attempt:
                return False
            self._stop(now, job)
            lost = max(0.0, job.work - job.ckpt_work) * job.gpus
            self.result.lost_gpu_seconds += lost
            self.result.preemptions += 1
            job.work = job.ckpt_work
            job.state = "pending"
            self.pending += 1
            self._emit(now, "preempt", job_id, reason=job.stop_reason, lost_gpu_seconds=round(lost, 3))
            self.sched.requeue(job.tj.request)
            return True
        if kind == _LEAVE:
            if job.kept is None or tag != job.attempt or job.state not in ("running", "terminating"):
                return False
            before = job.allocated
            job.placements, job.allocated, job.kept = job.kept, _capacity(job.kept), None
            extra = {"reason": job.kept_reason} if job.kept_reason else {}
            if job.kept_reason:  # the idle shrink's GPUs are back from now on
                job.reclaims.append((now, before - job.allocated))
                job.kept_reason = ""
            self._emit(now, "resize", job_id, allocations=allocations(job.placements), **extra)
            self.sched.release_leaving(job_id, now)
            return True
        raise AssertionError(kind)

    def _stop(self, now: float, job: _Job) -> None:
        """The job's processes exit: it stops working and its GPUs go back to the policy."""
        job.advance(now)
        self.running.pop(job.id, None)
        if job.reclaims:
            self.result.reclaimed_gpu_seconds += sum(g * (now - t) for t, g in job.reclaims)
            job.reclaims.clear()
        if self.adjuster is not None:
            self.adjuster.stopped(job.id)
        job.rate = 0.0
        job.epoch += 1
        job.attempt += 1
        job.placements, job.allocated, job.kept, job.kept_reason = (), 0.0, None, ""
        self.active -= 1
        self.sched.release(job.id, now)

    def _end(self, job: _Job) -> None:
        job.state = "done"
        self.ended += 1

    def _checkpoint(self, now: float, job_id: str, tag: int) -> None:
        job = self.jobs[job_id]
        if job.state != "running" or tag != job.epoch:
            return
        interval = job.tj.request.checkpoint_s or 0.0
        job.advance(now)
        # Snap to the checkpoint's exact amount of work so that float error never accumulates
        # (never back before a checkpoint-now of the adjustment pass).
        job.ckpt_work = max(job.ckpt_work, math.floor(job.work / interval + 1e-6) * interval)
        job.work = max(job.work, job.ckpt_work)
        self.sched.checkpoint(job_id, now)
        self._schedule_work(now, job)

    def _schedule_work(self, now: float, job: _Job) -> None:
        """Push the job's next checkpoint and its finish at its current rate."""
        if job.rate <= 0:
            return
        duration = job.tj.duration_s or 0.0
        interval = job.tj.request.checkpoint_s or 0.0
        if interval > 0:
            target = job.ckpt_work + interval
            while target <= job.work + _EPS:  # (a resize can jump past one)
                target += interval
            if target < duration - _EPS:
                self._push(now + (target - job.work) / job.rate, _CKPT, job.id, job.epoch)
        left = max(0.0, duration - job.work)
        self._push(now + left / job.rate, _FINISH, job.id, job.epoch)

    # -- decisions ----------------------------------------------------------------------------

    def _decide(self, now: float) -> bool:
        began = time.perf_counter()
        decisions: Decisions = self.sched.decide(now)
        self._first_estimates(decisions, now)
        self.result.decide_s += time.perf_counter() - began
        self.result.decide_calls += 1
        if self.result.decide_calls % PENDING_SAMPLE_EVERY == 1 and decisions.pending:
            self._pending_samples += 1
            for reason in decisions.pending.values():
                self._pending_counts[reason.code] += 1
        return self._apply(now, decisions)

    def _first_estimates(self, d: Decisions, now: float) -> None:
        """The estimate each job gets at the first pass that leaves it pending (what a user
        sees first), for the policies that give estimates."""
        estimate = getattr(self.sched, "estimate", None)
        seen = self.result.first_estimates
        new = [j for j in d.pending if j not in seen] if self.estimates else []
        if estimate is None or not new:
            return
        got = estimate(d, now, set(new))
        for job_id in new:
            seen[job_id] = got.get(job_id)

    def _set_rate(self, job: _Job, placements: tuple[Placement, ...]) -> None:
        job.placements = placements
        job.allocated = _capacity(placements)
        job.rate = self._rate(job)
        job.epoch += 1

    def _rate(self, job: _Job) -> float:
        """k/g on k of g GPUs; with --adjust on, min(1, k / demand): GPUs it keeps idle cost
        nothing when taken away."""
        working = _capacity(job.kept) if job.kept is not None else job.allocated
        if job.gpus <= 0 or working >= job.gpus:
            return 1.0
        if self.adjuster is None:
            return min(1.0, working / job.gpus)
        demand = job.demand.total(int(job.work // 60))
        return 1.0 if demand <= working else working / demand

    def _apply(self, now: float, d: Decisions) -> bool:
        changed = False
        for job_id, why in d.rejections.items():
            job = self.jobs.get(job_id)
            if job is None or job.state != "pending":
                continue
            self.pending -= 1
            self._emit(now, "reject", job_id, reason=why)
            self._end(job)
            changed = True
        # Resizes first: a shrink the policy made in the same pass as a preemption of that job
        # already took its removed replicas out of their size. Several resizes of one job in one
        # pass: the last one is its new set. A set within the old one is a shrink (its GPUs are
        # released after the grace period); any other takes effect at once, after the starts.
        final: dict[str, tuple[Placement, ...]] = {}
        for r in d.resizes:
            final[r.job_id] = r.placements
        grow: list[tuple[_Job, tuple[Placement, ...]]] = []
        bound = {b.job_id for b in d.bindings}
        for job_id, placements in final.items():
            job = self.jobs.get(job_id)
            if job is not None and job.state == "pending" and job_id in bound:
                grow.append((job, placements))  # started and grown in one pass: after its start
                continue
            if job is None or job.state not in ("running", "terminating"):
                continue
            changed = True
            before, after = _gpu_set(job.placements), _gpu_set(placements)
            if before == after:
                continue  # e.g. a shrink and a grow back in one pass
            if after < before:
                self._shrink(now, job, placements)
            else:
                grow.append((job, placements))
        for p in d.preemptions:
            job = self.jobs.get(p.job_id)
            if job is None or job.state != "running":
                continue
            job.advance(now)  # the signal: no more work from here on
            job.rate = 0.0
            job.epoch += 1
            job.attempt += 1
            job.state = "terminating"
            job.stop_reason = p.reason
            self._push(now + job.tj.request.grace_s, _GRACE, job.id, job.attempt)
            changed = True
        for b in d.bindings:
            job = self.jobs.get(b.job_id)
            if job is None or job.state != "pending":
                continue
            self.pending -= 1
            self.active += 1
            job.state = "running"
            job.since = now
            job.attempt += 1
            job.attempt_start = now
            self.running[job.id] = job
            if job.requeued is not None:  # reclaimed from its release to its restart
                self.result.reclaimed_gpu_seconds += job.requeued[1] * max(0.0, now - job.requeued[0])
                job.requeued = None
            self._set_rate(job, b.placements)
            if self.adjuster is not None:
                self.adjuster.placed(job.id, b.placements, new_attempt=True)
                self._arm_adjust(now)
            self._emit(now, "start", job.id, allocations=allocations(b.placements))
            self._schedule_work(now, job)
            limit = job.tj.request.time_limit_s
            if limit is not None:
                self._push(now + limit, _LIMIT, job.id, job.attempt)
            changed = True
        for job, placements in grow:
            if job.state == "running" and _gpu_set(placements) != _gpu_set(job.placements):
                self._resize(now, job, placements)
        return changed

    # -- the adjustment pass (--adjust on) -------------------------------------------------------

    def _arm_adjust(self, now: float) -> None:
        """Schedule the next pass, on the interval's grid, unless one is due."""
        if self.adjuster is None or self._adjust_at is not None:
            return
        interval = self.adjuster.options.interval_s
        self._adjust_at = (math.floor(now / interval + 1e-9) + 1) * interval
        self._push(self._adjust_at, _ADJUST, "", 0)

    def _adjust(self, now: float) -> bool:
        """One adjustment pass: sample the GPUs (every step), re-rate the jobs short of GPUs,
        ask the policy, act. Returns whether GPUs were freed (the scheduler decides then)."""
        adj = self.adjuster
        assert adj is not None
        self._adjust_at = None
        step = adj.settings.step_s
        sample = abs(now / step - round(now / step)) < 1e-9
        changed = False
        waiting: list[list[Waiting]] = []

        def pending() -> list[Waiting]:  # what waits, read once a pass when the policy needs it
            if not waiting:
                shapes = {
                    (j.tj.request.accelerators, j.tj.request.per_replica_gpus)
                    for j in self.jobs.values()
                    if j.state == "pending"
                }
                waiting.append([Waiting(m, g) for m, g in sorted(shapes)])
            return waiting[0]

        for job in list(self.running.values()):
            if job.state != "running":
                continue
            if sample:
                adj.sample(job.id, job.demand, job.work + job.rate * (now - job.since), now)
            if job.allocated < job.gpus or job.kept is not None:  # its demand moves with its work
                job.advance(now)
                rate = self._rate(job)
                if rate != job.rate:
                    job.rate = rate
                    job.epoch += 1
                    self._schedule_work(now, job)
            held = partial(held_by_node, job.kept if job.kept is not None else job.placements, self.models)
            action = adj.decide(job.tj, job.attempt_start, now, held, pending)
            if action is not None:
                changed |= self._act(now, job, action)
        if self.running:
            self._arm_adjust(now)
        return changed

    def _act(self, now: float, job: _Job, a: Adjustment) -> bool:
        adj = self.adjuster
        assert adj is not None
        counts = self.result.adjustments
        if a.action == WARN:
            counts[WARN] = counts.get(WARN, 0) + 1
            adj.warned(job.id, now)
            self._emit(now, "idle-warning", job.id, level=a.level, idle_s=round(a.idle_s, 1), reason=a.reason)
            return False
        req = job.tj.request
        if a.action == SHRINK:
            shrink = getattr(self.sched, "shrink", None)  # a policy that cannot shrink: warned only
            placements = shrink(job.id, a.to_gpus or 0, now) if shrink is not None else None
            if placements is None:
                return False
            # The engine's shrink, as live: the removed replicas' GPUs are held until they have
            # gone (after the job's grace period), then released (``resize`` with the reason).
            self._shrink(now, job, placements, reason=f"idle-reclaim: {a.reason}")
            adj.shrunk(job.id, now)
        elif a.action == REQUEUE:
            job.advance(now)
            if req.checkpoint_s:  # checkpoint-now: the requeue loses nothing
                job.ckpt_work = job.work
                self.sched.checkpoint(job.id, now)
            job.requeued = (now + req.grace_s, job.allocated)  # its GPUs are back after the grace
            stopping = getattr(self.sched, "stopping", None)  # as live: terminating, not a runtime
            if stopping is not None:
                stopping(job.id)
            job.rate = 0.0
            job.epoch += 1
            job.attempt += 1
            job.state = "terminating"
            job.stop_reason = f"idle-reclaim: {a.reason}"
            self._push(now + req.grace_s, _GRACE, job.id, job.attempt)
        else:
            return False
        counts[a.action] = counts.get(a.action, 0) + 1
        if not req.preemptible and job.tj.idle_reclaim != "allow":
            self.result.touched_non_preemptible.append(job.id)
        return True

    def _shrink(self, now: float, job: _Job, placements: tuple[Placement, ...], reason: str = "") -> None:
        """The removed replicas get their stop signal: the job goes on at the rate of those it
        keeps (the adjustment pass watches only those, as live); their GPUs are released after
        its grace period (``_LEAVE``)."""
        job.advance(now)
        job.kept, job.kept_reason = placements, reason
        if job.state == "running":
            job.rate = self._rate(job)
            job.epoch += 1
            self._schedule_work(now, job)
        if self.adjuster is not None:
            self.adjuster.placed(job.id, placements, new_attempt=False)
        self._push(now + job.tj.request.grace_s, _LEAVE, job.id, job.attempt)

    def _resize(self, now: float, job: _Job, placements: tuple[Placement, ...], **extra: Any) -> None:
        job.advance(now)
        if job.state == "terminating":  # in its grace period: new GPUs, still no work
            job.placements, job.allocated = placements, _capacity(placements)
        else:
            self._set_rate(job, placements)
        if self.adjuster is not None:
            self.adjuster.placed(job.id, placements, new_attempt=False)
        self._emit(now, "resize", job.id, allocations=allocations(placements), **extra)
        self._schedule_work(now, job)


def _check_idle_profiles(jobs: Iterable[_Job], adjuster: Adjuster) -> None:
    """With --adjust on, a job that idles all its GPUs for good, cannot checkpoint and may be
    requeued would restart from nothing into the same idle spell, again and again."""
    s = adjuster.settings
    for job in jobs:
        name, tj = job.demand.name, job.tj
        if not wholly_idle(name) or can_idle_safely(tj):
            continue
        after = float(name.rsplit("-", 1)[1]) * 60 if name != "idle" else 0.0
        if (tj.duration_s or 0.0) > after + s.exempt_s + s.act_after_s:
            raise ReplayError(
                f"job {job.id}: util_profile {name!r} idles all its GPUs for good and the job does "
                "not checkpoint: with --adjust on each requeue would restart it from nothing into "
                "the same idle spell; give it checkpoint_s, or make it not preemptible"
            )


def replay(
    nodes: Sequence[NodeSpec],
    jobs: Sequence[TraceJob],
    scheduler: Scheduler,
    *,
    tick_s: float = 300.0,
    progress: Progress | None = None,
    estimates: bool = False,
    adjust: AdjustOptions | None = None,
) -> ReplayResult:
    """Run ``jobs`` on ``nodes`` under ``scheduler`` and return the events and accounting;
    ``estimates``: keep the start estimate each job first gets (costly: a plan of the queue at
    nearly every pass); ``adjust``: run the adjustment pass (``--adjust on``)."""
    return Replay(
        nodes, jobs, scheduler, tick_s=tick_s, progress=progress, estimates=estimates, adjust=adjust
    ).run()
