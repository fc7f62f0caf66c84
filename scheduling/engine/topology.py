"""Gangs on the rack -> node -> island hierarchy (HiveD's cells, OSDI'20, kept simple).

A job of ``replicas`` members, each of one :class:`~.state.ReplicaReq` on one node:

* ``nvlink``: every GPU of the job in one NVLink island: the whole job is placed as one request
  inside one island (needs ``replicas x count`` free GPUs there) and cut into replicas;
* ``node``: the whole job on one node, likewise;
* ``rack``: every replica in one rack; racks are tried tightest first (fewest free GPUs of the job's
  models that still hold it), then by name;
* ``any``: replica by replica; a replica goes first where the previous one went if it fits there
  (a gang on as few nodes as possible), else to the best-scored node.
A replica the size of a node needs a fully free node, so it gets a whole node.

Placement is tentative: if fewer than ``need`` replicas fit, everything placed is given back at
once, so a gang never holds a partial allocation while it waits.
"""

from __future__ import annotations

from collections.abc import Callable

from .placement import Constraints, Placer
from .state import Alloc, ReplicaReq, fits_state
from .types import MILLI


def _rollback(placer: Placer, job_id: str, allocs: list[Alloc]) -> None:
    for a in allocs:
        placer.state.release_replica(job_id, a)


def _rack_filter(c: Constraints) -> str | None:
    for k, v in c.selector:
        if k == "rack":
            return v
    return None


def place_gang(
    placer: Placer,
    job_id: str,
    req: ReplicaReq,
    replicas: int,
    need: int,
    topology: str,
    c: Constraints,
    node_ok: Callable[[int], bool] | None = None,
    first_replica: int = 0,
) -> list[Alloc] | None:
    """Place between ``need`` and ``replicas`` replicas (as many as fit), or none (None)."""
    state = placer.state
    rack = _rack_filter(c)

    if topology in ("nvlink", "node") and replicas > 1 and req.count > 0:
        for k in range(replicas, need - 1, -1):
            whole = ReplicaReq(
                req.milli,
                req.count * k if req.milli >= MILLI else req.count,
                req.cpu * k,
                req.mem * k,
                topology == "nvlink",
            )
            if req.milli < MILLI and k > 1:
                continue  # several fractional replicas never share one request
            pick = _pick(placer, whole, c, node_ok, rack)
            if pick is None:
                continue
            node, _ = pick
            gpus = state.choose_gpus(state.nodes[node], whole, None, c.shares)
            allocs = [
                state.take(
                    job_id,
                    node,
                    gpus[r * req.count : (r + 1) * req.count],
                    req.milli,
                    req.cpu,
                    req.mem,
                    first_replica + r,
                    c.shares or "",
                )
                for r in range(k)
            ]
            return allocs
        return None
    if topology == "rack" and replicas > 1 and rack is None:
        allowed = [cls for cls, _ in placer.allowed_classes(c)]
        racks = {r: sum(state.rack_free.get((r, cls), 0) for cls in allowed) for r in state.rack_nodes}
        need_milli, full_milli = req.demand * need, req.demand * replicas

        def order(r: str) -> tuple[bool, int, str]:
            # The tightest rack with room for every replica; failing that (an elastic job or a
            # gang that may start partially), the rack with the most room: as many replicas as
            # can start now, since a rack gang grows only inside its rack.
            whole = racks[r] >= full_milli
            return (not whole, racks[r] if whole else -racks[r], r)

        for r_name in sorted((r for r, f in racks.items() if f >= need_milli), key=order):
            got = _greedy(placer, job_id, req, replicas, need, c, node_ok, first_replica, r_name)
            if got is not None:
                return got
        return None
    return _greedy(placer, job_id, req, replicas, need, c, node_ok, first_replica, rack)


def _pick(
    placer: Placer, req: ReplicaReq, c: Constraints, node_ok: Callable[[int], bool] | None, rack: str | None
) -> tuple[int, int | None] | None:
    if rack is None:
        return placer.best(req, c, node_ok)
    return placer.best_among(req, c, rack, node_ok)


def _greedy(
    placer: Placer,
    job_id: str,
    req: ReplicaReq,
    replicas: int,
    need: int,
    c: Constraints,
    node_ok: Callable[[int], bool] | None,
    first_replica: int,
    rack: str | None = None,
) -> list[Alloc] | None:
    state = placer.state
    allocs: list[Alloc] = []
    last: int | None = None
    for r in range(replicas):
        pick: tuple[int, int | None] | None = None
        if last is not None and req.count > 0:
            n = state.nodes[last]
            spec = n.spec
            d = max(1, min(spec.nvlink_domain, spec.gpus)) if spec.gpus else 1
            if fits_state(n.key(), req, d, spec.gpus) and (
                c.shares is None or req.milli >= MILLI or state.share_fits(last, req.milli, c.shares)
            ):
                pick = (last, None)
        if pick is None:
            pick = _pick(placer, req, c, node_ok, rack)
        if pick is None:
            break
        allocs.append(placer.place(job_id, pick[0], req, pick[1], first_replica + r, c.shares))
        last = pick[0]
    if len(allocs) < need:
        _rollback(placer, job_id, allocs)
        return None
    return allocs
