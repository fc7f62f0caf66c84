"""The adjustment pass in simulated time (``replay --adjust on``): what it sees of each job.

Every ``interval_s`` (30 s, as live) the replay asks :class:`Adjuster` for the running jobs'
adjustments; the decision is ``scheduling.engine.adjust.decide_job``, the code the live pass runs,
with the live defaults (:class:`~scheduling.engine.adjust.IdleSettings`). Its input is what
Prometheus would hold: one point a GPU every ``step_s`` (60 s), the GPU's utilisation at that moment
of the job's work (:mod:`.utilisation`), for the GPUs the job holds, back as far as the policy can
use (its action time and two steps more). It is told what waits (the pending jobs' models and
replica sizes), as the live pass reads it, for the requeue rule.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scheduling.engine.adjust import Adjustment, GpuSeries, IdleSettings, JobFacts, Waiting, decide_job
from scheduling.engine.types import Placement
from scheduling.sim.traces import TraceJob
from scheduling.sim.utilisation import Demand


@dataclass(frozen=True, slots=True)
class AdjustOptions:
    """``replay --adjust on``'s knobs: the pass's interval and the policy's settings."""

    interval_s: float = 30.0
    settings: IdleSettings = IdleSettings()


class _Watch:
    """One running job as the pass sees it: its GPUs' recent points and its warnings."""

    __slots__ = ("gpus", "points", "runs", "warned_at", "acted_at")

    def __init__(self) -> None:
        self.gpus: list[str] = []  # "node/index", by rank in the job
        self.points: list[deque[tuple[float, float]]] = []
        self.runs: list[int] = []  # per GPU: its newest points under the threshold, in a row
        self.warned_at: list[float] = []
        self.acted_at: float | None = None


def gpu_names(placements: Sequence[Placement]) -> list[str]:
    """The job's GPUs by rank: replica by replica, in each replica's order (a fractional job's
    one GPU counts once)."""
    return [f"{p.node}/{g}" for p in sorted(placements, key=lambda p: p.replica) for g in p.gpus]


def held_by_node(placements: Sequence[Placement], models: Mapping[str, str]) -> tuple[tuple[str, int], ...]:
    """(GPU model, GPUs) on each node the job holds, by node name."""
    count: dict[str, int] = {}
    for p in placements:
        count[p.node] = count.get(p.node, 0) + len(p.gpus)
    return tuple((models.get(node, ""), n) for node, n in sorted(count.items()))


class Adjuster:
    def __init__(self, options: AdjustOptions) -> None:
        self.options = options
        self.settings = options.settings
        self.keep = int((self.settings.act_after_s + 2 * self.settings.max_gap_s) // self.settings.step_s) + 2
        self.watch: dict[str, _Watch] = {}
        s = self.settings
        self.first_deadline = min([*s.warn_after_s, s.act_after_s])

    def placed(self, job_id: str, placements: Sequence[Placement], new_attempt: bool) -> None:
        """The job started (a new attempt) or was resized: the GPUs it keeps keep their points."""
        old = None if new_attempt else self.watch.get(job_id)
        w = _Watch()
        if old is not None:
            w.warned_at, w.acted_at = old.warned_at, old.acted_at
        had = dict(zip(old.gpus, old.points, strict=True)) if old is not None else {}
        w.gpus = gpu_names(placements)
        w.points = [had.get(g) or deque(maxlen=self.keep) for g in w.gpus]
        w.runs = [_run(p, self.settings.threshold) for p in w.points]
        self.watch[job_id] = w

    def stopped(self, job_id: str) -> None:
        self.watch.pop(job_id, None)

    def sample(self, job_id: str, demand: Demand, work_s: float, now: float) -> None:
        w = self.watch.get(job_id)
        if w is None:
            return
        threshold = self.settings.threshold
        for rank, points in enumerate(w.points):
            util = demand.gpu(rank, work_s)
            points.append((now, util))
            w.runs[rank] = w.runs[rank] + 1 if util < threshold else 0

    def decide(
        self,
        tj: TraceJob,
        started_at: float,
        now: float,
        held: Callable[[], tuple[tuple[str, int], ...]] | None = None,
        waiting: Callable[[], Sequence[Waiting]] | None = None,
    ) -> Adjustment | None:
        """The policy's decision for a running job; ``held``: its GPUs by node (model, count)
        and ``waiting``: the pending jobs, both asked for only when the policy is to judge."""
        w = self.watch.get(tj.request.id)
        s = self.settings
        if w is None or not w.points or tj.interactive or now - started_at < s.exempt_s:
            return None
        # The policy does nothing before a GPU has been idle for its first deadline; points come
        # every step without holes, so a GPU's idle time is its run of idle points (each covers
        # the step before it) plus the time since the newest.
        newest = max((p[-1][0] for p in w.points if p), default=now)
        if max(w.runs) * s.step_s + (now - newest) < self.first_deadline:
            return None
        req = tj.request
        facts = JobFacts(
            id=req.id,
            tenant=req.tenant,
            gpus=len(w.gpus),
            started_at=started_at,
            preemptible=req.preemptible,
            interactive=tj.interactive,
            idle_reclaim=tj.idle_reclaim,
            elastic_min_gpus=req.elastic_min_gpus,
            per_replica_gpus=max(1, int(round(req.per_replica_gpus))),
            warned_at=tuple(w.warned_at),
            acted_at=w.acted_at,
            held=held() if held is not None else (),
        )
        series = [GpuSeries(g, tuple(p)) for g, p in zip(w.gpus, w.points, strict=True)]
        return decide_job(facts, series, s, now, waiting() if waiting is not None else None)

    def warned(self, job_id: str, now: float) -> None:
        w = self.watch.get(job_id)
        if w is not None:
            w.warned_at.append(now)

    def shrunk(self, job_id: str, now: float) -> None:
        w = self.watch.get(job_id)
        if w is not None:
            w.acted_at = now


def _run(points: deque[tuple[float, float]], threshold: float) -> int:
    n = 0
    for _, util in reversed(points):
        if util >= threshold:
            break
        n += 1
    return n
