"""The control plane's own /metrics: unauthenticated (Prometheus scrapes it) and cheap (a few
aggregate queries in :mod:`monitoring.exporter`); and /metrics/targets, the agents' metrics
endpoints for Prometheus's HTTP service discovery."""

from urllib.parse import urlsplit

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from drf_spectacular.utils import extend_schema
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from monitoring.exporter import register_collector
from scheduling.api.permissions import is_operator
from scheduling.models import Node


@require_safe  # GET and HEAD (a probe's or a load balancer's check): HEAD is GET without the body
@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    register_collector()  # normally done in AppConfig.ready; idempotent
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)


def http_sd_groups() -> list[dict[str, object]]:
    """One target group per node that advertises a metrics URL (``Node.metrics_url``)."""
    groups: list[dict[str, object]] = []
    rows = Node.objects.exclude(metrics_url="").order_by("name").values_list("name", "rack", "metrics_url")
    for name, rack, url in rows:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            continue
        labels = {"node": name, "rack": rack, "__scheme__": parts.scheme}
        labels["__metrics_path__"] = parts.path or "/metrics"
        groups.append({"targets": [parts.netloc], "labels": labels})
    return groups


class PrometheusTargets(APIView):
    """``GET /metrics/targets``: every node's agent metrics endpoint, in Prometheus's http_sd
    format (``[{"targets": ["host:port"], "labels": {...}}]``), so Prometheus finds the agents
    without hand-edited targets. Operators only (a node's address is not a tenant's business):
    Prometheus sends an operator's API token (``authorization: {type: Token}``)."""

    @extend_schema(exclude=True)  # Prometheus's format, not the API's (docs/metrics.md)
    def get(self, request: Request) -> Response:
        if not is_operator(request.user):
            raise PermissionDenied("Operators only.")
        return Response(http_sd_groups())
