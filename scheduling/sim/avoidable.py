"""Avoidable waiting: how long a job waited while it could have started at once.

Judged from the events and the inputs alone, never from what the policy says of its reasons. A
pending job's wait is *avoidable* during any stretch between two events in which the GPUs then
free could hold its smallest allowed gang (``min_available`` replicas, or ``min_gpus`` for an
elastic job) without moving anyone:

1. on nodes of one model the job accepts, its node selector honoured, each replica on one node
   (whole GPUs wholly free; a fraction on one GPU with that share free), the nodes' free CPUs and
   memory permitting;
2. its topology honoured: ``nvlink``, the whole gang in one NVLink island of one node; ``node``,
   one node; ``rack``, one rack; ``any``, anywhere;
3. with quotas, the quota rules every policy obeys allowing it on that model: its tenant's usage
   plus the gang within the row's limit, and a non-preemptible job's within the guarantee counted
   over the tenant's non-preemptible usage alone.

Beside it, each job's wait *within its guarantee*: the stretches in which its smallest gang fit its
tenant's guarantee on a model it accepts (a non-preemptible job's counted over the tenant's
non-preemptible usage, a preemptible job's over all of it; without quotas, always), free GPUs or
not — room a job within its guarantee may have preempted borrowers for. The goal "inference p99
queueing ≤ 60 s where inference fits its guarantee" is judged on it: an inference job whose own
tenant's non-preemptible work fills the guarantee waits for that work by the quota rules, under
any policy.

Nothing is assumed about time the policy might have needed to decide; every stretch of an instant
on is counted. A job in a retry's backoff counts as waiting too (the events do not say the
backoff), so a policy's retries show here.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from scheduling.engine.types import JobRequest, NodeSpec, QuotaSpec
from scheduling.sim.feasible import eligible, min_replicas, quota_row
from scheduling.sim.metrics import percentile

EPS = 1e-6


@dataclass(frozen=True)
class NodeFree:
    """What one node has free at one moment."""

    spec: NodeSpec
    shares: tuple[float, ...]  # free share of each healthy GPU, by index (unhealthy: 0)
    cpus: float  # free CPUs (inf when not tracked)
    memory_gib: float  # free memory (inf when not tracked)
    whole: int  # GPUs wholly free


def node_free(
    n: NodeSpec,
    holders: Mapping[tuple[str, int], Mapping[str, float]],
    cpus_used: Mapping[str, float],
    memory_used: Mapping[str, float],
) -> NodeFree:
    """One node's free GPUs, CPUs and memory from the checker's accounting."""
    name, bad = n.name, n.unhealthy_gpus
    free = []
    for g in range(n.gpus):
        held = holders.get((name, g))
        free.append(0.0 if g in bad else max(0.0, 1.0 - sum(held.values())) if held else 1.0)
    shares = tuple(free)
    cpus = n.cpus - cpus_used.get(name, 0.0) if n.cpus else math.inf
    mem = n.memory_gib - memory_used.get(name, 0.0) if n.memory_gib else math.inf
    return NodeFree(n, shares, cpus, mem, sum(1 for x in shares if x >= 1 - EPS))


def free_view(
    nodes: Iterable[NodeSpec],
    holders: Mapping[tuple[str, int], Mapping[str, float]],
    cpus_used: Mapping[str, float],
    memory_used: Mapping[str, float],
) -> list[NodeFree]:
    """Every node's free GPUs, CPUs and memory from the checker's accounting."""
    return [node_free(n, holders, cpus_used, memory_used) for n in nodes]


class FreeView:
    """:func:`free_view`, kept from moment to moment: the nodes whose holders, CPUs or memory
    changed are named (:meth:`touch`) and only they are read again."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        holders: Mapping[tuple[str, int], Mapping[str, float]],
        cpus_used: Mapping[str, float],
        memory_used: Mapping[str, float],
    ) -> None:
        self.nodes = list(nodes)
        self._index = {n.name: i for i, n in enumerate(self.nodes)}
        self._accounts = (holders, cpus_used, memory_used)
        self._view: list[NodeFree] | None = None
        self._touched: set[str] = set()

    def touch(self, node: str) -> None:
        self._touched.add(node)

    def __call__(self) -> list[NodeFree]:
        if self._view is None:
            self._view = free_view(self.nodes, *self._accounts)
        else:
            for name in self._touched:
                i = self._index[name]
                self._view[i] = node_free(self.nodes[i], *self._accounts)
        self._touched.clear()
        return self._view


