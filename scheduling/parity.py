"""Live = simulated: one trace replayed through the live control plane and through the simulator.

The live side drives the real services on the configured database: jobs are submitted with
``do_submit_job``, every pass is ``services.passes.run_pass`` (its snapshot, its engine rebuilt
from the stored memory, its apply code), and the agents' reports are simulated in-process with
the agents' own services (``do_report_started``, ``do_report_checkpoint``, ``do_report_exits``).
Time is the simulator's: ``django.utils.timezone.now`` is the trace's clock (so every stored
timestamp, ``auto_now_add`` included, is simulated time), nodes heartbeat at every pass, the
pass's time budget is off. The simulator's :class:`~scheduling.sim.replay.Replay` is the driver
on both sides: it decides when jobs arrive, checkpoint, finish, hit their limit and end their
grace period, and calls the live side as it would call an engine.

The simulated side is one long-lived :class:`~scheduling.engine.policy.TesseraScheduler` with the
live pass's settings, fed the very jobs and nodes the live snapshot reads (the database's ids,
its rounding of times to microseconds), replaying the same trace.

A decision is (job, attempt, simulated time, start | preempt | resize, allocations); the two
lists are compared as multisets. Resizes are on on both sides: a grow's new replicas are
reported started at once; a shrink's removed replicas hold their GPUs until the replay's
``release_leaving`` (the grace period), when their exits are reported, as their agents would.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from unittest import mock

from django.conf import settings
from django.contrib.auth.models import User
from django.utils import timezone

from scheduling.choices import JobState
from scheduling.engine.config import EngineConfig
from scheduling.engine.geometry import geometry
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import (
    Binding,
    Decisions,
    JobRequest,
    NodeSpec,
    PendingReason,
    Placement,
    Preemption,
    QuotaSpec,
    Resize,
)
from scheduling.models import Allocation, Device, Job, Membership, Node, Quota, Tenant
from scheduling.services import passes
from scheduling.services.agents import ExitReport, do_report_checkpoint, do_report_exits, do_report_started
from scheduling.services.jobs import do_submit_job
from scheduling.services.snapshot import job_request, load_snapshot
from scheduling.sim.replay import replay
from scheduling.sim.traces import TraceJob

EPOCH = 1_767_225_600.0  # simulated time 0: 2026-01-01 00:00 UTC


def at(t: float) -> datetime:
    return datetime.fromtimestamp(EPOCH + t, tz=UTC)


@dataclass
class Clock:
    """The simulated clock every service reads (``timezone.now``)."""

    t: float = 0.0

    def now(self) -> datetime:
        return at(self.t)


@dataclass(frozen=True, slots=True)
class Decision:
    job: str  # the trace's id
    attempt: int
    t: float
    kind: str  # start | preempt | resize
    allocations: tuple[tuple[int, str, tuple[int, ...], float], ...] = ()


@dataclass
class ParityResult:
    jobs: int
    live: list[Decision]
    simulated: list[Decision]
    live_passes: int = 0
    pending_codes_differing: int = 0  # passes at one time whose pending jobs' codes differ
    unpaired_passes: int = 0  # passes at a time the other side made none
    first_difference: tuple[Decision | None, Decision | None] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def differing(self) -> int:
        a, b = Counter(self.simulated), Counter(self.live)
        return max(sum((a - b).values()), sum((b - a).values()))

    def line(self) -> dict[str, int]:
        return {"jobs": self.jobs, "decisions": len(self.simulated), "differing_decisions": self.differing}


class _Recorder:
    """Turns one side's decisions into :class:`Decision` rows, per pass, and keeps the pending
    codes it gave."""

    def __init__(self, ids: dict[str, str], offset: float = 0.0) -> None:
        self.ids = ids  # engine id -> trace id
        self.offset = offset  # the side's time of the trace's time 0
        self.decisions: list[Decision] = []
        self.codes: dict[float, dict[str, str]] = {}  # per pass, by its time
        self.rejected: set[str] = set()
        self.starts: Counter[str] = Counter()

    def note(self, t: float, d: Decisions) -> None:
        t -= self.offset
        for p in d.preemptions:
            job = self.ids.get(p.job_id, p.job_id)
            self.decisions.append(Decision(job, self.starts[job], _t(t), "preempt"))
        for b in d.bindings:
            job = self.ids.get(b.job_id, b.job_id)
            self.starts[job] += 1
            self.decisions.append(Decision(job, self.starts[job], _t(t), "start", _allocations(b.placements)))
        final = {r.job_id: r.placements for r in d.resizes}  # the last of a job's in a pass
        for job_id, placements in final.items():
            job = self.ids.get(job_id, job_id)
            self.decisions.append(Decision(job, self.starts[job], _t(t), "resize", _allocations(placements)))
        self.codes[_t(t)] = {self.ids.get(j, j): r.code for j, r in d.pending.items()}
        self.rejected.update(self.ids.get(j, j) for j in d.rejections)


def _t(t: float) -> float:
    """Milliseconds, by way of the microseconds both sides store: the live side's time comes
    back from a datetime, so the same moment can differ in the last bits of the float, and
    rounding those straight to milliseconds once split 72577.7875 into .787 and .788."""
    return round(round(t, 6), 3)


def _allocations(placements: Sequence[Placement]) -> tuple[tuple[int, str, tuple[int, ...], float], ...]:
    return tuple(sorted((p.replica, p.node, tuple(sorted(p.gpus)), round(p.share, 3)) for p in placements))


class PassWorker:
    """Passes run in a worker process of their own (``scheduling.parity_worker``), which
    :meth:`kill` ends with SIGKILL; the next pass starts a new one."""

    def __init__(self, database_url: str) -> None:
        self.env = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": "", "TESSERA_PASS_LOOP": "0"}
        self.process: subprocess.Popen[str] | None = None
        self.started = 0

    def run(self, t: float) -> dict[str, list[str]] | None:
        if self.process is None:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "scheduling.parity_worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=self.env,
            )
            self.started += 1
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{t!r}\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the pass worker died")
        return json.loads(line)

    def kill(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
            self.process = None


class LiveSide:
    """The live control plane as a :class:`~scheduling.engine.types.Scheduler` for the replay.
    With a ``worker``, each pass runs in that worker process, killed after the passes numbered in
    ``kill_after``; without, in this process."""

    def __init__(
        self,
        clock: Clock,
        nodes: Sequence[NodeSpec],
        quotas: Sequence[QuotaSpec],
        worker: PassWorker | None = None,
        kill_after: frozenset[int] = frozenset(),
    ) -> None:
        self.clock = clock
        self.worker = worker
        self.kill_after = kill_after
        self.users: dict[str, tuple[User, Tenant]] = {}
        self.pk: dict[str, int] = {}  # trace id -> job id
        self.trace_id: dict[str, str] = {}  # job id (as the engine names it) -> trace id
        self.requests: dict[str, JobRequest] = {}  # trace id -> the request as the database holds it
        self.recorder = _Recorder({})  # its decisions are named by the trace's ids already
        self.passes = 0
        for q in quotas:
            tenant = self._tenant(q.tenant)
            Quota.objects.create(
                tenant=tenant, model=q.model, guaranteed=q.guaranteed, limit=q.limit, weight=q.weight
            )
        for spec in nodes:
            self._node(spec)

    def _tenant(self, name: str) -> Tenant:
        if name not in self.users:
            tenant, _ = Tenant.objects.get_or_create(name=name)
            user = User.objects.create_user(f"parity-{name}")
            Membership.objects.create(user=user, tenant=tenant)
            self.users[name] = (user, tenant)
        return self.users[name][1]

    def _node(self, spec: NodeSpec) -> None:
        labels = {k: v for k, v in spec.labels if k != "rack"}
        node = Node.objects.create(
            name=spec.name,
            rack=spec.rack,
            kind=spec.kind,
            labels=labels,
            taints=list(spec.taints),
            nvlink_domain=spec.nvlink_domain,
            cpus=spec.cpus,
            memory_gib=spec.memory_gib,
            price_per_gpu_hour=spec.price_per_gpu_hour,
            last_heartbeat=self.clock.now(),
        )
        d = max(1, spec.nvlink_domain)
        Device.objects.bulk_create(
            Device(node=node, index=i, uuid=f"GPU-{spec.name}-{i}", model=spec.model, nvlink_island=i // d)
            for i in range(spec.gpus)
        )

    # -- the replay's calls ----------------------------------------------------------------------
    def submit(self, job: JobRequest) -> None:
        self.clock.t = job.submitted_at
        self._tenant(job.tenant)
        user, tenant = self.users[job.tenant]
        fields = _job_fields(job)
        stored, _ = do_submit_job(user, tenant, fields, body={**fields, "trace_id": job.id})
        self.pk[job.id] = stored.pk
        self.trace_id[str(stored.pk)] = job.id
        self.requests[job.id] = job_request(stored)

    def cancel(self, job_id: str) -> None:
        raise NotImplementedError("traces do not cancel jobs")

    def release(self, job_id: str, now: float) -> None:
        self.clock.t = now
        job = Job.objects.get(pk=self.pk[job_id])
        by_node: dict[int, list[ExitReport]] = {}
        for a in Allocation.objects.filter(job=job, released_at__isnull=True).order_by("replica"):
            by_node.setdefault(a.node_id, []).append(ExitReport(job.pk, job.attempts, a.replica, 0))
        for node_id, reports in sorted(by_node.items()):
            (result,) = set(map(type, do_report_exits(Node.objects.get(pk=node_id), reports)))
            assert result is tuple, f"exit of job {job_id} refused: {result}"

    def requeue(self, job: JobRequest) -> None:
        pass  # the exit of a preempted job put it back in the queue (Settlement.exit)

    def release_leaving(self, job_id: str, now: float) -> None:
        self.clock.t = now
        job = Job.objects.get(pk=self.pk[job_id])
        by_node: dict[int, list[ExitReport]] = {}
        leaving = Allocation.objects.filter(job=job, released_at__isnull=True, leaving_at__isnull=False)
        for a in leaving.order_by("replica"):
            # stopped by its agent (SIGTERM): not the job's own failure
            by_node.setdefault(a.node_id, []).append(ExitReport(job.pk, job.attempts, a.replica, 143))
        for node_id, reports in sorted(by_node.items()):
            (result,) = set(map(type, do_report_exits(Node.objects.get(pk=node_id), reports)))
            assert result is tuple, f"exit of job {job_id}'s removed replicas refused: {result}"

    def checkpoint(self, job_id: str, t: float) -> None:
        self.clock.t = t
        job = Job.objects.get(pk=self.pk[job_id])
        held = Allocation.objects.filter(job=job, released_at__isnull=True).first()
        assert held is not None, f"job {job_id} checkpoints while holding no GPU"
        node = held.node
        do_report_checkpoint(node, job.pk, job.attempts, EPOCH + t)

    def decide(self, now: float) -> Decisions:
        self.clock.t = now
        moment = self.clock.now()
        Node.objects.update(last_heartbeat=moment)
        if self.worker is not None:
            answer = self.worker.run(now)
            if self.passes in self.kill_after:
                self.worker.kill()
            bound, preempted, resized = (
                (answer["bound"], answer["preempted"], answer["resized"]) if answer else ([], [], [])
            )
        else:
            result = passes.run_pass(moment, max_rounds=1)
            bound, preempted, resized = (
                (result.bound, result.preempted, result.resized) if result else ([], [], [])
            )
        self.passes += 1
        d = Decisions()
        ids = self.trace_id  # the replay knows the jobs by the trace's ids
        for pk in preempted:
            d.preemptions.append(Preemption(ids[pk], "preempted"))
        jobs = {str(j.pk): j for j in Job.objects.filter(pk__in=[int(p) for p in bound])}
        for pk in bound:
            job = jobs[pk]
            allocs = list(  # (not the replicas a grow added in the same pass: a resize's)
                Allocation.objects.filter(job=job, released_at__isnull=True, joining=False).select_related(
                    "node", "device"
                )
            )
            d.bindings.append(Binding(ids[pk], _placements(allocs)))
            for a in {a.replica: a for a in allocs}.values():  # the agents start each replica now
                do_report_started(a.node, job.pk, job.attempts, a.replica, EPOCH + now)
        for pk in resized:
            job = Job.objects.get(pk=int(pk))
            allocs = list(
                Allocation.objects.filter(
                    job=job, released_at__isnull=True, leaving_at__isnull=True
                ).select_related("node", "device")
            )
            d.resizes.append(Resize(ids[pk], _placements(allocs)))
            for a in {a.replica: a for a in allocs if a.joining}.values():  # a grow's new replicas start
                do_report_started(a.node, job.pk, job.attempts, a.replica, EPOCH + now)
        for job_pk, code, why in Job.objects.filter(state=JobState.PENDING).values_list(
            "pk", "pending_code", "pending_reason"
        ):
            if code == "capacity" and why and not why.startswith("capacity:"):
                # the engine rejected it (no node can ever hold it): the live pass keeps it
                # pending, saying why; the replay ends it, as the simulator does
                d.rejections[ids[str(job_pk)]] = why
            else:
                d.pending[ids[str(job_pk)]] = PendingReason(code or "", "")
        self.recorder.note(now, d)
        return d


def _placements(allocs: list[Allocation]) -> tuple[Placement, ...]:
    by_replica: dict[int, tuple[str, list[int], int]] = {}
    for a in allocs:
        node, gpus, share = by_replica.setdefault(a.replica, (a.node.name, [], a.share_milli))
        if a.device is not None:
            gpus.append(a.device.index)
    return tuple(
        Placement(r, node, tuple(sorted(gpus)), share / 1000 if gpus and share < 1000 else 1.0)
        for r, (node, gpus, share) in sorted(by_replica.items())
    )


def _job_fields(job: JobRequest) -> dict[str, Any]:
    """The model fields of a submit of ``job`` (as a validated body would give them)."""
    need = geometry(job).need
    return {
        "name": job.id,
        "kind": job.kind,
        "command": ["true"],
        "gpus": job.gpus,
        "replicas": job.replicas,
        "min_available": job.min_available or need,
        "accelerators": list(job.accelerators),
        "topology": job.topology,
        "priority": job.priority,
        "preemptible": job.preemptible,
        "grace_seconds": math.ceil(job.grace_s),
        "checkpoint_seconds": math.ceil(job.checkpoint_s) if job.checkpoint_s else None,
        "time_limit_seconds": math.ceil(job.time_limit_s) if job.time_limit_s else None,
        "cpus": job.cpus,
        "memory_gib": job.memory_gib,
        "node_selector": dict(job.node_selector),
        "prefer_labels": dict(job.prefer_labels),
        "elastic_min_gpus": job.elastic_min_gpus,
        "elastic_max_gpus": job.elastic_max_gpus,
    }


class SimulatedSide(TesseraScheduler):
    """One long-lived engine, as the simulator runs it, recording its decisions."""

    recorder: _Recorder

    def decide(self, now: float, deadline=None) -> Decisions:
        d = super().decide(now, deadline)
        self.recorder.note(now, d)
        return d


@contextmanager
def live_settings(clock: Clock) -> Iterator[None]:
    """The live services on the simulated clock, passes in-process, no time budget."""
    tessera = {**settings.TESSERA, "EMBEDDED_PASSES": True, "PASS_BUDGET_S": 1e9}
    with (
        mock.patch.object(timezone, "now", clock.now),
        mock.patch.object(settings, "TESSERA", tessera),
        mock.patch.object(settings, "REDIS_URL", ""),
    ):
        yield


def run_parity(
    nodes: Sequence[NodeSpec],
    jobs: Sequence[TraceJob],
    quotas: Sequence[QuotaSpec],
    tick_s: float = 300.0,
    worker: PassWorker | None = None,
    kill_after: frozenset[int] = frozenset(),
) -> ParityResult:
    """Replay ``jobs`` through the live control plane (on the configured database, which must
    hold no cluster yet) and through the simulator; compare their decisions. With a ``worker``,
    the passes run in a worker process killed after each pass numbered in ``kill_after``."""
    clock = Clock()
    with live_settings(clock):
        live = LiveSide(clock, sorted(nodes, key=lambda n: n.name), quotas, worker, kill_after)
        try:
            replay(nodes, jobs, live, tick_s=tick_s)
        finally:
            if worker is not None:
                worker.kill()
        config: EngineConfig = passes.engine_config()
        loaded = load_snapshot(clock.now())
    # The simulated side sees what the live snapshot reads: its node specs (in its order) and the
    # jobs as stored (their database ids, their times to the microsecond).
    live_nodes = loaded.snapshot.nodes
    same = [
        TraceJob(live.requests[tj.request.id], live.requests[tj.request.id].submitted_at, tj.duration_s)
        for tj in jobs
    ]
    sim = SimulatedSide(live_nodes, tuple(quotas), config)
    sim.recorder = _Recorder({str(pk): tid for tid, pk in live.pk.items()}, offset=EPOCH)
    replay(live_nodes, same, sim, tick_s=tick_s)
    out = ParityResult(len(jobs), live.recorder.decisions, sim.recorder.decisions, live.passes)
    # A job no node can ever hold: the simulator rejects it (it ends); the live control plane
    # keeps it pending with the code "capacity" (nodes may join). Not a decision; left out.
    rejected = sim.recorder.rejected
    if rejected:
        out.notes.append(f"{len(rejected)} job(s) the simulator rejected stay pending live (capacity)")
    # The two sides' passes are compared at the times both made one: an event of one side can
    # fall a microsecond off the other's (the database keeps microseconds), and two events that
    # coincide on one side then cost the other two passes.
    times = live.recorder.codes.keys() & sim.recorder.codes.keys()
    out.unpaired_passes = len(live.recorder.codes.keys() ^ sim.recorder.codes.keys())
    for t in sorted(times):
        a = {j: c for j, c in live.recorder.codes[t].items() if j not in rejected}
        b = {j: c for j, c in sim.recorder.codes[t].items() if j not in rejected}
        if a != b:
            out.pending_codes_differing += 1
            out.notes.append(
                f"pass at {t}: pending codes differ: "
                + ", ".join(
                    f"{j} live {a.get(j)} simulated {b.get(j)}"
                    for j in sorted(set(a) | set(b))
                    if a.get(j) != b.get(j)
                )
            )
    diff = [(x, y) for x, y in zip(out.simulated, out.live, strict=False) if x != y]
    if diff:
        out.first_difference = diff[0]
    elif len(out.simulated) != len(out.live):
        n = min(len(out.simulated), len(out.live))
        out.first_difference = (
            out.simulated[n] if n < len(out.simulated) else None,
            out.live[n] if n < len(out.live) else None,
        )
    return out
