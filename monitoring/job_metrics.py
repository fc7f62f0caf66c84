"""Scrape-time metrics about jobs, tenants and nodes, derived from the database.

Nothing here is observed in the process that runs the passes: every value is read from rows every
deployment writes (jobs, their events and allocations, quotas, nodes), so the embedded default and a
Celery deployment report the same numbers from any web process. Each family is one bounded query.

| metric | labels | what |
| --- | --- | --- |
| ``tessera_queue_length`` | ``level`` | pending jobs by queue level (``inference``, ``training``, ...) |
| ``tessera_jobs_pending_by_code`` | ``code`` | pending jobs by why they wait (``fragmentation``, ...) |
| ``tessera_job_wait_seconds`` | ``quantile`` | submit to placement, first attempts of the last hour |
| ``tessera_job_submit_to_running_seconds`` | ``quantile`` | submit to running, same jobs |
| ``tessera_gpus_free`` | ``model`` | free healthy GPUs on ready nodes |
| ``tessera_gpus_free_fragmented`` | ``model`` | of those, the ones on partly allocated nodes |
| ``tessera_tenant_gpus_allocated`` | ``tenant``, ``model`` | the tenant's allocated GPU capacity |
| ``tessera_tenant_gpus_guaranteed`` | ``tenant``, ``model`` | its quota's guarantee |
| ``tessera_tenant_gpus_limit`` | ``tenant``, ``model`` | its quota's limit |
| ``tessera_lost_gpu_seconds_total`` | ``cause`` | GPU-seconds of requeued attempts since their checkpoint* |
| ``tessera_job_failures_total`` | ``cause`` | failed jobs by why they failed |
| ``tessera_node_heartbeat_age_seconds`` | ``node`` | seconds since each node's agent last reported |

* all of an attempt's, when a later attempt started from the beginning, its checkpoint out of reach.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime, timedelta

from django.db.models import Count, Min, Q, Sum
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from scheduling.choices import QUEUE_LEVEL_NAMES, EventType, JobState, NodeState, PendingCode
from scheduling.models import Allocation, Device, Job, JobEvent, Node, Quota
from scheduling.services.checkpoints import FRESH

QUANTILES = (0.5, 0.9, 0.99)
RECENT = timedelta(hours=1)
RECENT_JOBS_MAX = 10_000  # the newest placed jobs the percentiles are computed over
IDLE_RECLAIM_REASON = "preempted: idle"  # services/adjust.py's stop reason
LOST_CAUSES = ("preemption", "idle-reclaim", "node-lost", "retry")
FAILURE_CAUSES = ("exit-code", "time-limit", "disk-limit", "node-lost", "lost")


def job_families(now: datetime | None = None) -> list:
    now = now or timezone.now()
    return [
        *_queue_families(),
        *_latency_families(now),
        *_free_families(),
        *_tenant_families(),
        _lost_family(),
        _failure_family(),
        _heartbeat_family(now),
    ]


def _queue_families() -> list:
    length = GaugeMetricFamily("tessera_queue_length", "Pending jobs by queue level.", labels=["level"])
    by_code = GaugeMetricFamily(
        "tessera_jobs_pending_by_code",
        "Pending jobs by why they wait (the API's pending_code; 'none' before a pass looked at them).",
        labels=["code"],
    )
    levels: dict[int, int] = defaultdict(int)
    codes: dict[str | None, int] = defaultdict(int)
    rows = (
        Job.objects.filter(state=JobState.PENDING)
        .values_list("queue_level", "pending_code")
        .annotate(n=Count("id"))
        .order_by()
    )
    for level, code, n in rows:
        levels[level] += n
        codes[code] += n
    for level, name in sorted(QUEUE_LEVEL_NAMES.items()):
        length.add_metric([name], levels[level])
    for code in PendingCode.values:
        by_code.add_metric([code], codes[code])
    by_code.add_metric(["none"], codes[None])
    return [length, by_code]


def _latency_families(now: datetime) -> list:
    """Percentiles over first attempts placed in the last hour (the newest ``RECENT_JOBS_MAX``)."""
    rows = (
        Job.objects.filter(attempts=0, started_at__isnull=False, started_at__gte=now - RECENT)
        .annotate(placed_at=Min("events__at", filter=Q(events__type=EventType.SCHEDULED)))
        .order_by("-started_at")
        .values_list("submitted_at", "placed_at", "started_at")[:RECENT_JOBS_MAX]
    )
    waits, to_running = [], []
    for submitted, placed, started in rows:
        if started is None:
            continue  # (filtered out above)
        to_running.append((started - submitted).total_seconds())
        waits.append(((placed or started) - submitted).total_seconds())
    wait = GaugeMetricFamily(
        "tessera_job_wait_seconds",
        "Queue wait (submit to placement) of first attempts placed in the last hour.",
        labels=["quantile"],
    )
    running = GaugeMetricFamily(
        "tessera_job_submit_to_running_seconds",
        "Submit to running (the process started) of first attempts started in the last hour.",
        labels=["quantile"],
    )
    for family, values in ((wait, waits), (running, to_running)):
        for q in QUANTILES if values else ():
            family.add_metric([str(q)], _quantile(sorted(values), q))
    return [wait, running]


def _quantile(values: list[float], q: float) -> float:
    """The nearest-rank percentile of sorted ``values``."""
    return max(0.0, values[max(0, math.ceil(q * len(values)) - 1)])


def _free_families() -> list:
    free = GaugeMetricFamily(
        "tessera_gpus_free", "Free healthy GPUs on ready nodes, by model.", labels=["model"]
    )
    fragmented = GaugeMetricFamily(
        "tessera_gpus_free_fragmented",
        "Free healthy GPUs on ready nodes where some GPUs are allocated (not a whole free node).",
        labels=["model"],
    )
    busy = set(
        Allocation.objects.filter(released_at__isnull=True).values_list("device_id", flat=True).distinct()
    )
    per_node: dict[int, list[tuple[str, bool]]] = defaultdict(list)
    devices = Device.objects.filter(node__state=NodeState.READY, healthy=True).values_list(
        "node_id", "model", "id"
    )
    for node_id, model, device_id in devices:
        per_node[node_id].append((model, device_id in busy))
    free_n: dict[str, int] = defaultdict(int)
    frag_n: dict[str, int] = defaultdict(int)
    for gpus in per_node.values():
        partly = any(used for _, used in gpus)
        for model, used in gpus:
            free_n[model] += 0 if used else 1
            frag_n[model] += 1 if partly and not used else 0
    for model in sorted(free_n):
        free.add_metric([model], free_n[model])
        fragmented.add_metric([model], frag_n[model])
    return [free, fragmented]


def _tenant_families() -> list:
    labels = ["tenant", "model"]
    allocated = GaugeMetricFamily(
        "tessera_tenant_gpus_allocated", "A tenant's allocated GPU capacity by model.", labels=labels
    )
    guaranteed = GaugeMetricFamily(
        "tessera_tenant_gpus_guaranteed", "A tenant's guaranteed GPUs by model (its quota).", labels=labels
    )
    limit = GaugeMetricFamily("tessera_tenant_gpus_limit", "A tenant's GPU limit by model.", labels=labels)
    used = {
        (tenant, model): milli / 1000
        for tenant, model, milli in Allocation.objects.filter(released_at__isnull=True)
        .values_list("job__tenant__name", "device__model")
        .annotate(milli=Sum("share_milli"))
        .order_by()
    }
    quotas = {
        (tenant, model): (g, lim)
        for tenant, model, g, lim in Quota.objects.values_list("tenant__name", "model", "guaranteed", "limit")
    }
    for key in sorted(set(used) | set(quotas)):
        allocated.add_metric(list(key), used.get(key, 0.0))
        if key in quotas:
            guaranteed.add_metric(list(key), quotas[key][0])
            limit.add_metric(list(key), quotas[key][1])
    return [allocated, guaranteed, limit]


def _lost_family() -> CounterMetricFamily:
    """The GPU-seconds of attempts that ended without finishing and were requeued (preempted,
    reclaimed idle, lost with their node, or retried after a failure): from each allocation's start
    or the attempt's last checkpoint, whichever is later, to its release; from its start when the
    job later started from the beginning because its checkpoint was out of its nodes' reach
    (services/checkpoints.py): everything before such a start is lost."""
    lost = CounterMetricFamily(
        "tessera_lost_gpu_seconds",
        "GPU-seconds of work lost by attempts that ended and were requeued, since their last checkpoint.",
        labels=["cause"],
    )
    totals = dict.fromkeys(LOST_CAUSES, 0.0)
    requeued = Job.objects.filter(attempts__gt=0).values_list("id", flat=True)
    ends: dict[tuple[int, datetime], str] = {}
    checkpoints: dict[int, list[datetime]] = defaultdict(list)
    fresh: dict[int, datetime] = {}  # the job's last start from the beginning despite a checkpoint
    events = JobEvent.objects.filter(
        Q(type__in=[EventType.PREEMPTED, EventType.REQUEUED, EventType.RETRYING, EventType.CHECKPOINTED])
        | Q(type=EventType.SCHEDULED, reason__startswith=FRESH),
        job_id__in=requeued,
    ).values_list("job_id", "type", "at", "reason")
    for job_id, kind, at, reason in events:
        if kind == EventType.CHECKPOINTED:
            checkpoints[job_id].append(at)
        elif kind == EventType.SCHEDULED:
            fresh[job_id] = max(at, fresh.get(job_id, at))
        elif kind == EventType.PREEMPTED:
            ends[(job_id, at)] = "idle-reclaim" if reason == IDLE_RECLAIM_REASON else "preemption"
        elif kind == EventType.RETRYING:
            ends[(job_id, at)] = "retry"
        elif reason == "node-lost":
            ends[(job_id, at)] = "node-lost"
    allocations = Allocation.objects.filter(job_id__in=requeued, released_at__isnull=False).values_list(
        "job_id", "created_at", "released_at", "share_milli"
    )
    for job_id, start, end, milli in allocations:
        cause = ends.get((job_id, end)) if end is not None else None
        if cause is None or end is None:
            continue  # the attempt that ended the job, or one released by a resize
        lost_all = job_id in fresh and fresh[job_id] >= end
        since = start if lost_all else max([start, *(c for c in checkpoints[job_id] if start <= c <= end)])
        totals[cause] += (end - since).total_seconds() * milli / 1000
    for cause in LOST_CAUSES:
        lost.add_metric([cause], totals[cause])
    return lost


def _failure_family() -> CounterMetricFamily:
    failures = CounterMetricFamily(
        "tessera_job_failures", "Failed jobs by why they failed.", labels=["cause"]
    )
    totals = dict.fromkeys(FAILURE_CAUSES, 0)
    reasons = (
        JobEvent.objects.filter(job__state=JobState.FAILED, type=EventType.FAILED)
        .values_list("reason")
        .annotate(n=Count("id"))
        .order_by()
    )
    for reason, n in reasons:
        cause = "exit-code" if reason.startswith("exit ") else reason
        totals[cause if cause in totals else "lost"] += n
    for cause in FAILURE_CAUSES:
        failures.add_metric([cause], totals[cause])
    return failures


def _heartbeat_family(now: datetime) -> GaugeMetricFamily:
    age = GaugeMetricFamily(
        "tessera_node_heartbeat_age_seconds",
        "Seconds since the node's agent last reported (nodes that have reported at least once).",
        labels=["node"],
    )
    for name, last in Node.objects.filter(last_heartbeat__isnull=False).values_list("name", "last_heartbeat"):
        if last is not None:
            age.add_metric([name], max(0.0, (now - last).total_seconds()))
    return age
