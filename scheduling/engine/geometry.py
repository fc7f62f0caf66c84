"""A job's shape in engine units: per-replica request, how many replicas, how many needed at once."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, cast

from .buddy import order_for
from .fragmentation import to_milli
from .placement import Constraints, class_allows
from .quota import Quotas
from .state import ClusterState, ReplicaReq
from .types import MILLI, JobRequest


@dataclass(frozen=True, slots=True)
class Geometry:
    req: ReplicaReq
    replicas: int  # the most replicas it may run (elastic: max_gpus / per-replica size)
    need: int  # replicas that must start together
    charge: int  # quota milli-GPU per replica (a block rounded up counts whole)


def geometry(job: JobRequest, min_split: int = 1) -> Geometry:
    return _geometry(
        job.replicas,
        job.gpus,
        job.cpus,
        job.memory_gib,
        job.topology == "nvlink",
        job.min_available,
        job.elastic_max_gpus,
        job.elastic_min_gpus,
        min_split,
    )


# Jobs share a few shapes: a pass laying thousands of running jobs on the cluster asks for the
# same ones again and again (docs/benchmarks/scheduling-pass.md).
@functools.lru_cache(maxsize=4096)
def _geometry(
    replicas: int,
    gpus: float,
    cpus: float,
    memory_gib: float,
    nvlink: bool,
    min_available: int | None,
    elastic_max_gpus: int | None,
    elastic_min_gpus: int | None,
    min_split: int,
) -> Geometry:
    replicas = max(1, replicas)
    per = gpus / replicas
    cpu = to_milli(cpus / replicas)
    mem = int(round(memory_gib * 1024 / replicas))
    if per <= 0:
        req = ReplicaReq(0, 0, cpu, mem)
    elif per < 1:
        req = ReplicaReq(to_milli(per), 1, cpu, mem)
    else:
        req = ReplicaReq(MILLI, int(round(per)), cpu, mem, nvlink)
    top, need = replicas, min_available or replicas
    if elastic_max_gpus and per > 0:
        top = max(1, int(elastic_max_gpus // per))
        if min_available is None and elastic_min_gpus:
            need = max(1, -(-int(elastic_min_gpus) // max(1, int(round(per)))))
    need = max(1, min(need, top))
    if req.milli >= MILLI and req.count:
        charge = MILLI * max(1 << order_for(req.count), min_split)
    else:
        charge = req.milli * req.count
    return Geometry(req, top, need, charge)


def constraints(job: JobRequest, models: tuple[str, ...] | None = None) -> Constraints:
    if job.gpus <= 0:  # CPU-only: any node kind, but a model list still names acceptable nodes
        return Constraints(
            job.accelerators, job.node_selector, job.tolerations, gpu_job=False, prefer=job.prefer_labels
        )
    return Constraints(
        job.accelerators if models is None else models,
        job.node_selector,
        job.tolerations,
        gpu_job=True,
        prefer=job.prefer_labels,
    )


def static_check(
    state: ClusterState, quotas: Quotas, job: JobRequest, geo: Geometry, memo: dict[Any, Any]
) -> tuple[str, str] | None:
    """('reject', why) for a job that can never run here; ('capacity', why) for one larger
    than the cluster; None otherwise. Memoised per shape (what the cluster could ever hold) and
    per shape and tenant (what its quota could ever admit)."""
    r = geo.req  # keys of plain values: hashed in C, not by the dataclasses' Python methods
    shape = (
        r.milli,
        r.count,
        r.cpu,
        r.mem,
        r.nvlink,
        geo.need,
        job.accelerators,
        job.node_selector,
        job.tolerations,
        job.topology,
    )
    key = (shape, geo.replicas, geo.charge, job.tenant, job.preemptible, job.gpus)
    hit = memo.get(key, memo)
    if hit is not memo:
        return cast(tuple[str, str] | None, hit)
    ckey = ("cap", shape)
    cap = memo.get(ckey)
    if cap is None:
        cap = memo[ckey] = _holders(state, job, geo)
    holders, total, models_ok, most = cap
    req, need = geo.req, geo.need
    result: tuple[str, str] | None = None
    what = "|".join(job.accelerators) if job.accelerators else "GPUs"
    if holders == 0:
        result = (
            "reject",
            "no node can ever hold one replica "
            f"({geo.req.demand / MILLI:g} {what} each, topology {job.topology})",
        )
    elif (
        req.count
        and quotas.enabled
        and not any(quotas.ever_admits(job.tenant, m, geo.charge * need, job.preemptible) for m in models_ok)
    ):
        result = ("reject", f"quota: no quota of {job.tenant} admits {job.gpus:g} {what}")
    elif req.count and total < req.demand * need:
        result = (
            "capacity",
            f"capacity: needs {req.demand * need / MILLI:g} {what}; the "
            f"cluster has {total / MILLI:g} it may use",
        )
    elif most is not None and most < need:
        where = "one rack of one model" if job.topology == "rack" else "the nodes of one model"
        result = (
            "capacity",
            f"capacity: needs {need} replicas of {req.count} {what} together; "
            f"{where} could hold at most {most}",
        )
    memo[key] = result
    return result


def replica_holders(state: ClusterState, job: JobRequest, geo: Geometry) -> int:
    """How many nodes could ever hold one replica of ``job`` (all of a ``node``/``nvlink`` job)."""
    return _holders(state, job, geo)[0]


def _holders(
    state: ClusterState, job: JobRequest, geo: Geometry
) -> tuple[int, int, tuple[str, ...], int | None]:
    """Nodes that could ever hold one replica (all of a ``node``/``nvlink`` job), the milli-GPU
    they have, their models, and for a gang of whole-GPU replicas spread over nodes the most
    replicas the nodes of one model (of one rack, for a ``rack`` gang) could ever hold together
    (None for any other job): placement never mixes models in a gang."""
    req, need = geo.req, geo.need
    c = constraints(job)
    whole_job = job.topology in ("node", "nvlink")
    total = 0
    holders = 0
    models_ok: list[str] = []
    spread = need > 1 and not whole_job and req.count > 0 and req.milli >= MILLI
    groups: dict[tuple[str, str], int] = {}  # (model, rack or "") -> replicas it could hold
    rack = next((v for k, v in job.node_selector if k == "rack"), None)
    # a class is nodes alike but for the rack, their CPUs and their memory
    for cls, spec in state.class_spec.items():
        if class_allows(spec, c) is None:
            continue
        k = need if whole_job else 1
        size = (spec.nvlink_domain if req.nvlink else spec.gpus) - len(spec.unhealthy_gpus)
        if req.count and req.milli >= MILLI and req.count * k > size:
            continue
        count = 0
        for (cpu, mem), racks in state.class_sizes[cls].items():
            if req.cpu * k <= cpu and req.mem * k <= mem:
                count += racks.get(rack, 0) if rack else sum(racks.values())
                if spread:
                    per = min(
                        size // req.count,
                        cpu // req.cpu if req.cpu else size,
                        mem // req.mem if req.mem else size,
                    )
                    for name, n in racks.items():
                        if rack is None or name == rack:
                            g = (spec.model, name if job.topology == "rack" else "")
                            groups[g] = groups.get(g, 0) + per * n
        if not count:
            continue
        holders += count
        total += count * MILLI * (spec.gpus - len(spec.unhealthy_gpus))
        if spec.model not in models_ok:
            models_ok.append(spec.model)
    return holders, total, tuple(models_ok), (max(groups.values(), default=0) if spread else None)
