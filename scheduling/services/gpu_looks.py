"""What the dashboard shows of an allocated GPU's utilisation: its latest point and whether it is
idle, as the adjustment pass read them (``services/adjust.py``).

The pass keeps, per GPU it read points for, ``{"util", "idle", "jobs"}`` in
``AdjustmentState.gpus`` and publishes the rows of the GPUs whose look changed (``gpu.update``,
batched per socket like any other). A row carries ``util`` and ``idle`` only while the GPU holds
the jobs they were read for: a bind or a release publishes the row without them, and a fresh
snapshot then shows none either (a snapshot equals the old one plus its deltas). The dashboard
shows them to the GPU's own tenant and to operators only (``frontend/redaction.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from scheduling.engine.adjust import GpuSeries, IdleSettings, idle_span
from scheduling.models import AdjustmentState, Device
from scheduling.services import live
from scheduling.services.inventory import device_rows

Looks = dict[str, dict[str, Any]]  # "node/index" -> {"util", "idle", "jobs"}


def looks_of(
    series: Mapping[str, Sequence[GpuSeries]], settings: Mapping[str, IdleSettings], now: float
) -> Looks:
    """Each GPU's latest point (none: no fresh point, no look) and whether it has been idle past
    the first warning; ``series`` and ``settings`` by job id."""
    out: Looks = {}
    for job_id, gpus in series.items():
        policy = settings[job_id]
        warn = policy.warn_after_s[0] if policy.warn_after_s else policy.act_after_s
        for s in gpus:
            fresh = [u for t, u in s.points if now - policy.max_gap_s <= t <= now]
            if not fresh:
                continue
            idle = idle_span(s, policy, now).idle_s >= warn
            look = out.setdefault(s.gpu, {"util": 0.0, "idle": True, "jobs": []})
            look["util"] = round(max(look["util"], fresh[-1]), 2)  # the map shows whole percents
            look["idle"] = look["idle"] and idle
            look["jobs"] = sorted([*look["jobs"], int(job_id)])
    return out


def with_looks(rows: Iterable[dict[str, Any]], looks: Looks) -> list[dict[str, Any]]:
    """``rows`` (``inventory.row_of``'s) with ``util`` and ``idle`` where the GPU still holds the
    jobs its look was read for."""
    out = []
    for row in rows:
        look = looks.get(f"{row['node']}/{row['index']}")
        if look is not None and sorted(j["job_id"] for j in row.get("jobs", ())) == look["jobs"]:
            row = {**row, "util": look["util"], "idle": look["idle"]}
        out.append(row)
    return out


def current() -> Looks:
    """The looks the last adjustment pass left."""
    state = AdjustmentState.objects.filter(id=1).only("gpus").first()
    return dict(state.gpus) if state is not None and state.gpus else {}


def publish_changed(before: Looks, after: Looks) -> None:
    """Publish the rows of the GPUs whose look changed (after the caller's commit)."""
    changed = {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}
    if not changed:
        return
    nodes = {key.rsplit("/", 1)[0] for key in changed}
    devices = [
        d
        for d in Device.objects.filter(node__name__in=nodes).select_related("node")
        if f"{d.node.name}/{d.index}" in changed
    ]
    live.publish_devices(with_looks(device_rows(devices), after))
