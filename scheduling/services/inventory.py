"""Reads of the cluster's devices: which GPU is free, allocated or shared, and by whom."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from scheduling.choices import DeviceState
from scheduling.models import Allocation, Device


def active_allocations(device_ids: Iterable[int] | None = None):
    qs = Allocation.objects.filter(released_at__isnull=True).select_related("job", "job__tenant")
    if device_ids is not None:
        qs = qs.filter(device_id__in=list(device_ids))
    return qs


def device_rows(devices: Iterable[Device]) -> list[dict[str, Any]]:
    """One row per device: state and the jobs on it (for the heatmap and the nodes API)."""
    devices = list(devices)
    by_device: dict[int, list[Allocation]] = defaultdict(list)
    for alloc in active_allocations(d.pk for d in devices):
        by_device[alloc.device_id].append(alloc)
    rows = []
    for device in devices:
        allocs = by_device.get(device.pk, [])
        used = sum(a.share_milli for a in allocs)
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
                        "job_id": a.job_id,
                        "tenant_id": a.job.tenant_id,
                        "tenant": a.job.tenant.name,
                        "share": a.share,
                        "replica": a.replica,
                    }
                    for a in allocs
                ],
            }
        )
    return rows
