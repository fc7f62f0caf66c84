"""Metrics of a replay, computed from its events and inputs only (so live exports work too).

The summary's keys are docs/formats.md's (``summary.json``). Conventions:

- allocation = the GPU capacity listed in allocations (fractions count as their share),
  time-averaged over [first submit, last event] (``gpu_allocation_rate``) and over [first submit,
  last submit] (``gpu_allocation_rate_while_arriving``), beside the most any policy could reach
  over that span (``gpu_allocation_ceiling_while_arriving``, :mod:`scheduling.sim.ceiling`);
- queueing delay = first ``start`` − ``submit``; a job that never started (and was not rejected)
  counts with its wait until the last event, so ``max_queue_s`` never hides a starved job;
- JCT = end (``finish`` or ``fail``) − ``submit``; rejected and cancelled jobs have none;
- fragmentation = FGD's rate (:mod:`scheduling.engine.fragmentation`) with the typical
  requests of the last 1,000 submitted jobs, sampled on a regular grid, averaged where any GPU
  capacity is free;
- ``lost_gpu_seconds`` comes from the ``preempt`` events' ``lost_gpu_seconds`` (work since the
  last checkpoint × GPUs asked for) and ``lost_work_fraction`` divides it by all allocated
  GPU-seconds.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Sequence
from typing import Any

from scheduling.engine.fragmentation import UNTRACKED, FragmentationModel, to_milli
from scheduling.engine.types import KINDS, MILLI, NodeSpec, QuotaSpec
from scheduling.sim.ceiling import allocation_ceiling
from scheduling.sim.traces import TraceJob

TYPICAL_WINDOW = 1000
SAMPLES = 600


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in 0..100) of ``values``; None when empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _stats(jct: list[float], queue: list[float]) -> dict[str, Any]:
    return {
        "jobs": len(queue),
        "avg_jct_s": sum(jct) / len(jct) if jct else None,
        "p50_jct_s": percentile(jct, 50),
        "p99_jct_s": percentile(jct, 99),
        "avg_queue_s": sum(queue) / len(queue) if queue else None,
        "p99_queue_s": percentile(queue, 99),
        "max_queue_s": max(queue) if queue else None,
    }


class _Nodes:
    """Free GPU shares (milli) and CPUs per node, to sample fragmentation."""

    def __init__(self, nodes: Sequence[NodeSpec]) -> None:
        self.spec = {n.name: n for n in nodes}
        self.free = {n.name: [MILLI] * n.gpus for n in nodes}
        self.cpu = {n.name: to_milli(n.cpus) if n.cpus > 0 else UNTRACKED for n in nodes}

    def apply(self, allocs: list[dict[str, Any]], cpu_per_replica: int, sign: int) -> None:
        for a in allocs:
            free = self.free.get(a["node"])
            if free is None:
                continue
            milli = to_milli(float(a.get("share", 1.0)))
            for g in a.get("gpus", []):
                if 0 <= g < len(free):
                    free[g] -= sign * milli
            if self.cpu[a["node"]] != UNTRACKED:
                self.cpu[a["node"]] -= sign * cpu_per_replica

    def rate(self, model: FragmentationModel) -> float | None:
        total_f = 0.0
        total_free = 0
        for name, free in self.free.items():
            if not free:
                continue
            vec = tuple(sorted(max(0, v) for v in free))
            s = sum(vec)
            if s <= 0:
                continue
            total_free += s
            total_f += model.node(self.spec[name].model, self.cpu[name], vec)
        return total_f / total_free if total_free else None


def summarize(
    nodes: Sequence[NodeSpec],
    jobs: Sequence[TraceJob],
    events: Iterable[dict[str, Any]],
    quotas: Sequence[QuotaSpec] = (),
    samples: int = SAMPLES,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return ``(summary, series)``: the metrics, and the time series and JCTs for plots."""
    events = list(events)
    by_id = {tj.request.id: tj for tj in jobs}
    capacity = float(sum(n.gpus for n in nodes)) or 1.0
    submits = [e["t"] for e in events if e["event"] == "submit"]
    t0 = min(submits) if submits else 0.0
    t_arrive = max(submits) if submits else 0.0
    t_end = max((e["t"] for e in events), default=0.0)
    step = max(60.0, (t_end - t0) / max(1, samples))

    state = _Nodes(nodes)
    allocated = 0.0
    area = area_arriving = 0.0
    last_t = t0
    job_alloc: dict[str, tuple[float, float, list[dict[str, Any]]]] = {}  # capacity, since, allocs
    tenant_gs: dict[str, float] = {}
    submitted_at: dict[str, float] = {}
    first_start: dict[str, float] = {}
    ended: dict[str, str] = {}
    jct: dict[str, list[float]] = {k: [] for k in KINDS}
    pending: Counter[str] = Counter()
    recent: deque = deque(maxlen=TYPICAL_WINDOW)
    model: FragmentationModel | None = None
    model_stale = True
    series: dict[str, Any] = {"t": [], "allocation": [], "fragmentation": [], "queue": {}}
    series["queue"] = {k: [] for k in KINDS}
    frag_samples: list[float] = []
    lost = 0.0
    preemptions = 0
    next_sample = t0

    def integrate(t: float) -> None:
        nonlocal area, area_arriving, last_t
        if t > last_t:
            area += allocated * (t - last_t)
            hi = min(t, t_arrive)
            if hi > last_t:
                area_arriving += allocated * (hi - last_t)
            last_t = t

    def sample(t: float) -> None:
        nonlocal model, model_stale
        if model_stale and recent:
            model = FragmentationModel.from_jobs(recent)
            model_stale = False
        series["t"].append(t)
        series["allocation"].append(allocated / capacity)
        for k in KINDS:
            series["queue"][k].append(pending[k])
        rate = state.rate(model) if model is not None else None
        series["fragmentation"].append(rate)
        if rate is not None:
            frag_samples.append(rate)

    def release(job_id: str, t: float) -> None:
        nonlocal allocated
        cap, since, allocs = job_alloc.pop(job_id, (0.0, t, []))
        allocated -= cap
        req = by_id[job_id].request
        tenant_gs[req.tenant] = tenant_gs.get(req.tenant, 0.0) + cap * (t - since)
        state.apply(allocs, to_milli(req.cpus / max(1, req.replicas)), -1)

    def take(job_id: str, t: float, allocs: list[dict[str, Any]]) -> None:
        nonlocal allocated
        cap = sum(float(a.get("share", 1.0)) * len(a.get("gpus", [])) for a in allocs)
        allocated += cap
        job_alloc[job_id] = (cap, t, allocs)
        req = by_id[job_id].request
        state.apply(allocs, to_milli(req.cpus / max(1, req.replicas)), +1)

    for e in events:
        t, kind, job_id = e["t"], e["event"], e["job"]
        while next_sample < t:
            integrate(next_sample)
            sample(next_sample)
            next_sample += step
        integrate(t)
        tj = by_id.get(job_id)
        if tj is None:
            continue
        jkind = tj.request.kind
        if kind == "submit":
            submitted_at[job_id] = t
            pending[jkind] += 1
            recent.append(tj.request)
            model_stale = True
        elif kind == "start":
            first_start.setdefault(job_id, t)
            pending[jkind] -= 1
            take(job_id, t, e.get("allocations", []))
        elif kind == "resize":
            release(job_id, t)
            take(job_id, t, e.get("allocations", []))
        elif kind == "preempt":
            release(job_id, t)
            pending[jkind] += 1
            preemptions += 1
            lost += float(e.get("lost_gpu_seconds", 0.0))
        elif kind in ("finish", "fail", "cancel", "reject"):
            if job_id in job_alloc:
                release(job_id, t)
            elif job_id in submitted_at and job_id not in ended:
                pending[jkind] -= 1
            ended[job_id] = kind
            if kind in ("finish", "fail") and job_id in submitted_at:
                jct[jkind].append(t - submitted_at[job_id])
    integrate(t_end)
    sample(t_end)

    queue: dict[str, list[float]] = {k: [] for k in KINDS}
    for job_id, t in submitted_at.items():
        kind = by_id[job_id].request.kind
        if job_id in first_start:
            queue[kind].append(first_start[job_id] - t)
        elif ended.get(job_id) not in ("reject", "cancel"):
            queue[kind].append(t_end - t)  # never started: waited at least this long
    all_jct = [x for k in KINDS for x in jct[k]]
    all_queue = [x for k in KINDS for x in queue[k]]
    allocated_gs = sum(tenant_gs.values())
    span = max(1e-9, t_end - t0)
    guaranteed: dict[str, float] = {}
    for q in quotas:
        guaranteed[q.tenant] = guaranteed.get(q.tenant, 0.0) + q.guaranteed
    tenants = {}
    for tenant in sorted(set(tenant_gs) | set(guaranteed)):
        g = guaranteed.get(tenant, 0.0)
        tenants[tenant] = {
            "gpu_seconds": tenant_gs.get(tenant, 0.0),
            "guaranteed_gpus": g,
            "share_of_guarantee": tenant_gs.get(tenant, 0.0) / (g * span) if g else None,
        }
    outcome = Counter(ended.values())
    summary: dict[str, Any] = {
        "jobs": len(jobs),
        "gpus": capacity,
        "gpu_allocation_rate": area / (capacity * span),
        "gpu_allocation_rate_while_arriving": (
            area_arriving / (capacity * (t_arrive - t0)) if t_arrive > t0 else None
        ),
        # The most any policy could have allocated over the same span (scheduling/sim/ceiling.py).
        "gpu_allocation_ceiling_while_arriving": allocation_ceiling(jobs, capacity, t0, t_arrive),
        **{k: v for k, v in _stats(all_jct, all_queue).items() if k != "jobs"},
        "by_kind": {k: _stats(jct[k], queue[k]) for k in KINDS if queue[k] or jct[k]},
        "makespan_s": t_end - t0,
        "avg_fragmentation_rate": sum(frag_samples) / len(frag_samples) if frag_samples else None,
        "preemptions": preemptions,
        "lost_gpu_seconds": lost,
        "allocated_gpu_seconds": allocated_gs,
        "lost_work_fraction": lost / allocated_gs if allocated_gs else 0.0,
        "finished": outcome.get("finish", 0),
        "failed": outcome.get("fail", 0),
        "cancelled": outcome.get("cancel", 0),
        "rejected": outcome.get("reject", 0),
        "unfinished": len(jobs) - len(ended),
        "tenants": tenants,
    }
    series["jct"] = {k: jct[k] for k in KINDS}
    return summary, series
