"""The one outlet for live updates: every push to dashboards and agents leaves here, after commit.

Groups:
- ``jobs.tenant.<tenant_id>``: full job updates for that tenant's users;
- ``jobs.operators``: every job, for operators;
- ``gpus``: per-GPU state (``gpu.update``; consumers redact other tenants' jobs to "in use" before
  sending) and nodes' own fields (``node.update``);
- ``agent.<node_id>``: wake-ups for one node's agent (new bindings, stop orders).
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger("tessera.live")


def _send(group: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, message)
    except Exception:  # Redis down: live updates are best-effort, PostgreSQL keeps the truth
        log.warning("live update to %s not delivered", group, exc_info=True)


def publish_on_commit(group: str, message: dict[str, Any]) -> None:
    transaction.on_commit(lambda: _send(group, message))


def job_payload(job) -> dict[str, Any]:
    """What a dashboard shows of a job (the tenant's own users and operators only)."""
    return {
        "id": job.pk,
        "name": job.name,
        "tenant": job.tenant.name,
        "tenant_id": job.tenant_id,
        "kind": job.kind,
        "state": job.state,
        "gpus": job.gpus,
        "queue_level": job.queue_level,
        "queue_level_name": job.queue_level_name,
        "priority": job.priority,
        "pending_reason": job.pending_reason,
        "pending_code": job.pending_code,
        "submitted_at": job.submitted_at.isoformat() if job.submitted_at else None,
        "started_at": job.started_at.isoformat() if job.started_at else None,
    }


def publish_job(job) -> None:
    payload = job_payload(job)
    publish_on_commit(f"jobs.tenant.{job.tenant_id}", {"type": "job.update", "job": payload})
    publish_on_commit("jobs.operators", {"type": "job.update", "job": payload})


def publish_devices(devices: list[dict[str, Any]]) -> None:
    """``devices``: [{"node", "index", "state", "job_id", "tenant_id", "tenant"}]."""
    if devices:
        publish_on_commit("gpus", {"type": "gpu.update", "devices": devices})


def node_payload(node) -> dict[str, Any]:
    """What every signed-in person may see of a node (nodes are shared: nothing to redact)."""
    return {
        "name": node.name,
        "rack": node.rack,
        "state": node.state,
        "kind": node.kind,
        "nvlink_domain": node.nvlink_domain,
    }


def publish_node(node) -> None:
    """A node's own fields changed (state: ready, not-ready, cordoned, draining; rack; ...)."""
    publish_on_commit("gpus", {"type": "node.update", "node": node_payload(node)})


def publish_nodes(**filters: Any) -> None:
    """Publish every node matching ``filters`` (after a bulk state change)."""
    from scheduling.models import Node

    for node in Node.objects.filter(**filters):
        publish_node(node)


def wake_agent(node_id: int) -> None:
    publish_on_commit(f"agent.{node_id}", {"type": "agent.wake"})
