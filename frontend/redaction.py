"""Who is looking, and what of the cluster they may see (the dashboard's one redaction rule).

A tenant's user sees its own tenant's jobs on the heatmap with their ids; another tenant's use of a
GPU shows only as a share "in use", with no job id and no tenant name, and its utilisation only to
a viewer who sees every job on it (``util``, ``idle``: ``services/gpu_looks.py``). Operators
(staff) see all.
The REST snapshot and the websocket consumer both go through :func:`redact_device`, so a pushed
delta is exactly what a fresh fetch would show.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scheduling.models import Membership


@dataclass(frozen=True)
class Viewer:
    username: str
    operator: bool
    tenant_id: int | None
    tenant: str | None

    def as_json(self) -> dict[str, Any]:
        return {"username": self.username, "operator": self.operator, "tenant": self.tenant}

    def job_groups(self) -> list[str]:
        """The job groups of ``scheduling.services.live`` this viewer may join."""
        if self.operator:
            return ["jobs.operators"]
        if self.tenant_id is not None:
            return [f"jobs.tenant.{self.tenant_id}"]
        return []  # a user without a tenant sees no jobs at all

    def may_see_job(self, job: dict[str, Any]) -> bool:
        """Defence in depth on top of the groups: a tenant's socket never carries another's job."""
        return self.operator or (self.tenant_id is not None and job.get("tenant_id") == self.tenant_id)


def viewer_for(user: Any) -> Viewer:
    """The viewer for an authenticated user (reads its membership: call from sync code)."""
    if user.is_staff:
        return Viewer(user.get_username(), True, None, None)

    membership = Membership.objects.select_related("tenant").filter(user=user).first()
    if membership is None:
        return Viewer(user.get_username(), False, None, None)
    return Viewer(user.get_username(), False, membership.tenant_id, membership.tenant.name)


# A device row's fields the dashboard uses (besides its jobs).
MAP_FIELDS = ("node", "index", "model", "state", "used")
# Its utilisation as the adjustment pass read it, where it did: only for who sees all its jobs.
LOOK_FIELDS = ("util", "idle")


def redact_device(row: dict[str, Any], viewer: Viewer) -> dict[str, Any]:
    """One row of ``inventory.device_rows`` as ``viewer`` may see it.

    Adds ``others``: the share of the GPU used by jobs the viewer may not see (0 for operators).
    Keeps only what the map shows: at 8,000 GPUs the dropped fields (uuid, memory, island, which
    the node's size and index already give) were a third of the snapshot's bytes.
    """
    out = {key: row[key] for key in MAP_FIELDS if key in row}
    jobs = row.get("jobs", [])
    looks = {key: row[key] for key in LOOK_FIELDS if key in row}
    if viewer.operator:
        out["jobs"] = [dict(job) for job in jobs]
        out["others"] = 0.0
        return {**out, **looks}
    own = [job for job in jobs if viewer.tenant_id is not None and job.get("tenant_id") == viewer.tenant_id]
    out["jobs"] = [{"job_id": job["job_id"], "share": job["share"], "replica": job["replica"]} for job in own]
    out["others"] = round(sum(job["share"] for job in jobs if job not in own), 3)
    if own and len(own) == len(jobs):
        out.update(looks)
    return out
