"""The live pass's way of scheduling, in the simulator: a fresh engine every pass.

The simulator keeps one :class:`~scheduling.engine.policy.TesseraScheduler` for a whole trace;
the live control plane cannot (every pass may run in another worker process), so it keeps the
world in its database and the engine's memory in a table, and builds an engine from both each
pass. :class:`PerPassScheduler` does the same with the simulator's calls: it keeps what the
database would (pending and running jobs, finished runs) and the engine's memory *as the JSON
document the live pass stores*, and each :meth:`decide` builds an engine from a snapshot of them.
Replaying one trace with it and with the long-lived engine tells whether the memory is complete:
any difference in a decision is something the engine remembers that the memory does not carry.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from scheduling.engine.config import EngineConfig
from scheduling.engine.memory import EngineMemory
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.runtimes import KEEP
from scheduling.engine.types import (
    Decisions,
    Estimate,
    FinishedRun,
    JobRequest,
    NodeSpec,
    Placement,
    QuotaSpec,
    RunningJob,
    Snapshot,
)

HISTORY_KEEP = KEEP  # finished runs kept per (tenant, kind) and (user, name), as the live pass reads them


@dataclass(slots=True)
class _Run:
    job: JobRequest
    placements: tuple[Placement, ...]
    started_at: float
    last_checkpoint_at: float | None = None
    terminating: bool = False
    cancelled: bool = False
    leaving: tuple[Placement, ...] = ()  # replicas a shrink removed, until they exit
    leaving_until: float | None = None


class PerPassScheduler:
    """A :class:`~scheduling.engine.types.Scheduler` that forgets everything between passes but
    what the live control plane keeps. ``shuffle``: hand the engine the snapshot's jobs in
    another order than their arrival (by id, reversed), as a database might."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        quotas: Sequence[QuotaSpec] = (),
        config: EngineConfig | None = None,
        *,
        shuffle: bool = False,
    ) -> None:
        self.nodes = tuple(nodes)
        self.quotas = tuple(quotas)
        self.config = config or EngineConfig()
        self.shuffle = shuffle
        self.pending: dict[str, JobRequest] = {}
        self.running: dict[str, _Run] = {}
        self.history: dict[tuple[str, str, str], list[FinishedRun]] = {}
        self.stored: str | None = None  # the engine's memory, as the live pass stores it
        self._engine: TesseraScheduler | None = None  # the last pass's, for its estimates
        self.passes = 0

    def submit(self, job: JobRequest) -> None:
        self.pending[job.id] = job

    def cancel(self, job_id: str) -> None:
        self.pending.pop(job_id, None)
        run = self.running.get(job_id)
        if run is not None:
            run.cancelled = True

    def release(self, job_id: str, now: float) -> None:
        run = self.running.pop(job_id, None)
        if run is None:
            return
        outcome = "cancelled" if run.cancelled else "preempted" if run.terminating else "succeeded"
        job = run.job
        if outcome != "succeeded":
            return  # the predictors never learn from a preempted or cancelled run
        done = FinishedRun(
            job.id, job.tenant, job.kind, now - run.started_at, now, outcome, job.user, job.name, job.gpus
        )
        # what the live pass reads: the latest few that ended on their own, per tenant and kind
        # and per user and name
        keys = [("kind", job.tenant, job.kind)] + (
            [("named", job.user, job.name)] if job.user and job.name else []
        )
        for key in keys:
            runs = self.history.setdefault(key, [])
            runs.append(done)
            runs[:] = sorted(runs, key=lambda r: (r.ended_at, r.job_id))[-HISTORY_KEEP:]

    def release_leaving(self, job_id: str, now: float) -> None:
        run = self.running.get(job_id)
        if run is not None:
            run.leaving, run.leaving_until = (), None

    def stopping(self, job_id: str) -> None:
        run = self.running.get(job_id)
        if run is not None:
            run.terminating = True

    def requeue(self, job: JobRequest) -> None:
        self.running.pop(job.id, None)
        self.pending[job.id] = job

    def checkpoint(self, job_id: str, at: float) -> None:
        run = self.running.get(job_id)
        if run is not None:
            run.last_checkpoint_at = at

    def snapshot(self, now: float) -> Snapshot:
        pending = list(self.pending.values())
        running = [
            RunningJob(
                r.job,
                r.placements,
                r.started_at,
                r.last_checkpoint_at,
                r.terminating or r.cancelled,
                r.leaving,
                r.leaving_until,
            )
            for r in self.running.values()
        ]
        if self.shuffle:
            pending.sort(key=lambda j: j.id, reverse=True)
            running.sort(key=lambda r: r.job.id, reverse=True)
        history = tuple({r.job_id: r for runs in self.history.values() for r in runs}.values())
        return Snapshot(now, self.nodes, tuple(running), tuple(pending), self.quotas, history)

    def decide(self, now: float) -> Decisions:
        memory = EngineMemory.from_json(json.loads(self.stored)) if self.stored is not None else None
        engine = TesseraScheduler.from_snapshot(self.snapshot(now), self.config, memory)
        d = engine.decide(now)
        self.stored = json.dumps(engine.memory().to_json())
        self._engine = engine
        self.passes += 1
        self.apply(d, now)
        return d

    def estimate(
        self, d: Decisions, now: float, wanted: Collection[str] | None = None
    ) -> dict[str, Estimate]:
        """The last pass's start estimates, as the live pass makes them: by that pass's engine,
        its memory stored again after (what the estimates learnt is kept with it)."""
        if self._engine is None:
            return {}
        got = self._engine.estimate(d, now, wanted)
        self.stored = json.dumps(self._engine.memory().to_json())
        return got

    def apply(self, d: Decisions, now: float) -> None:
        """What the live pass writes of a pass's decisions, in the jobs kept here."""
        for jid in d.rejections:
            self.pending.pop(jid, None)
        for b in d.bindings:
            job = self.pending.pop(b.job_id)
            self.running[job.id] = _Run(job, b.placements, now)
        for r in d.resizes:
            run = self.running.get(r.job_id)
            if run is not None:
                kept = {p.replica for p in r.placements}
                gone = tuple(p for p in run.placements if p.replica not in kept)
                if gone:  # a shrink: the removed replicas hold their GPUs until they exit
                    run.leaving, run.leaving_until = gone, now + run.job.grace_s
                run.placements = r.placements
        for p in d.preemptions:
            self.running[p.job_id].terminating = True
