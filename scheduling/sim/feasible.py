"""Could an empty cluster (within the tenant's quota) ever hold a job? Used to judge rejects.

A reject is legal only when the answer is no: no set of eligible nodes can hold the job's
smallest allowed gang (``min_available`` replicas, or ``min_gpus`` for an elastic job) with its
topology, CPUs and memory, or no quota row of its tenant has a limit that large on any model the
job accepts (a guarantee that large, for a non-preemptible job: it may never borrow).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from scheduling.engine.types import JobRequest, NodeSpec, QuotaSpec

EPS = 1e-9


def min_replicas(job: JobRequest) -> int:
    """The fewest replicas that may start: ``min_available``, else from ``min_gpus``, else all."""
    if job.min_available is not None:
        return job.min_available
    if job.elastic_min_gpus is not None and job.gpus >= 1 and job.replicas:
        per = job.gpus / job.replicas
        return max(1, math.ceil(job.elastic_min_gpus / per - EPS))
    return job.replicas


def eligible(job: JobRequest, node: NodeSpec) -> bool:
    """The node's model and labels are ones the job accepts."""
    if job.accelerators and node.model not in job.accelerators:
        return False
    if job.gpus > 0 and node.gpus == 0:
        return False
    labels = dict(node.labels)
    return all(labels.get(k) == v for k, v in job.node_selector)


def _replicas_on(job: JobRequest, node: NodeSpec, per_gpu_limit: int | None = None) -> int:
    """How many of the job's replicas an empty ``node`` could hold."""
    r = max(1, job.replicas)
    gpus, cpus, mem = job.gpus / r, job.cpus / r, job.memory_gib / r
    fits = 10**9
    if gpus >= 1:
        fits = (per_gpu_limit if per_gpu_limit is not None else node.gpus) // int(round(gpus))
    elif gpus > 0:
        fits = node.gpus  # one fraction per GPU at least
    if cpus > 0 and node.cpus > 0:
        fits = min(fits, int(node.cpus / cpus + EPS))
    if mem > 0 and node.memory_gib > 0:
        fits = min(fits, int(node.memory_gib / mem + EPS))
    return fits


def cluster_could_hold(job: JobRequest, nodes: Sequence[NodeSpec]) -> bool:
    need = min_replicas(job)
    pool = [n for n in nodes if eligible(job, n)]
    if job.topology == "nvlink":
        return any(_replicas_on(job, n, n.nvlink_domain) >= need for n in pool)
    if job.topology == "node":
        return any(_replicas_on(job, n) >= need for n in pool)
    if job.topology == "rack":
        by_rack: dict[str, int] = defaultdict(int)
        for n in pool:
            by_rack[n.rack] += _replicas_on(job, n)
        return any(count >= need for count in by_rack.values())
    return sum(_replicas_on(job, n) for n in pool) >= need


def quota_row(quotas: Sequence[QuotaSpec], tenant: str, model: str) -> QuotaSpec | None:
    """The row that governs ``tenant`` on ``model``: its own row, else its ``*`` row, else none."""
    star = None
    for q in quotas:
        if q.tenant == tenant:
            if q.model == model:
                return q
            if q.model == "*":
                star = q
    return star


def quota_could_admit(job: JobRequest, nodes: Sequence[NodeSpec], quotas: Sequence[QuotaSpec]) -> bool:
    """Some model the job accepts (and the cluster has) has a quota row with a limit that large
    (a guarantee, for a non-preemptible job: it may never borrow)."""
    smallest = job.gpus
    if job.gpus >= 1 and job.replicas:
        smallest = job.gpus / job.replicas * min_replicas(job)
    models = {n.model for n in nodes if eligible(job, n)}
    for model in models:
        row = quota_row(quotas, job.tenant, model)
        if row is None:
            continue
        cap = row.limit if job.preemptible else min(row.limit, row.guaranteed)
        if cap + EPS >= smallest:
            return True
    return False


def could_hold(job: JobRequest, nodes: Sequence[NodeSpec], quotas: Sequence[QuotaSpec] | None = None) -> bool:
    """Whether the empty cluster — and, given ``quotas``, the tenant's quota — could hold ``job``."""
    if not cluster_could_hold(job, nodes):
        return False
    return not quotas or quota_could_admit(job, nodes, quotas)
