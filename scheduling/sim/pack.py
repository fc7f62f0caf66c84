"""The FGD paper's packing benchmark (``python -m scheduling.sim pack``), as docs/evaluation.md defines it.

1. Every pod of the list, sorted by name, shuffled with the seed; then "tune-up" draws with
   replacement from the name-sorted list until the GPU demand would pass 130% of capacity.
2. Pods are offered once, in that order: placed, or rejected at once. Nothing leaves.
3. Measured per pod: arrived demand and allocated capacity over cluster capacity; the value "at x%"
   is the mean allocation rate over the pods at which the rounded arrived percentage is x; the
   fragmentation rate (FGD's) likewise at 90%.

Speed: nodes in the same state (node type, free CPU, free memory, sorted free GPU shares) form one
*group*; a pod shape is scored once per group (a group's state never changes while it lives), and
the group's lowest-ranked node wins ties. Each pod shape keeps a heap of its best groups that reads
only the groups created or re-ranked since its last query (:class:`BestGroups`), so a pod costs
O(log groups), not a scan of every group; ``random`` draws nodes until one fits. A placement moves
one node between groups and updates the running sum of ``F(n)`` for that node only: nothing is
rebuilt per pod (how long a seed takes: docs/evaluation.md, "Method").
"""

from __future__ import annotations

import bisect
import heapq
import json
import math
import multiprocessing
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scheduling.engine.config import EngineConfig
from scheduling.engine.fragmentation import (
    UNTRACKED,
    FragmentationModel,
    cluster_rate,
    shape_of,
    to_milli,
    typical_requests,
)
from scheduling.engine.placement import tessera_pack_choice
from scheduling.engine.types import MILLI, NodeSpec
from scheduling.sim.plots import pyplot
from scheduling.sim.traces import read_jobs, read_nodes

PACK_POLICIES = ("random", "best-fit", "fgd", "fcfs-device", "fcfs-node", "tessera")
TUNE_UP = 1.3
RANDOM_TRIES = 16  # random: draws from all nodes before counting the feasible ones

GroupKey = tuple[int, str, int, int, tuple[int, ...]]  # node type, model, cpu, memory, GPUs


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    cpu: int  # milli-CPU
    mem: int  # MiB
    milli: int  # share of each GPU (1000 whole, 0 CPU-only)
    count: int  # GPUs (1 for a fraction, 0 for CPU-only)
    models: tuple[str, ...]

    @property
    def demand(self) -> int:
        return self.milli * self.count

    @property
    def key(self) -> tuple[int, int, int, int, tuple[str, ...]]:
        return (self.cpu, self.mem, self.milli, self.count, self.models)


def _sigmoid_score(delta: float) -> int:
    return math.floor(100.0 / (1.0 + math.exp(-delta / 1000.0)))


class Group:
    """Nodes in one state: an id that never changes while the group lives, and their ranks."""

    __slots__ = ("gid", "key", "ranks")

    def __init__(self, gid: int, key: GroupKey):
        self.gid = gid
        self.key = key
        self.ranks: list[int] = []


