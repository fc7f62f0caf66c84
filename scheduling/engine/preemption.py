"""Choosing victims: the least lost work that makes room, or no preemption at all.

Eligible victims (decided by the policy): preemptible, not already terminating, running at least
the minimum run time, and either strictly behind the job in (level, priority) or, for a reclaim,
running on capacity their tenant borrowed. Jobs already terminating count as capacity coming free
at no cost, so a job never preempts twice for the same room.

1. Every node the job may use starts from its hypothetical free state for this pass (actual free
   capacity plus terminating holders, minus what earlier preemptors of this pass claimed).
2. For each replica: on each node, add the node's eligible victims in order of least lost work
   (GPU-seconds since their last checkpoint), then lowest priority, then id, until the replica fits.
   That node's cost is the lost work of the victims newly added, then their number.
3. Take the cheapest node (then lowest rank); the victims' capacity on every node they hold comes
   free; the replica's need is taken from that node's hypothetical state.
4. If some replica cannot be covered, no victim is taken (a preemption that does not make room is
   never made). Otherwise the victims are returned and the claimed room stays claimed for the pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .backfill import gang_group, gang_shape
from .placement import Constraints, Placer
from .state import Alloc, ReplicaReq, fits_state
from .types import MILLI


@dataclass(frozen=True, slots=True)
class Victim:
    job_id: str
    lost: float  # GPU-seconds of work since the last checkpoint
    priority: int
    allocs: tuple[Alloc, ...]
    grace: float = 0.0  # seconds it may take to exit once told to stop


class Hypo:
    """Hypothetical free capacity per node for one pass: the current state, plus what
    terminating jobs (and victims chosen this pass) will free, minus the room that preemptors of
    this pass already claimed. Recomputed from the live state on each look, so bindings made
    earlier in the pass are never counted as free."""

    def __init__(self, placer: Placer, terminating: list[tuple[str, tuple[Alloc, ...]]]):
        self.placer = placer
        self.terminating = terminating
        self.freed: dict[int, list[Alloc]] = {}
        self.claims: dict[int, list[ReplicaReq]] = {}
        self.last_nodes: tuple[int, ...] = ()  # where the last commit claimed room
        for _jid, allocs in terminating:
            for a in allocs:
                self.freed.setdefault(a.node, []).append(a)

    def copy(self) -> Hypo:
        """An independent copy: a search may commit to it and be dropped."""
        other = Hypo(self.placer, [])
        other.terminating = self.terminating
        other.freed = {i: list(v) for i, v in self.freed.items()}
        other.claims = {i: list(v) for i, v in self.claims.items()}
        other.last_nodes = self.last_nodes
        return other

    def nodes_of_interest(self) -> set[int]:
        return set(self.freed) | set(self.claims)

    def get(self, i: int) -> list[Any]:
        n = self.placer.state.nodes[i]
        st = [list(n.free), n.cpu, n.mem]
        for a in self.freed.get(i, ()):
            self._add(st, a)
        for req in self.claims.get(i, ()):
            _take(self.placer, i, st, req)
        return st

    def commit(self, victims: list[Victim], claims: list[tuple[int, ReplicaReq]]) -> None:
        for v in victims:
            for a in v.allocs:
                self.freed.setdefault(a.node, []).append(a)
        for i, req in claims:
            self.claims.setdefault(i, []).append(req)
        self.last_nodes = tuple(sorted({i for i, _ in claims}))

    @staticmethod
    def _add(st: list[Any], a: Alloc) -> None:
        for g in a.gpus:
            st[0][g] = min(MILLI, st[0][g] + a.milli)
        st[1] += a.cpu
        st[2] += a.mem


def _shareable(placer: Placer, i: int, st: list[Any], req: ReplicaReq, shares: str | None) -> list[int]:
    """The GPUs of node ``i`` in hypothetical state ``st`` that a fraction ``req`` may share
    under exclusive GPU shares (tenant ``shares``): whole free ones, or those whose fractions
    now are all its tenant's (a GPU partly freed of another tenant's is not counted)."""
    held = placer.state.share_tenants or {}
    free = st[0]
    return [
        g
        for g, v in enumerate(free)
        if v >= MILLI or (v >= req.milli and held.get((i, g), {}).keys() <= {shares})
    ]


def _fits(placer: Placer, i: int, st: list[Any], req: ReplicaReq, shares: str | None = None) -> bool:
    n = placer.state.nodes[i]
    spec = n.spec
    d = max(1, min(spec.nvlink_domain, spec.gpus)) if spec.gpus else 1
    if not fits_state((n.cls, st[1], st[2], tuple(st[0])), req, d, spec.gpus):
        return False
    return shares is None or not 0 < req.milli < MILLI or bool(_shareable(placer, i, st, req, shares))


def _take(placer: Placer, i: int, st: list[Any], req: ReplicaReq, shares: str | None = None) -> None:
    if req.milli < MILLI:
        if req.count:
            some = _shareable(placer, i, st, req, shares) if shares is not None else range(len(st[0]))
            g = max(some, key=lambda k: (st[0][k] >= req.milli, -st[0][k], -k))
            st[0][g] -= req.milli
    else:
        full = [g for g, v in enumerate(st[0]) if v >= MILLI][: req.count]
        for g in full:
            st[0][g] = 0
    if st[1] < 1 << 59:
        st[1] -= req.cpu
    if st[2] < 1 << 59:
        st[2] -= req.mem


def choose_victims(
    placer: Placer,
    hypo: Hypo,
    req: ReplicaReq,
    replicas: int,
    c: Constraints,
    victims_by_node: dict[int, list[Victim]],
    gone: Callable[[str], bool] = lambda _j: False,
    topology: str = "any",
    node_ok: Callable[[int], bool] | None = None,
    by_grace: bool = False,
) -> list[Victim] | None:
    """Steps 1-4 for a job of ``replicas`` x ``req`` with ``topology``: the room is searched where
    placement could use it — a ``node``/``nvlink`` gang on one node, a gang's replicas on one
    model (and one rack for ``rack``) — and the cheapest such room wins. ``node_ok`` leaves out
    nodes the job may not use (e.g. reserved for a job ahead of it). ``by_grace``: the job waits
    for its slowest victim to exit, so the room whose victims' longest grace period is shortest
    wins, then the least lost work (for a service, whose users wait on its start)."""
    state = placer.state
    req, replicas = gang_shape(req, replicas, topology)
    classes = {cls for cls, _ in placer.allowed_classes(c)}
    rack = next((v for k, v in c.selector if k == "rack"), None)
    # A single replica only fits where victims or capacity coming free are (placement just
    # failed); a gang may put some replicas on nodes that are free already.
    if replicas > 1:
        pool = [n.index for n in state.nodes if n.cls in classes]
    else:
        pool = [
            i
            for i in sorted(set(victims_by_node) | hypo.nodes_of_interest())
            if state.nodes[i].cls in classes
        ]
    groups: dict[tuple[str, str], list[int]] = {}
    for i in pool:
        spec = state.nodes[i].spec
        if (rack is not None and spec.rack != rack) or (node_ok is not None and not node_ok(i)):
            continue
        groups.setdefault(gang_group(spec, replicas, topology), []).append(i)
    if by_grace:  # each node's victims, quickest to exit first (then the least lost work)
        victims_by_node = {
            i: sorted(victims_by_node[i], key=_by_grace)
            for nodes in groups.values()
            for i in nodes
            if i in victims_by_node
        }
    best: tuple[tuple[float, float, int], list[Victim], list[tuple[int, ReplicaReq]]] | None = None
    for _key, nodes in sorted(groups.items()):
        if req.count * replicas > sum(state.nodes[i].spec.gpus for i in nodes):
            continue
        got = _search(placer, hypo, req, replicas, nodes, victims_by_node, gone, by_grace, c.shares)
        if got is not None and (best is None or got[0] < best[0]):
            best = got
    if best is None:
        return None
    _cost, result, claims = best
    hypo.commit(result, claims)  # step 4: the room stays claimed for the rest of the pass
    return result


def _by_grace(v: Victim) -> tuple[float, float, int, str]:
    return (v.grace, v.lost, v.priority, v.job_id)


def _search(
    placer: Placer,
    hypo: Hypo,
    req: ReplicaReq,
    replicas: int,
    allowed: list[int],
    victims_by_node: dict[int, list[Victim]],
    gone: Callable[[str], bool],
    by_grace: bool = False,
    shares: str | None = None,
) -> tuple[tuple[float, float, int], list[Victim], list[tuple[int, ReplicaReq]]] | None:
    """Steps 2-3 on the nodes ``allowed``: (cost, victims, claims), or None if no room. Each
    node's victims come cheapest first (by grace period first when ``by_grace``)."""
    state = placer.state
    chosen: dict[str, Victim] = {}
    work: dict[int, list[Any]] = {}  # nodes this search changed
    claims: list[tuple[int, ReplicaReq]] = []

    def base(i: int) -> list[Any]:
        st = work.get(i)
        return st if st is not None else hypo.get(i)

    def view(i: int) -> list[Any]:
        st = work.get(i)
        if st is None:
            st = work[i] = hypo.get(i)
        return st

    wait = 0.0  # by_grace: the longest grace period among the victims chosen so far
    for _r in range(replicas):
        best: tuple[tuple[float, float, int, int], int, list[Victim]] | None = None
        for i in allowed:
            st = base(i)
            trial = [list(st[0]), st[1], st[2]]
            added: list[Victim] = []
            cost = 0.0
            slowest = wait
            ok = _fits(placer, i, trial, req, shares)
            if not ok:
                for v in victims_by_node.get(i, []):
                    if v.job_id in chosen or gone(v.job_id):
                        continue
                    g = max(slowest, v.grace) if by_grace else 0.0
                    if best is not None and (g, cost + v.lost, len(added) + 1) > best[0][:3]:
                        break  # victims come cheapest first: this node cannot beat the best
                    slowest = g
                    for a in v.allocs:
                        if a.node == i:
                            Hypo._add(trial, a)
                    added.append(v)
                    cost += v.lost
                    if _fits(placer, i, trial, req, shares):
                        ok = True
                        break
            if not ok:
                continue
            key = (slowest, cost, len(added), state.nodes[i].rank)
            if best is None or key < best[0]:
                best = (key, i, added)
                if cost == 0 and not added:
                    break
        if best is None:
            return None
        (wait, *_), i, added = best
        for v in added:
            chosen[v.job_id] = v
            for a in v.allocs:
                Hypo._add(view(a.node), a)
        _take(placer, i, view(i), req, shares)
        claims.append((i, req))
    result = sorted(chosen.values(), key=lambda v: v.job_id)
    return (wait, sum(v.lost for v in result), len(result)), result, claims
