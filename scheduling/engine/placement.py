"""Placement scoring: where a replica should go so that the cluster stays packable.

The main term is FGD's: the drop ``delta`` in expected fragmentation ``F(n)`` (see
:mod:`.fragmentation`) that placing the request causes. Tessera scores it
``floor(100 * sigmoid(delta / 2000))`` (FGD uses ``/ 1000``) and breaks ties between nodes by a
seeded node order, except that a CPU-only request prefers, among equal scores, the node with the
least free GPU capacity (so it does not take the CPUs that free GPUs will need). On openb's
default pod list this packs a little more than FGD's own score (docs/evaluation.md). Exact deltas
instead of the coarse score pack worse (docs/placement.md): the exact delta herds every pod of a
shape onto the same few node types, and the seeded ties spread them. Inside a node, a fractional
request goes to the GPU that leaves the least fragmentation, then the least leftover share (best
fit), so whole GPUs stay whole for the requests that need them.
The cost weights α (price), β (consolidation) and δ (data locality: the share of the job's
``prefer_labels`` a node carries) enter the score here; γ (expected wait for a preferred model) is
:mod:`.preference`'s (docs/placement.md).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .fragmentation import UNTRACKED, FragmentationModel
from .state import Alloc, ClusterState, Group, NodeState, ReplicaReq, fits_state
from .types import MILLI, JobRequest, NodeSpec


def after_vector(gpus: tuple[int, ...], milli: int, count: int, value: int | None) -> tuple[int, ...]:
    """The sorted free vector after placing ``count`` GPUs of ``milli`` (on a GPU with ``value``)."""
    if count == 0:
        return gpus
    out = list(gpus)
    if milli < MILLI:
        out[out.index(value)] = value - milli  # type: ignore[arg-type,operator]
    else:
        for _ in range(count):
            out[out.index(MILLI)] = 0
    out.sort()
    return tuple(out)


def sigmoid_score(delta: float, scale: float = 1000.0) -> int:
    """FGD's node score for a fragmentation drop ``delta`` in milli-GPU (``scale`` 1000)."""
    return math.floor(100.0 / (1.0 + math.exp(-delta / scale)))


TESSERA_SCALE = 2000.0


def tessera_score(delta: float, count: int, free_sum: int) -> float:
    """Tessera's node score: the softened FGD score; for a CPU-only request, a fraction (< 1, so
    it never crosses a score step) that favours nodes with less free GPU capacity."""
    score = float(sigmoid_score(delta, TESSERA_SCALE))
    if count == 0:
        score -= free_sum / 1e7
    return score


def consolidation_cost(free: int, capacity: int) -> float:
    """β's term, ``1 - utilisation`` of the node as it is: the share of its GPU capacity free
    before the request lands. 1 for an idle node, near 0 for a busy one, so a positive β puts
    work on nodes already in use and keeps idle nodes whole (consolidation). Measured before the
    placement, not after, so it does not favour small nodes for being filled by less."""
    return free / capacity


def frag_delta(
    frag: FragmentationModel,
    model: str,
    cpu_free: int,
    gpus: tuple[int, ...],
    cpu: int,
    milli: int,
    count: int,
) -> tuple[float, int | None]:
    """The best fragmentation drop of a request on a node state (sorted free vector ``gpus``) and,
    for a fractional request, the free value of the GPU to use. The caller checked that it fits."""
    before = frag.node(model, cpu_free, gpus)
    cpu_after = cpu_free - cpu if cpu_free < UNTRACKED else cpu_free
    if 0 < milli < MILLI:
        best: tuple[tuple[float, int], int] | None = None
        for v in sorted(set(gpus)):
            if v < milli:
                continue
            fa = frag.node(model, cpu_after, after_vector(gpus, milli, 1, v))
            key = (round(before - fa, 6), -(v - milli))  # least fragmentation, then best fit
            if best is None or key > best[0]:
                best = (key, v)
        assert best is not None
        return best[0][0], best[1]
    return before - frag.node(model, cpu_after, after_vector(gpus, milli, count, None)), None


def tessera_pack_choice(
    frag: FragmentationModel,
    model: str,
    cpu_free: int,
    gpus: tuple[int, ...],
    cpu: int,
    milli: int,
    count: int,
    beta: float = 0.0,
) -> tuple[float, int | None]:
    """Score (higher is better) of a request on a node state, and the GPU free value to use for a
    fractional request (ties between nodes: the caller's seeded node order); what the placer
    scores, for the pack benchmark. ``gpus`` lists every GPU of the node, so its capacity is
    ``len(gpus)`` GPUs."""
    delta, value = frag_delta(frag, model, cpu_free, gpus, cpu, milli, count)
    score = tessera_score(delta, count, sum(gpus))
    if beta and gpus:
        score -= beta * consolidation_cost(sum(gpus), MILLI * len(gpus))
    return score, value