class PackCluster:
    """Free capacity of every node, grouped by state, with the running fragmentation sums.

    ``log`` lists, in order, every group that appeared or got a new lowest-ranked node: the
    per-shape heaps of :class:`BestGroups` read only what they have not seen yet.
    """

    def __init__(self, nodes: list[NodeSpec], rank: list[int], frag: FragmentationModel):
        types: dict[tuple, int] = {}
        self.type = [types.setdefault((n.model, n.gpus, n.cpus, n.memory_gib), len(types)) for n in nodes]
        self.model = [n.model for n in nodes]
        self.cpu = [to_milli(n.cpus) if n.cpus > 0 else UNTRACKED for n in nodes]
        self.mem = [int(round(n.memory_gib * 1024)) if n.memory_gib > 0 else UNTRACKED for n in nodes]
        self.gpu = [[MILLI] * n.gpus for n in nodes]
        self.full = [self.key(i) for i in range(len(nodes))]  # each node's state when empty
        self.rank = rank
        self.at_rank = [0] * len(nodes)
        for i, r in enumerate(rank):
            self.at_rank[r] = i
        self.frag = frag
        self.capacity = sum(n.gpus for n in nodes) * MILLI
        self.allocated = 0
        self.total_free = self.capacity
        self.total_f = 0.0
        self.groups: dict[GroupKey, Group] = {}
        self.by_gid: dict[int, Group] = {}
        self.node_gid = [0] * len(nodes)
        self.log: list[int] = []
        self._next_gid = 0
        for i in range(len(nodes)):
            key = self.key(i)
            self._join(i, key)
            self.total_f += frag.node(key[1], key[2], key[4])

    def key(self, i: int) -> GroupKey:
        return (self.type[i], self.model[i], self.cpu[i], self.mem[i], tuple(sorted(self.gpu[i])))

    def _join(self, i: int, key: GroupKey) -> None:
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = Group(self._next_gid, key)
            self.by_gid[group.gid] = group
            self._next_gid += 1
        r = self.rank[i]
        if not group.ranks or r < group.ranks[0]:
            self.log.append(group.gid)
        bisect.insort(group.ranks, r)
        self.node_gid[i] = group.gid

    def _leave(self, i: int, key: GroupKey) -> None:
        group = self.groups[key]
        ranks = group.ranks
        del ranks[bisect.bisect_left(ranks, self.rank[i])]
        if not ranks:
            del self.groups[key]
            del self.by_gid[group.gid]

    def apply(self, i: int, pod: Pod, gpu_indices: list[int], consume_node: bool = False) -> None:
        """Place ``pod`` on node ``i`` on ``gpu_indices``; move the node to its new group."""
        old = self.key(i)
        self._leave(i, old)
        if consume_node:  # fcfs-node: the whole node is held, whatever the pod uses
            self.cpu[i] = 0
            self.mem[i] = 0
            self.gpu[i] = [0] * len(self.gpu[i])
        else:
            self.cpu[i] -= pod.cpu
            self.mem[i] -= pod.mem
            for g in gpu_indices:
                self.gpu[i][g] -= pod.milli
        new = self.key(i)
        self._join(i, new)
        f = self.frag
        self.total_f += f.node(new[1], new[2], new[4]) - f.node(old[1], old[2], old[4])
        self.total_free -= sum(old[4]) - sum(new[4])
        self.allocated += pod.demand


def _fits(key: GroupKey, pod: Pod) -> bool:
    _type, model, cpu, mem, gpus = key
    if pod.cpu > cpu or pod.mem > mem or (pod.models and model not in pod.models):
        return False
    if pod.count == 0:
        return True
    if pod.milli < MILLI:
        return bool(gpus) and gpus[-1] >= pod.milli
    return gpus.count(MILLI) >= pod.count


def _after(gpus: tuple[int, ...], pod: Pod, value: int | None) -> tuple[int, ...]:
    """The sorted free vector after placing ``pod`` (on a GPU with free ``value`` if fractional)."""
    if pod.count == 0:
        return gpus
    out = list(gpus)
    if pod.milli < MILLI:
        assert value is not None  # a fraction goes on a GPU whose free share was chosen
        out[out.index(value)] = value - pod.milli
    else:
        for _ in range(pod.count):
            out[out.index(MILLI)] = 0
    out.sort()
    return tuple(out)


