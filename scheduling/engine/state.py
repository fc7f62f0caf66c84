"""The incremental cluster state: free capacity per node, kept exact in integer units.

* GPU capacity in milli-GPU per device (1000 = a whole free GPU, 0 = used or unhealthy);
  CPU in milli-CPU and memory in MiB, ``UNTRACKED`` when the node does not report them.
* Each node keeps buddy free lists per NVLink island (:mod:`.buddy`) for whole-GPU requests.
* Nodes in the same class (model, size, islands, labels, taints, price) and the same free state form a
  *group* with an integer id; placement scores a request once per group, not once per node, and a
  change of one node moves it between two groups. The expected fragmentation ``F(n)`` of each
  node is looked up per state (memoised) and summed incrementally.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .buddy import IslandBuddy, order_for
from .fragmentation import UNTRACKED, FragmentationModel, to_milli
from .types import MILLI, NodeSpec, Placement

GroupKey = tuple[int, int, int, tuple[int, ...]]  # class id, cpu free, memory free, free per GPU


@dataclass(frozen=True, slots=True)
class ReplicaReq:
    """What one replica needs on its node."""

    milli: int  # share of each GPU: 1000 for whole GPUs, 0 for CPU-only
    count: int  # GPUs (1 for a fraction, 0 for CPU-only)
    cpu: int = 0  # milli-CPU
    mem: int = 0  # MiB
    nvlink: bool = False  # all of the replica's GPUs inside one island

    @property
    def demand(self) -> int:
        return self.milli * self.count

    @property
    def charge(self) -> int:
        """What quotas count: a fraction as its share, whole GPUs as the buddy block they take."""
        if self.milli < MILLI:
            return self.milli * self.count
        return MILLI * (1 << order_for(self.count)) if self.count else 0


@dataclass(frozen=True, slots=True)
class Alloc:
    """One replica's hold on one node."""

    node: int
    gpus: tuple[int, ...]
    milli: int
    cpu: int
    mem: int
    replica: int
    tenant: str = ""  # whose job it is (kept for fractions when GPU shares are exclusive)


class NodeState:
    """Free capacity of one node."""

    __slots__ = ("index", "spec", "free", "cpu", "mem", "islands", "cls", "rank", "labels", "group")

    def __init__(self, index: int, spec: NodeSpec, cls: int, rank: int):
        self.index = index
        self.spec = spec
        self.cls = cls
        self.rank = rank
        bad = set(spec.unhealthy_gpus)
        self.free = [0 if g in bad else MILLI for g in range(spec.gpus)]
        self.cpu = to_milli(spec.cpus) if spec.cpus > 0 else UNTRACKED
        self.mem = int(round(spec.memory_gib * 1024)) if spec.memory_gib > 0 else UNTRACKED
        d = max(1, min(spec.nvlink_domain, spec.gpus)) if spec.gpus else 1
        self.islands = [
            IslandBuddy(b, min(d, spec.gpus - b), tuple(sorted(bad))) for b in range(0, spec.gpus, d)
        ]
        self.labels = dict(spec.labels)
        self.group: Group | None = None  # the group of nodes in its state (ClusterState sets it)

    def key(self) -> GroupKey:
        return (self.cls, self.cpu, self.mem, tuple(self.free))

    def frag_key(self) -> tuple[str, int, tuple[int, ...]]:
        return (self.spec.model, self.cpu, tuple(sorted(self.free)))

    def largest_block(self) -> int:
        return max((isl.largest() for isl in self.islands), default=0)

    def whole_free(self) -> int:
        return sum(1 for v in self.free if v >= MILLI)