# -- the engine's placer: best node for one replica, scored once per group of equal nodes ---------

MISS = object()


@dataclass(frozen=True, slots=True)
class Constraints:
    """What a job allows, beyond the size of each replica."""

    models: tuple[str, ...] = ()  # acceptable, in preference order; () = any GPU model
    selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[str, ...] = ()
    gpu_job: bool = True  # False for CPU-only jobs (any node kind)
    prefer: tuple[tuple[str, str], ...] = ()  # labels a node should carry (δ's term)
    # Exclusive GPU shares (``EngineConfig.exclusive_gpu_shares``): the job's tenant, whose
    # fractions alone a fractional replica may share a GPU with; None: shares with anyone.
    shares: str | None = None


def locality(spec: NodeSpec, prefer: tuple[tuple[str, str], ...]) -> float:
    """δ's term: the fraction of ``prefer`` (labels but the rack) that nodes like ``spec`` carry.
    The rack is not part of a node's class (nodes alike share a group across racks), so a
    preferred ``rack`` counts as never carried: the API refuses it (use ``node_selector`` or
    ``topology``)."""
    wanted = [kv for kv in prefer if kv[0] != "rack"]
    if not wanted:
        return 0.0
    labels = dict(spec.labels)
    return sum(labels.get(k) == v for k, v in wanted) / len(wanted)


def selects(node: NodeSpec, job: JobRequest) -> bool:
    """May ``job`` run on ``node`` by its node selector (the rack a label like any other) and its
    tolerations of the node's taints? Models and sizes aside."""
    labels = dict(node.labels)
    return all(labels.get(k) == v for k, v in job.node_selector) and all(
        t in job.tolerations for t in node.taints
    )


def class_allows(spec: NodeSpec, c: Constraints) -> int | None:
    """None if ``c`` excludes nodes like ``spec`` (taints, labels but the rack, model), else the
    position of the node's model in the job's preference list (0 when any model will do)."""
    if any(t not in c.tolerations for t in spec.taints):
        return None
    labels = dict(spec.labels)
    if any(k != "rack" and labels.get(k) != v for k, v in c.selector):
        return None
    if not c.gpu_job:
        return 0 if not c.models or spec.model in c.models else None
    if spec.gpus == 0 or (c.models and spec.model not in c.models):
        return None
    return c.models.index(spec.model) if c.models else 0


class OffRacks:
    """A node filter: the nodes off ``racks`` (a set the caller may shrink between searches) that
    ``inner`` (if any) allows. Callable like any filter; :meth:`Placer.best` also searches it
    rack by rack, so that a group of nodes mostly on those racks is not walked node by node."""

    __slots__ = ("nodes", "racks", "inner", "_open", "_seen")

    def __init__(self, nodes: list[NodeState], racks: set[str], inner: Callable[[int], bool] | None):
        self.nodes = nodes
        self.racks = racks
        self.inner = inner
        self._open: list[str] = []
        self._seen = -1  # len(racks) when _open was listed

    def __call__(self, i: int) -> bool:
        return self.nodes[i].spec.rack not in self.racks and (self.inner is None or self.inner(i))

    def open_racks(self, state: ClusterState) -> list[str]:
        """The racks of ``state`` not in ``racks``."""
        if self._seen != len(self.racks):
            self._open = [r for r in state.rack_groups if r not in self.racks]
            self._seen = len(self.racks)
        return self._open


