"""The control plane's own /metrics: unauthenticated (Prometheus scrapes it) and cheap (a few
aggregate queries in :mod:`monitoring.exporter`)."""

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from monitoring.exporter import register_collector


@require_GET
@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    register_collector()  # normally done in AppConfig.ready; idempotent
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
