"""Reads of the cluster's devices: which GPU is free, allocated or shared, and by whom."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from scheduling.choices import DeviceState
from scheduling.models import Allocation, Device
from scheduling.services.snapshot import PreparedRead

# One active allocation of a device, as its row shows it: (job id, tenant id, tenant, share in
# thousandths, replica). Read as plain tuples: the pass and every exit report build device rows.
Holder = tuple[int, int, str, int, int]


# The active allocations of some devices (``HOLDERS.rows(device_ids)``), by job and replica: rows
# for :func:`holders_of`.
HOLDERS = PreparedRead(
    lambda device_ids: (
        Allocation.objects.filter(device_id__in=device_ids, released_at__isnull=True)
        .order_by("job_id", "replica")
        .values_list("device_id", "job_id", "job__tenant_id", "job__tenant__name", "share_milli", "replica")
    )
)


# The active allocations of every device some jobs' active allocations hold
# (``HOLDERS_OF_JOBS.rows(job_ids)``), as ``HOLDERS`` rows with each allocation's id last: read
# with those jobs' lock, before anything of theirs is released (an exit batch's ``Settlement``
# then leaves out the allocations it released, by id).
HOLDERS_OF_JOBS = PreparedRead(
    lambda job_ids: (
        Allocation.objects.filter(
            released_at__isnull=True,
            device_id__in=Allocation.objects.filter(
                job_id__in=job_ids, released_at__isnull=True, device__isnull=False
            ).values("device_id"),
        )
        .order_by("job_id", "replica")
        .values_list(
            "device_id", "job_id", "job__tenant_id", "job__tenant__name", "share_milli", "replica", "id"
        )
    )
)


def holders(device_ids: Iterable[int]) -> dict[int, list[Holder]]:
    """The active allocations of ``device_ids``, per device id, by job and replica."""
    return holders_of(HOLDERS.rows(sorted(set(device_ids))))


def holders_of(rows: Iterable[Any]) -> dict[int, list[Holder]]:
    """``HOLDERS`` rows, per device id."""
    out: dict[int, list[Holder]] = defaultdict(list)
    for device_id, *holder in rows:
        out[device_id].append(tuple(holder))
    return out


def device_rows(
    devices: Iterable[Device], held: dict[int, list[Holder]] | None = None
) -> list[dict[str, Any]]:
    """One row per device: state and the jobs on it (for the heatmap and the nodes API).

    ``held``: the devices' :func:`holders`, when the caller has them already."""
    devices = list(devices)
    if held is None:
        held = holders(d.pk for d in devices)
    return [
        row_of(
            device.node.name,
            device.index,
            device.uuid,
            device.model,
            device.memory_gib,
            device.nvlink_island,
            device.healthy,
            held.get(device.pk, []),
        )
        for device in devices
    ]


# The states as plain strings (an enum member's str() is slow, and there is one per GPU).
_FREE, _ALLOCATED, _SHARED, _UNHEALTHY = (
    str(s.value) for s in (DeviceState.FREE, DeviceState.ALLOCATED, DeviceState.SHARED, DeviceState.UNHEALTHY)
)


def row_of(
    node: str,
    index: int,
    uuid: str,
    model: str,
    memory_gib: float,
    nvlink_island: int,
    healthy: bool,
    allocs: list[Holder],
) -> dict[str, Any]:
    """One device's row (the shape every reader and every ``gpu.update`` shares)."""
    used = sum(share for _, _, _, share, _ in allocs) if allocs else 0
    if not healthy:
        state = _UNHEALTHY
    elif not allocs:
        state = _FREE
    elif used >= 1000 and len(allocs) == 1:
        state = _ALLOCATED
    else:
        state = _SHARED
    return {
        "node": node,
        "index": index,
        "uuid": uuid,
        "model": model,
        "memory_gib": memory_gib,
        "nvlink_island": nvlink_island,
        "state": state,
        "used": used / 1000,
        "jobs": [
            {
                "job_id": job_id,
                "tenant_id": tenant_id,
                "tenant": tenant,
                "share": share / 1000,
                "replica": replica,
            }
            for job_id, tenant_id, tenant, share, replica in allocs
        ],
    }


# Every device (as plain values) and every active allocation of one: the whole cluster's rows in
# two queries without building a model instance per device (at 8,000 GPUs, building them was most
# of the dashboard's snapshot time).
_ALL_DEVICES = PreparedRead(
    lambda: Device.objects.order_by("node__name", "index").values_list(
        "id", "node__name", "index", "uuid", "model", "memory_gib", "nvlink_island", "healthy"
    )
)
_ALL_HOLDERS = PreparedRead(
    lambda: (
        Allocation.objects.filter(released_at__isnull=True, device__isnull=False)
        .order_by("job_id", "replica")
        .values_list("device_id", "job_id", "job__tenant_id", "job__tenant__name", "share_milli", "replica")
    )
)


def all_device_values() -> tuple[list[Any], dict[int, list[Holder]]]:
    """Every device as plain values (its id, then :func:`row_of`'s fields before its holders),
    ordered by node name and index, and the active holders by device id: what
    :func:`all_device_rows` is made of, for a reader that needs a row only for some devices."""
    return _ALL_DEVICES.rows(), holders_of(_ALL_HOLDERS.rows())


def all_device_rows() -> list[dict[str, Any]]:
    """Every device's row, ordered by node name and index."""
    rows, held = all_device_values()
    # mypy cannot match a star-unpacked row against row_of's parameters.
    return [row_of(*values, held.get(device_id, [])) for device_id, *values in rows]  # type: ignore[call-arg]