class Placer:
    """Chooses nodes for replicas on a :class:`~.state.ClusterState`.

    The score of a replica on a node is ``-preference`` (the position of the node's model in the
    job's list), then FGD's fragmentation score minus ``alpha`` x price minus ``beta`` x the
    node's free share (consolidation) plus ``delta`` x the share of the job's preferred labels
    the node carries; ties go to the lowest node rank (a seeded permutation). Scores are memoised
    per (group, request); δ's term depends only on the class, so it is added per class, outside
    the memo and the per-class heaps. docs/placement.md has the whole score.
    """

    def __init__(self, state: ClusterState, alpha: float = 0.0, beta: float = 0.0, delta: float = 0.0):
        self.state = state
        self.alpha = alpha
        self.beta = beta
        self.delta = delta
        self._loc: dict[tuple[int, tuple[Any, ...]], float] = {}
        self._cls_ok: dict[tuple[int, Constraints], int | None] = {}
        self._score: dict[ReplicaReq, dict[int, tuple[float, int | None] | None]] = {}
        self._allowed: dict[Constraints, list[tuple[int, int]]] = {}
        self._heaps: dict[ReplicaReq, dict[int, list[Any]]] = {}  # req -> class -> [heap, log read]
        # The fragmentation part of a score depends on the node's model, sorted free vector and
        # which typical requests its CPU holds before and after: shared by every group and
        # request alike in those (~3.5x fewer computations than one per group and request).
        self._frag_score: dict[tuple[Any, ...], tuple[float, int | None]] = {}
        self._cls_info: dict[int, tuple[int, int, str, float, int]] = {}

    def class_pref(self, cls: int, c: Constraints) -> int | None:
        """None if no node of class ``cls`` may ever take the job, else its model's preference."""
        key = (cls, c)
        hit = self._cls_ok.get(key, MISS)
        if hit is not MISS:
            return hit  # type: ignore[return-value]
        spec = self.state.class_spec[cls]
        ok = class_allows(spec, c)
        if ok is not None and not spec.schedulable:
            ok = None
        self._cls_ok[key] = ok
        return ok

    def bonus(self, cls: int, c: Constraints) -> float:
        """δ x the share of ``c.prefer`` that nodes of class ``cls`` carry (0 without any)."""
        if not c.prefer or not self.delta:
            return 0.0
        key = (cls, c.prefer)
        hit = self._loc.get(key)
        if hit is None:
            hit = self._loc[key] = self.delta * locality(self.state.class_spec[cls], c.prefer)
        return hit

    def _class_info(self, cls: int) -> tuple[int, int, str, float, int]:
        """(GPUs per island, GPUs, model, price per GPU-hour, healthy milli-GPU) of a class."""
        info = self._cls_info.get(cls)
        if info is None:
            spec = self.state.class_spec[cls]
            d = max(1, min(spec.nvlink_domain, spec.gpus)) if spec.gpus else 1
            cap = MILLI * (spec.gpus - len(spec.unhealthy_gpus))
            info = self._cls_info[cls] = (d, spec.gpus, spec.model, spec.price_per_gpu_hour, cap)
        return info

    def _group_score(self, g: Group, req: ReplicaReq, per: dict[Any, Any]) -> tuple[float, int | None] | None:
        """Score of ``req`` on the nodes of group ``g`` (higher is better) and, for a fraction,
        the free share of the GPU to use; None when it does not fit. Memoised in ``per`` (the
        request's scores by group id)."""
        result: tuple[float, int | None] | None = None
        key = g.key
        info = self._cls_info.get(g.cls) or self._class_info(g.cls)
        cpu_free = key[1]
        if req.cpu > cpu_free or req.mem > key[2]:
            fits = False
        elif req.count == 0:
            fits = True
        elif req.milli < MILLI:
            fits = g.top >= req.milli
        elif g.whole < req.count:
            fits = False
        else:
            fits = not req.nvlink or fits_state(key, req, info[0], info[1])
        if fits:
            frag = self.state.frag
            cpus = frag.cpu_sizes
            fk = (
                info[2],
                bisect_right(cpus, cpu_free),
                bisect_right(cpus, cpu_free - req.cpu) if cpu_free < UNTRACKED else -1,
                g.sfree,
                req.milli,
                req.count,
            )
            hit = self._frag_score.get(fk)
            if hit is None:
                delta, value = frag_delta(frag, info[2], cpu_free, g.sfree, req.cpu, req.milli, req.count)
                hit = self._frag_score[fk] = (tessera_score(delta, req.count, g.fsum), value)
            score = hit[0]
            if self.alpha:
                score -= self.alpha * info[3] * req.count
            if self.beta and info[4]:
                score -= self.beta * consolidation_cost(g.fsum, info[4])
            result = (score, hit[1])
        per[g.gid] = result
        return result

    def allowed_classes(self, c: Constraints) -> list[tuple[int, int]]:
        """(class, preference) of every class the job may use, most preferred first (stable:
        class order within a preference), from the class table (small)."""
        hit = self._allowed.get(c)
        if hit is None:
            hit = self._allowed[c] = sorted(
                (
                    (cls, pref)
                    for cls in sorted(self.state.class_spec)
                    if (pref := self.class_pref(cls, c)) is not None
                ),
                key=lambda t: t[1],
            )
        return hit

    def candidates(
        self, req: ReplicaReq, c: Constraints, sort: bool = True
    ) -> list[tuple[tuple[Any, ...], list[int], int | None, int]]:
        """Every group that can take ``req``: (sort key, its node ranks, GPU value, group id),
        best first."""
        out = []
        per = self._score.get(req)
        if per is None:
            per = self._score[req] = {}
        may_fit = self.state.class_may_fit
        for cls, pref in self.allowed_classes(c):
            if not may_fit(cls, req):
                continue
            bonus = self.bonus(cls, c)
            for g in self.state.by_class[cls].values():
                sc = per.get(g.gid, MISS)
                if sc is MISS:
                    sc = self._group_score(g, req, per)
                if sc is None:
                    continue
                out.append(((-pref, sc[0] + bonus, -g.ranks[0]), g.ranks, sc[1], g.gid))  # type: ignore[index]
        if sort:
            out.sort(key=lambda t: t[0], reverse=True)
        return out

    def share_filter(
        self, req: ReplicaReq, c: Constraints, node_ok: Callable[[int], bool] | None
    ) -> Callable[[int], bool] | None:
        """``node_ok`` narrowed, for a fraction under exclusive GPU shares, to the nodes with a
        GPU it may share (:meth:`.state.ClusterState.share_fits`); else ``node_ok`` itself."""
        tenant = c.shares
        if tenant is None or not 0 < req.milli < MILLI:
            return node_ok
        fits, milli = self.state.share_fits, req.milli
        if isinstance(node_ok, OffRacks):  # keep the rack-by-rack search
            inner = node_ok.inner
            return OffRacks(
                node_ok.nodes,
                node_ok.racks,
                lambda i: fits(i, milli, tenant) and (inner is None or inner(i)),
            )
        if node_ok is None:
            return lambda i: fits(i, milli, tenant)
        outer = node_ok
        return lambda i: fits(i, milli, tenant) and outer(i)

    def best(
        self, req: ReplicaReq, c: Constraints, node_ok: Callable[[int], bool] | None = None
    ) -> tuple[int, int | None] | None:
        """The best node index for ``req`` and the GPU value (fractions), or None."""
        return self._best(req, c, self.share_filter(req, c, node_ok))

    def _best(
        self, req: ReplicaReq, c: Constraints, node_ok: Callable[[int], bool] | None = None
    ) -> tuple[int, int | None] | None:
        by_rank = self.state.by_rank
        if node_ok is not None:
            quick = self._best(req, c)
            if quick is None or node_ok(quick[0]):
                return quick
            cands = self.candidates(req, c, sort=False)
            first_ok = self._first_ok
            for _ in range(4):  # usually the best group has an allowed node: no full sort
                if not cands:
                    return None
                first = max(range(len(cands)), key=lambda k: cands[k][0])
                _k, ranks, value, gid = cands.pop(first)
                r = first_ok(gid, ranks, node_ok)
                if r is not None:
                    return by_rank[r], value
            cands.sort(key=lambda t: t[0], reverse=True)
            for _k, ranks, value, gid in cands:
                r = first_ok(gid, ranks, node_ok)
                if r is not None:
                    return by_rank[r], value
            return None
        best_key: tuple[Any, ...] | None = None
        best_pick: tuple[int, int | None] | None = None
        may_fit = self.state.class_may_fit
        for cls, pref in self.allowed_classes(c):  # by preference: a better model always wins
            if best_key is not None and -pref < best_key[0]:
                break
            if not may_fit(cls, req):
                continue
            top = self._class_top(req, cls)
            if top is None:
                continue
            score, rank, value = top
            k = (-pref, score + self.bonus(cls, c) if c.prefer else score, -rank)
            if best_key is None or k > best_key:
                best_key, best_pick = k, (by_rank[rank], value)
        return best_pick

    def _first_ok(self, gid: int, ranks: list[int], node_ok: Callable[[int], bool]) -> int | None:
        """The lowest of ``ranks`` (group ``gid``'s nodes) whose node ``node_ok`` allows. Off the
        racks kept clear (:class:`OffRacks`), a large group is searched by its nodes on each open
        rack (``ClusterState.rack_groups``) instead of node by node: the same node, found in
        steps bounded by the open racks, not by the group's nodes on the clear ones."""
        by_rank = self.state.by_rank
        if isinstance(node_ok, OffRacks):
            open_racks = node_ok.open_racks(self.state)
            if len(open_racks) < len(ranks):
                rack_groups, inner = self.state.rack_groups, node_ok.inner
                found: int | None = None
                for rack in open_racks:
                    here = rack_groups[rack].get(gid)
                    if here is None:
                        continue
                    for r in here:
                        if found is not None and r >= found:
                            break
                        if inner is None or inner(by_rank[r]):
                            found = r
                            break
                return found
        for r in ranks:
            if node_ok(by_rank[r]):
                return r
        return None

    def best_among(
        self, req: ReplicaReq, c: Constraints, rack: str, node_ok: Callable[[int], bool] | None = None
    ) -> tuple[int, int | None] | None:
        """Like :meth:`best`, over the nodes of one rack: a look at each group the rack's nodes
        are in (the best node of a group is its lowest-ranked allowed node in the rack)."""
        state = self.state
        node_ok = self.share_filter(req, c, node_ok)
        per = self._score.get(req)
        if per is None:
            per = self._score[req] = {}
        by_gid = state.group_by_gid
        by_rank = state.by_rank
        best_key: tuple[Any, ...] | None = None
        best_pick: tuple[int, int | None] | None = None
        for gid, ranks in state.rack_groups.get(rack, {}).items():
            g = by_gid[gid]
            pref = self.class_pref(g.cls, c)
            if pref is None:
                continue
            sc = per.get(gid, MISS)
            if sc is MISS:
                sc = self._group_score(g, req, per)
            if sc is None:
                continue
            score = sc[0] + self.bonus(g.cls, c) if c.prefer else sc[0]  # type: ignore[index]
            if best_key is not None and (-pref, score) < best_key[:2]:
                continue
            for r in ranks:
                i = by_rank[r]
                if node_ok is None or node_ok(i):
                    k = (-pref, score, -r)
                    if best_key is None or k > best_key:
                        best_key, best_pick = k, (i, sc[1])  # type: ignore[index]
                    break
        return best_pick

    # The best group of one class for one request, kept in a heap of (-score, first rank, gid).
    # A group's score never changes (its state is its key); what changes is which groups exist
    # and their first node, and the state logs exactly those events per class. So a query reads
    # the log entries it has not seen, pushes them, and drops stale tops: amortised O(log n)
    # instead of a scan of every group.
    def _class_top(self, req: ReplicaReq, cls: int) -> tuple[float, int, int | None] | None:
        state = self.state
        per = self._score.get(req)
        if per is None:
            per = self._score[req] = {}
        log = state.log.get(cls, [])
        base = state.log_base.get(cls, 0)
        end = base + len(log)
        heaps = self._heaps.get(req)
        if heaps is None:
            heaps = self._heaps[req] = {}
        h = heaps.get(cls)
        groups = state.by_class[cls]
        by_gid = state.group_by_gid
        score = self._group_score
        g: Group | None
        if h is None or h[1] < base or end - h[1] > len(groups) + 16 or len(h[0]) > 4 * len(groups) + 64:
            heap = []
            for g in groups.values():
                sc = per.get(g.gid, MISS)
                if sc is MISS:
                    sc = score(g, req, per)
                if sc is not None:
                    heap.append((-sc[0], g.ranks[0], g.gid))  # type: ignore[index]
            heapq.heapify(heap)
            h = heaps[cls] = [heap, end]
        elif end > h[1]:
            heap = h[0]
            push = heapq.heappush
            for gid in log[h[1] - base :]:
                g = by_gid.get(gid)
                if g is None:
                    continue
                sc = per.get(gid, MISS)
                if sc is MISS:
                    sc = score(g, req, per)
                if sc is not None:
                    push(heap, (-sc[0], g.ranks[0], gid))  # type: ignore[index]
            h[1] = end
        heap = h[0]
        while heap:
            negs, r0, gid = heap[0]
            g = by_gid.get(gid)
            if g is None:
                heapq.heappop(heap)
                continue
            if g.ranks[0] != r0:
                heapq.heapreplace(heap, (negs, g.ranks[0], gid))
                continue
            return -negs, r0, per[gid][1]  # type: ignore[index]
        return None

    def place(
        self,
        job_id: str,
        node: int,
        req: ReplicaReq,
        value: int | None,
        replica: int,
        shares: str | None = None,
    ) -> Alloc:
        """Take ``req`` on ``node``; ``shares``: :attr:`Constraints.shares` of the job."""
        n = self.state.nodes[node]
        gpus = self.state.choose_gpus(n, req, value, shares)
        return self.state.take(job_id, node, gpus, req.milli, req.cpu, req.mem, replica, shares or "")
