"""Placement scoring: where a replica should go so that the cluster stays packable.

The main term is FGD's: the drop in expected fragmentation ``F(n)`` (see :mod:`.fragmentation`)
that placing the request causes, unrounded. Ties (frequent: many nodes in the same state) are
broken to keep whole GPUs, whole islands and whole nodes for the requests that need them.
"""

from __future__ import annotations

from .fragmentation import UNTRACKED, FragmentationModel
from .types import MILLI


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


def tessera_pack_choice(
    frag: FragmentationModel,
    model: str,
    cpu_free: int,
    gpus: tuple[int, ...],
    cpu: int,
    milli: int,
    count: int,
) -> tuple[tuple, int | None]:
    """Score (a tuple, higher is better) of a request on a node state, and the GPU free value to
    use for a fractional request. The caller has checked that the request fits."""
    before = frag.node(model, cpu_free, gpus)
    cpu_after = cpu_free - cpu if cpu_free < UNTRACKED else cpu_free
    if 0 < milli < MILLI:
        best: tuple | None = None
        for v in sorted(set(gpus)):
            if v < milli:
                continue
            after = after_vector(gpus, milli, 1, v)
            fa = frag.node(model, cpu_after, after)
            key = (round(before - fa, 6), -(v - milli))
            if best is None or key > best[0]:
                best = (key, v)
        assert best is not None
        (delta, leftover), v = best
        return (delta, leftover, -sum(gpus)), v
    after = after_vector(gpus, milli, count, None)
    fa = frag.node(model, cpu_after, after)
    return (round(before - fa, 6), 0, -sum(gpus)), None
