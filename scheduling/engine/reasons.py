"""Pending reasons: the binding constraint of a pending job, in words a person can act on.

Codes are CONTRACTS.md's (``types.PENDING_CODES``). Capacity-type reasons are diagnosed on the
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

from .placement import Constraints, Placer
from .quota import fmt_gpus
from .state import ReplicaReq, fits_state
from .types import MILLI, JobRequest, PendingReason


def _models(c: Constraints) -> str:
    return "|".join(c.models) if c.models else "GPUs"


def diagnose(placer: Placer, job: JobRequest, req: ReplicaReq, replicas: int, need: int,
             c: Constraints) -> PendingReason:
    """Why ``job`` (which did not fit) cannot start on the current state."""
    state = placer.state
    rack = next((v for k, v in c.selector if k == "rack"), None)
    total_need = req.demand * need
    mine_total = mine_free = other_free = 0
    fit_nodes = 0
    best_block: tuple[int, str] = (0, "")
    best_node: tuple[int, str] = (0, "")
    gpu_ok_nodes = 0
    selector_excluded = 0
    for n in state.nodes:
        spec = n.spec
        if not spec.schedulable:
            continue
        allowed = placer.class_pref(n.cls, c) is not None and (rack is None or spec.rack == rack)
        if not allowed:
            if c.models and spec.model in c.models:
                selector_excluded += sum(n.free)
            other_free += sum(n.free)
            continue
        mine_total += MILLI * (spec.gpus - len(spec.unhealthy_gpus))
        mine_free += sum(n.free) if req.milli < MILLI else MILLI * n.whole_free()
        d = max(1, min(spec.nvlink_domain, spec.gpus)) if spec.gpus else 1
        if fits_state(n.key(), req, d, spec.gpus):
            fit_nodes += 1
        gpu_only = ReplicaReq(req.milli, req.count, 0, 0, req.nvlink)
        if fits_state(n.key(), gpu_only, d, spec.gpus):
            gpu_ok_nodes += 1
        blk = n.largest_block()
        if blk > best_block[0]:
            best_block = (blk, spec.name)
        whole = n.whole_free()
        if whole > best_node[0]:
            best_node = (whole, spec.name)
    what = _models(c)
    if fit_nodes:
        if fit_nodes < need:
            return PendingReason(
                "gang",
                f"gang: needs {need} replicas of {fmt_gpus(req.demand)} {what} together; "
                f"only {fit_nodes} node(s) can take one now",
            )
        return PendingReason("gang", f"gang: {need} replicas of {fmt_gpus(req.demand)} {what} "
                                     "do not fit together now")
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
    if gpu_ok_nodes:
        return PendingReason(
            "capacity",
            f"capacity: {gpu_ok_nodes} node(s) have the GPUs but not "
            f"{req.cpu / 1000:g} CPUs / {req.mem / 1024:g} GiB free",
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
            f"fragmentation: {fmt_gpus(mine_free)} {what} free, no GPU with "
            f"{fmt_gpus(req.milli)} free",
        )
    if replicas > 1 and c.models is not None and req.count > 0 and best_node[0] >= req.count:
        return PendingReason("topology", f"topology: no rack or node holds all {need} replicas")
    return PendingReason(
        "fragmentation",
        f"fragmentation: {fmt_gpus(mine_free)} {what} free, in blocks of at most "
        f"{best_node[0]} per node ({best_node[1] or 'none'})",
    )