def _replicas_on(
    free: NodeFree, per_gpu: float, cpus: float, mem: float, gpus: Sequence[int] | None = None
) -> int:
    """How many replicas (``per_gpu`` GPUs, ``cpus``, ``mem`` each) fit now on ``gpus`` of a node
    (None: all of them)."""
    if per_gpu >= 1:
        whole = free.whole if gpus is None else sum(1 for g in gpus if free.shares[g] >= 1 - EPS)
        fits = whole // int(round(per_gpu))
        if not fits:
            return 0
    elif per_gpu > 0:
        fits = sum(
            int(x / per_gpu + EPS) for x in (free.shares if gpus is None else (free.shares[g] for g in gpus))
        )
    else:
        fits = 10**9
    if cpus > 0:
        fits = min(fits, int(free.cpus / cpus + EPS))
    if mem > 0:
        fits = min(fits, int(free.memory_gib / mem + EPS))
    return fits


def fits_now(job: JobRequest, pool: Sequence[NodeFree]) -> bool:
    """Steps 1 and 2: the free resources of ``pool`` (the schedulable nodes of one model the job
    accepts, :meth:`AvoidableWait.pools`) hold the job's smallest gang now."""
    r = max(1, job.replicas)
    need = min_replicas(job)
    per, cpus, mem = job.gpus / r, job.cpus / r, job.memory_gib / r
    if job.topology == "nvlink":
        for f in pool:
            d = max(1, min(f.spec.nvlink_domain, f.spec.gpus))
            for base in range(0, f.spec.gpus, d):
                if _replicas_on(f, per, cpus, mem, range(base, min(base + d, f.spec.gpus))) >= need:
                    return True
        return False
    counts = [(f.spec.rack, _replicas_on(f, per, cpus, mem)) for f in pool]
    if job.topology == "node":
        return any(c >= need for _, c in counts)
    if job.topology == "rack":
        by_rack: dict[str, int] = defaultdict(int)
        for rack, c in counts:
            by_rack[rack] += c
        return any(c >= need for c in by_rack.values())
    return sum(c for _, c in counts) >= need


def quota_allows(
    job: JobRequest,
    model: str,
    quotas: Sequence[QuotaSpec] | None,
    usage: Mapping[tuple[str, str], float],
    steady: Mapping[tuple[str, str], float],
) -> bool:
    """Step 3: the quota rules allow the smallest gang on ``model`` now (always, without quotas)."""
    if quotas is None or job.gpus <= 0:
        return True
    row = quota_row(quotas, job.tenant, model)
    if row is None:
        return False
    gang = job.gpus / max(1, job.replicas) * min_replicas(job)
    key = (job.tenant, row.model)
    if usage.get(key, 0.0) + gang > row.limit + EPS:
        return False
    return job.preemptible or steady.get(key, 0.0) + gang <= row.guaranteed + EPS


def within_guarantee(
    job: JobRequest,
    models: Sequence[str],
    quotas: Sequence[QuotaSpec] | None,
    usage: Mapping[tuple[str, str], float],
    steady: Mapping[tuple[str, str], float],
) -> bool:
    """The smallest gang fits its tenant's guarantee on one of ``models`` (always without quotas)."""
    if quotas is None or job.gpus <= 0:
        return True
    gang = job.gpus / max(1, job.replicas) * min_replicas(job)
    for m in models:
        row = quota_row(quotas, job.tenant, m)
        if row is None:
            continue
        held = (usage if job.preemptible else steady).get((job.tenant, row.model), 0.0)
        if held + gang <= min(row.guaranteed, row.limit) + EPS:
            return True
    return False


def _fit_shape(job: JobRequest) -> tuple:
    """What :func:`fits_now` reads of a job beside its pool."""
    return (job.gpus, job.replicas, min_replicas(job), job.topology, job.cpus, job.memory_gib)


def _where(job: JobRequest) -> tuple:
    """What :func:`~.feasible.eligible` reads of a job: jobs alike in it accept the same nodes."""
    return (job.accelerators, job.gpus > 0, job.node_selector)


def _shape(job: JobRequest) -> tuple:
    """What the judgement reads of a job: jobs alike in it are judged once per moment."""
    return (
        job.tenant,
        job.preemptible,
        job.gpus,
        job.replicas,
        min_replicas(job),
        job.accelerators,
        job.topology,
        job.node_selector,
        job.cpus,
        job.memory_gib,
    )


