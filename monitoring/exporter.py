"""The control plane's own Prometheus metrics.

Everything is computed at scrape time from the database (a custom collector, a handful of
aggregate queries), so every web process reports the same truth. That includes the passes: the
process that runs them (the Celery worker, or the web process in the embedded default) records
each one in ``SchedulerState``, and the histogram and counters are read from there.

| metric | labels | what |
| --- | --- | --- |
| ``tessera_scheduling_pass_seconds`` | | histogram of pass durations |
| ``tessera_scheduling_decisions_total`` | ``decision`` | bindings made, dropped as stale, preemptions |
| ``tessera_scheduling_passes_cut_short_total`` | | passes that reached their time budget |
| ``tessera_scheduling_last_pass_timestamp_seconds`` | | when the last pass ran |
| ``tessera_jobs_pending`` | ``kind`` | pending jobs |
| ``tessera_jobs`` | ``state`` | jobs by state (terminal ones included) |
| ``tessera_gpus_total`` | ``model`` | GPUs known to the control plane |
| ``tessera_gpus_allocated`` | ``model`` | allocated GPU capacity (a fraction counts as its share) |
| ``tessera_gpus_unhealthy`` | ``model`` | GPUs reported unhealthy |
| ``tessera_nodes`` | ``state`` | nodes by state |
| ``tessera_adjustment_actions_total`` | ``action`` | the adjustment pass's warnings, shrinks, requeues |
| ``tessera_adjustment_metrics_available`` | | 0 while the adjustment pass cannot read utilisation |
| ``tessera_gpus_idle_allocated`` | | allocated GPUs idle past the first warning's window |
| ``tessera_adjustment_last_pass_timestamp_seconds`` | | when the last adjustment pass ran |
| ``tessera_cluster_metrics_available`` | | 0 when the scrape could not read the database (the rest absent) |
| ``tessera_redis_available`` | | 0 when Redis does not answer this web process (absent without Redis) |

Queue levels, wait and start latency percentiles, fragmentation, per-tenant usage against
guarantees, lost GPU-seconds, failures by cause and heartbeat ages: ``monitoring/job_metrics.py``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

from django.conf import settings
from django.db.models import Count, Sum
from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from monitoring.job_metrics import job_families
from scheduling.choices import JobKind, JobState, NodeState
from scheduling.models import Allocation, Device, Job, Node, SchedulerState
from scheduling.services import redis_flags
from scheduling.services.passes import PASS_BUCKETS_S

log = logging.getLogger("tessera.metrics")


class ClusterCollector(Collector):
    """Reads the cluster's totals from the database when Prometheus scrapes."""

    def describe(self) -> list:
        # No queries at registration time (the database may not exist yet).
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families: list[GaugeMetricFamily] = []
        try:
            families, read = _cluster_families(), True
        except Exception:  # a scrape must never take the web process down
            log.warning("cluster metrics unavailable", exc_info=True)
            read = False
        # Always there, unlike the families it vouches for: when they vanish (the database out
        # of reach) every alert on them goes quiet, and this says why (deploy/alerts.yml).
        available = GaugeMetricFamily(
            "tessera_cluster_metrics_available",
            "1 when this scrape read the cluster's state from the database; 0 when it could not.",
        )
        available.add_metric([], 1 if read else 0)
        yield from families
        yield available
        if settings.REDIS_URL:
            yield _redis_family()


def _redis_family() -> GaugeMetricFamily:
    """Whether Redis answers this web process now. Its outage loses no job (PostgreSQL keeps the
    truth) but stops this process's pass triggers, live updates and rate limits until it is back
    (docs/operations.md): without this, nothing on /metrics said so (deploy/alerts.yml). The
    worker's and beat's view is not here: their loss of Redis stops the passes, which
    ``tessera_scheduling_last_pass_timestamp_seconds`` shows."""
    available = GaugeMetricFamily(
        "tessera_redis_available",
        "1 when Redis answered this web process's PING for this scrape; 0 when it did not.",
    )
    available.add_metric([], 1 if redis_flags.answers() else 0)
    return available