class _Scorer:
    """Score of a pod shape on a group state for one policy (higher is better) and the free share
    of the GPU to use for a fraction; ``None`` = does not fit. Memoised per (shape, group id): a
    group's state never changes while it lives."""

    def __init__(self, policy: str, frag: FragmentationModel, full: set[GroupKey]):
        self.policy = policy
        self.frag = frag
        self.full = full  # fcfs-node: the states of empty nodes
        self.beta = EngineConfig().beta  # tessera: the engine's default consolidation weight
        self.cache: dict[tuple, dict[int, tuple[float, int | None] | None]] = {}

    def per_shape(self, pod: Pod) -> dict[int, tuple[float, int | None] | None]:
        per = self.cache.get(pod.key)
        if per is None:
            per = self.cache[pod.key] = {}
        return per

    def score(self, key: GroupKey, pod: Pod) -> tuple[float, int | None] | None:
        if not _fits(key, pod):
            return None
        if self.policy == "fcfs-node" and key not in self.full:
            return None
        return self._score(key, pod)

    def _score(self, key: GroupKey, pod: Pod) -> tuple[float, int | None]:
        _type, model, cpu, _mem, gpus = key
        policy = self.policy
        fractional = 0 < pod.milli < MILLI
        if policy in ("random", "fcfs-device", "fcfs-node"):
            return (0.0, None)
        if policy == "best-fit":
            c = (cpu if cpu < UNTRACKED else 128_000) / 1000.0
            g = sum(gpus) / 1000.0
            s = 1 - (0.5 * (c - pod.cpu / 1000.0) / 128 + 0.5 * (g - pod.demand / 1000.0) / 8)
            value = None
            if fractional:  # the least free share that still fits
                value = min(v for v in gpus if v >= pod.milli)
            return (math.floor(100 * s), value)
        frag = self.frag
        before = frag.node(model, cpu, gpus)
        cpu_after = cpu - pod.cpu if cpu < UNTRACKED else cpu
        if policy == "fgd":
            if fractional:
                best = None
                for v in sorted(set(gpus)):
                    if v < pod.milli:
                        continue
                    fa = frag.node(model, cpu_after, _after(gpus, pod, v))
                    if best is None or fa < best[0]:
                        best = (fa, v)
                assert best is not None
                return (_sigmoid_score(before - best[0]), best[1])
            fa = frag.node(model, cpu_after, _after(gpus, pod, None))
            return (_sigmoid_score(before - fa), None)
        # tessera: the engine's own placement scoring
        return tessera_pack_choice(frag, model, cpu, gpus, pod.cpu, pod.milli, pod.count, self.beta)


class BestGroups:
    """The best group for each pod shape, kept in a heap of ``(-score, lowest rank, gid)``.

    A group's score for a shape never changes (its state is its key); what changes is which groups
    exist and their lowest-ranked node, and the cluster logs exactly those events. A query pushes
    the log entries it has not seen and drops stale tops: amortised O(log groups) per pod instead
    of scoring every group (about 700 on openb) for every pod.
    """

    def __init__(self, cl: PackCluster, scorer: _Scorer):
        self.cl = cl
        self.scorer = scorer
        self.heaps: dict[tuple, list] = {}  # shape -> [heap, log position read]

    def _scored(
        self, per: dict[int, tuple[float, int | None] | None], group: Group, pod: Pod
    ) -> tuple[float, int | None] | None:
        try:
            return per[group.gid]
        except KeyError:
            sc = per[group.gid] = self.scorer.score(group.key, pod)
            return sc

    def best(self, pod: Pod) -> tuple[int, int | None] | None:
        """``(rank, GPU value)`` of the best node for ``pod``, or None if none fits."""
        cl = self.cl
        per = self.scorer.per_shape(pod)
        log = cl.log
        h = self.heaps.get(pod.key)
        groups = cl.groups
        g: Group | None
        if h is None or len(log) - h[1] > 2 * len(groups) or len(h[0]) > 4 * len(groups) + 64:
            heap = []
            for g in groups.values():
                sc = self._scored(per, g, pod)
                if sc is not None:
                    heap.append((-sc[0], g.ranks[0], g.gid))
            heapq.heapify(heap)
            h = self.heaps[pod.key] = [heap, len(log)]
        else:
            heap = h[0]
            by_gid = cl.by_gid
            for gid in log[h[1] :]:
                g = by_gid.get(gid)
                if g is None:
                    continue
                sc = self._scored(per, g, pod)
                if sc is not None:
                    heapq.heappush(heap, (-sc[0], g.ranks[0], gid))
            h[1] = len(log)
        by_gid = cl.by_gid
        while heap:
            negs, r0, gid = heap[0]
            g = by_gid.get(gid)
            if g is None:
                heapq.heappop(heap)
            elif g.ranks[0] != r0:
                heapq.heapreplace(heap, (negs, g.ranks[0], gid))
            else:
                return r0, per[gid][1]  # type: ignore[index]
        return None

    def random_node(self, pod: Pod, rng: random.Random) -> int | None:
        """A uniformly random node that fits ``pod``: draws from all nodes until one fits (exactly
        uniform over the feasible ones), after a few misses a count over the feasible groups."""
        if self.best(pod) is None:
            return None
        cl = self.cl
        per = self.scorer.per_shape(pod)
        n = len(cl.node_gid)
        for _ in range(RANDOM_TRIES):
            i = rng.randrange(n)
            if self._scored(per, cl.by_gid[cl.node_gid[i]], pod) is not None:
                return i
        feasible = [
            (g.ranks, len(g.ranks)) for g in cl.groups.values() if self._scored(per, g, pod) is not None
        ]
        pick = rng.randrange(sum(c for _, c in feasible))
        for ranks, c in feasible:
            if pick < c:
                return cl.at_rank[ranks[pick]]
            pick -= c
        raise AssertionError("unreachable")


