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
    rows = []
    for device in devices:
        allocs = held.get(device.pk, [])
        used = sum(share for _, _, _, share, _ in allocs)
        if not device.healthy:
            state = DeviceState.UNHEALTHY
        elif not allocs:
            state = DeviceState.FREE
        elif used >= 1000 and len(allocs) == 1:
            state = DeviceState.ALLOCATED
        else:
            state = DeviceState.SHARED
        rows.append(
            {
                "node": device.node.name,
                "index": device.index,
                "uuid": device.uuid,
                "model": device.model,
                "memory_gib": device.memory_gib,
                "nvlink_island": device.nvlink_island,
                "state": str(state),
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
        )
    return rows