def _cluster_families() -> list[GaugeMetricFamily]:
    pending = GaugeMetricFamily("tessera_jobs_pending", "Pending jobs by kind.", labels=["kind"])
    counts = dict(
        Job.objects.filter(state=JobState.PENDING).values_list("kind").annotate(n=Count("id")).order_by()
    )
    for kind in JobKind.values:
        pending.add_metric([kind], counts.get(kind, 0))

    jobs = GaugeMetricFamily("tessera_jobs", "Jobs by state.", labels=["state"])
    by_state = dict(Job.objects.values_list("state").annotate(n=Count("id")).order_by())
    for state in JobState.values:
        jobs.add_metric([state], by_state.get(state, 0))

    total = GaugeMetricFamily("tessera_gpus_total", "GPUs by model.", labels=["model"])
    unhealthy = GaugeMetricFamily("tessera_gpus_unhealthy", "Unhealthy GPUs by model.", labels=["model"])
    allocated = GaugeMetricFamily(
        "tessera_gpus_allocated",
        "Allocated GPU capacity by model (a fractional share counts as its share).",
        labels=["model"],
    )
    models: dict[str, tuple[int, int]] = {}
    rows = Device.objects.values_list("model", "healthy").annotate(n=Count("id")).order_by()
    for model, healthy, n in rows:
        all_n, bad_n = models.get(model, (0, 0))
        models[model] = (all_n + n, bad_n + (0 if healthy else n))
    used = dict(
        Allocation.objects.filter(released_at__isnull=True)
        .values_list("device__model")
        .annotate(milli=Sum("share_milli"))
        .order_by()
    )
    for model in sorted(models):
        total.add_metric([model], models[model][0])
        unhealthy.add_metric([model], models[model][1])
        allocated.add_metric([model], (used.get(model) or 0) / 1000)

    nodes = GaugeMetricFamily("tessera_nodes", "Nodes by state.", labels=["state"])
    by_node_state = dict(Node.objects.values_list("state").annotate(n=Count("id")).order_by())
    for state in NodeState.values:
        nodes.add_metric([state], by_node_state.get(state, 0))
    return [
        pending,
        jobs,
        total,
        allocated,
        unhealthy,
        nodes,
        *_pass_families(),
        *_adjust_families(),
        *job_families(),
    ]


def _adjust_families() -> list:
    """The adjustment pass as recorded in ``AdjustmentState`` (``services/adjust.py``)."""
    from scheduling.engine.adjust import ACTIONS
    from scheduling.models import AdjustmentState

    state = AdjustmentState.objects.filter(id=1).first()
    actions = CounterMetricFamily(
        "tessera_adjustment_actions",
        "Actions of the adjustment pass: idle warnings, shrinks, requeues.",
        labels=["action"],
    )
    totals = (state.actions_total or {}) if state is not None else {}
    for action in ACTIONS:
        actions.add_metric([action], totals.get(action, 0))
    available = GaugeMetricFamily(
        "tessera_adjustment_metrics_available",
        "1 when the last adjustment pass could read GPU utilisation; 0 when it acted on nothing.",
    )
    available.add_metric([], 1 if state is None or state.metrics_ok else 0)
    idle = GaugeMetricFamily(
        "tessera_gpus_idle_allocated",
        "Allocated GPUs idle (under the idle threshold) since at least the first warning's window.",
    )
    idle.add_metric([], state.idle_gpus if state is not None else 0)
    last = GaugeMetricFamily(
        "tessera_adjustment_last_pass_timestamp_seconds", "When the last adjustment pass ran (epoch)."
    )
    last.add_metric([], state.last_pass_at.timestamp() if state is not None and state.last_pass_at else 0)
    return [actions, available, idle, last]


def _pass_families() -> list:
    """The passes as recorded in ``SchedulerState`` by whichever process ran them."""
    state = SchedulerState.objects.filter(id=1).first()
    counts = list(state.pass_buckets or []) if state is not None else []
    counts += [0] * (len(PASS_BUCKETS_S) + 1 - len(counts))
    cumulative, buckets = 0, []
    for bound, n in zip([*(floatToGoString(b) for b in PASS_BUCKETS_S), "+Inf"], counts, strict=False):
        cumulative += n
        buckets.append((bound, cumulative))
    seconds = HistogramMetricFamily(
        "tessera_scheduling_pass_seconds",
        "Duration of scheduling passes (snapshot, decide, apply).",
        buckets=buckets,
        sum_value=state.pass_seconds_sum if state is not None else 0.0,
    )
    decisions = CounterMetricFamily(
        "tessera_scheduling_decisions", "Decisions of all scheduling passes.", labels=["decision"]
    )
    totals = (state.decisions_total or {}) if state is not None else {}
    for decision in ("bound", "dropped", "preempted"):
        decisions.add_metric([decision], totals.get(decision, 0))
    cut_short = CounterMetricFamily(
        "tessera_scheduling_passes_cut_short",
        "Scheduling passes that reached their time budget (TESSERA_PASS_BUDGET_S) before deciding every job.",
    )
    cut_short.add_metric([], totals.get("cut_short", 0))
    last = GaugeMetricFamily(
        "tessera_scheduling_last_pass_timestamp_seconds", "When the last scheduling pass ran (epoch)."
    )
    last.add_metric([], state.last_pass_at.timestamp() if state is not None and state.last_pass_at else 0)
    return [seconds, decisions, cut_short, last]


_registered: set[int] = set()
_lock = threading.Lock()


def register_collector(registry: CollectorRegistry = REGISTRY) -> None:
    """Register the cluster collector with ``registry`` once (safe to call on every app start)."""
    with _lock:
        if id(registry) in _registered:
            return
        registry.register(ClusterCollector())
        _registered.add(id(registry))