def build_pods(jobs_csv: str | Path) -> list[Pod]:
    pods = []
    for tj in read_jobs(jobs_csv):
        r = tj.request
        cpu, milli, count, models = shape_of(r)
        pods.append(Pod(r.id, cpu, int(round(r.memory_gib * 1024)), milli, count, models))
    pods.sort(key=lambda p: p.name)
    return pods


class PackError(ValueError):
    """Inputs the benchmark cannot measure (no GPUs in the cluster, none asked for)."""


def workload(pods: list[Pod], capacity: int, seed: int) -> list[Pod]:
    """Shuffle by the seed, then tune up with draws with replacement to 130% of ``capacity``."""
    if not pods:
        raise PackError("the pod list is empty")
    if not any(p.demand > 0 for p in pods):  # the top-up to 130% would draw for ever
        raise PackError("no pod asks for a GPU: the benchmark tops the pods up to 130% of the cluster's GPUs")
    rng = random.Random(seed)
    order = list(pods)
    rng.shuffle(order)
    total = sum(p.demand for p in order)
    limit = TUNE_UP * capacity
    while True:
        pod = pods[rng.randrange(len(pods))]
        if total + pod.demand > limit:
            break
        order.append(pod)
        total += pod.demand
    return order


def _choose_gpus(
    cl: PackCluster, i: int, pod: Pod, value: int | None, policy: str, rng: random.Random
) -> list[int]:
    gpus = cl.gpu[i]
    if pod.count == 0:
        return []
    if pod.milli >= MILLI:
        return [g for g, v in enumerate(gpus) if v == MILLI][: pod.count]
    if policy == "random":
        return [rng.choice([g for g, v in enumerate(gpus) if v >= pod.milli])]
    if value is None:  # first fit
        return [next(g for g, v in enumerate(gpus) if v >= pod.milli)]
    return [gpus.index(value)]


def run_seed(nodes: list[NodeSpec], pods: list[Pod], policy: str, seed: int) -> dict:
    """One seed of the benchmark; returns its metrics and a sampled allocation curve."""
    if policy not in PACK_POLICIES:
        raise ValueError(f"unknown pack policy {policy!r}; one of {', '.join(PACK_POLICIES)}")
    frag = FragmentationModel(typical_requests(shape_of_pod(p) for p in pods))
    node_rng = random.Random(seed * 1_000_003 + 17)
    if policy.startswith("fcfs"):
        rank = list(range(len(nodes)))
    else:
        perm = list(range(len(nodes)))
        node_rng.shuffle(perm)
        rank = [0] * len(nodes)
        for r, i in enumerate(perm):
            rank[i] = r
    cl = PackCluster(nodes, rank, frag)
    if cl.capacity <= 0:
        raise PackError("the cluster has no GPUs: the benchmark measures their allocation")
    finder = BestGroups(cl, _Scorer(policy, frag, set(cl.full)))
    order = workload(pods, cl.capacity, seed)
    rng = random.Random(seed * 7_919 + 3)
    arrived = 0
    sums: dict[str, list[float]] = {"a100": [0.0, 0], "a130": [0.0, 0], "f90": [0.0, 0]}
    curve: list[tuple[float, float]] = []
    placed = 0
    whole_node = policy == "fcfs-node"
    for n, pod in enumerate(order):
        node = None
        choice_value = None
        if policy == "random":
            node = finder.random_node(pod, rng)
        else:
            best = finder.best(pod)
            if best is not None:
                node, choice_value = cl.at_rank[best[0]], best[1]
        if node is not None:
            cl.apply(node, pod, _choose_gpus(cl, node, pod, choice_value, policy, rng), whole_node)
            placed += 1
        arrived += pod.demand
        pct = math.floor(arrived * 100 / cl.capacity + 0.5)
        rate = cl.allocated / cl.capacity
        if pct == 100:
            sums["a100"][0] += rate
            sums["a100"][1] += 1
        elif pct == 130:
            sums["a130"][0] += rate
            sums["a130"][1] += 1
        elif pct == 90:
            sums["f90"][0] += cluster_rate(cl.total_f, cl.total_free)
            sums["f90"][1] += 1
        if n % 25 == 0 or n == len(order) - 1:
            curve.append((arrived / cl.capacity, rate))

    def mean(k: str) -> float | None:
        s, c = sums[k]
        return s / c if c else None

    return {
        "seed": seed,
        "pods": len(order),
        "placed": placed,
        "gpu_allocation_rate_at_100": mean("a100"),
        "gpu_allocation_rate_at_130": mean("a130"),
        "fragmentation_rate_at_90": mean("f90"),
        "final_allocation_rate": cl.allocated / cl.capacity,
        "curve": curve,
    }


