"""The dashboard's snapshot: nodes with their GPUs, and the live queue, as one viewer may see them.

The rows have exactly the shapes the websocket pushes (``gpu.update`` device rows after
:func:`frontend.redaction.redact_device`, ``job.update`` jobs from ``live.job_payload``,
``node.update`` fields from ``live.node_payload``), once the page has put back what a device row
of the snapshot leaves out (:data:`DEVICE_DEFAULTS`), so the page replaces a row by its key when a
delta arrives, and a fresh snapshot equals the old one plus its deltas.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from django.db.models import Count, Sum

from frontend.redaction import Viewer, redact_device
from scheduling.choices import TERMINAL_STATES, JobState
from scheduling.models import AdjustmentState, Allocation, Job, Node
from scheduling.services import live_seq
from scheduling.services.gpu_looks import current, with_looks
from scheduling.services.inventory import all_device_values, row_of
from scheduling.services.live import job_payload, node_payload

# The node columns ``live.node_payload`` reads.
NODE_FIELDS = ("name", "rack", "state", "kind", "nvlink_domain")

# Enough for any real queue view; beyond it the page says the list is cut.
MAX_JOBS = 2000


# What a device row of the snapshot leaves out, for the page to put back (dashboard.js,
# ``expandDevice``): its node (the row is inside it), its model where it is the node's one model,
# and each of these fields where it has this value. Most GPUs of a cluster are whole, of their
# node's model, and free or held by one job: at 8,000 free GPUs the rows were 0.99 MB of the
# snapshot's 1 MB, and the time to encode and parse it went with them.
DEVICE_DEFAULTS: dict[str, Any] = {"state": "free", "used": 0.0, "jobs": [], "others": 0.0}


def nodes_state(viewer: Viewer, compact: bool = False) -> list[dict[str, Any]]:
    """Every node (grouped later by rack) with its devices, redacted for ``viewer``. Two queries
    for the devices and their active allocations, whatever the cluster's size; the nodes are read
    as plain rows (at 1,000 nodes their model instances were a fifth of the snapshot's time).
    ``compact``: each device row without what :data:`DEVICE_DEFAULTS` lets the page put back."""
    nodes = [SimpleNamespace(**row) for row in Node.objects.order_by("rack", "name").values(*NODE_FIELDS)]
    looks = current()  # utilisation where the pass read it
    values, held = all_device_values()
    by_node: dict[str, list[Any]] = {node.name: [] for node in nodes}
    for device in values:
        by_node.setdefault(device[1], []).append(device)
    out = []
    for node in nodes:
        devices = by_node[node.name]
        models = sorted({model for _, _, _, _, model, *_ in devices})
        one_model = models[0] if len(models) == 1 else None
        rows = []
        for device_id, name, index, uuid, model, memory_gib, island, healthy in devices:
            allocs = held.get(device_id)
            if compact and allocs is None and healthy and f"{name}/{index}" not in looks:
                # A free GPU: no one's job to hide, nothing but its index (and an odd model) to say.
                rows.append({"index": index} if model == one_model else {"index": index, "model": model})
                continue
            row = row_of(name, index, uuid, model, memory_gib, island, healthy, allocs or [])
            if looks:
                row = with_looks([row], looks)[0]
            row = redact_device(row, viewer)
            rows.append(compact_device(row, one_model) if compact else row)
        out.append({**node_payload(node), "models": models, "devices": rows})  # node.update's fields
    return out


_KEEP = object()


def compact_device(row: dict[str, Any], model: str | None) -> dict[str, Any]:
    """``row`` without its node, its model when it is ``model``, and its :data:`DEVICE_DEFAULTS`."""
    return {
        key: value
        for key, value in row.items()
        if key != "node"
        and not (key == "model" and value == model)
        and DEVICE_DEFAULTS.get(key, _KEEP) != value
    }


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


# How many of the viewer's finished jobs the dashboard keeps in view (a failed job leaves a trace).
ENDED_KEPT = 20


def ended_jobs(user: Any) -> list[dict[str, Any]]:
    """The viewer's most recently ended jobs, newest first (the page adds those that end later)."""
    qs = (
        Job.objects.visible_to(user)
        .filter(state__in=[str(s) for s in TERMINAL_STATES], finished_at__isnull=False)
        .select_related("tenant")
        .order_by("-finished_at", "-id")
    )
    return [job_payload(job) for job in qs[:ENDED_KEPT]]


def dashboard_state(user: Any, viewer: Viewer) -> dict[str, Any]:
    # Read before the database: every message numbered at most this is shown (``live_seq``).
    seq = live_seq.current()
    jobs, truncated = live_jobs(user)
    return {
        "seq": seq,
        "viewer": viewer.as_json(),
        "nodes": nodes_state(viewer, compact=True),
        "device_defaults": DEVICE_DEFAULTS,
        "jobs": jobs,
        "ended": ended_jobs(user),
        "jobs_truncated": truncated,
        "utilisation_problem": utilisation_problem(),
        "states": {"terminal": sorted(str(s) for s in TERMINAL_STATES), "pending": JobState.PENDING},
    }


def utilisation_problem() -> str:
    """Why the adjustment pass could not read GPU utilisation at its last run ("" when it could):
    the dashboard says so in a banner, as the loop acts on nothing and no GPU is marked idle."""
    state = AdjustmentState.objects.filter(id=1).only("metrics_ok", "problem").first()
    if state is None or state.metrics_ok:
        return ""
    return state.problem or "the utilisation source does not answer"


def team_usage(tenants: Any) -> list[dict[str, Any]]:
    """Per tenant, its quota rows with the GPUs its jobs hold now on each row's models (a row
    for ``*`` counts every model without a row of its own), and its jobs waiting and running."""

    tenants = list(tenants)
    held = (
        Allocation.objects.filter(released_at__isnull=True, device__isnull=False, job__tenant__in=tenants)
        .values("job__tenant_id", "device__model")
        .annotate(milli=Sum("share_milli"))
    )
    used: dict[int, dict[str, float]] = {}
    for row in held:
        used.setdefault(row["job__tenant_id"], {})[row["device__model"]] = row["milli"] / 1000
    counts: dict[tuple[int, str], int] = {
        (row["tenant_id"], row["state"]): row["n"]
        for row in Job.objects.filter(tenant__in=tenants, state__in=["pending", "running"])
        .values("tenant_id", "state")
        .annotate(n=Count("id"))
    }
    day = usage_last_day([t.pk for t in tenants])
    out = []
    for tenant in tenants:
        models = used.get(tenant.pk, {})
        named = {q.model for q in tenant.quotas.all()}
        rows = []
        for quota in tenant.quotas.all():
            if quota.model == "*":
                in_use = sum(v for m, v in models.items() if m not in named)
            else:
                in_use = models.get(quota.model, 0.0)
            rows.append(
                {
                    "model": quota.model,
                    "guaranteed": quota.guaranteed,
                    "limit": quota.limit,
                    "weight": quota.weight,
                    "used": in_use,
                    "borrowed": max(0.0, in_use - quota.guaranteed),
                }
            )
        history = []
        for (tenant_id, model), hours in sorted(day.items()):
            if tenant_id == tenant.pk:
                peak = max(range(DAY_BUCKETS), key=lambda h: hours[h])
                history.append(
                    {
                        "model": model,
                        "spark": sparkline(hours),
                        "average": sum(hours) / DAY_BUCKETS,
                        "peak": hours[peak],
                        "peak_hours_ago": DAY_BUCKETS - peak,
                    }
                )
        out.append(
            {
                "name": tenant.name,
                "rows": rows,
                "history": history,
                "pending": counts.get((tenant.pk, "pending"), 0),
                "running": counts.get((tenant.pk, "running"), 0),
            }
        )
    return out


DAY_BUCKETS = 24
SPARKS = "▁▂▃▄▅▆▇█"


def usage_last_day(tenant_ids: list[int], now: Any = None) -> dict[tuple[int, str], list[float]]:
    """GPUs in use per tenant and model, averaged over each of the last 24 hours (oldest first),
    from the allocation rows themselves (kept after release, with their times): no sampling."""
    from datetime import timedelta

    from django.db.models import Q
    from django.utils import timezone

    from scheduling.models import Allocation

    now = now or timezone.now()
    since = now - timedelta(hours=DAY_BUCKETS)
    rows = (
        Allocation.objects.filter(job__tenant_id__in=tenant_ids, device__isnull=False, created_at__lt=now)
        .filter(Q(released_at__isnull=True) | Q(released_at__gt=since))
        .values_list("job__tenant_id", "device__model", "share_milli", "created_at", "released_at")
    )
    out: dict[tuple[int, str], list[float]] = {}
    for tenant_id, model, share, start, end in rows.iterator(chunk_size=2000):
        buckets = out.setdefault((tenant_id, model), [0.0] * DAY_BUCKETS)
        start, end = max(start, since), min(end or now, now)
        for b in range(int((start - since).total_seconds() // 3600), DAY_BUCKETS):
            lo = since + timedelta(hours=b)
            hi = lo + timedelta(hours=1)
            if lo >= end:
                break
            overlap = (min(hi, end) - max(lo, start)).total_seconds()
            if overlap > 0:
                buckets[b] += share / 1000 * overlap / 3600
    return out


def sparkline(values: list[float]) -> str:
    top = max(values, default=0)
    if top <= 0:
        return SPARKS[0] * len(values)
    return "".join(SPARKS[min(len(SPARKS) - 1, int(v / top * (len(SPARKS) - 1) + 0.5))] for v in values)
