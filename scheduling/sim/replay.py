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
4. ``time_limit_s`` is a hard per-attempt limit: a job still running at its limit fails
   (``fail``, reason ``time-limit``).
5. Rejections become ``reject`` events. At one time, releases come before binds in the output.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduling.engine.types import Decisions, Estimate, NodeSpec, Placement, Scheduler
from scheduling.sim.traces import TraceJob

# Internal event kinds, in the order they are handled at one time (releases first).
_FINISH, _LIMIT, _GRACE, _CKPT, _ARRIVE, _TICK = range(6)
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


class _Job:
    """The simulator's view of one job: progress, rate, and the attempt it is in."""

    __slots__ = (
        "tj", "id", "gpus", "state", "work", "ckpt_work", "rate", "since", "epoch",
        "attempt", "attempt_start", "placements", "allocated", "stop_reason",
    )  # fmt: skip

    def __init__(self, tj: TraceJob) -> None:
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

    def advance(self, now: float) -> None:
        if self.rate:
            self.work += self.rate * (now - self.since)
        self.since = now


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
        self.jobs = {tj.request.id: _Job(tj) for tj in jobs}
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
        self.result = ReplayResult(self.events)
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
                    and not any(k != _TICK for _, k, *_ in heap)
                ):
                    break  # a quiet tick changed nothing and nothing else will: the rest is stuck
            if need_decision and self.pending and self.tick_s > 0:
                self.tick_no += 1  # the next tick comes tick_s after this decision
                self._push(now + self.tick_s, _TICK, "", self.tick_no)
            if self.progress is not None:
                self.progress(self.ended, total)
        self.result.unfinished = [j.id for j in self.jobs.values() if j.state != "done"]
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
        raise AssertionError(kind)

    def _stop(self, now: float, job: _Job) -> None:
        """The job's processes exit: it stops working and its GPUs go back to the policy."""
        job.advance(now)
        job.rate = 0.0
        job.epoch += 1
        job.attempt += 1
        job.placements, job.allocated = (), 0.0
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
        # Snap to the checkpoint's exact amount of work so that float error never accumulates.
        job.ckpt_work = math.floor(job.work / interval + 1e-6) * interval
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
        job.rate = 1.0 if job.gpus <= 0 else min(1.0, job.allocated / job.gpus)
        job.epoch += 1

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
        # already freed GPUs in its own state. Several resizes of one job in one pass: the last
        # one is its new set. Written in an order a reader can replay: sets that only shrink, then
        # the starts, then sets that only grow; a set that does both is written as a shrink to
        # the replicas it keeps, and later as its full new set.
        final: dict[str, tuple[Placement, ...]] = {}
        for r in d.resizes:
            final[r.job_id] = r.placements
        shrink: list[tuple[_Job, tuple[Placement, ...]]] = []
        grow: list[tuple[_Job, tuple[Placement, ...]]] = []
        for job_id, placements in final.items():
            job = self.jobs.get(job_id)
            if job is None or job.state not in ("running", "terminating"):
                continue
            changed = True
            before, after = _gpu_set(job.placements), _gpu_set(placements)
            if before == after:
                continue  # e.g. a shrink and a grow back in one pass
            if before <= after:
                grow.append((job, placements))
                continue
            if not after <= before:
                kept = tuple(p for p in placements if _gpu_set((p,)) <= before)
                if kept:
                    shrink.append((job, kept))
                    grow.append((job, placements))
                    continue
            shrink.append((job, placements))
        # Pure shrinks first; a set moved wholly elsewhere after them, since it also takes GPUs.
        shrink.sort(key=lambda jp: not _gpu_set(jp[1]) <= _gpu_set(jp[0].placements))
        for job, placements in shrink:
            self._resize(now, job, placements)
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
            self._set_rate(job, b.placements)
            self._emit(now, "start", job.id, allocations=allocations(b.placements))
            self._schedule_work(now, job)
            limit = job.tj.request.time_limit_s
            if limit is not None:
                self._push(now + limit, _LIMIT, job.id, job.attempt)
            changed = True
        for job, placements in grow:
            self._resize(now, job, placements)
        return changed

    def _resize(self, now: float, job: _Job, placements: tuple[Placement, ...]) -> None:
        job.advance(now)
        if job.state == "terminating":  # in its grace period: new GPUs, still no work
            job.placements, job.allocated = placements, _capacity(placements)
        else:
            self._set_rate(job, placements)
        self._emit(now, "resize", job.id, allocations=allocations(placements))
        self._schedule_work(now, job)


def replay(
    nodes: Sequence[NodeSpec],
    jobs: Sequence[TraceJob],
    scheduler: Scheduler,
    *,
    tick_s: float = 300.0,
    progress: Progress | None = None,
    estimates: bool = False,
) -> ReplayResult:
    """Run ``jobs`` on ``nodes`` under ``scheduler`` and return the events and accounting;
    ``estimates``: keep the start estimate each job first gets (costly: a plan of the queue at
    nearly every pass)."""
    return Replay(nodes, jobs, scheduler, tick_s=tick_s, progress=progress, estimates=estimates).run()
