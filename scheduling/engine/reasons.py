"""Pending reasons: the binding constraint of a pending job, in words a person can act on.

Codes are the API's (``types.PENDING_CODES``; docs/api.md). Capacity-type reasons are diagnosed on the
state as it stands at the end of the pass, so every number in a message is true of that state:

* ``capacity``: the nodes the job may use have fewer GPUs (or CPUs/memory) than it needs, free or
  in all (a job larger than the cluster stays pending with this code);
* ``model`` / ``node-selector``: its nodes are full while nodes it excludes have room;
* ``topology``: enough free GPUs on its nodes, but no NVLink island / node holds a replica;
* ``fragmentation``: enough free GPUs on its nodes, but scattered in blocks too small;
* ``gang``: single replicas fit, but not ``min_available`` of them together.
Flow reasons (``quota``, ``borrow-limit``, ``reserved``, ``priority``, ``held``, ``backoff``)
come from the pass itself.
"""

from __future__ import annotations

from typing import Protocol

from .geometry import Geometry, constraints
from .placement import Constraints, Placer
from .quota import fmt_gpus
from .state import ClusterState, ReplicaReq, fits_state
from .types import MILLI, JobRequest, PendingReason


def _models(c: Constraints) -> str:
    return "|".join(c.models) if c.models else "GPUs"


class ClassSummary:
    """Free capacity of the nodes of one class (optionally in one rack), from one scan."""

    __slots__ = (
        "nodes",
        "gpus",
        "whole_free",
        "free_milli",
        "max_whole",
        "max_block",
        "max_island",
        "max_gpu",
        "model",
    )

    def __init__(self, model: str):
        self.model = model
        self.nodes = self.gpus = self.whole_free = self.free_milli = 0
        self.max_whole: tuple[int, str] = (0, "")
        self.max_block: tuple[int, str] = (0, "")
        self.max_island = 0
        self.max_gpu = 0


def summarize(state: ClusterState, rack: str | None = None) -> dict[int, ClassSummary]:
    out: dict[int, ClassSummary] = {}
    for n in state.nodes:
        spec = n.spec
        if not spec.schedulable or (rack is not None and spec.rack != rack):
            continue
        cs = out.get(n.cls)
        if cs is None:
            cs = out[n.cls] = ClassSummary(spec.model)
        cs.nodes += 1
        cs.gpus += spec.gpus - len(spec.unhealthy_gpus)
        whole = n.whole_free()
        cs.whole_free += whole
        cs.free_milli += sum(n.free)
        if whole > cs.max_whole[0]:
            cs.max_whole = (whole, spec.name)
        blk = n.largest_block()
        if blk > cs.max_block[0]:
            cs.max_block = (blk, spec.name)
        for isl in n.islands:
            cs.max_island = max(cs.max_island, isl.free_count())
        cs.max_gpu = max(cs.max_gpu, max(n.free, default=0))
    return out


class ClassPrefs(Protocol):
    """What :func:`diagnose` reads of a placer (:class:`.placement.Placer`; the baselines' probe)."""

    state: ClusterState

    def class_pref(self, cls: int, c: Constraints) -> int | None: ...


