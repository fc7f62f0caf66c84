"""``/api/v1/nodes/``: nodes with their devices and each device's state.

Nodes are shared by every tenant, so everyone signed in may read them; what a device is used for is
not. A tenant's user sees its own tenant's jobs on a device, and another tenant's use only as "in
use" (``job_id``, ``tenant`` and ``replica`` null, the share kept); operators see everything.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view, inline_serializer
from rest_framework import serializers, viewsets
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from scheduling.api.fields import text_problem
from scheduling.api.filters import NodeFilter
from scheduling.api.pagination import BoundedLimitOffsetPagination
from scheduling.api.permissions import is_operator
from scheduling.api.query_params import ReadsItsQueryParams
from scheduling.models import Device, Node, Tenant
from scheduling.services.inventory import device_rows


class NodePagination(BoundedLimitOffsetPagination):
    default_limit = 1000  # a heatmap wants the whole cluster in one read
    max_limit = 5000


def visible_tenant_ids(user) -> set[int] | None:
    """Tenants whose jobs ``user`` may see on devices (None = all: an operator)."""
    if is_operator(user):
        return None
    return set(Tenant.objects.visible_to(user).values_list("pk", flat=True))


def redact(row: dict[str, Any], visible: set[int] | None) -> dict[str, Any]:
    jobs = []
    for job in row["jobs"]:
        if visible is None or job["tenant_id"] in visible:
            jobs.append(
                {
                    "job_id": job["job_id"],
                    "tenant": job["tenant"],
                    "share": job["share"],
                    "replica": job["replica"],
                }
            )
        else:  # another tenant's use: only that the capacity is taken
            jobs.append({"job_id": None, "tenant": None, "share": job["share"], "replica": None})
    out = {k: v for k, v in row.items() if k not in ("jobs", "node")}
    out["jobs"] = jobs
    return out


def node_payloads(nodes: Iterable[Node], user) -> list[dict[str, Any]]:
    """Nodes as the API shows them to ``user``: a fixed number of queries for any number of nodes."""
    nodes = list(nodes)
    devices = Device.objects.filter(node__in=[n.pk for n in nodes]).select_related("node")
    by_node: dict[str, list[dict[str, Any]]] = defaultdict(list)
    visible = visible_tenant_ids(user)
    for row in device_rows(devices.order_by("node__name", "index")):
        by_node[row["node"]].append(redact(row, visible))
    return [
        {
            "name": node.name,
            "rack": node.rack,
            "kind": node.kind,
            "state": node.state,
            "labels": node.labels,
            "nvlink_domain": node.nvlink_domain,
            "cpus": node.cpus,
            "memory_gib": node.memory_gib,
            "price_per_gpu_hour": node.price_per_gpu_hour,
            "last_heartbeat": node.last_heartbeat.isoformat() if node.last_heartbeat else None,
            "gpus": len(by_node[node.name]),
            "models": sorted({d["model"] for d in by_node[node.name]}),
            "devices": by_node[node.name],
        }
        for node in nodes
    ]


NodeSchema = inline_serializer(
    "Node",
    {
        "name": serializers.CharField(),
        "rack": serializers.CharField(),
        "kind": serializers.CharField(),
        "state": serializers.CharField(),
        "labels": serializers.DictField(child=serializers.CharField()),
        "nvlink_domain": serializers.IntegerField(),
        "cpus": serializers.FloatField(),
        "memory_gib": serializers.FloatField(),
        "price_per_gpu_hour": serializers.FloatField(),
        "last_heartbeat": serializers.DateTimeField(allow_null=True),
        "gpus": serializers.IntegerField(),
        "models": serializers.ListField(child=serializers.CharField()),
        "devices": serializers.ListField(
            child=inline_serializer(
                "Device",
                {
                    "index": serializers.IntegerField(),
                    "uuid": serializers.CharField(),
                    "model": serializers.CharField(),
                    "memory_gib": serializers.FloatField(),
                    "nvlink_island": serializers.IntegerField(),
                    "state": serializers.ChoiceField(["free", "allocated", "shared", "unhealthy"]),
                    "used": serializers.FloatField(),
                    "jobs": serializers.ListField(
                        child=inline_serializer(
                            "DeviceUse",
                            {
                                "job_id": serializers.IntegerField(allow_null=True),
                                "tenant": serializers.CharField(allow_null=True),
                                "share": serializers.FloatField(),
                                "replica": serializers.IntegerField(allow_null=True),
                            },
                        )
                    ),
                },
            )
        ),
    },
)


@extend_schema_view(
    list=extend_schema(summary="Nodes with their devices", responses={200: NodeSchema}),
    retrieve=extend_schema(summary="One node with its devices", responses={200: NodeSchema}),
)
class NodeViewSet(ReadsItsQueryParams, viewsets.GenericViewSet):
    pagination_class = NodePagination
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    serializer_class = serializers.Serializer  # responses are built by node_payloads
    filterset_class = NodeFilter  # the list's query filters (scheduling/api/filters.py)

    def get_queryset(self) -> QuerySet[Node]:
        return Node.objects.order_by("name")

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        assert page is not None  # NodePagination has a default limit: it always pages
        return self.get_paginated_response(node_payloads(page, request.user))

    def retrieve(self, request: Request, name: str) -> Response:
        if text_problem(name) or len(name) > 128:
            raise NotFound("No such node.")
        node = self.get_queryset().filter(name=name).first()
        if node is None:
            raise NotFound("No such node.")
        return Response(node_payloads([node], request.user)[0])
