"""The REST API's URL map, mounted at ``/api/v1/`` (docs/api.md, "Endpoints").

Paths are listed one by one (no router) so that each has a name; the tenant-isolation test walks
this module's patterns and fails on any it does not know, so a new endpoint cannot go unchecked.
The node agents' protocol (``agent/``) lives in its own module, with its own authentication.
"""

from __future__ import annotations

from importlib.util import find_spec

from django.urls import URLPattern, URLResolver, include, path, re_path

from scheduling.api import schema  # noqa: F401  (registers the agents' auth schemes in the schema)
from scheduling.api.audit import AuditViewSet
from scheduling.api.cluster import ClusterView
from scheduling.api.errors import not_found
from scheduling.api.job_stream import job_stream, jobs_stream
from scheduling.api.job_wait import job_detail
from scheduling.api.jobs import JobViewSet
from scheduling.api.nodes import NodeViewSet
from scheduling.api.pagination import EventOrOffsetPagination
from scheduling.api.quotas import QuotaViewSet
from scheduling.api.tenants import TenantIdlePolicyView, TenantViewSet
from scheduling.api.tokens import TokenViewSet
from scheduling.api.webhooks import WebhookViewSet

urlpatterns: list[URLPattern | URLResolver] = [
    path("jobs/", JobViewSet.as_view({"get": "list", "post": "create"}), name="job-list"),
    path("jobs/stream/", jobs_stream, name="job-list-stream"),
    path("jobs/<str:pk>/", job_detail, name="job-detail"),
    path("jobs/<str:pk>/stream/", job_stream, name="job-stream"),
    path("jobs/<str:pk>/cancel/", JobViewSet.as_view({"post": "cancel"}), name="job-cancel"),
    path("jobs/<str:pk>/hold/", JobViewSet.as_view({"post": "hold"}), name="job-hold"),
    path("jobs/<str:pk>/release/", JobViewSet.as_view({"post": "release"}), name="job-release"),
    path(
        "jobs/<str:pk>/events/",
        # Pages of its own (oldest first), not the job list's filters (nor in the schema).
        JobViewSet.as_view({"get": "events"}, pagination_class=EventOrOffsetPagination, filter_backends=[]),
        name="job-events",
    ),
    path("jobs/<str:pk>/logs/", JobViewSet.as_view({"get": "logs"}), name="job-logs"),
    path("jobs/<str:pk>/utilisation/", JobViewSet.as_view({"get": "utilisation"}), name="job-utilisation"),
    path("nodes/", NodeViewSet.as_view({"get": "list"}), name="node-list"),
    path("nodes/<str:name>/", NodeViewSet.as_view({"get": "retrieve"}), name="node-detail"),
    path("tenants/", TenantViewSet.as_view({"get": "list"}), name="tenant-list"),
    path("tenants/<str:pk>/", TenantViewSet.as_view({"get": "retrieve"}), name="tenant-detail"),
    path("tenants/<str:pk>/idle-policy/", TenantIdlePolicyView.as_view(), name="tenant-idle-policy"),
    path("quotas/", QuotaViewSet.as_view({"get": "list", "post": "create"}), name="quota-list"),
    path(
        "quotas/<str:pk>/",
        QuotaViewSet.as_view({"get": "retrieve", "patch": "partial_update", "delete": "destroy"}),
        name="quota-detail",
    ),
    path("cluster/", ClusterView.as_view(), name="cluster"),
    path("audit/", AuditViewSet.as_view({"get": "list"}), name="audit-list"),
    path("webhooks/", WebhookViewSet.as_view({"get": "list", "post": "create"}), name="webhook-list"),
    path(
        "webhooks/<str:pk>/",
        WebhookViewSet.as_view({"get": "retrieve", "delete": "destroy"}),
        name="webhook-detail",
    ),
    path(
        "webhooks/<str:pk>/deliveries/",
        WebhookViewSet.as_view({"get": "deliveries"}),
        name="webhook-deliveries",
    ),
    path(
        "webhooks/<str:pk>/deliveries/<str:delivery>/redeliver/",
        WebhookViewSet.as_view({"post": "redeliver"}),
        name="webhook-redeliver",
    ),
    path("tokens/", TokenViewSet.as_view({"get": "list", "post": "create"}), name="token-list"),
    path("tokens/<str:pk>/", TokenViewSet.as_view({"delete": "destroy"}), name="token-detail"),
]

# The agent engineer's module; guarded so this map loads in a checkout that does not have it yet.
if find_spec("scheduling.api.agent_urls") is not None:
    urlpatterns.append(path("agent/", include("scheduling.api.agent_urls")))

# Last: any other path under /api/v1/ is a JSON 404 (not Django's HTML page, and not the
# APPEND_SLASH error that a POST without its trailing slash would otherwise raise).
urlpatterns.append(re_path(r"^[\s\S]*$", not_found, name="api-not-found"))  # any path, line breaks too