def shape_of_pod(p: Pod) -> tuple[int, int, int, tuple[str, ...]]:
    return (p.cpu, p.milli, p.count, p.models)


def _seed_job(args: tuple[str, str, str, int]) -> dict:
    nodes_csv, jobs_csv, policy, seed = args
    return run_seed(read_nodes(nodes_csv), build_pods(jobs_csv), policy, seed)


def _mean(values: list[float | None]) -> float | None:
    real = [v for v in values if v is not None]
    return sum(real) / len(real) if real else None


def run_pack(
    nodes_csv: str | Path,
    jobs_csv: str | Path,
    policy: str,
    out_dir: str | Path,
    seeds: list[int],
    progress: Callable[[int, int], None] | None = None,
    processes: int = 1,
) -> dict:
    """Run the benchmark for ``seeds``; write ``summary.json`` and ``allocation.png``; return it."""
    if policy not in PACK_POLICIES:
        raise ValueError(f"unknown pack policy {policy!r}; one of {', '.join(PACK_POLICIES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tasks = [(str(nodes_csv), str(jobs_csv), policy, s) for s in seeds]
    results: list[dict] = []
    if progress:
        progress(0, len(tasks))
    if processes > 1 and len(tasks) > 1:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(min(processes, len(tasks))) as pool:
            for r in pool.imap(_seed_job, tasks):
                results.append(r)
                if progress:
                    progress(len(results), len(tasks))
    else:
        nodes = read_nodes(nodes_csv)
        pods = build_pods(jobs_csv)
        for s in seeds:
            results.append(run_seed(nodes, pods, policy, s))
            if progress:
                progress(len(results), len(tasks))
    per_seed = [{k: v for k, v in r.items() if k != "curve"} for r in results]
    summary = {
        "policy": policy,
        "nodes": str(nodes_csv),
        "jobs": str(jobs_csv),
        "seeds": list(seeds),
        "gpu_allocation_rate_at_100": _mean([r["gpu_allocation_rate_at_100"] for r in results]),
        "gpu_allocation_rate_at_130": _mean([r["gpu_allocation_rate_at_130"] for r in results]),
        "fragmentation_rate_at_90": _mean([r["fragmentation_rate_at_90"] for r in results]),
        "per_seed": per_seed,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    _plot(out / "allocation.png", policy, results)
    return summary


def _plot(path: Path, policy: str, results: list[dict]) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        xs = [100 * a for a, _ in r["curve"]]
        ys = [100 * b for _, b in r["curve"]]
        ax.plot(xs, ys, linewidth=0.8, alpha=0.7, label=f"seed {r['seed']}")
    ax.plot([0, 130], [0, 130], color="grey", linestyle=":", linewidth=0.8, label="demand")
    ax.set_xlabel("arrived GPU demand (% of capacity)")
    ax.set_ylabel("GPU allocation rate (%)")
    ax.set_title(f"pack: {policy}")
    ax.set_xlim(0, 132)
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    if len(results) <= 10:
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
