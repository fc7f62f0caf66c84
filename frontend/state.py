"""The dashboard's snapshot: nodes with their GPUs, and the live queue, as one viewer may see them.

The rows have exactly the shapes the websocket pushes (``gpu.update`` device rows after
:func:`frontend.redaction.redact_device`, ``job.update`` jobs from ``live.job_payload``,
``node.update`` fields from ``live.node_payload``), so the
page replaces a row by its key when a delta arrives, and a fresh snapshot equals the old one plus
its deltas.
"""

from __future__ import annotations

from typing import Any

from frontend.redaction import Viewer, redact_device
from scheduling.choices import TERMINAL_STATES, JobState
from scheduling.models import Device, Job, Node
from scheduling.services.inventory import device_rows
from scheduling.services.live import job_payload, node_payload

# Enough for any real queue view; beyond it the page says the list is cut.
MAX_JOBS = 2000


def nodes_state(viewer: Viewer) -> list[dict[str, Any]]:
    """Every node (grouped later by rack) with its devices, redacted for ``viewer``. Two queries
    for the devices and their active allocations, whatever the cluster's size."""
    nodes = list(Node.objects.order_by("rack", "name"))
    devices = Device.objects.select_related("node").order_by("node__name", "index")
    by_node: dict[str, list[dict[str, Any]]] = {node.name: [] for node in nodes}
    for row in device_rows(devices):
        by_node.setdefault(row["node"], []).append(redact_device(row, viewer))
    return [
        {
            **node_payload(node),  # the fields a node.update replaces
            "models": sorted({d["model"] for d in by_node[node.name]}),
            "devices": by_node[node.name],
        }
        for node in nodes
    ]


def live_jobs(user: Any) -> tuple[list[dict[str, Any]], bool]:
    """The viewer's jobs that are not finished (pending ones and those holding GPUs)."""
    qs = (
        Job.objects.visible_to(user)
        .exclude(state__in=[str(s) for s in TERMINAL_STATES])
        .select_related("tenant")
        .order_by("queue_level", "-priority", "submitted_at", "id")
    )
    jobs = [job_payload(job) for job in qs[: MAX_JOBS + 1]]
    return jobs[:MAX_JOBS], len(jobs) > MAX_JOBS


def dashboard_state(user: Any, viewer: Viewer) -> dict[str, Any]:
    jobs, truncated = live_jobs(user)
    return {
        "viewer": viewer.as_json(),
        "nodes": nodes_state(viewer),
        "jobs": jobs,
        "jobs_truncated": truncated,
        "states": {"terminal": sorted(str(s) for s in TERMINAL_STATES), "pending": JobState.PENDING},
    }
