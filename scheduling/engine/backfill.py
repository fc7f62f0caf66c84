"""Reservations and backfill: a blocked job gets a start time and nodes, and no job that starts
after it may delay that start.

1. The expected end of a running job is its start plus its time limit, else a runtime predicted
   from history (mean of the last runs of the same tenant and kind), else a default.
2. For a blocked job, every node that could hold one replica is "ready" at the earliest expected
   end after which its holders have freed enough for the replica (now, if it fits already). The
   job's reservation is its ``replicas`` earliest-ready nodes, and its start is the latest of them.
3. Backfill: a later job may use a reserved node only if it is sure to be gone by the reserved
   start (now + its time limit or predicted runtime <= start), or if it leaves the reserved job's
   room (:func:`leaves_room`: a reservation holds only what its job needs, so a GPU job may run
   beside a CPU-only job's reservation however long); otherwise it must go elsewhere.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from .placement import Constraints, Placer
from .state import Alloc, ClusterState, ReplicaReq, fits_state
from .types import MILLI, PREDICTED_OUTCOMES, FinishedRun, JobRequest, NodeSpec


@dataclass(frozen=True, slots=True)
class Reservation:
    job_id: str
    nodes: tuple[int, ...]
    start: float
    # A starving job's kind level (None otherwise): on its nodes only jobs it could preempt
    # (preemptible, of its level or below) backfill on an estimate; any other job needs a hard
    # time limit that ends it before the start, since one that overstays cannot be removed.
    strict_level: int | None = None


class History:
    """Runtimes of finished runs, per (tenant, kind), for jobs that give no time limit: the
    ``keep`` latest by (end, job id), so the same runs give the same prediction whether they
    were recorded one by one (the simulator's long-lived engine) or loaded at once from the
    database (the live pass, :class:`~.types.FinishedRun`)."""

    def __init__(self, keep: int = 10):
        self.keep = keep
        self.runs: dict[tuple[str, str], list[tuple[float, str, float]]] = {}  # (end, job, runtime)

    @classmethod
    def of(cls, runs: Iterable[FinishedRun], keep: int = 10) -> History:
        """The history of ``runs`` (those that ended on their own: succeeded or failed): the same
        as :meth:`add` of each in turn, each key's runs sorted once."""
        grouped: dict[tuple[str, str], list[tuple[float, str, float]]] = {}
        for r in runs:
            if r.outcome in PREDICTED_OUTCOMES:
                grouped.setdefault((r.tenant, r.kind), []).append(
                    (r.ended_at, r.job_id, max(0.0, r.runtime_s))
                )
        h = cls(keep)
        h.runs = {key: sorted(q)[-keep:] for key, q in grouped.items()}
        return h

    def copy(self) -> History:
        h = History(self.keep)
        h.runs = {key: list(q) for key, q in self.runs.items()}
        return h

    def record(self, job: JobRequest, runtime: float, ended_at: float) -> None:
        self.add(job.tenant, job.kind, job.id, runtime, ended_at)

    def add(self, tenant: str, kind: str, job_id: str, runtime: float, ended_at: float) -> None:
        q = self.runs.setdefault((tenant, kind), [])
        bisect.insort(q, (ended_at, job_id, max(0.0, runtime)))
        if len(q) > self.keep:
            del q[0]

    def predict(self, job: JobRequest) -> float | None:
        if job.time_limit_s:
            return job.time_limit_s
        q = self.runs.get((job.tenant, job.kind))
        return sum(r for _, _, r in q) / len(q) if q else None


def node_ready_time(
    placer: Placer,
    node: int,
    req: ReplicaReq,
    holders: list[tuple[float, Alloc]],
    now: float,
    shares: str | None = None,
) -> float | None:
    """When ``req`` fits on ``node`` if its holders leave at their expected ends (None: never);
    ``shares``: :attr:`.placement.Constraints.shares` (a fraction also needs a GPU whose other
    fractions have left or are that tenant's)."""
    state = placer.state
    n = state.nodes[node]
    spec = n.spec
    d = max(1, min(spec.nvlink_domain, spec.gpus)) if spec.gpus else 1
    free = list(n.free)
    cpu, mem = n.cpu, n.mem
    ruled = shares is not None and 0 < req.milli < MILLI
    held: dict[int, dict[str, int]] = {}
    if ruled:
        every = state.share_tenants or {}
        held = {g: dict(every[(node, g)]) for g in range(spec.gpus) if (node, g) in every}

    def fits() -> bool:
        if not fits_state((n.cls, cpu, mem, tuple(free)), req, d, spec.gpus):
            return False
        return not ruled or any(
            v >= MILLI or (v >= req.milli and held.get(g, {}).keys() <= {shares}) for g, v in enumerate(free)
        )

    if fits():
        return now
    for end, a in sorted(holders, key=lambda t: (t[0], t[1].gpus)):
        for g in a.gpus:
            free[g] = min(MILLI, free[g] + a.milli)
            if ruled and a.milli < MILLI and g in held:
                left = held[g].get(a.tenant, 0) - 1
                if left > 0:
                    held[g][a.tenant] = left
                else:
                    held[g].pop(a.tenant, None)
        cpu += a.cpu
        mem += a.mem
        if fits():
            return max(now, end)
    return None


def gang_shape(req: ReplicaReq, replicas: int, topology: str) -> tuple[ReplicaReq, int]:
    """The room ``replicas`` x ``req`` with ``topology`` needs, as placement would take it: a
    ``node``/``nvlink`` gang of whole GPUs is one request on one node (reservations and
    preemption search the same shape)."""
    if topology in ("node", "nvlink") and replicas > 1 and req.count and req.milli >= MILLI:
        return ReplicaReq(
            req.milli, req.count * replicas, req.cpu * replicas, req.mem * replicas, topology == "nvlink"
        ), 1
    return req, replicas


def gang_group(spec: NodeSpec, replicas: int, topology: str) -> tuple[str, str]:
    """Which nodes a gang's replicas may share, as placement would place them: one model
    (placement never mixes them) and, for a ``rack`` gang, one rack; ("", "") for one replica."""
    if replicas <= 1:
        return ("", "")
    return (spec.model, spec.rack if topology == "rack" else "")


def reserve(
    placer: Placer,
    job: JobRequest,
    req: ReplicaReq,
    replicas: int,
    c: Constraints,
    holders: dict[int, list[tuple[float, Alloc]]],
    taken: set[int],
    now: float,
) -> Reservation | None:
    """The reservation for ``job`` (step 2), avoiding nodes already reserved (``taken``).

    The nodes must be able to hold the job as placement would: a ``node``/``nvlink`` gang is one
    request on one node; a gang's replicas share one model (placement never mixes them), and a
    ``rack`` gang's one rack. Among the groups that qualify, the earliest start wins."""
    req, replicas = gang_shape(req, replicas, job.topology)
    by_group: dict[tuple[str, str], list[tuple[float, int, int]]] = {}
    for n in placer.state.nodes:
        if n.index in taken or placer.class_pref(n.cls, c) is None:
            continue
        if any(k == "rack" and n.spec.rack != v for k, v in c.selector):
            continue
        t = node_ready_time(placer, n.index, req, holders.get(n.index, []), now, c.shares)
        if t is not None:
            by_group.setdefault(gang_group(n.spec, replicas, job.topology), []).append((t, n.rank, n.index))
    best: tuple[float, int, tuple[str, str]] | None = None
    chosen: list[tuple[float, int, int]] = []
    for group, ready in sorted(by_group.items()):
        if len(ready) < replicas:
            continue
        ready.sort()
        key = (ready[replicas - 1][0], ready[replicas - 1][1], group)
        if best is None or key < best:
            best, chosen = key, ready[:replicas]
    if best is None:
        return None
    return Reservation(job.id, tuple(sorted(i for _, _, i in chosen)), best[0])


def leaves_room(
    state: ClusterState,
    node: int,
    held: ReplicaReq,
    start: float,
    holders: list[tuple[float, Alloc]],
    take: ReplicaReq,
    copies: int,
) -> bool:
    """May a job taking up to ``copies`` x ``take`` on ``node`` run there past the reserved
    ``start`` of a job that needs ``held`` there? Only if it takes no GPU while the reserved job
    needs GPUs, and the node's CPUs and memory when the reserved job is due (``start``, or later
    if its holders are now expected to free its CPUs and memory only later) still cover ``held``
    beside it: then it delays nothing."""
    if held.count and take.count:
        return False
    n = state.nodes[node]
    cpu, mem = n.cpu, n.mem
    for end, a in sorted(holders, key=lambda h: h[0]):
        if end > start and cpu >= held.cpu and mem >= held.mem:
            break
        cpu += a.cpu
        mem += a.mem
    return cpu - copies * take.cpu >= held.cpu and mem - copies * take.mem >= held.mem


class Reservations:
    """The reservations of one pass and the backfill rule (step 3)."""

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.items: list[Reservation] = []
        self.start_by_node: dict[int, float] = {}
        self.owner_by_node: dict[int, str] = {}
        self.strict_by_node: dict[int, int] = {}  # node -> lowest strict level reserving it
        self.owners_by_node: dict[int, set[str]] = {}  # node -> the jobs reserving it
        self._key: tuple[tuple[str, tuple[int, ...], float, int | None], ...] | None = ()

    def add(self, r: Reservation) -> None:
        """Reserve ``r``; a job holds one reservation, its latest (each pass carries the last
        pass's: adding beside it, one blocked job's copies filled ``max_reservations`` and the
        oldest copy's start, long past, kept its nodes from any backfill)."""
        self.drop(r.job_id)
        self._index(r)
        self._key = None

    def drop(self, job_id: str) -> None:
        """Give up ``job_id``'s reservation, if it holds one."""
        kept = [r for r in self.items if r.job_id != job_id]
        if len(kept) == len(self.items):
            return
        self._clear()
        for r in kept:
            self._index(r)
        self._key = None

    def of(self, job_id: str) -> Reservation | None:
        """``job_id``'s reservation, if it holds one."""
        return next((r for r in self.items if r.job_id == job_id), None)

    def holds(self, job_id: str) -> bool:
        return self.of(job_id) is not None

    def slot_for(self, job_id: str, limit: int) -> bool:
        """May ``job_id`` reserve within ``limit`` reservations (its own, if held, is replaced)?"""
        return len(self.items) < limit or self.holds(job_id)

    def key(self) -> tuple[tuple[str, tuple[int, ...], float, int | None], ...]:
        """What the backfill rule depends on, for memo keys: equal keys allow the same nodes."""
        if self._key is None:
            self._key = tuple((r.job_id, tuple(r.nodes), r.start, r.strict_level) for r in self.items)
        return self._key

    def _index(self, r: Reservation) -> None:
        self.items.append(r)
        for i in r.nodes:
            self.owners_by_node.setdefault(i, set()).add(r.job_id)
            if r.start < self.start_by_node.get(i, float("inf")):
                self.start_by_node[i] = r.start
                self.owner_by_node[i] = r.job_id
            if r.strict_level is not None:
                self.strict_by_node[i] = min(r.strict_level, self.strict_by_node.get(i, 1 << 30))

    def taken(self) -> set[int]:
        return set(self.start_by_node)

    def allows(
        self,
        node: int,
        now: float,
        runtime: float | None,
        job_id: str = "",
        removable_at: int | None = None,
        limited: bool = False,
    ) -> bool:
        """May a job that runs ``runtime`` use ``node`` now? ``removable_at``: the lowest kind
        level whose starving job could preempt it (None: none could); ``limited``: ``runtime``
        is a hard time limit."""
        start = self.start_by_node.get(node)
        if start is None or self.owner_by_node.get(node) == job_id:
            return True
        strict = self.strict_by_node.get(node)
        if strict is not None and not limited and (removable_at is None or removable_at < strict):
            return False
        return runtime is not None and now + runtime <= start