def fits_state(key: GroupKey, req: ReplicaReq, island: int, ngpus: int) -> bool:
    """Does ``req`` fit a node in state ``key`` (``island`` GPUs per island, ``ngpus`` GPUs)?"""
    _cls, cpu, mem, free = key
    if req.cpu > cpu or req.mem > mem:
        return False
    if req.count == 0:
        return True
    if req.milli < MILLI:
        return any(v >= req.milli for v in free)
    if not req.nvlink:
        return sum(1 for v in free if v >= MILLI) >= req.count
    if req.count > island:
        return False
    for base in range(0, ngpus, island):
        if sum(1 for v in free[base : base + island] if v >= MILLI) >= req.count:
            return True
    return False


class Group:
    """Nodes of one class in one free state: their seeded ranks, sorted."""

    __slots__ = ("gid", "cls", "key", "ranks", "sfree", "fsum", "whole", "top")

    def __init__(self, gid: int, key: GroupKey):
        self.gid = gid
        self.cls = key[0]
        self.key = key
        self.ranks: list[int] = []
        free = key[3]
        self.sfree = tuple(sorted(free))  # free milli per GPU, sorted: what F(n) looks at
        self.fsum = sum(free)  # free milli-GPU of each node
        self.whole = sum(1 for v in free if v >= MILLI)  # whole free GPUs of each node
        self.top = self.sfree[-1] if free else 0  # largest free share of a GPU


