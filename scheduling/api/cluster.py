"""``/api/v1/cluster/``: totals — GPUs by model and state, allocation and fragmentation rates, queues.

Totals name no job and no tenant, so every signed-in user may read them.

- ``allocation_rate``: allocated GPU capacity (fractions counted as their share) over the capacity
  of healthy GPUs.
- ``fragmentation_rate``: FGD's definition (docs/evaluation.md), computed by the engine's
  ``scheduling.engine.fragmentation``: the share of free GPU capacity on ready nodes that the typical
  requests could not use, the typical requests taken from the last 1,000 submitted jobs (as the
  simulator's summary does). 0 when nothing is free or nothing was ever submitted.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db.models import Count
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduling.api.query_params import ReadsItsQueryParams
from scheduling.choices import HOLDING_STATES, QUEUE_LEVEL_NAMES, DeviceState, JobState, NodeState
from scheduling.engine.fragmentation import FragmentationModel, cluster_rate, to_milli
from scheduling.engine.types import MILLI
from scheduling.models import Allocation, Device, Job, Node
from scheduling.services.inventory import device_rows
from scheduling.services.snapshot import job_request

RECENT_JOBS = 1000


def fragmentation_rate(rows: list[dict[str, Any]]) -> float:
    """FGD's fragmentation rate of the ready nodes' free capacity for the recent request mix."""
    recent = Job.objects.select_related("tenant").order_by("-id")[:RECENT_JOBS]
    model = FragmentationModel.from_jobs(job_request(j) for j in recent)
    if not model.typical:
        return 0.0
    nodes = {n.name: n for n in Node.objects.filter(state=NodeState.READY)}
    # CPUs in use per node: each holding job's CPUs spread evenly over its replicas.
    cpu_used: dict[str, float] = defaultdict(float)
    seen: set[tuple[int, int, str]] = set()
    for a in Allocation.objects.filter(released_at__isnull=True, job__state__in=list(HOLDING_STATES)).values(
        "job_id", "replica", "node__name", "job__cpus", "job__replicas"
    ):
        key = (a["job_id"], a["replica"], a["node__name"])
        if key not in seen:
            seen.add(key)
            cpu_used[a["node__name"]] += a["job__cpus"] / max(a["job__replicas"], 1)
    free_by_node: dict[str, list[int]] = defaultdict(list)
    models: dict[str, str] = {}
    for row in rows:
        if row["node"] in nodes and row["state"] != DeviceState.UNHEALTHY:
            free_by_node[row["node"]].append(MILLI - to_milli(row["used"]))
            models.setdefault(row["node"], row["model"])
    total_f = 0.0
    total_free = 0
    for name, free in free_by_node.items():
        node = nodes[name]
        cpu_free = to_milli(node.cpus - cpu_used[name]) if node.cpus > 0 else 1 << 60
        total_f += model.node(models[name], cpu_free, tuple(sorted(free)))
        total_free += sum(free)
    return cluster_rate(total_f, total_free)


ClusterSchema = inline_serializer(
    "Cluster",
    {
        "gpus": serializers.IntegerField(),
        "gpus_by_model": serializers.DictField(child=serializers.DictField(child=serializers.FloatField())),
        "allocated_gpus": serializers.FloatField(),
        "allocation_rate": serializers.FloatField(),
        "fragmentation_rate": serializers.FloatField(),
        "queue_lengths": serializers.DictField(child=serializers.IntegerField()),
        "jobs_by_state": serializers.DictField(child=serializers.IntegerField()),
        "nodes_by_state": serializers.DictField(child=serializers.IntegerField()),
    },
)


class ClusterView(ReadsItsQueryParams, APIView):
    @extend_schema(summary="Cluster totals", responses={200: ClusterSchema})
    def get(self, request: Request) -> Response:
        rows = device_rows(Device.objects.select_related("node").order_by("node__name", "index"))
        by_model: dict[str, dict[str, float]] = {}
        capacity = allocated = 0.0
        for row in rows:
            counts = by_model.setdefault(
                row["model"], {"total": 0, **{str(s): 0 for s in DeviceState}, "allocated_capacity": 0.0}
            )
            counts["total"] += 1
            counts[row["state"]] += 1
            counts["allocated_capacity"] += row["used"]
            allocated += row["used"]
            if row["state"] != DeviceState.UNHEALTHY:
                capacity += 1
        pending = dict(
            Job.objects.filter(state=JobState.PENDING)
            .order_by()
            .values_list("queue_level")
            .annotate(n=Count("id"))
        )
        queues = {name: pending.pop(level, 0) for level, name in sorted(QUEUE_LEVEL_NAMES.items())}
        queues.update({str(level): n for level, n in pending.items()})  # levels the engine added
        by_state = dict(Job.objects.order_by().values_list("state").annotate(n=Count("id")))
        nodes = dict(Node.objects.order_by().values_list("state").annotate(n=Count("id")))
        return Response(
            {
                "gpus": len(rows),
                "gpus_by_model": by_model,
                "allocated_gpus": allocated,
                "allocation_rate": allocated / capacity if capacity else 0.0,
                "fragmentation_rate": fragmentation_rate(rows),
                "queue_lengths": queues,
                "jobs_by_state": {str(s): by_state.get(s, 0) for s in JobState},
                "nodes_by_state": {str(s): nodes.get(s, 0) for s in NodeState},
            }
        )