def diagnose(
    placer: ClassPrefs,
    job: JobRequest,
    req: ReplicaReq,
    replicas: int,
    need: int,
    c: Constraints,
    summaries: dict[str | None, dict[int, ClassSummary]] | None = None,
) -> PendingReason:
    """Why ``job`` (which did not fit) cannot start on the current state."""
    state = placer.state
    rack = next((v for k, v in c.selector if k == "rack"), None)
    if summaries is None:
        summaries = {}
    summary = summaries.get(rack)
    if summary is None:
        summary = summaries[rack] = summarize(state, rack)
    total_need = req.demand * need
    mine_total = mine_free = other_free = selector_excluded = 0
    gpu_ok = False
    best_block: tuple[int, str] = (0, "")
    best_node: tuple[int, str] = (0, "")
    for cls, cs in summary.items():
        if placer.class_pref(cls, c) is None:
            if c.models and cs.model in c.models:
                selector_excluded += cs.free_milli
            other_free += cs.free_milli
            continue
        mine_total += MILLI * cs.gpus
        mine_free += cs.free_milli if req.milli < MILLI else MILLI * cs.whole_free
        if req.milli < MILLI:
            gpu_ok = gpu_ok or cs.max_gpu >= req.milli
        elif req.nvlink:
            gpu_ok = gpu_ok or cs.max_island >= req.count
        else:
            gpu_ok = gpu_ok or cs.max_whole[0] >= req.count
        best_block = max(best_block, cs.max_block, key=lambda t: t[0])
        best_node = max(best_node, cs.max_whole, key=lambda t: t[0])
    what = _models(c)
    fit_nodes = 0
    if need > 1:  # gangs: how many single replicas would fit now
        for n in state.nodes:
            if placer.class_pref(n.cls, c) is None or (rack is not None and n.spec.rack != rack):
                continue
            d = max(1, min(n.spec.nvlink_domain, n.spec.gpus)) if n.spec.gpus else 1
            if fits_state(n.key(), req, d, n.spec.gpus):
                fit_nodes += 1
    if fit_nodes:
        if fit_nodes < need:
            return PendingReason(
                "gang",
                f"gang: needs {need} replicas of {fmt_gpus(req.demand)} {what} together; "
                f"only {fit_nodes} node(s) can take one now",
            )
        return PendingReason(
            "gang", f"gang: {need} replicas of {fmt_gpus(req.demand)} {what} do not fit together now"
        )
    if mine_total < total_need:
        return PendingReason(
            "capacity",
            f"capacity: needs {fmt_gpus(total_need)} {what}; the nodes it may use have "
            f"{fmt_gpus(mine_total)} in all",
        )
    if mine_free < total_need:
        if selector_excluded >= total_need and c.selector:
            return PendingReason(
                "node-selector",
                f"node-selector: {fmt_gpus(mine_free)} {what} free on nodes matching "
                f"{','.join(f'{k}={v}' for k, v in c.selector)}; {fmt_gpus(selector_excluded)} "
                "free elsewhere",
            )
        if c.models and other_free >= total_need:
            return PendingReason(
                "model",
                f"model: needs {fmt_gpus(total_need)} {what}, {fmt_gpus(mine_free)} free; "
                f"{fmt_gpus(other_free)} GPUs of other models free",
            )
        return PendingReason(
            "capacity", f"capacity: needs {fmt_gpus(total_need)} {what}, {fmt_gpus(mine_free)} free"
        )
    if gpu_ok:
        return PendingReason(
            "capacity",
            f"capacity: the nodes with the GPUs free lack {req.cpu / 1000:g} CPUs / "
            f"{req.mem / 1024:g} GiB free",
        )
    if req.nvlink:
        return PendingReason(
            "topology",
            f"topology: needs {req.count} GPUs in one NVLink island; largest free block is "
            f"{best_block[0]} ({best_block[1] or 'none'})",
        )
    if req.milli < MILLI:
        return PendingReason(
            "fragmentation",
            f"fragmentation: {fmt_gpus(mine_free)} {what} free, no GPU with {fmt_gpus(req.milli)} free",
        )
    return PendingReason(
        "fragmentation",
        f"fragmentation: {fmt_gpus(mine_free)} {what} free, in blocks of at most "
        f"{best_node[0]} per node ({best_node[1] or 'none'})",
    )


def share_rule(placer: Placer, job: JobRequest, geo: Geometry, shares: str) -> PendingReason | None:
    """The ``capacity`` reason of a fractional job that exclusive GPU shares keep waiting: fewer
    than ``need`` nodes could take a replica under the rule while more could without it (None:
    the rule is not what stops it)."""
    state, req, c = placer.state, geo.req, constraints(job)
    rack = next((v for k, v in c.selector if k == "rack"), None)
    without = with_rule = 0
    for n in state.nodes:
        if placer.class_pref(n.cls, c) is None or (rack is not None and n.spec.rack != rack):
            continue
        if fits_state(n.key(), req, 1, n.spec.gpus):
            without += 1
            with_rule += state.share_fits(n.index, req.milli, shares)
    if with_rule >= geo.need or without <= with_rule:
        return None
    return PendingReason(
        "capacity",
        f"capacity: exclusive_gpu_shares: no GPU with {fmt_gpus(req.milli)} free holds only "
        f"{shares}'s shares, and no whole GPU is free (GPUs are not shared between tenants)",
    )


def diagnose_job(
    placer: Placer,
    job: JobRequest,
    geo: Geometry,
    summaries: dict[str | None, dict[int, ClassSummary]] | None = None,
    shares: str | None = None,
) -> PendingReason:
    """:func:`diagnose` for a job of geometry ``geo``; a gang that fits nowhere together within
    its topology is told so as a ``topology`` reason. ``shares``: the job's tenant under
    exclusive GPU shares (:func:`share_rule`)."""
    if shares is not None:
        ruled = share_rule(placer, job, geo, shares)
        if ruled is not None:
            return ruled
    reason = diagnose(placer, job, geo.req, geo.replicas, geo.need, constraints(job), summaries)
    if reason.code == "gang" and job.topology in ("node", "nvlink", "rack") and geo.need > 1:
        return PendingReason(
            "topology",
            f"topology: {geo.need} replicas of "
            f"{geo.req.demand / MILLI:g} GPUs do not fit in one "
            f"{job.topology} now",
        )
    return reason
