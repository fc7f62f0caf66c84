"""The answer to an error no view handled (``handler500``): a database that cannot be reached is
the service being unavailable, not a bug, and says so.

Without this, a request that could not reach PostgreSQL (a connection refused, dropped, or none
free in the pool in time) got Django's HTML "Server Error (500)" page — the API's clients (the
CLI, pipelines, agents) a 500 they treat as a failure of the request rather than a moment to
retry. Now: 503 with ``Retry-After``, as JSON (``{"detail": ...}``, the API's error shape) under
``/api/``, a short page elsewhere. Any other error keeps Django's own 500."""

from __future__ import annotations

import sys

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

RETRY_AFTER_S = 5
DETAIL = "The database is unavailable; try again shortly."


def database_unreachable(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what it was raised from) is a failure to reach the database."""
    while exc is not None:
        if isinstance(exc, OperationalError | InterfaceError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: Django calls it while handling the exception, so ``sys.exc_info`` holds it."""
    if not database_unreachable(sys.exc_info()[1]):
        return defaults.server_error(request)
    response: HttpResponse
    if request.path.startswith("/api/"):
        response = JsonResponse({"detail": DETAIL}, status=503)
    else:
        page = f"<!doctype html><title>Service unavailable (503)</title><h1>Unavailable</h1><p>{DETAIL}"
        response = HttpResponse(page, status=503)
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response
