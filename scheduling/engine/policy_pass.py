"""One pass of Tessera's policy over the pending jobs: steps 2-6 of :mod:`.policy`.

:class:`PolicyPass` keeps what a pass carries from job to job (the decisions so far, the
reservations made, the quota room claimed, the jobs left to explain) and has one method per step
of the policy; :meth:`PolicyPass.run` reads as the policy does, and :meth:`PolicyPass.decide`
as its steps 3-4 for one job. The scheduler (:class:`.policy.TesseraScheduler`) keeps the cluster,
the queue, and what each pass leaves for the next.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from . import queues
from .backfill import Reservation, Reservations, gang_shape, leaves_room
from .geometry import Geometry
from .placement import Constraints, OffRacks
from .preemption import Hypo, Victim, choose_victims
from .preference import wait_for_preferred
from .reasons import ClassSummary, diagnose_job
from .state import Alloc, leaving_key, placements_of
from .topology import place_gang
from .types import (
    HELD_REASON,
    MILLI,
    Deadline,
    Decisions,
    JobRequest,
    PendingReason,
    Preemption,
    Resize,
    job_named,
)

if TYPE_CHECKING:
    from .policy import Running, TesseraScheduler

NodeOk = Callable[[int], bool]
# For the backfill rule on a starving job's nodes: the kind level at and above which a starving
# job could preempt the job (None: not preemptible), and whether its runtime is a hard limit.
Removable = tuple[int | None, bool]
Outranks = Callable[[Collection[str]], bool]
# The pending codes of a job left waiting for nodes (its quota admitted it): its models are
# contested (PolicyPass.off_contested).
WAITING_FOR_NODES = frozenset(
    {"capacity", "model", "node-selector", "topology", "fragmentation", "gang", "reserved"}
)


def _minutes(seconds: float) -> str:
    return f"~{max(1, round(seconds / 60))} min"


@dataclass(slots=True)
class Want:
    """The job being decided, with what its steps share."""

    job: JobRequest
    geo: Geometry
    runtime: float | None  # expected (time limit or history): must it end before a reservation?
    who: Removable
    node_ok: NodeOk | None  # the nodes this pass's reservations leave it (None: none reserved)
    outranks: Outranks | None = None  # does it go before every job reserving a node (of these)?


@dataclass(frozen=True, slots=True)
class ShrinkPlan:
    """Elastic jobs' replicas a shrink would remove (job, allocation) to make room on ``nodes``,
    and when the room is free at the latest (the grace periods of those removed there)."""

    shrunk: list[tuple[str, Alloc]]
    nodes: tuple[int, ...]
    ready: float


@dataclass(slots=True)
class RowHold:
    """A quota row held for an aged job, against its tenant's later jobs.

    Held for a job its quota refuses (:meth:`PolicyPass.refused_by_quota`) or for one its quota
    admits but nodes do not yet (:meth:`PolicyPass.hold_aged_quota`). ``steady_only``: the job is
    non-preemptible and refused at the guarantee, so it waits for its tenant's other
    non-preemptible work to end; preemptible jobs (which borrow) take nothing it waits for and
    are not kept off (they were, and a tenant's borrowers waited days while GPUs idled).
    ``frees_at``: when it can start on the row at the earliest — by the running jobs' expected
    ends for one its quota refuses, its reservation's start for one waiting for nodes; a later
    job expected to end by then delays it nothing and goes ahead (backfill within the quota, as
    reservations allow on nodes). ``spare``: what the row has then beyond the held job's need
    (milli-GPU); a later job charged no more than that delays it nothing either, however long it
    runs (as EASY backfill lets a job run on the nodes a reservation leaves over), and what it
    takes is spare no longer. ``fixed_spare``: the same of the guarantee, for later
    non-preemptible jobs, when the held job is non-preemptible and its quota admits it.
    ``strict_level``: the held job starves (its reservation's level): a later job whose end is
    only an estimate goes ahead on ``frees_at`` only if a job of that level could preempt it."""

    job_id: str
    steady_only: bool
    frees_at: float
    spare: int = 0
    fixed_spare: int | None = None
    strict_level: int | None = None

    def keeps_off(self, job: JobRequest, ends: float, charge: int, who: Removable) -> bool:
        if self.steady_only and job.preemptible:
            return False
        fixed_ok = job.preemptible or self.fixed_spare is None or charge <= self.fixed_spare
        if charge <= self.spare and fixed_ok:
            return False
        removable_at, limited = who
        strict = self.strict_level
        if strict is not None and not limited and (removable_at is None or removable_at < strict):
            return True
        return ends > self.frees_at

    def take(self, job: JobRequest, ends: float, charge: int) -> None:
        """``job`` started on the row, charged ``charge``: past ``frees_at`` it uses the spare."""
        if ends > self.frees_at and not (self.steady_only and job.preemptible):
            self.spare -= charge
            if self.fixed_spare is not None and not job.preemptible:
                self.fixed_spare -= charge


class PolicyPass:
    """Steps 2-6 of the policy (:mod:`.policy`) at ``now``, stopping at ``deadline`` if given."""

    def __init__(self, s: TesseraScheduler, now: float, deadline: Deadline | None = None) -> None:
        self.s = s
        self.cfg = s.config
        self.now = now
        self.deadline = deadline
        self.d = Decisions()
        self.res = Reservations()  # made this pass (and carried from the last)
        self.starts = 0  # jobs bound (max_starts_per_pass)
        self.blocked_seen = False  # the first blocked job has had its chance at a reservation
        self.to_diagnose: list[tuple[JobRequest, Geometry]] = []  # pending, reason not yet given
        self.quota_blocked: list[tuple[JobRequest, Geometry]] = []  # worded on the final usage
        self.held_rows: dict[tuple[str, str], RowHold] = {}  # quota rows held for an aged job
        # Per quota row, the need (milli-GPU) of the aged jobs its quota refused this pass, in
        # queue order: a later one's quota frees only once the row could hold them and it too.
        self.refused_ahead: dict[tuple[str, str], int] = {}
        # a job's quota rows by (tenant, models): asked per job, the same for most (read only)
        self.rows_of: dict[tuple[str, tuple[str, ...]], list[tuple[str, str]]] = {}
        # quota room claimed this pass (tenant, model, milli, preemptible), undone at the end
        self.claimed: list[tuple[str, str, int, bool]] = []
        # an aged job that quotas admit but nodes do not: its quota, held from the next job on
        self.hold: list[tuple[JobRequest, Geometry]] = []
        self.reached: set[str] = set()  # the jobs this pass has looked at (for its deadline)
        self.hypo: Hypo | None = None  # the cluster as preemptions will leave it
        self.attempts = 0  # victim searches made
        self.preempt_failed: set[tuple[object, ...]] = set()  # requests no preemption can help
        self.contested: set[str] = set()  # models the jobs blocked for nodes so far could use
        # the jobs the last pass left waiting for nodes, not yet reached by this one: their
        # models (those their quota admits them on), and per model how many such jobs use it
        self.waited: dict[str, tuple[str, ...]] = {}
        self.waited_on: dict[str, int] = {}

    def run(self) -> Decisions:
        self.begin()
        for job in self.in_turn():  # step 2
            if self.out_of_time():
                break
            self.reached.add(job.id)
            self.hold_aged_quota()
            self.decide(job)  # steps 3-4
        if self.cfg.resizes:
            self.grow()  # step 5
        self.keep_reservations()
        self.explain()  # step 6
        return self.d

    # -- around the queue ------------------------------------------------------------------------
    def begin(self) -> None:
        """Per-pass indexes, and the room held from earlier passes: the nodes preemptions are
        freeing for their job, and last pass's reservations, held from the start of this one
        (so even a job that comes first, inference say, backfills them only if it ends before
        their start)."""
        s, now = self.s, self.now
        s.begin_pass(now)
        s.note_owed(now)
        s.quotas.frozen = {}
        self.seed_contested()
        # Nodes reserved last pass: no preemption is planned on another job's (see plan_victims).
        s.prev_reserved = {i: r.job_id for r in s.last_reservations for i in r.nodes}
        for jid, (nodes, until) in list(s.room.items()):
            if jid in s.pending and now <= until:
                self.res.add(Reservation(jid, nodes, now))
            else:
                del s.room[jid]
        for r in s.last_reservations:
            if r.job_id in s.pending and r.job_id not in s.room:
                self.res.add(r)

    def seed_contested(self) -> None:
        """The models of every GPU job the last pass left waiting for nodes (``last_codes``),
        where its quota admits it now, are contested from the start of this pass until the
        job's turn comes: flexible jobs ahead of it in the queue are placed off them too, not
        only those after it (docs/benchmarks/eval-matrix.md, 2026-12-06)."""
        s, now = self.s, self.now
        for jid, code in s.last_codes.items():
            job = s.pending.get(jid)
            if code not in WAITING_FOR_NODES or job is None or job.held or job.not_before > now:
                continue
            geo = s.geo(job)
            if not geo.req.count:
                continue
            need = geo.charge * geo.need
            models = tuple(m for m in s.models_for(job)[0] if s.admits(job, m, need))
            self.waited[jid] = models
            for m in models:
                self.waited_on[m] = self.waited_on.get(m, 0) + 1

    def reached_turn(self, job_id: str) -> None:
        """A seeded job's turn: from here it contests its models only if blocked again."""
        for m in self.waited.pop(job_id, ()):
            self.waited_on[m] -= 1

    def in_turn(self) -> Iterator[JobRequest]:
        """Queue order; with a deadline that names the jobs the last pass did not reach, those
        first (in queue order), then the others (in queue order)."""
        s, now, cfg = self.s, self.now, self.cfg
        jobs = list(s.pending.values())
        first = self.deadline.first if self.deadline is not None else frozenset()
        if not first:
            yield from queues.order(jobs, now, cfg, s.quotas)
            return
        yield from queues.order([j for j in jobs if j.id in first], now, cfg, s.quotas)
        yield from queues.order([j for j in jobs if j.id not in first], now, cfg, s.quotas)

    def out_of_time(self) -> bool:
        """Past the deadline (once at least one job was decided)? What was decided stands; the
        jobs not reached are told so, and decided first by the next pass (the driver asks)."""
        if self.deadline is None or not (self.deadline.passed() and self.reached):
            return False
        why = PendingReason(
            "priority",
            "priority: the scheduling pass ran out of time before reaching it; "
            "the next pass decides it first",
        )
        for jid in self.s.pending:
            if jid not in self.reached:
                self.d.pending[jid] = why
                self.d.not_reached.append(jid)
        return True

    def hold_aged_quota(self) -> None:
        """What the aged job before this one needs stays its tenant's for the rest of the pass,
        so its tenant's later jobs cannot take the quota it will start on (they could, and a
        64-GPU job near its tenant's limit never started). With a reservation starting later,
        its rows are held (:class:`RowHold`): a later job that ends before that start, or takes
        only what the row has beyond its need, goes ahead (charged outright, a 64-GPU gang
        waiting hours for a rack kept its tenant's 8-GPU jobs off free GPUs all that time).
        Else its need is charged, undone with the other claims."""
        if not self.hold:
            return
        job, geo = self.hold.pop()
        s = self.s
        if job.id not in s.pending:
            return  # it started after all (shrinking made room)
        need = geo.charge * geo.need
        models, _ = s.models_for(job)
        kept = self.res.of(job.id)
        for m in models:
            if s.quotas.row(job.tenant, m) is not None and s.admits(job, m, need):
                row = s.quotas.row_key(job.tenant, m)
                if row in self.held_rows or row in s.quotas.claims:
                    continue  # held for an aged job ahead of it already: one a row
                if kept is not None and kept.start > self.now:
                    self.held_rows[row] = self.admitted_hold(job, need, row, kept)
                    continue
                s.quotas.claim(job.tenant, m, need, job.preemptible)
                self.claimed.append((job.tenant, m, need, job.preemptible))
                s.quota_token = (*s.quota_token, job.id)  # placements failed before it may not now

    def admitted_hold(self, job: JobRequest, need: int, row: tuple[str, str], kept: Reservation) -> RowHold:
        """The hold of ``row`` for an aged job its quota admits, reserved to start at
        ``kept.start``: what the row has beyond its need now is spare."""
        q = self.s.quotas.rows[row[0]][row[1]]
        spare = round(q.limit * MILLI) - self.s.quotas.usage.get(row, 0) - need
        fixed = None
        if not job.preemptible:
            fixed = round(q.guaranteed * MILLI) - self.s.quotas.fixed.get(row, 0) - need
        return RowHold(job.id, False, kept.start, spare, fixed, kept.strict_level)

    # -- steps 3-4, one job ----------------------------------------------------------------------
    def decide(self, job: JobRequest) -> None:
        """Steps 3-4 for ``job``: each step settles it (a start, a reason, a reservation) or
        hands it on to the next; the jobs none settles get their reason in step 6."""
        if self.waited:
            self.reached_turn(job.id)
        if self.not_yet(job):
            return
        geo = self.s.geo(job)
        if self.never_now(job, geo):
            return
        rows = self.quota_rows(job, geo)
        want = self.want(job, geo)
        held = self.held_off(want)
        if held and self.quota_held_for_another(want, rows, held):
            return
        allocs, refusal = self.place(want, held)
        if allocs:
            self.start(want, allocs)
            return
        if refusal is not None:
            self.refused_by_quota(want, rows, refusal)
            return
        if self.s.quotas.enabled and geo.req.count and queues.is_aged(job, self.now, self.cfg):
            self.hold.append((job, geo))
        want = self.admitted(want)
        if geo.req.count:
            self.contested.update(self.s.models_for(want.job)[0])
        held_back = self.held_back_by_reservations(want)
        if held_back and not self.may_preempt_for_priority(job):
            return
        if self.make_room(want) or self.reserve(want):
            return
        if held_back:
            return  # nothing to preempt: its reason stands, the free room is another job's
        self.to_diagnose.append((job, geo))

    def not_yet(self, job: JobRequest) -> bool:
        """Held, or in its retry backoff: pending whatever the cluster does."""
        if job.held:
            self.d.pending[job.id] = PendingReason("held", HELD_REASON)
            return True
        if job.not_before > self.now:
            self.d.pending[job.id] = PendingReason(
                "backoff", f"backoff: retrying in {_minutes(job.not_before - self.now)}", job.not_before
            )
            return True
        return False

    def never_now(self, job: JobRequest, geo: Geometry) -> bool:
        """Larger than the cluster (rejected, or pending for capacity live), or this pass has
        started its limit of jobs."""
        s, cfg = self.s, self.cfg
        static = s.cannot_fit(job, geo)
        if static is not None:
            if static[0] == "reject" or cfg.reject_over_capacity:
                self.d.rejections[job.id] = static[1]
                s.pending.pop(job.id, None)
            else:
                self.d.pending[job.id] = PendingReason("capacity", static[1])
            return True
        if self.starts >= cfg.max_starts_per_pass:
            self.d.pending[job.id] = PendingReason(
                "priority",
                f"priority: this pass started its limit of {cfg.max_starts_per_pass} jobs; next pass",
            )
            return True
        return False

    def quota_rows(self, job: JobRequest, geo: Geometry) -> list[tuple[str, str]]:
        """The quota rows (tenant, row model) a GPU job could be charged to."""
        s = self.s
        if not s.quotas.enabled or not geo.req.count:
            return []
        models, _ = s.models_for(job)
        key = (job.tenant, models)
        rows = self.rows_of.get(key)
        if rows is None:
            rows = self.rows_of[key] = sorted({s.quotas.row_key(job.tenant, m) for m in models})
        return rows

    def quota_held_for_another(self, want: Want, rows: list[tuple[str, str]], held: frozenset[str]) -> bool:
        """Every quota row it could use is held against it (``held``, :meth:`held_off`: every
        model it accepts) for an aged job of its tenant ahead of it (:class:`RowHold`). A job past
        the starvation bound is held off no longer: a hold delays a job, never for ever (a
        43-hour job waited 27 hours on free GPUs behind its tenant's 64-GPU job, and a tenant's
        stream of such jobs could hold a row for days)."""
        job = want.job
        if not held.issuperset(self.s.models_for(job)[0]):
            return False
        self.res.drop(job.id)  # its nodes held for it would idle: its quota does not admit it
        holder = self.held_rows[rows[0]].job_id
        self.d.pending[job.id] = PendingReason(
            "quota", f"quota: {job.tenant}'s quota is held for its job {holder}, which has waited longest"
        )
        self.d.held_for[job.id] = holder
        return True

    def want(self, job: JobRequest, geo: Geometry) -> Want:
        runtime = self.s.history.predict(job)
        who = self.removable(job)
        outranks = self.outranking(job, geo)
        node_ok = self.reservations_allow(job.id, geo, runtime, who, outranks) if self.res.items else None
        return Want(job, geo, runtime, who, node_ok, outranks)

    def reservations_allow(
        self,
        job_id: str,
        geo: Geometry,
        runtime: float | None,
        who: Removable,
        outranks: Outranks | None = None,
    ) -> NodeOk:
        res, now = self.res, self.now

        def node_ok(i: int) -> bool:
            return (
                res.allows(i, now, runtime, job_id, *who)
                or self.beside(i, geo)
                or (outranks is not None and outranks(res.owners_by_node.get(i, ())))
            )

        return node_ok

    def outranking(self, job: JobRequest, geo: Geometry) -> Outranks | None:
        """For a job of a preemptor level (inference) that its tenant's guarantee holds: may it
        use a node reserved only for jobs of lower kind levels? A guarantee is served before
        any wait bound of lower work: an inference service within its tenant's guarantee once
        waited 5.5 hours beside preemptible fine-tunes and batch jobs, every node of its model
        reserved for other tenants' aged training (the scarce held-out shape). The reserving
        jobs find their room again by their own rules (a starving one preempts younger work)."""
        s, cfg = self.s, self.cfg
        level = cfg.level_of(job.kind)
        if not s.quotas.enabled or not geo.req.count or level not in cfg.preemptor_levels:
            return None
        models, _ = s.models_for(job)
        charge = geo.charge * geo.need
        if not any(s.quotas.under_guarantee(job.tenant, m, charge, job.preemptible) for m in models):
            return None

        def outranks(owners: Collection[str]) -> bool:
            if not owners:
                return False
            for j in owners:
                other = s.pending.get(j)
                if other is None or cfg.level_of(other.kind) <= level:
                    return False
            return True

        return outranks

    def beside(self, node: int, geo: Geometry) -> bool:
        """May a job of ``geo`` run on ``node`` beside the one job reserving it, however long,
        taking nothing that job needs there (:func:`.backfill.leaves_room`)? A room being freed
        by preemption or shrinking (``room``), or a node two jobs reserve, is held whole."""
        s, res = self.s, self.res
        owner = res.owner_by_node.get(node)
        job = s.pending.get(owner) if owner is not None else None
        if job is None or owner in s.room or len(res.owners_by_node[node]) > 1:
            return False
        held_geo = s.geo(job)
        held, _ = gang_shape(held_geo.req, held_geo.need, job.topology)
        holders = s.holders(self.now).get(node, [])
        return leaves_room(s.state, node, held, res.start_by_node[node], holders, geo.req, geo.replicas)

    def place(self, want: Want, held: frozenset[str]) -> tuple[list[Alloc] | None, tuple[str, str] | None]:
        """Where it fits now, honouring the reservations (non-preemptible work off the racks
        kept clear for rack gangs first) and never on ``held``, the models whose quota rows are
        held against it (:meth:`held_off`); else the quota reason that refused it, if one did."""
        s, job, geo = self.s, want.job, want.geo
        allocs: list[Alloc] | None = None
        refusal: tuple[str, str] | None = None
        if s.clear_racks and not job.preemptible and geo.req.count:
            allocs, refusal = s.try_place(job, geo, self.off_models(held, self.off_clear(want.node_ok)))
        if not allocs and refusal is None:
            allocs = self.off_contested(want, held)
        if not allocs and refusal is None:
            token = (self.res.key(), want.runtime, job.id if job.id in s.room else None, want.who, held)
            allocs, refusal = s.try_place(job, geo, self.off_models(held, want.node_ok), token=token)
        return allocs, refusal

    def off_models(self, models: frozenset[str], inner: NodeOk | None) -> NodeOk | None:
        """``inner`` (None: every node) less the nodes of ``models``."""
        if not models:
            return inner
        nodes = self.s.state.nodes

        def node_ok(i: int) -> bool:
            return nodes[i].spec.model not in models and (inner is None or inner(i))

        return node_ok

    def held_off(self, want: Want) -> frozenset[str]:
        """The models ``want``'s job may not start on because their quota rows are held against
        it for its tenant's aged job (:class:`RowHold`), unless it starves itself. Before, a
        hold kept off only a job all of whose rows were held: one that accepts several models
        took the held row's quota on its preferred model and the aged job waited on
        (docs/benchmarks/eval-matrix.md)."""
        s, job, geo = self.s, want.job, want.geo
        if not self.held_rows or not geo.req.count or queues.starving(job, self.now, self.cfg):
            return frozenset()
        ends = self.expected_end(job, want.runtime)
        charge = geo.charge * geo.need
        held = set()
        for m in s.models_for(job)[0]:
            hold = self.held_rows.get(s.quotas.row_key(job.tenant, m))
            if hold is not None and hold.keeps_off(job, ends, charge, want.who):
                held.add(m)
        return frozenset(held)

    def off_contested(self, want: Want, held: frozenset[str]) -> list[Alloc] | None:
        """A job that accepts several models, placed first off the models a job waiting for
        nodes needs (where that job's quota admits it), if it fits there: a job blocked earlier
        in this pass, or one the last pass left waiting that this pass has not reached yet.
        Before, it took its preferred model's free GPUs while a job that could use only that
        model waited for them and the other models idled (docs/scheduler.md). ``held``: the
        models it may not use at all (:meth:`held_off`)."""
        s, job, geo = self.s, want.job, want.geo
        contested = self.contested
        if self.waited:
            contested = contested | {m for m, n in self.waited_on.items() if n}
        if not contested or not geo.req.count:
            return None
        models = s.models_for(job)[0]
        if len(models) < 2 or contested.isdisjoint(models):
            return None
        avoid = contested | held
        if avoid.issuperset(models):
            return None
        allocs, _ = s.try_place(job, geo, self.off_models(frozenset(avoid), want.node_ok))
        return allocs

    def start(self, want: Want, allocs: list[Alloc]) -> None:
        """Bind it where it fits, unless a model it prefers frees soon enough to wait for (γ)."""
        wait = wait_for_preferred(self.s, want.job, want.geo, allocs, self.now)
        if wait is not None:
            self.d.pending[want.job.id] = wait
            return
        self.s.bind(want.job, want.geo, allocs, self.now, self.d)
        self.starts += 1
        if self.held_rows:
            self.take_spare(want)

    def take_spare(self, want: Want) -> None:
        """What a started job is charged on a held row past the row's freeing is spare no more."""
        s, job = self.s, want.job
        ends = self.expected_end(job, want.runtime)
        for model, milli in s.running[job.id].charged:
            hold = self.held_rows.get(s.quotas.row_key(job.tenant, model))
            if hold is not None and milli:
                hold.take(job, ends, milli)

    def refused_by_quota(self, want: Want, rows: list[tuple[str, str]], refusal: tuple[str, str]) -> None:
        """Its quota refuses it: preempt its tenant's own jobs behind it to make quota room (the
        preemptor levels), else wait; an aged job holds its rows against its tenant's later jobs
        that would delay it (:class:`RowHold`) and keeps a reservation starting no earlier than
        its quota frees, so it starts once both have freed and its nodes are backfilled until
        then (with the nodes' start alone, they idled while it waited for its quota; none is
        made while the running jobs' ends alone never free it)."""
        s, cfg, job, geo = self.s, self.cfg, want.job, want.geo
        left = cfg.max_preemptions_per_pass - len(self.d.preemptions)
        own = s.quota_victims(job, geo, left) if cfg.preemption and left > 0 else None
        if own is not None:
            self.make_quota_room(want, own)
            return
        self.quota_blocked.append((job, geo))
        self.res.drop(job.id)  # kept below only where its quota frees by the running jobs' ends
        if queues.is_aged(job, self.now, cfg):  # its tenant's later jobs must not overtake it
            steady_only = not job.preemptible and refusal[0] == "borrow-limit"
            frees: dict[tuple[str, str], tuple[float, int]] = {}
            for r in rows:
                ahead = self.refused_ahead.get(r, 0)
                frees[r] = self.quota_frees_at(geo, r, steady_only, ahead)
                self.held_rows.setdefault(r, RowHold(job.id, steady_only, *frees[r]))
                self.refused_ahead[r] = ahead + geo.charge * geo.need
            ready = self.quota_ready(job, geo, frees)  # after the aged jobs ahead on its rows
            if cfg.backfill and self.res.slot_for(job.id, cfg.max_reservations) and ready:
                ranked = tuple(m for m in s.models_for(job)[0] if m in ready)
                kept = s.reserve_for(replace(job, accelerators=ranked), geo, self.res, self.now)
                at = ready.get(s.nodes[kept.nodes[0]].model) if kept is not None else None
                if kept is not None and at is not None:  # (its sticky nodes may be elsewhere)
                    self.res.add(replace(kept, start=max(kept.start, at)))

    def quota_ready(
        self, job: JobRequest, geo: Geometry, frees: dict[tuple[str, str], tuple[float, int]]
    ) -> dict[str, float]:
        """Per model the job may use, when its quota there will admit it by the running jobs'
        expected ends (``frees``, per row); a model left out never does by their ends alone: its
        row frees never so, or the row has room but the model is owed to other tenants waiting
        within their guarantee (:meth:`.policy.TesseraScheduler.refusal`), which no running job's
        end decides. Nodes drained for it there idled while others' jobs went on being owed."""
        s = self.s
        need = geo.charge * geo.need
        ready: dict[str, float] = {}
        for m in s.models_for(job)[0]:
            row = s.quotas.row_key(job.tenant, m)
            at = frees.get(row, (math.inf, 0))[0]
            if at == math.inf:
                continue
            if s.quotas.check(job.tenant, m, need, job.preemptible) is None and not s.admits(job, m, need):
                continue  # room on its row, but owed to others
            ready[m] = at
        return ready

    def quota_frees_at(
        self, geo: Geometry, row: tuple[str, str], steady_only: bool, ahead: int = 0
    ) -> tuple[float, int]:
        """When the tenant's running jobs on ``row`` will have freed room for a job of ``geo``
        (and ``ahead`` milli-GPU more: aged jobs ahead of it waiting on the row), by their
        expected ends (inf: never by their ends alone), and how much more than its need the row
        has free then (milli-GPU)."""
        s, now = self.s, self.now
        q = s.quotas.rows.get(row[0], {}).get(row[1])
        if q is None:
            return math.inf, 0
        need = geo.charge * geo.need + ahead
        if steady_only:
            over = s.quotas.fixed.get(row, 0) + need - round(q.guaranteed * MILLI)
        else:
            over = s.quotas.usage.get(row, 0) + need - round(q.limit * MILLI)
        if over <= 0:
            return now, -over
        ends = []
        for run in s.running.values():
            if run.job.tenant != row[0] or (steady_only and run.job.preemptible):
                continue
            milli = sum(m for model, m in run.charged if s.quotas.row_key(row[0], model) == row)
            if milli:
                ends.append((s.expected_end(run, now), milli))
            gone = sum(m for model, m in run.leaving_charged if s.quotas.row_key(row[0], model) == row)
            if gone:  # a shrink's removed replicas, charged until they exit
                ends.append((max(now, run.leaving_until), gone))
        for end, milli in sorted(ends):
            over -= milli
            if over <= 0:
                return end, -over
        return math.inf, 0

    def make_quota_room(self, want: Want, own: list[Victim]) -> None:
        """Preempt ``own`` (its tenant's jobs) for it. The room being freed is this job's: later
        jobs of its tenant see it as used (a second waiting job makes its own room) and may not
        grow the row meanwhile."""
        s, job, geo = self.s, want.job, want.geo
        m = s.quota_room_model
        if m is not None:
            s.quotas.add(job.tenant, m, geo.charge * geo.need, job.preemptible)
            self.claimed.append((job.tenant, m, geo.charge * geo.need, job.preemptible))
            s.quota_token = (*s.quota_token, job.id)
            s.quotas.frozen.setdefault(s.quotas.row_key(job.tenant, m), job.id)
        for v in own:
            s.running[v.job_id].terminating = True
            self.d.preemptions.append(
                Preemption(v.job_id, f"quota: {job.tenant} needs the room for job {job.id}", job.id)
            )
        self.d.pending[job.id] = PendingReason(
            "reserved",
            f"reserved: preempting {len(own)} of {job.tenant}'s own jobs to "
            "make quota room; starts when they exit"
            if own
            else f"reserved: waiting for {job.tenant}'s terminating jobs to exit",
            self.now + max((s.running[v.job_id].job.grace_s for v in own), default=0.0),
        )

    def admitted(self, want: Want) -> Want:
        """``want`` with its job's models cut to those its quota admits it on now: room made
        or nodes reserved on a model its quota refuses could never start it (a gang got an empty
        preemption plan on a free rack of such a model and was told it waited for terminating
        jobs, with none terminating, for hours while its rack was drained for it)."""
        s, job, geo = self.s, want.job, want.geo
        if not s.quotas.enabled or not geo.req.count:
            return want
        models, _ = s.models_for(job)
        ok = tuple(m for m in models if s.admits(job, m, geo.charge * geo.need))
        if not ok or len(ok) == len(models):
            return want
        return replace(want, job=replace(job, accelerators=ok))

    def held_back_by_reservations(self, want: Want) -> bool:
        """It would fit but for the reservations: say whose."""
        if want.node_ok is None:
            return False
        s, job = self.s, want.job
        probe, _ = s.try_place(job, want.geo, None)
        if not probe:
            return False
        for a in probe:
            s.state.release_replica(job.id, a)
        owner = next((r for r in self.res.items), None)
        holder = s.pending.get(owner.job_id) if owner else None
        held_for = job_named(owner.job_id, holder.tenant if holder else None, job.tenant) if owner else ""
        self.d.pending[job.id] = PendingReason(
            "reserved",
            f"reserved: the free room is held for {held_for}, expected to start "
            f"in {_minutes(owner.start - self.now)}"
            if owner
            else "reserved",
        )
        return True

    def may_preempt_for_priority(self, job: JobRequest) -> bool:
        """A job that may preempt (inference) makes its room off the reserved nodes."""
        return self.cfg.level_of(job.kind) in self.cfg.preemptor_levels

    def make_room(self, want: Want) -> bool:
        """Step 4: shrink elastic jobs if that alone makes room, else preempt (within the pass's
        budget of victim searches and preemptions). A job of the preemptor levels (inference)
        takes whichever of the two frees its room sooner, each by its grace periods (a shrink
        loses no work, so it wins a tie): a service waited 120 s for a shrink's grace period
        where preempting a job with a 30-s grace period would have made the room."""
        cfg = self.cfg
        budget = (
            self.attempts < cfg.max_preemption_attempts
            and len(self.d.preemptions) < cfg.max_preemptions_per_pass
        )
        if not (want.geo.req.count and cfg.preemption and budget):
            return False
        shrink = self.plan_shrink(want) if cfg.resizes else None
        if shrink is not None and self.may_preempt_for_priority(want.job):
            self.undo_shrink(shrink)
            plan = self.sooner_preemption(want, shrink.ready)
            if plan is not None:
                self.preempt(want, plan)
                return True
            self.redo_shrink(shrink)
        if shrink is not None:
            self.commit_shrink(want, shrink)
            return True
        plan = self.plan_preemption(want)
        if plan is None:
            return False
        self.preempt(want, plan)
        return True

    def sooner_preemption(self, want: Want, shrink_ready: float) -> list[Victim] | None:
        """The victims that would free the job's room before ``shrink_ready`` (when the shrink
        found for it would), or None (the pass's hypothetical cluster is left as it was)."""
        before = self.hypo  # (None: made after the shrink, if it is made, counting its replicas)
        self.hypo = before.copy() if before is not None else self.s.new_hypo()
        plan = self.plan_preemption(want)
        if plan is not None and self.room_ready(plan, self.hypo.last_nodes) < shrink_ready:
            return plan
        self.hypo = before
        return None

    def room_ready(self, plan: list[Victim], nodes: tuple[int, ...]) -> float:
        """When preempting ``plan`` has freed the room on ``nodes`` at the latest: its victims'
        grace periods, and what is already leaving those nodes — a terminating job within its
        grace period (when it was told to stop is not known here), a shrink's removed replicas
        by their deadline."""
        s, now = self.s, self.now
        ready = now + max((v.grace for v in plan), default=0.0)
        on = set(nodes)
        for jid, run in s.running.items():
            if (run.terminating or run.cancelled) and any(a.node in on for a in s.state.allocs.get(jid, ())):
                ready = max(ready, now + run.job.grace_s)
            if run.leaving and any(a.node in on for a in run.leaving):
                ready = max(ready, run.leaving_until)
        return ready

    def reserve(self, want: Want) -> bool:
        """Reserve nodes for it (backfill keeps them for it), if it is aged or the first job
        blocked, within the pass's reservations."""
        cfg, job = self.cfg, want.job
        aged = queues.is_aged(job, self.now, cfg)
        if not (
            cfg.backfill
            and self.res.slot_for(job.id, cfg.max_reservations)
            and (aged or not self.blocked_seen)
        ):
            return False
        self.blocked_seen = True
        r = self.s.reserve_for(job, want.geo, self.res, self.now)
        if r is None:
            return False
        self.res.add(r)
        self.d.pending[job.id] = PendingReason(
            "reserved",
            f"reserved: {len(r.nodes)} node(s) held for it, expected to start "
            f"in {_minutes(r.start - self.now)}",
            r.start,
        )
        return True

    # -- step 4: preemption and shrinking --------------------------------------------------------
    def plan_preemption(self, want: Want) -> list[Victim] | None:
        """The victims that would make its room (see :meth:`plan_victims`), or None. A request
        no preemption could help is not searched again this pass."""
        s, job, geo, now = self.s, want.job, want.geo, self.now
        if self.hypo is None:
            self.hypo = s.new_hypo()
        fail_key = (
            geo,
            job.accelerators,
            job.node_selector,
            job.tolerations,
            job.topology,
            queues.rank(job, self.cfg),
            queues.is_aged(job, now, self.cfg),
            job.tenant,
            self.res.key(),
            want.runtime,
        )
        if fail_key in self.preempt_failed:
            return None
        victims = s.victims(job, geo, now)
        if not victims and not self.hypo.terminating:
            return None
        self.attempts += 1
        models, _ranked = s.models_for(job)
        c = Constraints(models, job.node_selector, job.tolerations, True, shares=s.shares(job, geo))
        plan = self.plan_victims(self.hypo, want, c, victims)
        if plan is None:
            self.preempt_failed.add(fail_key)
        return plan

    def plan_victims(
        self, hypo: Hypo, want: Want, c: Constraints, victims: dict[int, list[Victim]]
    ) -> list[Victim] | None:
        """Victims that make room for the job where its topology allows, off the nodes reserved
        for other jobs — this pass's (``node_ok``) and last pass's, so that even a job ahead of
        a reserved one in the queue makes its room elsewhere: a preemption never delays a
        reservation."""
        s, job, geo, node_ok = self.s, want.job, want.geo, want.node_ok
        prev = s.prev_reserved

        outranks = want.outranks

        def allowed(i: int) -> bool:
            before = prev.get(i, job.id)
            if before != job.id and not (outranks is not None and outranks((before,))):
                return False
            return node_ok is None or node_ok(i)

        def gone(jid: str) -> bool:
            run = s.running.get(jid)
            return run is None or run.terminating

        ok = allowed if prev or node_ok is not None else None
        urgent = not job.preemptible  # a service: its start waits on its slowest victim's exit
        if s.clear_racks and not job.preemptible:  # off the racks kept clear, if room is there
            plan = choose_victims(
                s.placer, hypo, geo.req, geo.need, c, victims, gone, job.topology, self.off_clear(ok), urgent
            )
            if plan is not None:
                return plan
        return choose_victims(s.placer, hypo, geo.req, geo.need, c, victims, gone, job.topology, ok, urgent)

    def preempt(self, want: Want, plan: list[Victim]) -> None:
        """Mark the victims; the room they free is held for the job (no other job may start
        there meanwhile); it starts when they have exited."""
        s, cfg, job, now = self.s, self.cfg, want.job, self.now
        may_rank = cfg.level_of(job.kind) in cfg.preemptor_levels
        for v in plan:
            s.running[v.job_id].terminating = True
            self.d.preemptions.append(Preemption(v.job_id, self.why(job, v.job_id, may_rank), job.id))
        waiting = f"preempting {len(plan)} job(s)" if plan else "waiting for terminating jobs"
        grace = max((s.running[v.job_id].job.grace_s for v in plan), default=0.0)
        assert self.hypo is not None  # plan_preemption made it
        if plan and self.hypo.last_nodes:
            s.room[job.id] = (self.hypo.last_nodes, now + grace + cfg.room_hold_s)
            self.res.add(Reservation(job.id, self.hypo.last_nodes, now))
        self.d.pending[job.id] = PendingReason(
            "reserved",
            f"reserved: {waiting} to make room; starts when they exit",
            now + grace if plan else None,
        )

    def why(self, job: JobRequest, victim: str, may_rank: bool) -> str:
        """The reason a victim is given: which of the preemption rules chose it."""
        s = self.s
        named = job_named(job.id, job.tenant, s.running[victim].job.tenant)
        if may_rank and queues.rank(s.running[victim].job, s.config) > queues.rank(job, s.config):
            return f"priority: for {named}"
        if s.starving(job, self.now):
            waited = (self.now - job.submitted_at) / 3600
            return f"seniority: {named} has waited {waited:.0f} h (starvation bound)"
        return f"reclaim: {job.tenant} needs its guarantee"

    def plan_shrink(self, want: Want) -> ShrinkPlan | None:
        """Shrink elastic jobs behind the job (or borrowing) if that alone lets it start: the
        plan, with the state shrunk (:meth:`commit_shrink` keeps it, :meth:`undo_shrink` puts it
        back), or None (the state as it was). A job whose shrink is under way is not shrunk
        again."""
        s, job, geo, now = self.s, want.job, want.geo, self.now
        elastic = [
            jid
            for _r, jid, run, _v, _m in s.elastic
            if not run.terminating and not run.leaving and len(s.state.allocs.get(jid, ())) > run.geo.need
        ]
        if not elastic:
            return None
        eligible = {v.job_id for vs in s.victims(job, geo, now).values() for v in vs}
        shrunk: list[tuple[str, Alloc]] = []
        for jid in sorted(j for j in elastic if j in eligible):
            run = s.running[jid]
            held = sorted(s.state.allocs.get(jid, ()), key=lambda a: -a.replica)
            for a in held[: max(0, len(held) - run.geo.need)]:
                s.state.release_replica(jid, a)
                shrunk.append((jid, a))
        if not shrunk:
            return None
        allocs, _ = s.try_place(job, geo, None)
        plan = ShrinkPlan(shrunk, (), now)
        if not allocs:
            self.undo_shrink(plan)
            return None
        for a in allocs:
            s.state.release_replica(job.id, a)
        nodes = tuple(sorted({a.node for a in allocs}))
        # it starts once the removed replicas on the nodes it would take have exited
        slowest = max((s.running[j].job.grace_s for j, a in shrunk if a.node in nodes), default=0.0)
        return ShrinkPlan(shrunk, nodes, now + slowest)

    def undo_shrink(self, plan: ShrinkPlan) -> None:
        """Give the shrunk jobs their removed replicas back."""
        s = self.s
        for jid, a in reversed(plan.shrunk):
            s.state.take(jid, a.node, a.gpus, a.milli, a.cpu, a.mem, a.replica, a.tenant)

    def redo_shrink(self, plan: ShrinkPlan) -> None:
        """Remove the replicas :meth:`undo_shrink` gave back again."""
        s = self.s
        for jid, a in plan.shrunk:
            s.state.release_replica(jid, next(b for b in s.state.allocs[jid] if b.replica == a.replica))

    def commit_shrink(self, want: Want, plan: ShrinkPlan) -> None:
        """Make the shrink :meth:`plan_shrink` found.

        The replicas removed keep their GPUs until their processes have exited (invariant 8:
        the driver's ``release_leaving``, at the latest after the shrunk job's grace period);
        the room is held for the job meanwhile, as for a preemption, and it starts in a later
        pass."""
        s, cfg, job, now = self.s, self.cfg, want.job, self.now
        shrunk, nodes = plan.shrunk, plan.nodes
        # It fits once they have gone: the room it would take is held for it until then.
        # keep every shrink made (they are cheap to undo by growing later); the victims changed
        s.forget_victims()
        grace = 0.0
        for jid in dict.fromkeys(j for j, _ in shrunk):
            run = s.running[jid]
            for j, a in shrunk:
                if j == jid:
                    run.leaving.append(
                        s.state.take(
                            leaving_key(jid), a.node, a.gpus, a.milli, a.cpu, a.mem, a.replica, a.tenant
                        )
                    )
                    # charged until they exit (the driver's release_leaving), as their GPUs are
                    run.leaving_charged.append(run.charged.pop())
            run.leaving_until = now + run.job.grace_s
            grace = max(grace, run.job.grace_s)
            why = f"shrunk to make room for {job_named(job.id, job.tenant, run.job.tenant)}"
            self.d.resizes.append(Resize(jid, placements_of(s.state.allocs.get(jid, []), s.state), why))
        s.room[job.id] = (nodes, now + grace + cfg.room_hold_s)
        self.res.add(Reservation(job.id, nodes, now))
        n = len({j for j, _ in shrunk})
        self.d.pending[job.id] = PendingReason(
            "reserved",
            f"reserved: shrinking {n} elastic job(s) to make room; starts when their removed replicas exit",
            now + grace,
        )

    # -- step 5: growing -------------------------------------------------------------------------
    def grow(self) -> None:
        """Elastic jobs and partially started gangs take more replicas if room is left."""
        s, now, res = self.s, self.now, self.res
        for jid in sorted(s.running):
            run = s.running[jid]
            if run.terminating or run.cancelled or run.leaving:
                continue  # (a job whose shrink is under way grows once it is done)
            have = s.state.allocs.get(jid, [])
            if len(have) >= run.geo.replicas or not have:
                continue
            runtime = s.history.predict(run.job)
            used = {a.replica for a in have}
            nxt = max(used) + 1

            topo = run.job.topology
            if topo == "nvlink":
                more = self.grow_in_island(
                    run, have, nxt, res.allows(have[0].node, now, runtime, "", *self.removable(run.job))
                )
                if more:
                    self.d.resizes.append(Resize(jid, placements_of(s.state.allocs[jid], s.state), "grown"))
                continue
            home_nodes = {a.node for a in have}
            home_racks = {s.state.nodes[a.node].spec.rack for a in have}

            who = self.removable(run.job)

            def node_ok(
                i: int,
                runtime: float | None = runtime,
                topo: str = topo,
                home_nodes: set[int] = home_nodes,
                home_racks: set[str] = home_racks,
                who: Removable = who,
            ) -> bool:
                if topo == "node" and i not in home_nodes:
                    return False
                if topo == "rack" and s.state.nodes[i].spec.rack not in home_racks:
                    return False
                return res.allows(i, now, runtime, "", *who)

            more_allocs, _ = s.try_place(
                replace(run.job, topology="any"),
                run.geo,
                node_ok,
                nxt,
                top=run.geo.replicas - len(have),
                need=1,
            )
            if not more_allocs:
                continue
            for a in more_allocs:
                s.charge(run, s.nodes[a.node].model, run.geo.charge if a.gpus else 0)
            self.d.resizes.append(Resize(jid, placements_of(s.state.allocs[jid], s.state), "grown"))

    def grow_in_island(
        self, run: Running, have: list[Alloc], first_replica: int, allowed: bool
    ) -> list[Alloc]:
        """Grow an ``nvlink`` job with whole free GPUs of the island it runs in (never another
        island, never another node), as many replicas as fit there, its quota admits and the
        reservations allow (``allowed``: the node is not held for another job)."""
        s = self.s
        req = run.geo.req
        node = have[0].node
        if (
            not allowed
            or req.count == 0
            or req.milli < MILLI
            or any(a.node != node or not a.gpus for a in have)
        ):
            return []
        n = s.state.nodes[node]
        size = n.islands[0].size
        base = have[0].gpus[0] // size * size
        if any(g // size * size != base for a in have for g in a.gpus):
            return []  # not in one island (adopted from elsewhere): nothing to grow into
        free = [g for g in range(base, min(base + size, len(n.free))) if n.free[g] >= MILLI]
        k = min(run.geo.replicas - len(have), len(free) // req.count)
        if req.cpu:
            k = min(k, n.cpu // req.cpu)
        if req.mem:
            k = min(k, n.mem // req.mem)
        model = s.nodes[node].model
        while k > 0 and not s.admits(run.job, model, run.geo.charge * k):
            k -= 1
        out = []
        for r in range(max(0, k)):
            out.append(
                s.state.take(
                    run.job.id,
                    node,
                    free[r * req.count : (r + 1) * req.count],
                    req.milli,
                    req.cpu,
                    req.mem,
                    first_replica + r,
                    run.job.tenant,
                )
            )
            s.charge(run, model, run.geo.charge)
        return out

    # -- step 6: reasons -------------------------------------------------------------------------
    def keep_reservations(self) -> None:
        """This pass's reservations are the next one's to honour; a job no longer reserved for
        forgets the nodes it held."""
        s = self.s
        s.last_reservations = list(self.res.items)
        held = {r.job_id for r in self.res.items}
        for jid in [j for j in s.sticky if j not in held]:
            del s.sticky[jid]

    def explain(self) -> None:
        """Every job still pending gets its reason, on the final state: quota reasons on the
        final usage (before this pass's claims are given back), then a diagnosis."""
        s, d = self.s, self.d
        for job, geo in self.quota_blocked:
            refusal = s.quota_refusal(job, geo)
            if refusal is not None:
                d.pending[job.id] = PendingReason(*refusal)
            else:
                self.to_diagnose.append((job, geo))
        for tenant, m, milli, preemptible in self.claimed:
            s.quotas.add(tenant, m, -milli, preemptible)
        s.quotas.frozen = {}
        s.quotas.claims.clear()
        s.quotas.fixed_claims.clear()
        cache: dict[tuple[object, ...], PendingReason] = {}
        summaries: dict[str | None, dict[int, ClassSummary]] = {}
        quota_cache: dict[tuple[object, ...], PendingReason | None] = {}
        for job, geo in self.to_diagnose:
            qkey = (
                geo,
                job.accelerators,
                job.node_selector,
                job.tolerations,
                job.topology,
                job.tenant,
                job.preemptible,
            )
            if qkey not in quota_cache:
                quota_cache[qkey] = self.quota_instead(job, geo)
            instead = quota_cache[qkey]
            if instead is not None:  # room exists, on a model its quota refuses it
                d.pending[job.id] = instead
                continue
            shares = s.shares(job, geo)
            key = (geo, job.accelerators, job.node_selector, job.tolerations, job.topology, shares)
            reason = cache.get(key)
            if reason is None:
                reason = cache[key] = diagnose_job(s.placer, job, geo, summaries, shares)
            d.pending[job.id] = reason
        s.last_codes = {jid: r.code for jid, r in d.pending.items()}

    def quota_instead(self, job: JobRequest, geo: Geometry) -> PendingReason | None:
        """The quota reason of a job that would fit now on a model its quota refuses (else
        None): the honest answer there is the quota, not the capacity of the models it may use."""
        s = self.s
        if not s.quotas.enabled or not geo.req.count:
            return None
        models, _ = s.models_for(job)
        for m in models:
            why = s.refusal(job, m, geo.charge * geo.need)
            if why is None:
                continue
            c = Constraints((m,), job.node_selector, job.tolerations, True, shares=s.shares(job, geo))
            got = place_gang(s.placer, job.id, geo.req, geo.need, geo.need, job.topology, c, None, 0)
            if got:
                for a in got:
                    s.state.release_replica(job.id, a)
                return PendingReason(*why)
        return None

    # -- helpers ---------------------------------------------------------------------------------
    def off_clear(self, node_ok: NodeOk | None) -> NodeOk:
        """``node_ok`` narrowed to the nodes off the racks kept clear for rack gangs."""
        return OffRacks(self.s.state.nodes, self.s.clear_racks, node_ok)

    def expected_end(self, job: JobRequest, runtime: float | None) -> float:
        """When a job started now is expected to end (``runtime``: its prediction, if any)."""
        return self.now + (runtime if runtime is not None else self.cfg.default_runtime_s)

    def removable(self, job: JobRequest) -> Removable:
        return (self.cfg.level_of(job.kind) if job.preemptible else None), bool(job.time_limit_s)
