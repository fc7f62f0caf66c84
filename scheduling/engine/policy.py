"""Tessera's policy: one scheduling pass, in this order.

1. Refresh the request mix that defines fragmentation (last ``frag_window`` submitted jobs).
2. Order the pending jobs (:mod:`.queues`): level (aged jobs promoted), priority, fair share,
   arrival.
3. For each job: held / backoff / never-runnable (rejected) / quota; then try to place it
   (:mod:`.topology`), honouring the reservations made so far (:mod:`.backfill`).
4. If it does not fit: shrink elastic jobs behind it if that alone makes room; else preempt
   (:mod:`.preemption`); else, if it is aged or the first blocked job, reserve nodes for it.
   An inference job (the preemptor levels) preempts instead of shrinking when its victims'
   grace periods free its room sooner than the shrunk jobs' grace period would.
   Steps 3-4 stop at the driver's deadline, if it gives one: the jobs not reached wait for the
   next pass.
5. Grow elastic jobs and partially started gangs with what is left.
   (Shrinking in 4 and growing in 5 only with ``config.resizes``.) A shrink does not start the
   job it makes room for at once: the replicas it removes keep their GPUs, and their tenant's
   quota, until their processes have exited (the driver's
   :meth:`TesseraScheduler.release_leaving`, at the latest after the shrunk job's grace period),
   and the room is held for that job meanwhile, as for a preemption.
   A job whose shrink is under way is neither shrunk nor grown again until it is done.
6. Give every job still pending its reason (:mod:`.reasons`), diagnosed on the final state.

Step 1 is :meth:`TesseraScheduler.decide`'s; steps 2-6 are :class:`.policy_pass.PolicyPass`'s, one
method each. :class:`TesseraScheduler` keeps the cluster, the queue, what each pass leaves for the
next, and the questions the pass asks of them (where a job fits, what its quota admits, whom it
may preempt, where to reserve).

Bindings, resizes and preemption marks are applied to the engine's own state as they are made;
a preempted job keeps its GPUs until the driver calls :meth:`TesseraScheduler.release`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from . import eta, queues
from .backfill import (
    History,
    Reservation,
    Reservations,
    gang_shape,
    node_ready_time,
    reserve,
)
from .buddy import order_for
from .config import EngineConfig
from .eta_learnt import Learnt
from .fragmentation import FragmentationModel, Shape, shape_of, to_milli
from .geometry import Geometry, constraints, geometry, static_check
from .kept_history import KeptHistory
from .memory import EngineMemory, HeldReservation, HeldRoom
from .placement import Constraints, Placer, selects
from .policy_pass import PolicyPass
from .preemption import Hypo, Victim
from .quota import Quotas
from .runtimes import RecentRuns
from .state import Alloc, ClusterState, leaving_key, placements_of
from .topology import place_gang
from .types import (
    MILLI,
    Binding,
    Deadline,
    Decisions,
    Estimate,
    JobRequest,
    NodeSpec,
    Placement,
    QuotaSpec,
    RunningJob,
    Snapshot,
)

_NOTE_ANY: tuple[float, frozenset[str]] = (-math.inf, frozenset())  # nothing counted yet in the request mix


@dataclass(slots=True)
class Running:
    job: JobRequest
    geo: Geometry
    started_at: float
    last_checkpoint: float | None = None
    terminating: bool = False
    cancelled: bool = False
    charged: list[tuple[str, int]] = field(default_factory=list)  # (model, milli) per replica
    # Replicas a shrink removed, still holding their GPUs until their processes exit (taken in
    # the cluster state under :func:`leaving_key`), and when their grace period ends at the latest.
    leaving: list[Alloc] = field(default_factory=list)
    leaving_until: float = 0.0
    # What the leaving replicas are charged (model, milli): on the tenant's quota until they exit.
    leaving_charged: list[tuple[str, int]] = field(default_factory=list)


class TesseraScheduler:
    """The default policy; implements :class:`~.types.Scheduler`."""

    def __init__(
        self,
        nodes: tuple[NodeSpec, ...] | list[NodeSpec],
        quotas: tuple[QuotaSpec, ...] | list[QuotaSpec] = (),
        config: EngineConfig | None = None,
    ):
        self.config = config or EngineConfig()
        self.nodes = tuple(nodes)
        self.state = ClusterState(self.nodes, FragmentationModel(()), seed=self.config.seed)
        self.state.min_split_order = order_for(max(1, self.config.min_split_gpus))
        if self.config.exclusive_gpu_shares:
            self.state.keep_share_tenants()
        self.placer = Placer(self.state, self.config.alpha, self.config.beta, self.config.delta)
        self.quotas = Quotas(quotas)
        self.pending: dict[str, JobRequest] = {}
        self.running: dict[str, Running] = {}
        self.history = History()
        self.recent_runs = RecentRuns()  # the start estimates' runtime history (:mod:`.runtimes`)
        # Whether the two histories are shared with other engines (:mod:`.kept_history`): a run
        # is then recorded into copies of this engine's own.
        self._histories_shared = False
        self.eta_learnt = Learnt()  # how its first start estimates turned out (:mod:`.eta_learnt`)
        self.recent: deque[Shape] = deque(maxlen=self.config.frag_window)
        self._recent_changes = 0
        self._static: dict[tuple[Any, ...], tuple[str, str] | None] = {}
        self.models = tuple(sorted({n.model for n in self.nodes if n.gpus and n.model}))
        self.last_reservations: list[Reservation] = []
        self._fail_memo: dict[tuple[Any, ...], int] = {}
        self._owed: dict[str, list[str]] = {}
        self._now = 0.0
        # refusal's answers, kept while quota usage (its version), the owed models and the time
        # stand: a job asks the same of each model and replica count, and so does every job
        # after it that starts nowhere (docs/benchmarks/scheduling-pass.md).
        self._refusals: dict[tuple[str, str, int, bool, bool], tuple[str, str] | None] = {}
        self._refusals_at: tuple[Quotas | None, int] = (None, 0)
        self.last_codes: dict[str, str] = {}  # job -> its pending code in the last pass
        self._geo_cache: dict[str, tuple[JobRequest, Geometry]] = {}
        self.sticky: dict[str, tuple[int, ...]] = {}  # job -> nodes reserved for it last pass
        # job -> (nodes, until): room its preemptions are freeing, held for it alone
        self.room: dict[str, tuple[tuple[int, ...], float]] = {}
        self.prev_reserved: dict[int, str] = {}  # node -> job it was reserved for last pass
        # The latest submission time counted in the request mix, and the jobs submitted then
        # that were counted: a job is counted once, when a pass first sees it (memory.py).
        self._noted_at, self._noted_ids = _NOTE_ANY[0], set(_NOTE_ANY[1])
        self._holders: dict[int, list[tuple[float, Alloc]]] | None = None
        self.quota_room_model: str | None = None  # the model quota_victims made room on
        # What quota admission depends on besides usage (which moves with the state version):
        # the models owed to waiting tenants and the room claimed this pass. Part of the
        # failure memo's key, so a job refused a model last pass is searched again once the
        # model is no longer owed.
        self.quota_token: tuple[Any, ...] = ()
        # Racks kept clear for rack gangs: those that could hold the largest rack gang submitted
        # (its GPUs, of one model) and hold no non-preemptible work, so that seniority
        # preemption can always empty them. Non-preemptible work goes there only when it fits
        # nowhere else. Updated per pass and per start.
        self.rack_gang_gpus = 0.0
        self.clear_racks: set[str] = set()
        self._rack_gpus: dict[str, int] = {}  # rack -> GPUs of its largest model
        per_model: dict[tuple[str, str], int] = {}
        for n in self.nodes:
            per_model[(n.rack, n.model)] = per_model.get((n.rack, n.model), 0) + n.gpus
        for (rack, _m), g in per_model.items():
            self._rack_gpus[rack] = max(g, self._rack_gpus.get(rack, 0))

    # -- the driver's calls -----------------------------------------------------------------------
    @classmethod
    def from_snapshot(
        cls,
        snapshot: Snapshot,
        config: EngineConfig | None = None,
        memory: EngineMemory | None = None,
        kept: KeptHistory | None = None,
    ) -> TesseraScheduler:
        """A scheduler for one pass over ``snapshot``. With ``memory`` (what the last pass's
        :meth:`memory` gave), it decides as the scheduler that made that pass would have, had
        it lived on and been told of every change since; without, as a first pass: every job in
        the snapshot counts in the request mix and nothing was reserved before. With ``kept``,
        the runtime histories are the last pass's updated to the snapshot's (the same tables,
        built for less)."""
        s = cls(snapshot.nodes, snapshot.quotas, config)
        if kept is not None:
            runtimes = kept.of(snapshot.history)
            s.history, s.recent_runs = runtimes.history, runtimes.recent
            s._histories_shared = True
        elif snapshot.history:
            s.history = History.of(snapshot.history)
            s.recent_runs = RecentRuns.of(snapshot.history)
        if memory is None:
            for job in snapshot.pending:
                s.submit(job)
            s.adopt_all(snapshot.running)
            return s
        s.restore(memory)
        jobs = [*snapshot.pending, *(r.job for r in snapshot.running)]
        for job in sorted((j for j in jobs if s._unnoted(j)), key=lambda j: (j.submitted_at, j.id)):
            s._note(job)
        for job in snapshot.pending:
            s.submit(job, note=False)
        s.adopt_all(snapshot.running, note=False)
        return s

    def restore(self, memory: EngineMemory) -> None:
        """Take on what an earlier pass left (see :mod:`.memory`); entries naming a node this
        scheduler does not have are dropped (their jobs are planned afresh)."""
        by_name = self.state.by_name

        def indices(names: tuple[str, ...]) -> tuple[int, ...] | None:
            if not all(n in by_name for n in names):
                return None
            return tuple(sorted(by_name[n] for n in names))

        self.last_reservations = [
            Reservation(r.job_id, nodes, r.start, r.strict_level)
            for r in memory.reservations
            if (nodes := indices(r.nodes)) is not None
        ]
        self.sticky = {j: nodes for j, names in memory.sticky if (nodes := indices(names)) is not None}
        self.room = {
            r.job_id: (nodes, r.until) for r in memory.room if (nodes := indices(r.nodes)) is not None
        }
        self.last_codes = dict(memory.last_codes)
        self.rack_gang_gpus = memory.rack_gang_gpus
        self.recent = deque(memory.recent, maxlen=self.config.frag_window)
        self._recent_changes = memory.frag_changes
        if memory.frag_typical is not None:
            self.state.set_frag(FragmentationModel(memory.frag_typical))
            self.placer = Placer(self.state, self.config.alpha, self.config.beta, self.config.delta)
        self._noted_at, self._noted_ids = memory.noted_at, set(memory.noted_ids)
        self.eta_learnt = Learnt.of(memory.eta_first, memory.eta_seen)

    def memory(self) -> EngineMemory:
        """What the next pass needs of this one's (see :mod:`.memory`)."""

        def names(nodes: tuple[int, ...]) -> tuple[str, ...]:
            return tuple(self.nodes[i].name for i in nodes)

        typical = self.state.frag.typical
        eta_first, eta_seen = self.eta_learnt.to_data()
        return EngineMemory(
            reservations=tuple(
                HeldReservation(r.job_id, names(r.nodes), r.start, r.strict_level)
                for r in self.last_reservations
            ),
            sticky=tuple((j, names(nodes)) for j, nodes in self.sticky.items()),
            room=tuple(HeldRoom(j, names(nodes), until) for j, (nodes, until) in self.room.items()),
            last_codes=tuple(self.last_codes.items()),
            rack_gang_gpus=self.rack_gang_gpus,
            recent=tuple(self.recent),
            frag_changes=self._recent_changes,
            frag_typical=typical if typical else None,
            noted_at=self._noted_at,
            noted_ids=tuple(sorted(self._noted_ids)),
            eta_first=eta_first,
            eta_seen=eta_seen,
        )

    def adopt_all(self, running: Sequence[RunningJob], note: bool = True) -> None:
        """:meth:`adopt` a snapshot's running jobs, and what of them is leaving, in one batch of
        takes (one leave and join of its group per node, not per replica)."""
        with self.state.batched():
            for run in running:
                checkpoint, terminating = run.last_checkpoint_at, run.terminating
                self.adopt(run.job, run.placements, run.started_at, checkpoint, terminating, note=note)
                self.adopt_leaving(run.job.id, run.leaving, run.leaving_until)

    def adopt(
        self,
        job: JobRequest,
        placements: tuple[Placement, ...],
        started_at: float,
        last_checkpoint: float | None = None,
        terminating: bool = False,
        note: bool = True,
    ) -> None:
        """Record a job that already holds GPUs (from a snapshot); ``note``: count it in the
        request mix (a scheduler restored from memory counts only jobs it has not seen)."""
        geo = geometry(job, self.config.min_split_gpus)
        run = Running(job, geo, started_at, last_checkpoint, terminating)
        self.running[job.id] = run
        if note:
            self._note(job)
        for p in placements:
            node = self.state.by_name[p.node]
            milli = MILLI if p.share >= 1 else to_milli(p.share)
            self.state.take(
                job.id, node, p.gpus, milli if p.gpus else 0, geo.req.cpu, geo.req.mem, p.replica, job.tenant
            )
            self.charge(run, self.nodes[node].model, geo.charge if p.gpus else 0)

    def adopt_leaving(self, job_id: str, placements: tuple[Placement, ...], until: float | None) -> None:
        """Record the replicas a shrink removed from an adopted job that still hold their GPUs."""
        run = self.running.get(job_id)
        if run is None or not placements:
            return
        geo = run.geo
        for p in placements:
            node = self.state.by_name[p.node]
            milli = MILLI if p.share >= 1 else to_milli(p.share)
            run.leaving.append(
                self.state.take(
                    leaving_key(job_id),
                    node,
                    p.gpus,
                    milli if p.gpus else 0,
                    geo.req.cpu,
                    geo.req.mem,
                    p.replica,
                    run.job.tenant,
                )
            )
            self.charge_leaving(run, self.nodes[node].model, geo.charge if p.gpus else 0)
        run.leaving_until = until if until is not None else self._now

    def submit(self, job: JobRequest, note: bool = True) -> None:
        self.pending[job.id] = job
        if note:
            self._note(job)
        if job.topology == "rack" and job.replicas > 1:
            self.rack_gang_gpus = max(self.rack_gang_gpus, job.gpus)

    def cancel(self, job_id: str) -> None:
        self.pending.pop(job_id, None)
        run = self.running.get(job_id)
        if run is not None:  # it keeps its GPUs until its processes exit (release)
            run.cancelled = True

    def release(self, job_id: str, now: float) -> None:
        self._geo_cache.pop(job_id, None)
        run = self.running.pop(job_id, None)
        self.state.release(job_id)
        self.state.release(leaving_key(job_id))
        if run is None:
            return
        for model, milli in [*run.charged, *run.leaving_charged]:
            self.quotas.add(run.job.tenant, model, -milli, run.job.preemptible)
        if not run.terminating and not run.cancelled:
            if self._histories_shared:
                self.history, self.recent_runs = self.history.copy(), self.recent_runs.copy()
                self._histories_shared = False
            self.history.record(run.job, now - run.started_at, now)
            self.recent_runs.record(run.job, now - run.started_at, now)

    def stopping(self, job_id: str) -> None:
        """A stop signal sent outside the pass (the adjustment pass requeues an idle job): the
        job holds its GPUs until :meth:`release`, as a preempted one does, and its run, ended by
        that signal, tells nothing of how long it needs (live, the snapshot says it is
        terminating and the run ends ``preempted``)."""
        run = self.running.get(job_id)
        if run is not None:
            run.terminating = True

    def release_leaving(self, job_id: str, now: float) -> None:
        self.state.release(leaving_key(job_id))
        run = self.running.get(job_id)
        if run is not None:
            run.leaving = []
            for model, milli in run.leaving_charged:  # their quota is free once they have exited
                self.quotas.add(run.job.tenant, model, -milli, run.job.preemptible)
            run.leaving_charged = []

    def requeue(self, job: JobRequest) -> None:
        if job.id in self.running:
            self.release(job.id, job.submitted_at)
        self.pending[job.id] = job

    def checkpoint(self, job_id: str, at: float) -> None:
        run = self.running.get(job_id)
        if run is not None:
            run.last_checkpoint = at

    def shrink(self, job_id: str, gpus: int, now: float) -> tuple[Placement, ...] | None:
        """The adjustment pass took a running elastic job down to ``gpus`` (its busy GPUs or its
        minimum, scheduling/engine/adjust.py): its highest replicas beyond that leave as for a
        shrink the pass makes (:meth:`PolicyPass.commit_shrink`) — their GPUs stay held until the
        driver's :meth:`release_leaving`, at the latest after the job's grace period — and it
        is never grown past ``gpus`` again in this attempt. Returns the placements it keeps
        (None: not a running elastic job, a shrink of it under way, or nothing to drop)."""
        run = self.running.get(job_id)
        if run is None or run.terminating or run.leaving or run.job.elastic_max_gpus is None:
            return None
        held = sorted(self.state.allocs.get(job_id, ()), key=lambda a: a.replica)
        per = run.job.per_replica_gpus
        keep = max(run.geo.need, int(gpus // per) if per > 0 else len(held))
        if keep >= len(held):
            return None
        for a in held[keep:]:
            self.state.release_replica(job_id, a)
            run.leaving.append(
                self.state.take(
                    leaving_key(job_id), a.node, a.gpus, a.milli, a.cpu, a.mem, a.replica, a.tenant
                )
            )
            run.leaving_charged.append(run.charged.pop())  # charged until they exit
        run.leaving_until = now + run.job.grace_s
        run.job = replace(run.job, elastic_max_gpus=int(round(keep * per)))
        run.geo = self.geo(run.job)
        return placements_of(self.state.allocs.get(job_id, []), self.state)

    # -- bookkeeping ------------------------------------------------------------------------------
    def _note(self, job: JobRequest) -> None:
        self.recent.append(shape_of(job))
        self._recent_changes += 1
        if job.submitted_at > self._noted_at:
            self._noted_at, self._noted_ids = job.submitted_at, {job.id}
        elif job.submitted_at == self._noted_at:
            self._noted_ids.add(job.id)

    def _unnoted(self, job: JobRequest) -> bool:
        """Has no pass counted ``job`` in the request mix yet?"""
        return job.submitted_at > self._noted_at or (
            job.submitted_at == self._noted_at and job.id not in self._noted_ids
        )

    def charge(self, run: Running, model: str, milli: int) -> None:
        run.charged.append((model, milli))
        self.quotas.add(run.job.tenant, model, milli, run.job.preemptible)

    def charge_leaving(self, run: Running, model: str, milli: int) -> None:
        """Charge a replica a shrink removed that has not exited yet (it holds its GPUs)."""
        run.leaving_charged.append((model, milli))
        self.quotas.add(run.job.tenant, model, milli, run.job.preemptible)

    def _refresh_frag(self) -> None:
        if self._recent_changes and (
            self._recent_changes >= max(1, len(self.recent) // 10) or not self.state.frag.typical
        ):
            self.state.set_frag(FragmentationModel.from_shapes(list(self.recent)))
            self.placer = Placer(self.state, self.config.alpha, self.config.beta, self.config.delta)
            self._recent_changes = 0

    def models_for(self, job: JobRequest) -> tuple[tuple[str, ...], bool]:
        """Acceptable models in preference order, and whether the order ranks them."""
        if job.accelerators:
            return job.accelerators, True
        preferred = self.config.preferred(job.kind)
        if preferred:
            rest = tuple(m for m in self.models if m not in preferred)
            return tuple(m for m in preferred if m in self.models) + rest, True
        return self.models, False

    def cannot_fit(self, job: JobRequest, geo: Geometry) -> tuple[str, str] | None:
        return static_check(self.state, self.quotas, job, geo, self._static)

    # -- placing one job --------------------------------------------------------------------------
    def try_place(
        self,
        job: JobRequest,
        geo: Geometry,
        node_ok: Callable[[int], bool] | None,
        first_replica: int = 0,
        top: int | None = None,
        need: int | None = None,
        token: tuple[Any, ...] | None = None,
    ) -> tuple[list[Alloc] | None, tuple[str, str] | None]:
        """(allocations, None) on success; (None, quota reason or None) otherwise.

        A failure is memoised with the state's version and ``token`` (what ``node_ok`` depends
        on): the same request on an unchanged state fails again without a search."""
        memo_key = None
        if token is not None or node_ok is None:
            memo_key = (
                geo,
                job.accelerators,
                job.node_selector,
                job.tolerations,
                job.topology,
                job.tenant,
                job.preemptible,
                top,
                need,
                token,
                self.quota_token,
            )
            if self._fail_memo.get(memo_key) == self.state.version:
                return None, None
        got, refusal = self._try_place_inner(job, geo, node_ok, first_replica, top, need)
        if got is None and refusal is None and memo_key is not None:
            self._fail_memo[memo_key] = self.state.version
        return got, refusal

    def _try_place_inner(
        self,
        job: JobRequest,
        geo: Geometry,
        node_ok: Callable[[int], bool] | None,
        first_replica: int,
        top: int | None,
        need: int | None,
    ) -> tuple[list[Alloc] | None, tuple[str, str] | None]:
        top = geo.replicas if top is None else top
        need = geo.need if need is None else need
        if geo.req.count == 0:
            c = constraints(job)
            return place_gang(
                self.placer, job.id, geo.req, top, need, job.topology, c, node_ok, first_replica
            ), None
        models, ranked = self.models_for(job)
        allowed: list[tuple[str, int]] = []
        refusal: tuple[str, str] | None = None
        for m in models:
            fit = 0
            for r in range(top, need - 1, -1):
                if self.refusal(job, m, geo.charge * r) is None:
                    fit = r
                    break
            if fit:
                allowed.append((m, fit))
            elif refusal is None:
                refusal = self.refusal(job, m, geo.charge * need)
        if not allowed:
            return None, refusal
        if top == 1 or job.topology in ("node", "nvlink"):
            attempts = [(tuple(m for m, _ in allowed), min(r for _, r in allowed))]
        else:
            attempts = [((m,), r) for m, r in allowed]
        for ms, r in attempts:
            c = Constraints(
                ms if ranked or len(ms) < len(self.models) else (),
                job.node_selector,
                job.tolerations,
                True,
                job.prefer_labels,
                self.shares(job, geo),
            )
            got = place_gang(self.placer, job.id, geo.req, r, need, job.topology, c, node_ok, first_replica)
            if got:
                return got, None
        return None, None

    def shares(self, job: JobRequest, geo: Geometry) -> str | None:
        """:attr:`.placement.Constraints.shares` of ``job``: its tenant for a fractional job
        under exclusive GPU shares, else None."""
        if self.config.exclusive_gpu_shares and 0 < geo.req.milli < MILLI:
            return job.tenant
        return None

    def quota_refusal(self, job: JobRequest, geo: Geometry) -> tuple[str, str] | None:
        """The quota reason that stops ``job`` on the current usage (None: quotas admit it)."""
        if geo.req.count == 0:
            return None
        models, _ranked = self.models_for(job)
        first = None
        for m in models:
            why = self.refusal(job, m, geo.charge * geo.need)
            if why is None:
                return None
            first = first or why
        return first

    # Borrowing only from idle guarantees: a job that would borrow on a model for which another
    # tenant, still under its guarantee there, has a job waiting that the free capacity of that
    # model could start does not start; it would be reclaimed (its work thrown away) as soon as
    # that owner's wait passes reclaim_after_s. An owner's job too big for what is free does not
    # hold the model idle: it gets a reservation and, after reclaim_after_s, reclaims. Nodes
    # reserved for a job are not counted as free (the owner could not start there either).
    def admits(self, job: JobRequest, model: str, milli: int) -> bool:
        return self.refusal(job, model, milli) is None

    def refusal(self, job: JobRequest, model: str, milli: int) -> tuple[str, str] | None:
        quotas = self.quotas
        if not milli or not quotas.enabled:
            return None
        if quotas.frozen:  # rows being freed for a job this pass: rare, asked afresh
            return self._refusal(job, model, milli)
        at = self._refusals_at
        if at[0] is not quotas or at[1] != quotas.version:
            self._refusals.clear()
            self._refusals_at = (quotas, quotas.version)
        key = (job.tenant, model, milli, job.preemptible, queues.starving(job, self._now, self.config))
        try:
            return self._refusals[key]
        except KeyError:
            why = self._refusals[key] = self._refusal(job, model, milli)
            return why

    def _refusal(self, job: JobRequest, model: str, milli: int) -> tuple[str, str] | None:
        why = self.quotas.check(job.tenant, model, milli, job.preemptible)
        if why is not None or not self.quotas.enabled or not milli:
            return why
        owners = self._owed.get(model)
        if (
            owners
            and any(t != job.tenant for t in owners)
            and not self.starving(job, self._now)
            and not self.quotas.under_guarantee(job.tenant, model, milli, job.preemptible)
        ):
            waiting = ", ".join(t for t in owners if t != job.tenant)
            return (
                "borrow-limit",
                f"borrow-limit: {model} above {job.tenant}'s guarantee is "
                f"owed to {waiting}, waiting within their guarantee",
            )
        return None

    def geo(self, job: JobRequest) -> Geometry:
        """The job's geometry, cached per job object."""
        hit = self._geo_cache.get(job.id)
        if hit is not None and hit[0] is job:
            return hit[1]
        geo = geometry(job, self.config.min_split_gpus)
        self._geo_cache[job.id] = (job, geo)
        return geo

    def owed_to(self) -> dict[str, list[str]]:
        """Per model, the tenants this pass found it owed to (:meth:`note_owed`)."""
        return self._owed

    def note_owed(self, now: float) -> None:
        """Per pass: models on which a tenant under its guarantee has a GPU job waiting that
        the model's free capacity could start (jobs that quotas hold back themselves do not
        count, so two tenants' holds can never wait on each other)."""
        self._now = now
        self._owed = {}
        self._refusals.clear()
        self.quota_token = ()
        if not self.quotas.enabled:
            return
        reserved = {i for r in self.last_reservations for i in r.nodes}
        open_nodes = [
            (n.spec, n.whole_free(), sum(n.free))
            for n in self.state.nodes
            if n.spec.gpus and n.spec.schedulable and n.index not in reserved
        ]
        # (selector, tolerations) -> (model -> whole free GPUs, model -> free milli-GPU): only
        # the nodes the job may run on count (a job that may run on one T4 node alone held every
        # A100 owed to its tenant while the A100s idled).
        free_on: dict[tuple[Any, ...], tuple[dict[str, int], dict[str, int]]] = {}
        seen: set[tuple[str, str, int, bool]] = set()
        for job in self.pending.values():
            if job.held or job.not_before > now or job.gpus <= 0:
                continue
            if self.last_codes.get(job.id) in ("quota", "borrow-limit"):
                continue  # held back by quotas itself: it is not waiting for the capacity
            geo = self.geo(job)
            models, _ = self.models_for(job)
            whole = geo.req.milli >= MILLI
            size = geo.req.count * geo.need if whole else geo.req.demand * geo.need
            selected = (job.node_selector, job.tolerations)
            free = free_on.get(selected)
            if free is None:
                free = free_on[selected] = _free_on(open_nodes, job)
            free_whole, free_milli = free
            for m in models:
                if size > (free_whole.get(m, 0) if whole else free_milli.get(m, 0)):
                    continue  # too big for what is free: a reservation and reclaim serve it
                key = (job.tenant, m, geo.charge * geo.need, job.preemptible)
                if key in seen:  # usage does not change here: one answer per key
                    continue
                seen.add(key)
                if self.quotas.under_guarantee(job.tenant, m, geo.charge * geo.need, job.preemptible):
                    owners = self._owed.setdefault(m, [])
                    if job.tenant not in owners:
                        owners.append(job.tenant)
        for owners in self._owed.values():  # whatever order the pending jobs came in
            owners.sort()
        self.quota_token = tuple(sorted((m, tuple(o)) for m, o in self._owed.items()))

    def bind(self, job: JobRequest, geo: Geometry, allocs: list[Alloc], now: float, d: Decisions) -> None:
        run = Running(job, geo, now)
        for a in allocs:
            self.charge(run, self.nodes[a.node].model, geo.charge if a.gpus else 0)
        self.running[job.id] = run
        self.pending.pop(job.id, None)
        self.room.pop(job.id, None)
        if not job.preemptible and geo.req.count:
            self.clear_racks.difference_update(self.nodes[a.node].rack for a in allocs)
        d.bindings.append(Binding(job.id, placements_of(allocs, self.state)))

    # -- the pass ---------------------------------------------------------------------------------
    def decide(self, now: float, deadline: Deadline | None = None) -> Decisions:
        """One pass at ``now``. With a ``deadline``, the pass stops deciding more jobs once it
        has passed, keeps what it decided, and says which jobs it did not reach
        (``Decisions.undecided``): a driver that bounds its passes in time asks for another."""
        self._refresh_frag()
        # Failed placements are remembered within a pass only: the next one is at another time
        # (reservations' backfill windows, starvation), and a scheduler rebuilt from memory
        # (the live pass) must decide as one that lived on.
        self._fail_memo.clear()
        return PolicyPass(self, now, deadline).run()

    def estimate(
        self, d: Decisions, now: float, wanted: Collection[str] | None = None
    ) -> dict[str, Estimate]:
        """When the jobs ``d`` (this scheduler's last pass) left pending are expected to start
        (:mod:`.eta`); ``wanted``: only these jobs' estimates are needed (the rest may be
        missing). It decides nothing: a driver asks for it when it shows the estimates."""
        return eta.estimate(self, d, now, wanted)

    # helpers used by the pass ----------------------------------------------------------------------
    def expected_end(self, run: Running, now: float) -> float:
        """Its start plus its time limit, else its predicted runtime; a job past its prediction
        (and with no hard limit) is expected to run as long again as it has so far, since run
        times are heavy-tailed — so a long-running service is not taken to end any minute."""
        est = self.history.predict(run.job)
        end = run.started_at + (est if est is not None else self.config.default_runtime_s)
        if end <= now and not run.job.time_limit_s:
            end = now + (now - run.started_at)
        return max(end, now)

    def starving(self, job: JobRequest, now: float) -> bool:
        """Has ``job`` waited past the starvation bound (``config.starve_s``)?"""
        return queues.starving(job, now, self.config)

    def begin_pass(self, now: float) -> None:
        """Per-pass indexes: who may be preempted at all (min run time, preemptible), with the
        work each would lose, computed once."""
        self._victim_memo: dict[tuple[Any, ...], dict[int, list[Victim]]] = {}
        self._holders = None
        self._quota_memo: dict[tuple[Any, ...], list[Victim]] = {}
        self._eligible = []
        self._reclaimable: set[str] = set()  # borrowers whose reclaim would lose little now
        self._protected: set[str] = set()  # started after starving: never reclaimed
        self._senior_ok: set[str] = set()  # may be preempted for seniority (not ending soon)
        # Served: checkpointing jobs whose current run has lasted starve_s: a starving job may
        # preempt them even if they were submitted before it (they have had their turn).
        self._served: set[str] = set()
        starve = self.config.starve_s
        window = self.config.reclaim_checkpoint_window_s
        for jid, run in self.running.items():
            if (
                not run.job.preemptible
                or run.terminating
                or run.cancelled
                or now - run.started_at < self.config.preempt_min_run_s
            ):
                continue
            allocs = tuple(self.state.allocs.get(jid, ()))
            since = max(run.started_at, run.last_checkpoint or run.started_at)
            limit = run.job.time_limit_s
            if limit and run.started_at + limit <= now + self.config.spare_ending_s:
                pass  # its hard limit ends it soon: neither reclaimed nor preempted for seniority
            elif window <= 0 or not run.job.checkpoint_s or now - since <= window:
                self._reclaimable.add(jid)
            else:
                self._senior_ok.add(jid)
            if self.starving(run.job, run.started_at):
                # started starving: its borrowing ends with it, and no seniority preemption
                # takes it back (an older job it made room for cannot preempt it in turn)
                self._protected.add(jid)
            elif (
                starve > 0
                and run.job.checkpoint_s
                and now - run.started_at >= starve
                and (jid in self._reclaimable or jid in self._senior_ok)
            ):
                self._served.add(jid)
            gpus = sum(len(a.gpus) * a.milli for a in allocs) / MILLI
            victim = Victim(jid, gpus * max(0.0, now - since), run.job.priority, allocs, run.job.grace_s)
            models = tuple(sorted({m for m, _ in run.charged}))
            self._eligible.append((queues.rank(run.job, self.config), jid, run, victim, models))
        self.elastic = [e for e in self._eligible if e[2].job.elastic_max_gpus is not None]
        self.clear_racks = set()
        if self.rack_gang_gpus:
            self.clear_racks = {r for r, g in self._rack_gpus.items() if g >= self.rack_gang_gpus}
            for run in self.running.values():
                if not run.job.preemptible and run.geo.req.count:
                    self.clear_racks.difference_update(
                        self.nodes[a.node].rack for a in self.state.allocs.get(run.job.id, ())
                    )

    def forget_victims(self) -> None:
        """The running jobs changed (shrunk): the victims memoised this pass are stale, and so are
        the allocations (and lost work) of the shrunk victims, whose removed replicas are now
        leaving (counted as coming free already: counted twice, a gang claimed one node twice)."""
        self._victim_memo.clear()
        fresh = []
        for rank, jid, run, v, models in self._eligible:
            allocs = tuple(self.state.allocs.get(jid, ()))
            if allocs != v.allocs:
                old = sum(len(a.gpus) * a.milli for a in v.allocs)
                new = sum(len(a.gpus) * a.milli for a in allocs)
                v = replace(v, allocs=allocs, lost=v.lost * new / old if old else v.lost)
            fresh.append((rank, jid, run, v, models))
        self._eligible = fresh

    def victims(self, job: JobRequest, geo: Geometry, now: float) -> dict[int, list[Victim]]:
        """Eligible victims per node, cheapest first (see :mod:`.preemption`): jobs strictly
        behind ``job``, plus, when its tenant is under its guarantee, jobs running on borrowed
        capacity of that model. Memoised per pass; terminating jobs are skipped by the caller."""
        mine = queues.rank(job, self.config)
        under: tuple[str, ...] = ()
        borrowing: tuple[tuple[str, str], ...] = ()
        if self.quotas.enabled and geo.req.count and now - job.submitted_at >= self.config.reclaim_after_s:
            models, _ = self.models_for(job)
            under = tuple(
                m
                for m in models
                if self.quotas.under_guarantee(job.tenant, m, geo.charge * geo.need, job.preemptible)
            )
            if under:
                borrowing = tuple(
                    sorted(
                        (t, m)
                        for t in self.quotas.rows
                        for m in under
                        if t != job.tenant and self.quotas.borrowed(t, m) > 0
                    )
                )
        may_rank = self.config.level_of(job.kind) in self.config.preemptor_levels
        # An aged job may preempt strictly lower kind levels (never its own level): this bounds
        # the wait of big gangs, and the victims, being lower, can never preempt it back.
        aged = self.config.aged_preempts and queues.is_aged(job, now, self.config)
        # A starving job may preempt younger jobs of its level or below (see config.starve_s).
        senior = (job.submitted_at, job.id) if self.starving(job, now) else None
        key = (mine, may_rank, aged, job.tenant, under, borrowing, senior)
        hit = self._victim_memo.get(key)
        if hit is not None:
            return hit
        out: dict[int, list[Victim]] = {}
        for vrank, _jid, run, victim, vmodels in self._eligible:
            if (
                not (may_rank and vrank > mine)
                and not (aged and vrank[0] > mine[0])
                and not (
                    borrowing
                    and _jid in self._reclaimable
                    and _jid not in self._protected
                    and any((run.job.tenant, m) in borrowing for m in vmodels)
                )
                and not (senior is not None and self._senior_victim(_jid, run, vrank, mine, senior))
            ):
                continue
            for node in sorted({a.node for a in victim.allocs}):
                out.setdefault(node, []).append(victim)
        for lst in out.values():
            lst.sort(key=lambda v: (v.lost, v.priority, v.job_id))
        self._victim_memo[key] = out
        return out

    def quota_victims(self, job: JobRequest, geo: Geometry, budget: int = 1 << 30) -> list[Victim] | None:
        """Victims among ``job``'s own tenant's jobs behind it on one of its models whose
        release would make quota room for it (least lost work first); [] when jobs already
        terminating will make the room; None when preemption cannot help. Only for the
        preemptor levels (an inference job stuck behind its tenant's own batch work)."""
        if (
            not self.quotas.enabled
            or not geo.req.count
            or self.config.level_of(job.kind) not in self.config.preemptor_levels
        ):
            return None
        mine = queues.rank(job, self.config)
        models, _ = self.models_for(job)
        need = geo.charge * geo.need
        for m in models:
            q = self.quotas.row(job.tenant, m)
            if q is None:
                continue
            cap = round(q.limit * MILLI)
            if need > cap or (
                not job.preemptible
                and self.quotas.fixed_used(job.tenant, m) + need > round(q.guaranteed * MILLI)
            ):
                continue  # its own preemptible jobs' room would not admit it
            excess = self.quotas.used(job.tenant, m) + need - cap
            row = self.quotas.row_key(job.tenant, m)
            for run in self.running.values():  # what is already on its way out counts as room
                if run.job.tenant == job.tenant and (run.terminating or run.cancelled):
                    excess -= self._row_charge(run, job.tenant, row)
            self.quota_room_model = m
            if excess <= 0:
                return []
            memo_key = (job.tenant, row, mine)
            mine_jobs = self._quota_memo.get(memo_key)
            if mine_jobs is None:  # once per pass and (tenant, row, rank)
                mine_jobs = self._quota_memo[memo_key] = sorted(
                    (
                        v
                        for vrank, _j, run, v, vmodels in self._eligible
                        if run.job.tenant == job.tenant
                        and vrank > mine
                        and any(self.quotas.row_key(job.tenant, vm) == row for vm in vmodels)
                    ),
                    key=lambda v: (v.lost, v.priority, v.job_id),
                )
            mine_jobs = [v for v in mine_jobs if not self.running[v.job_id].terminating]
            # The job starts when the slowest victim has exited, so the victims come from the
            # shortest grace period that can make the room; within it:
            # 1. take the tenant's jobs behind it, least lost work first, until the room is made;
            # 2. then drop, most lost work first, any victim the room does not need after all.
            graces = sorted({self.running[v.job_id].job.grace_s for v in mine_jobs})
            for g in graces:
                chosen = self._quota_pick(
                    [v for v in mine_jobs if self.running[v.job_id].job.grace_s <= g],
                    job.tenant,
                    row,
                    excess,
                    budget,
                )
                if chosen is not None:
                    return chosen
        self.quota_room_model = None
        return None

    def _senior_victim(
        self, jid: str, run: Running, vrank: tuple[Any, ...], mine: tuple[Any, ...], senior: tuple[Any, ...]
    ) -> bool:
        """May a starving job of rank ``mine``, submitted at ``senior``, preempt ``run``? One that
        checkpoints, only within ``reclaim_checkpoint_window_s`` of its last checkpoint, as a
        reclaim, until the starving job has waited one of its checkpoint intervals past the
        bound: it checkpoints meanwhile, and the preemption then loses little (preempting at
        once threw away up to an interval of a 64-GPU gang's work, 2.4% of a day's)."""
        if not (
            vrank[0] >= mine[0]
            and jid not in self._protected
            and ((run.job.submitted_at, run.job.id) > senior or jid in self._served)
        ):
            return False
        if jid in self._reclaimable:
            return True
        patience = self.config.starve_s + (run.job.checkpoint_s or 0.0)
        return jid in self._senior_ok and self._now - senior[0] >= patience

    def _row_charge(self, run: Running, tenant: str, row: tuple[str, str]) -> int:
        """What ``run`` is charged on ``tenant``'s quota row ``row`` (milli-GPU): what leaving frees
        (its replicas a shrink removed too: they are charged until they exit)."""
        held = [*run.charged, *run.leaving_charged]
        return sum(mi for mm, mi in held if self.quotas.row_key(tenant, mm) == row)

    def _quota_pick(
        self, candidates: list[Victim], tenant: str, row: tuple[str, str], excess: int, budget: int
    ) -> list[Victim] | None:
        chosen: list[tuple[Victim, int]] = []
        for v in candidates:
            if excess <= 0 or len(chosen) >= budget:
                break
            run = self.running[v.job_id]
            freed = self._row_charge(run, tenant, row)
            chosen.append((v, freed))
            excess -= freed
        if excess > 0 or not chosen:
            return None
        for v, freed in sorted(chosen, key=lambda t: (-t[0].lost, t[0].job_id)):
            if excess + freed <= 0:
                chosen.remove((v, freed))
                excess += freed
        return sorted((v for v, _ in chosen), key=lambda v: v.job_id)

    def new_hypo(self) -> Hypo:
        """The cluster as the terminating jobs, and the replicas shrinks are removing, will leave
        it: a job waiting for a shrink's room waits for it, it does not preempt."""
        term = [
            (jid, tuple(self.state.allocs.get(jid, ())))
            for jid, r in self.running.items()
            if r.terminating or r.cancelled
        ]
        term += [(leaving_key(jid), tuple(r.leaving)) for jid, r in self.running.items() if r.leaving]
        return Hypo(self.placer, term)

    def holders(self, now: float) -> dict[int, list[tuple[float, Alloc]]]:
        """Per node, the allocations on it with their holders' expected ends (built once per pass)."""
        if self._holders is None:
            self._holders = {}
            for jid, run in self.running.items():
                end = self.expected_end(run, now)
                for a in self.state.allocs.get(jid, ()):
                    self._holders.setdefault(a.node, []).append((end, a))
                for a in run.leaving:
                    self._holders.setdefault(a.node, []).append((max(now, run.leaving_until), a))
        return self._holders

    def reserve_for(
        self, job: JobRequest, geo: Geometry, res: Reservations, now: float
    ) -> Reservation | None:
        """A reservation for ``job``: the nodes it held last pass if they can still take it
        (so a reservation is sticky and its start only moves when running jobs overrun), else
        the earliest-ready nodes now. Holders' expected ends are indexed once per pass."""
        starving = self.starving(job, now)
        holders = self.holders(now)
        if starving:
            # A starving job does not wait for what it may preempt: its start is when the jobs
            # it may not preempt (older, ending soon, not preemptible) have left, so backfill
            # cannot keep refilling its nodes.
            may = {v.job_id for vs in self.victims(job, geo, now).values() for v in vs}
            holders = {}
            for jid, run in self.running.items():
                end = now if jid in may else self.expected_end(run, now)
                for a in self.state.allocs.get(jid, ()):
                    holders.setdefault(a.node, []).append((end, a))
                for a in run.leaving:
                    holders.setdefault(a.node, []).append((max(now, run.leaving_until), a))
        # Nodes another waiting job held last pass stay its own: a reservation, once made, is
        # not taken over by a job that comes first in a later pass — unless that job is
        # starving (it comes before every younger job's reservation).
        taken = {i for i in res.taken() if res.owner_by_node.get(i) != job.id}
        if not starving:
            taken |= {i for i, j in self.prev_reserved.items() if j != job.id and j in self.pending}
        prev = self.sticky.get(job.id)
        strict = self.config.level_of(job.kind) if starving else None
        if prev is not None and job.accelerators:  # not on a model it may no longer use
            prev = prev if all(self.nodes[i].model in job.accelerators for i in prev) else None
        kept: Reservation | None = None
        if prev is not None and not (set(prev) & taken):
            req, _n = gang_shape(geo.req, geo.need, job.topology)
            shares = self.shares(job, geo)
            times = [node_ready_time(self.placer, i, req, holders.get(i, []), now, shares) for i in prev]
            ready = [t for t in times if t is not None]
            if len(ready) == len(times):
                kept = Reservation(job.id, prev, max(ready), strict)
                if kept.start <= now + self.config.aging_s:
                    return kept
        c = replace(constraints(job), shares=self.shares(job, geo))
        r = reserve(self.placer, job, geo.req, geo.need, c, holders, taken, now)
        # Far-off sticky nodes are kept unless fresh ones would at least halve the wait: their
        # start recedes whenever a holder runs past its estimate (568 -> 1,510 min over 16 h
        # while other racks freed), and nothing else would move the job.
        if kept is not None and (r is None or 2 * (r.start - now) > kept.start - now):
            return kept
        if r is not None:
            self.sticky[job.id] = r.nodes
            r = replace(r, strict_level=strict)
        return r


def _free_on(
    open_nodes: list[tuple[NodeSpec, int, int]], job: JobRequest
) -> tuple[dict[str, int], dict[str, int]]:
    """Per model, the whole free GPUs and the free milli-GPU of ``open_nodes`` (spec, whole
    free, milli free) that ``job``'s node selector and tolerations allow."""
    whole: dict[str, int] = {}
    milli: dict[str, int] = {}
    for spec, free_whole, free_milli in open_nodes:
        if selects(spec, job):
            whole[spec.model] = whole.get(spec.model, 0) + free_whole
            milli[spec.model] = milli.get(spec.model, 0) + free_milli
    return whole, milli