class ClusterState:
    """Every node's free capacity, the groups, the running fragmentation sums and who holds what."""

    def __init__(self, specs: list[NodeSpec] | tuple[NodeSpec, ...], frag: FragmentationModel, seed: int = 0):
        self.frag = frag
        self.min_split_order = 0  # blocks smaller than 2^this are not split off for whole GPUs
        order = list(range(len(specs)))
        random.Random(seed).shuffle(order)  # the seeded node order that breaks score ties
        rank = [0] * len(specs)
        for r, i in enumerate(order):
            rank[i] = r
        classes: dict[tuple[Any, ...], int] = {}
        self.nodes: list[NodeState] = []
        for i, s in enumerate(specs):
            labels = tuple(kv for kv in s.labels if kv[0] != "rack")
            ckey = (
                s.model,
                s.gpus,
                s.nvlink_domain,
                s.kind,
                labels,
                s.taints,
                s.schedulable,
                s.unhealthy_gpus,
                s.price_per_gpu_hour,  # α scores a node by its class's price
            )
            cls = classes.setdefault(ckey, len(classes))
            self.nodes.append(NodeState(i, s, cls, rank[i]))
        self.by_name = {n.spec.name: n.index for n in self.nodes}
        self.by_rank = [0] * len(specs)
        for n in self.nodes:
            self.by_rank[n.rank] = n.index
        self.class_spec = {n.cls: n.spec for n in self.nodes}
        self.rack_nodes: dict[str, list[int]] = {}
        for n in self.nodes:
            self.rack_nodes.setdefault(n.spec.rack, []).append(n.index)
        self.rack_free: dict[tuple[str, int], int] = {}  # (rack, class) -> free milli-GPU
        # rack -> group id -> sorted ranks of the rack's nodes in that group: a rack gang's
        # placer looks at the rack's groups, not at each of its nodes
        self.rack_groups: dict[str, dict[int, list[int]]] = {}
        # class -> (CPUs, memory) of its nodes -> rack -> nodes: a class's nodes may differ in
        # both (openb's P100 nodes: 16 or 64 CPUs), and what one of them holds is no measure
        self.class_sizes: dict[int, dict[tuple[int, int], dict[str, int]]] = {}
        for n in self.nodes:
            sized = self.class_sizes.setdefault(n.cls, {}).setdefault((n.cpu, n.mem), {})
            sized[n.spec.rack] = sized.get(n.spec.rack, 0) + 1
        self.groups: dict[GroupKey, Group] = {}
        self.by_class: dict[int, dict[GroupKey, Group]] = {}  # class -> its groups
        # Per class: nodes by number of whole free GPUs, and by their largest free share; a
        # request that no node of a class could take skips the class without a scan.
        # Per class, an append-only log of groups that appeared or got a new first node; the
        # placer's per-request heaps read it to stay current without rescanning (see placement).
        self.group_by_gid: dict[int, Group] = {}
        self.log: dict[int, list[int]] = {}
        self.log_base: dict[int, int] = {}
        self.whole_hist: dict[int, list[int]] = {}
        self.share_hist: dict[int, dict[int, int]] = {}
        self._next_gid = 0
        self.version = 0  # bumped on every change; memoised failures are keyed by it
        self.total_f = 0.0
        self.total_free = 0
        self.allocs: dict[str, list[Alloc]] = {}
        # (node, GPU) -> tenant -> fractions it holds there; kept only with exclusive GPU
        # shares (:meth:`keep_share_tenants`), None otherwise (nothing kept, nothing slower).
        self.share_tenants: dict[tuple[int, int], dict[str, int]] | None = None
        self._batch: dict[int, None] | None = None  # nodes taken from in a batch (:meth:`batched`)
        for n in self.nodes:
            self._join(n)

    # -- groups and fragmentation ---------------------------------------------------------------
    def _join(self, n: NodeState) -> None:
        key = n.key()
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = Group(self._next_gid, key)
            self.by_class.setdefault(n.cls, {})[key] = group
            self.group_by_gid[group.gid] = group
            self._next_gid += 1
        n.group = group
        if not group.ranks or n.rank < group.ranks[0]:
            log = self.log.get(n.cls)
            if log is None:
                log = self.log[n.cls] = []
                self.log_base[n.cls] = 0
            log.append(group.gid)
            if len(log) > 4 * len(self.by_class[n.cls]) + 1024:
                drop = len(log) // 2
                del log[:drop]
                self.log_base[n.cls] += drop
        bisect.insort(group.ranks, n.rank)
        in_rack = self.rack_groups.get(n.spec.rack)
        if in_rack is None:
            in_rack = self.rack_groups[n.spec.rack] = {}
        rack_ranks = in_rack.get(group.gid)
        if rack_ranks is None:
            in_rack[group.gid] = [n.rank]
        else:
            bisect.insort(rack_ranks, n.rank)
        hist = self.whole_hist.get(n.cls)
        if hist is None:
            hist = self.whole_hist[n.cls] = [0] * (n.spec.gpus + 1)
            self.share_hist[n.cls] = {}
        hist[group.whole] += 1
        rk = (n.spec.rack, n.cls)
        self.rack_free[rk] = self.rack_free.get(rk, 0) + group.fsum
        shares = self.share_hist[n.cls]
        shares[group.top] = shares.get(group.top, 0) + 1
        if n.spec.schedulable:
            self.total_f += self.frag.node(n.spec.model, key[1], group.sfree)
            self.total_free += group.fsum

    def _leave(self, n: NodeState) -> None:
        group = n.group
        assert group is not None  # every node is in a group, from its _join on
        key = group.key
        ranks = group.ranks
        del ranks[bisect.bisect_left(ranks, n.rank)]
        in_rack = self.rack_groups[n.spec.rack]
        rack_ranks = in_rack[group.gid]
        if len(rack_ranks) == 1:
            del in_rack[group.gid]
        else:
            del rack_ranks[bisect.bisect_left(rack_ranks, n.rank)]
        if not ranks:
            del self.groups[key]
            del self.by_class[n.cls][key]
            del self.group_by_gid[group.gid]
        self.whole_hist[n.cls][group.whole] -= 1
        self.rack_free[(n.spec.rack, n.cls)] -= group.fsum
        shares = self.share_hist[n.cls]
        shares[group.top] -= 1
        if not shares[group.top]:
            del shares[group.top]
        if n.spec.schedulable:
            self.total_f -= self.frag.node(n.spec.model, key[1], group.sfree)
            self.total_free -= group.fsum

    def class_may_fit(self, cls: int, req: ReplicaReq) -> bool:
        """A necessary condition (GPUs only) for some node of ``cls`` to take ``req``."""
        if req.count == 0:
            return True
        if req.milli < MILLI:
            return any(v >= req.milli for v in self.share_hist[cls])
        hist = self.whole_hist[cls]
        return any(hist[req.count :])

    def set_frag(self, frag: FragmentationModel) -> None:
        """Switch to another request mix: recompute the sums once (not per decision)."""
        self.frag = frag
        self.total_f = sum(frag.node(*n.frag_key()) for n in self.nodes if n.spec.schedulable)

    def fragmentation_rate(self) -> float:
        return self.total_f / self.total_free if self.total_free > 0 else 0.0

    # -- which tenants' fractions each GPU holds (exclusive GPU shares) ---------------------------
    def keep_share_tenants(self) -> None:
        """Keep, from now on, which tenants hold fractions of each GPU (before any allocation)."""
        self.share_tenants = {}

    def share_gpus(self, n: NodeState, milli: int, tenant: str) -> list[int]:
        """The GPUs of ``n`` a fraction of ``milli`` of ``tenant`` may go to when shares are
        exclusive: a whole free GPU, or one with room whose fractions are all ``tenant``'s."""
        held = self.share_tenants or {}
        out = []
        for g, v in enumerate(n.free):
            if v >= MILLI or (v >= milli and held.get((n.index, g), {}).keys() <= {tenant}):
                out.append(g)
        return out

    def share_fits(self, node: int, milli: int, tenant: str) -> bool:
        """Could a fraction of ``milli`` of ``tenant`` go to node ``node`` (exclusive shares)?"""
        return bool(self.share_gpus(self.nodes[node], milli, tenant))

    # -- choosing GPUs inside a node -----------------------------------------------------------
    def choose_gpus(
        self, n: NodeState, req: ReplicaReq, value: int | None = None, tenant: str | None = None
    ) -> list[int]:
        """GPU indices for ``req`` on ``n`` (which fits it): a fraction on a GPU with free share
        ``value`` (lowest index); whole GPUs from the smallest buddy block that holds them.
        ``tenant`` (exclusive GPU shares): a fraction only on a GPU :meth:`share_gpus` allows,
        the one with free share ``value`` if there is one, else the best fit."""
        if req.count == 0:
            return []
        if req.milli < MILLI and tenant is not None:
            ok = self.share_gpus(n, req.milli, tenant)
            same = [g for g in ok if n.free[g] == value]
            return same[:1] or [min(ok, key=lambda g: (n.free[g], g))]
        if req.milli < MILLI:
            if value is None:
                value = min(v for v in n.free if v >= req.milli)
            return [n.free.index(value)]
        best: tuple[int, int] | None = None  # (block order, first GPU)
        for k in dict.fromkeys((max(order_for(req.count), self.min_split_order), order_for(req.count))):
            for isl in n.islands:
                for order in range(k, len(isl.free)):
                    if isl.free[order]:
                        cand = (order, isl.base + min(isl.free[order]))
                        if best is None or cand < best:
                            best = cand
                        break
            if best is not None:
                break
        if best is not None:
            return list(range(best[1], best[1] + req.count))
        if req.nvlink:  # no aligned block: any free GPUs of one island
            for isl in n.islands:
                got = [g for g in range(isl.base, isl.base + isl.size) if n.free[g] >= MILLI]
                if len(got) >= req.count:
                    return got[: req.count]
            raise ValueError("no island holds the request")
        # 1. Larger than any island: whole free blocks, largest first, then the smallest rest.
        blocks = sorted((b for isl in n.islands for b in isl.blocks()), key=lambda b: (-b[1], b[0]))
        out: list[int] = []
        for first, size in blocks:
            out.extend(range(first, first + min(size, req.count - len(out))))
            if len(out) == req.count:
                break
        return out

    # -- binding and freeing ---------------------------------------------------------------------
    def take(
        self,
        job_id: str,
        node: int,
        gpus: list[int] | tuple[int, ...],
        milli: int,
        cpu: int,
        mem: int,
        replica: int,
        tenant: str = "",
    ) -> Alloc:
        n = self.nodes[node]
        batch = self._batch
        if batch is None:
            self._leave(n)
        elif node not in batch:
            self._leave(n)
            batch[node] = None
        for g in gpus:
            if n.free[g] < milli:
                if batch is None:
                    self._join(n)
                raise ValueError(f"GPU {g} of {n.spec.name} has {n.free[g]} milli free, not {milli}")
            if n.free[g] == MILLI:
                self._island(n, g).take(g)
            n.free[g] -= milli
        if n.cpu < UNTRACKED:
            n.cpu -= cpu
        if n.mem < UNTRACKED:
            n.mem -= mem
        if batch is None:
            self._join(n)
        self.version += 1
        alloc = Alloc(node, tuple(gpus), milli, cpu, mem, replica, tenant)
        self.allocs.setdefault(job_id, []).append(alloc)
        if self.share_tenants is not None and milli < MILLI:
            for g in gpus:
                held = self.share_tenants.setdefault((node, g), {})
                held[tenant] = held.get(tenant, 0) + 1
        return alloc

    @contextmanager
    def batched(self) -> Iterator[None]:
        """Takes without the groups kept current: each node taken from leaves its group at its
        first take and joins the group of its final state at the end (how a snapshot's running
        jobs are laid on a fresh state: one leave and join per node, not per replica). Nothing
        may read the groups, histograms or sums meanwhile; the nodes' capacities, islands and
        holders are the same as after the same takes one by one."""
        assert self._batch is None, "batches do not nest"
        self._batch = {}
        try:
            yield
        finally:
            touched, self._batch = self._batch, None
            for node in touched:
                self._join(self.nodes[node])

    def give(self, alloc: Alloc) -> None:
        assert self._batch is None, "a batch only takes"
        n = self.nodes[alloc.node]
        self._leave(n)
        for g in alloc.gpus:
            n.free[g] += alloc.milli
            if n.free[g] == MILLI:
                self._island(n, g).give(g)
        if n.cpu < UNTRACKED:
            n.cpu += alloc.cpu
        if n.mem < UNTRACKED:
            n.mem += alloc.mem
        self._join(n)
        self.version += 1
        if self.share_tenants is not None and alloc.milli < MILLI:
            for g in alloc.gpus:
                held = self.share_tenants[(alloc.node, g)]
                held[alloc.tenant] -= 1
                if not held[alloc.tenant]:
                    del held[alloc.tenant]
                    if not held:
                        del self.share_tenants[(alloc.node, g)]

    def release(self, job_id: str) -> list[Alloc]:
        allocs = self.allocs.pop(job_id, [])
        for a in allocs:
            self.give(a)
        return allocs

    def release_replica(self, job_id: str, alloc: Alloc) -> None:
        held = self.allocs.get(job_id, [])
        held.remove(alloc)
        if not held:
            self.allocs.pop(job_id, None)
        self.give(alloc)

    @staticmethod
    def _island(n: NodeState, g: int) -> IslandBuddy:
        d = n.islands[0].size if n.islands else 1
        return n.islands[g // d]


def leaving_key(job_id: str) -> str:
    """The holder, in the cluster state, of the GPUs of a job's replicas that a shrink removed
    and whose processes have not exited yet (held by no size of the job's)."""
    return f"{job_id}/leaving"


def placements_of(allocs: list[Alloc], state: ClusterState) -> tuple[Placement, ...]:
    """Allocations as the driver's placements (by replica; a whole GPU or a CPU-only replica
    has share 1.0)."""
    out = []
    for a in sorted(allocs, key=lambda a: a.replica):
        share = 1.0 if a.milli >= MILLI or not a.gpus else a.milli / MILLI
        out.append(Placement(a.replica, state.nodes[a.node].spec.name, a.gpus, share))
    return tuple(out)