class AvoidableWait:
    """Accumulates each job's avoidable wait as the checker walks the events.

    ``advance(t)`` is called before the events at ``t`` are applied: the state then is the one
    that held since the previous call, so the stretch in between is judged on it. ``view`` lists
    the same nodes in the same order each time (only what is free changes). The checker says
    which nodes its events change (:meth:`touch`): the judgements of a moment are kept for the
    next one while no node and no quota usage has changed."""

    def __init__(self, view: FreeView, quotas: Sequence[QuotaSpec] | None) -> None:
        self._view = view
        self.quotas = quotas
        self.usage: dict[tuple[str, str], float] = defaultdict(float)
        self.steady: dict[tuple[str, str], float] = defaultdict(float)  # non-preemptible usage
        self.pending: dict[str, JobRequest] = {}
        self.seconds: dict[str, float] = defaultdict(float)
        self.guaranteed_s: dict[str, float] = defaultdict(float)  # waited within its guarantee
        self.t = -math.inf
        # per _where(job): the models it accepts, and per model the view's indexes of its
        # schedulable nodes it accepts (the nodes do not change; what is free on them does)
        self._pools: dict[tuple, tuple[list[str], dict[str, list[int]]]] = {}
        self._shapes: dict[str, tuple] = {}  # job -> _shape(job)
        # this state's judgements by _shape and fits_now's answers by (nodes, shape); cleared
        # when a node or the quota usage changes
        self._judged: dict[tuple, tuple[bool, bool]] = {}
        self._fitted: dict[tuple, bool] = {}
        self._changed = True

    def pools(self, job: JobRequest, view: Sequence[NodeFree]) -> tuple[list[str], dict[str, list[int]]]:
        key = _where(job)
        got = self._pools.get(key)
        if got is None:
            ok = [i for i, f in enumerate(view) if eligible(job, f.spec)]
            models = sorted({view[i].spec.model for i in ok})
            by_model: dict[str, list[int]] = {m: [] for m in models}
            for i in ok:
                if view[i].spec.schedulable:
                    by_model[view[i].spec.model].append(i)
            got = self._pools[key] = (models, by_model)
        return got

    def could_start_now(self, job: JobRequest, view: Sequence[NodeFree], fitted: dict[tuple, bool]) -> bool:
        """Steps 1-3 on some model the job accepts; ``fitted``: this moment's answers of
        :func:`fits_now` by (nodes, shape)."""
        models, by_model = self.pools(job, view)
        for m in models:
            if not quota_allows(job, m, self.quotas, self.usage, self.steady):
                continue
            key = (_where(job), m, _fit_shape(job))
            ok = fitted.get(key)
            if ok is None:
                ok = fitted[key] = fits_now(job, [view[i] for i in by_model[m]])
            if ok:
                return True
        return False

    def touch(self, node: str) -> None:
        """What is free on ``node`` changed."""
        self._view.touch(node)
        self._changed = True

    def advance(self, t: float) -> None:
        span = t - self.t
        if span > EPS and self.pending:
            if self._changed:
                self._judged.clear()
                self._fitted.clear()
                self._changed = False
            judged, fitted, shapes = self._judged, self._fitted, self._shapes
            view: list[NodeFree] | None = None
            for job_id, job in self.pending.items():
                key = shapes.get(job_id)
                if key is None:
                    key = shapes[job_id] = _shape(job)
                ok = judged.get(key)
                if ok is None:
                    if view is None:
                        view = self._view()
                    models, _ = self.pools(job, view)
                    ok = judged[key] = (
                        self.could_start_now(job, view, fitted),
                        within_guarantee(job, models, self.quotas, self.usage, self.steady),
                    )
                if ok[0]:
                    self.seconds[job_id] += span
                if ok[1]:
                    self.guaranteed_s[job_id] += span
        self.t = max(self.t, t)

    def charge(self, job: JobRequest, key: tuple[str, str], gpus: float) -> None:
        """``gpus`` (negative to give back) on the quota row ``key`` for ``job``."""
        self.usage[key] += gpus
        if not job.preemptible:
            self.steady[key] += gpus
        self._changed = True

    def summary(self, kinds: Mapping[str, str]) -> dict[str, object]:
        """Totals in hours: overall, per kind, and the worst job."""
        per_kind: dict[str, float] = defaultdict(float)
        for job_id, s in self.seconds.items():
            per_kind[kinds.get(job_id, "?")] += s
        worst = max(self.seconds.items(), key=lambda kv: (kv[1], kv[0]), default=("", 0.0))
        inference = [self.guaranteed_s.get(j, 0.0) for j, kind in kinds.items() if kind == "inference"]
        return {
            "avoidable_wait_total_h": round(sum(self.seconds.values()) / 3600, 3),
            "avoidable_wait_by_kind_h": {k: round(v / 3600, 3) for k, v in sorted(per_kind.items())},
            "avoidable_wait_max_h": round(worst[1] / 3600, 3),
            "avoidable_wait_max_job": worst[0],
            "jobs_with_avoidable_wait": sum(1 for s in self.seconds.values() if s > 0),
            "inference_p99_queue_within_guarantee_s": percentile(inference, 99),
        }
