"""Baseline policies for replay, behind the same :class:`~.types.Scheduler` protocol.

The FCFS family serves the queue first come, first served (submission time, then id) and
**blocks at the head**: when the oldest startable job does not fit, nothing behind it starts (no
backfill), as a classic FIFO batch system does. Jobs held, in backoff or refused by their quota do
not block (they cannot start whatever the cluster does). Gangs start all together or not at all;
models, node selectors, topology and quota limits are honoured; nothing is ever preempted.

The greedy references are the fair ones to beat: they serve the queue by kind level (inference,
then training, then fine-tune and batch, as :class:`~.config.EngineConfig` ranks them), then the
job's priority, then arrival, and start **every** job that fits, first fit on the lowest-index free
GPUs — no reservation, no reclaim, no preemption, nothing blocks:
* ``greedy-quota``: obeys the same quota rules as every policy (non-preemptible work within the
  tenant's guarantee, preemptible work up to its limit);
* ``greedy``: ignores quotas.

Placement of each replica (docs/evaluation.md, "The packing benchmark, defined"):
* ``fcfs-node``: the first wholly free node (index order), held whole for the replica; only the
  GPUs the replica asked for are listed, the rest of the node counts as idle;
* ``fcfs-device``: the first node that fits, lowest-index free GPUs (first fit);
* ``random``: a uniformly random feasible node (seeded), a fraction on a random GPU that fits;
* ``best-fit``: the packing benchmark's best-fit score, ties by a seeded node order; a fraction on the GPU
  with the least free share that fits;
* ``fgd``: FGD's fragmentation-gradient score, ties by the seeded node order.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from .config import EngineConfig
from .fragmentation import UNTRACKED, FragmentationModel, Shape, shape_of
from .geometry import Geometry, constraints, geometry, replica_holders, static_check
from .placement import Constraints, class_allows, frag_delta, sigmoid_score
from .quota import Quotas
from .reasons import diagnose
from .state import Alloc, ClusterState, NodeState, ReplicaReq, fits_state, placements_of
from .types import HELD_REASON, MILLI, Binding, Decisions, JobRequest, NodeSpec, PendingReason, QuotaSpec

BASELINES = ("fcfs-node", "fcfs-device", "random", "best-fit", "fgd", "greedy", "greedy-quota")
GREEDY = ("greedy", "greedy-quota")
IGNORES_QUOTAS = frozenset({"greedy"})  # the fair reference without quotas
NO_ROOM = PendingReason("capacity", "capacity: no room for it now")


class BaselineScheduler:
    def __init__(
        self,
        name: str,
        nodes: tuple[NodeSpec, ...] | list[NodeSpec],
        quotas: tuple[QuotaSpec, ...] | list[QuotaSpec] = (),
        seed: int = 0,
    ):
        if name not in BASELINES:
            raise ValueError(f"unknown baseline {name!r}")
        self.name = name
        self.nodes = tuple(nodes)
        self.state = ClusterState(self.nodes, FragmentationModel(()), seed=seed)
        self.quotas = Quotas(() if name in IGNORES_QUOTAS else quotas)
        self.levels = EngineConfig()
        self.rng = random.Random(seed)
        self.pending: dict[str, JobRequest] = {}
        self.running: dict[str, list[tuple[str, int]]] = {}  # job -> (model, milli) charged
        self.tenant: dict[str, str] = {}
        self.preemptible: dict[str, bool] = {}  # quotas count non-preemptible usage apart
        self.held_nodes: dict[int, str] = {}  # fcfs-node: node -> job holding it whole
        self.recent: deque[Shape] = deque(maxlen=1000)
        self._dirty = 0
        self._static: dict[Any, Any] = {}
        self._shapes: dict[str, tuple[JobRequest, Geometry, tuple[str, str] | None]] = {}
        self._allowed_nodes: dict[tuple[Constraints, str | None, str | None], list[NodeState]] = {}

    # -- protocol ---------------------------------------------------------------------------------
    def submit(self, job: JobRequest) -> None:
        self.pending[job.id] = job
        self.recent.append(shape_of(job))
        self._dirty += 1

    def cancel(self, job_id: str) -> None:
        self.pending.pop(job_id, None)
        self._shapes.pop(job_id, None)

    def release(self, job_id: str, now: float) -> None:
        self.state.release(job_id)
        self._shapes.pop(job_id, None)
        for node in [n for n, j in self.held_nodes.items() if j == job_id]:
            del self.held_nodes[node]
        for model, milli in self.running.pop(job_id, []):
            self.quotas.add(self.tenant[job_id], model, -milli, self.preemptible.get(job_id, True))

    def release_leaving(self, job_id: str, now: float) -> None:
        return None  # a baseline never shrinks a job

    def requeue(self, job: JobRequest) -> None:
        if job.id in self.running:
            self.release(job.id, 0.0)
        self.pending[job.id] = job

    def checkpoint(self, job_id: str, at: float) -> None:
        return None

    def decide(self, now: float) -> Decisions:
        if (
            self.name == "fgd"
            and self._dirty
            and (self._dirty >= max(1, len(self.recent) // 10) or not self.state.frag.typical)
        ):
            self.state.set_frag(FragmentationModel.from_shapes(list(self.recent)))
            self._dirty = 0
        d = Decisions()
        head: str | None = None
        greedy = self.name in GREEDY
        # Shapes that found no room in this decide: the cluster only fills up while it goes on, so
        # a job alike in everything placement reads finds none either (the greedy references try
        # every job; without this a long queue costs a placement attempt per job per call).
        no_room: dict[tuple[Any, ...], PendingReason] = {}
        for job in sorted(self.pending.values(), key=self._greedy_key if greedy else _arrival):
            if job.held:
                d.pending[job.id] = PendingReason("held", HELD_REASON)
                continue
            if job.not_before > now:
                d.pending[job.id] = PendingReason("backoff", "backoff: waiting to retry", job.not_before)
                continue
            geo, static = self._shape(job)
            if static is not None:
                if static[0] == "reject":
                    d.rejections[job.id] = static[1]
                    del self.pending[job.id]
                else:
                    # Larger than the cluster: it waits for nodes to join, but it does not hold
                    # the queue behind it (nothing this cluster frees will ever start it).
                    d.pending[job.id] = PendingReason("capacity", static[1])
                continue
            if head is not None:
                d.pending[job.id] = PendingReason(
                    "priority", f"priority: behind job {head} (first come, first served)"
                )
                continue
            refusal = self._quota(job, geo)
            if refusal is not None:
                d.pending[job.id] = PendingReason(*refusal)
                continue
            shape = self._placement_key(job, geo) if greedy else None
            if shape is not None and shape in no_room:
                d.pending[job.id] = no_room[shape]
                continue
            allocs = self._place(job, geo)
            if allocs is None and shape is not None:  # greedy
                # A reference, judged by its starts: its pending reasons are not worth a diagnosis
                # each (three quarters of its time went there).
                d.pending[job.id] = no_room[shape] = NO_ROOM
                continue
            if allocs is None:
                reason = diagnose(_Probe(self.state), job, geo.req, geo.replicas, geo.need, constraints(job))
                if self.name == "fcfs-node" and reason.code == "gang":
                    reason = PendingReason(
                        "capacity", f"capacity: not enough wholly free nodes for {geo.replicas} replica(s)"
                    )
                d.pending[job.id] = reason
                head = job.id
                continue
            charged = []
            for a in allocs:
                model = self.nodes[a.node].model
                charged.append((model, geo.charge if a.gpus else 0))
                self.quotas.add(job.tenant, model, charged[-1][1], job.preemptible)
            self.running[job.id] = charged
            self.tenant[job.id] = job.tenant
            self.preemptible[job.id] = job.preemptible
            del self.pending[job.id]
            d.bindings.append(Binding(job.id, placements_of(allocs, self.state)))
        return d

    def _placement_key(self, job: JobRequest, geo: Geometry) -> tuple[Any, ...]:
        """Everything :meth:`_place` reads of a job (the quota's allowed models included)."""
        models = self._allowed_models(job, geo) if geo.req.count else None
        return (
            geo.req,
            geo.replicas,
            job.topology,
            job.accelerators,
            models,
            job.node_selector,
            job.tolerations,
        )

    def _greedy_key(self, job: JobRequest) -> tuple[int, int, float, str]:
        return (self.levels.level_of(job.kind), -job.priority, job.submitted_at, job.id)

    def _shape(self, job: JobRequest) -> tuple[Geometry, tuple[str, str] | None]:
        """The job's geometry here and whether it can never run (cached per job object: both
        depend only on the job, the nodes and the quota rows)."""
        hit = self._shapes.get(job.id)
        if hit is not None and hit[0] is job:
            return hit[1], hit[2]
        geo = geometry(job)  # elastic jobs run at their asked size here; all replicas at once
        least = geo
        geo = replace(geo, replicas=max(1, job.replicas), need=max(1, job.replicas))
        static = static_check(self.state, self.quotas, job, geo, self._static)
        if static is not None and static_check(self.state, self.quotas, job, least, self._static) is None:
            # too big at its asked size for the cluster or quota: run at its elastic minimum
            geo, static = replace(least, replicas=least.need), None
        if static is None and self.name == "fcfs-node" and geo.req.count:
            holders = replica_holders(self.state, job, geo)
            if holders < geo.replicas:  # a whole node each: fewer nodes than replicas, ever
                why = f"capacity: {geo.replicas} replicas need a whole node each; {holders} could hold one"
                static = ("capacity", why)
        self._shapes[job.id] = (job, geo, static)
        return geo, static

    # -- placement --------------------------------------------------------------------------------
    def _quota(self, job: JobRequest, geo: Geometry) -> tuple[str, str] | None:
        if not geo.req.count or not self.quotas.enabled:
            return None
        models = job.accelerators or tuple(sorted({n.model for n in self.nodes if n.gpus}))
        first = None
        for m in models:
            why = self.quotas.check(job.tenant, m, geo.charge * geo.replicas, job.preemptible)
            if why is None:
                return None
            first = first or why
        return first

    def _allowed_models(self, job: JobRequest, geo: Geometry) -> tuple[str, ...]:
        models = job.accelerators or tuple(sorted({n.model for n in self.nodes if n.gpus}))
        if not self.quotas.enabled or not geo.req.count:
            return job.accelerators
        return tuple(
            m
            for m in models
            if self.quotas.check(job.tenant, m, geo.charge * geo.replicas, job.preemptible) is None
        )

    def _place(self, job: JobRequest, geo: Geometry) -> list[Alloc] | None:
        req, n_rep = geo.req, geo.replicas
        c = constraints(job, self._allowed_models(job, geo) if geo.req.count else None)
        rack_sel = next((v for k, v in job.node_selector if k == "rack"), None)
        if job.topology in ("node", "nvlink") and n_rep > 1 and req.milli >= MILLI:
            whole = ReplicaReq(
                req.milli, req.count * n_rep, req.cpu * n_rep, req.mem * n_rep, job.topology == "nvlink"
            )
            node = self._choose(whole, c, rack_sel, None)
            if node is None:
                return None
            gpus = self._gpus(node[0], whole, node[1])
            return [
                self.state.take(
                    job.id, node[0], gpus[r * req.count : (r + 1) * req.count], req.milli, req.cpu, req.mem, r
                )
                for r in range(n_rep)
            ]
        racks: Sequence[str | None] = [None]
        if job.topology == "rack" and n_rep > 1:
            racks = sorted({n.spec.rack for n in self.state.nodes})
        for rack in racks:
            allocs: list[Alloc] = []
            for r in range(n_rep):
                node = self._choose(req, c, rack_sel, rack)
                if node is None:
                    break
                allocs.append(
                    self.state.take(
                        job.id, node[0], self._gpus(node[0], req, node[1]), req.milli, req.cpu, req.mem, r
                    )
                )
                if self.name == "fcfs-node":
                    self.held_nodes[node[0]] = job.id
            if len(allocs) == n_rep:
                return allocs
            for a in allocs:
                self.state.release_replica(job.id, a)
                self.held_nodes.pop(a.node, None)
        return None

    def _feasible(
        self, req: ReplicaReq, c: Constraints, rack_sel: str | None, rack: str | None
    ) -> Iterator[int]:
        """The nodes that fit a replica now, in index order (lazily: first fit reads only the first)."""
        for n in self._candidates(c, rack_sel, rack):
            spec = n.spec
            if self.name == "fcfs-node" and (
                n.index in self.held_nodes
                or any(v < MILLI for g, v in enumerate(n.free) if g not in spec.unhealthy_gpus)
            ):
                continue
            d = max(1, min(spec.nvlink_domain, spec.gpus)) if spec.gpus else 1
            if fits_state(n.key(), req, d, spec.gpus):
                yield n.index

    def _candidates(self, c: Constraints, rack_sel: str | None, rack: str | None) -> list[NodeState]:
        """The nodes ``c`` and the racks allow, whatever they hold, in index order (the nodes do
        not change: kept per constraints)."""
        key = (c, rack_sel, rack)
        got = self._allowed_nodes.get(key)
        if got is None:
            allows: dict[int, bool] = {}  # per node class, asked once
            got = []
            for n in self.state.nodes:
                spec = n.spec
                ok = allows.get(n.cls)
                if ok is None:
                    ok = allows[n.cls] = spec.schedulable and class_allows(spec, c) is not None
                if ok and not ((rack_sel and spec.rack != rack_sel) or (rack and spec.rack != rack)):
                    got.append(n)
            self._allowed_nodes[key] = got
        return got

    def _choose(
        self, req: ReplicaReq, c: Constraints, rack_sel: str | None, rack: str | None
    ) -> tuple[int, int | None] | None:
        if self.name in ("fcfs-node", "fcfs-device", *GREEDY):
            first = next(self._feasible(req, c, rack_sel, rack), None)
            return None if first is None else (first, None)
        feasible = list(self._feasible(req, c, rack_sel, rack))
        if not feasible:
            return None
        if self.name == "random":
            node = self.rng.choice(feasible)
            value = None
            if 0 < req.milli < MILLI:
                value = self.rng.choice([v for v in self.state.nodes[node].free if v >= req.milli])
            return node, value
        best: tuple[Any, ...] | None = None
        for i in feasible:
            n = self.state.nodes[i]
            free = tuple(sorted(n.free))
            value = None
            if self.name == "best-fit":
                cpu = n.cpu if n.cpu < UNTRACKED else 128_000
                s = 1 - (0.5 * (cpu - req.cpu) / 1000 / 128 + 0.5 * (sum(free) - req.demand) / 8000)
                score = math.floor(100 * s)
                if 0 < req.milli < MILLI:
                    value = min(v for v in free if v >= req.milli)
            else:
                delta, value = frag_delta(
                    self.state.frag, n.spec.model, n.cpu, free, req.cpu, req.milli, req.count
                )
                score = sigmoid_score(delta)
            key = (score, -n.rank)
            if best is None or key > best[0]:
                best = (key, i, value)
        assert best is not None
        return best[1], best[2]

    def _gpus(self, node: int, req: ReplicaReq, value: int | None) -> list[int]:
        free = self.state.nodes[node].free
        if req.count == 0:
            return []
        if req.milli < MILLI:
            if value is None:
                return [next(g for g, v in enumerate(free) if v >= req.milli)]
            return [free.index(value)]
        if req.nvlink:
            spec = self.nodes[node]
            d = max(1, min(spec.nvlink_domain, spec.gpus))
            for base in range(0, spec.gpus, d):
                got = [g for g in range(base, min(base + d, spec.gpus)) if free[g] >= MILLI]
                if len(got) >= req.count:
                    return got[: req.count]
        return [g for g, v in enumerate(free) if v >= MILLI][: req.count]


def _arrival(job: JobRequest) -> tuple[float, str]:
    return (job.submitted_at, job.id)


class _Probe:
    """The little of a Placer that :func:`.reasons.diagnose` needs, for the baselines."""

    def __init__(self, state: ClusterState):
        self.state = state

    def class_pref(self, cls: int, c: Constraints) -> int | None:
        spec = self.state.class_spec[cls]
        return class_allows(spec, c) if spec.schedulable else None
