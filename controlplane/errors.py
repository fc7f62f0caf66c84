"""The answer to an error no view handled (``handler500``): a database that cannot be reached is
the service being unavailable, not a bug, and says so.

Without this, a request that could not reach PostgreSQL (a connection refused, dropped, or none
free in the pool in time) got Django's HTML "Server Error (500)" page — the API's clients (the
CLI, pipelines, agents) a 500 they treat as a failure of the request rather than a moment to
retry. Now: 503 with ``Retry-After``, as JSON (``{"detail": ...}``, the API's error shape) under
``/api/``, a short page elsewhere. Any other error keeps Django's own 500.

Django logs each such request as an error with its traceback: with every agent heartbeating
that was a page of traceback per request for as long as the database was away.
:class:`DatabaseUnreachableFilter` (on ``django.request``, settings.LOGGING) makes it one line."""

from __future__ import annotations

import logging
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


def first_line(exc: BaseException) -> str:
    """What an operator needs of ``exc`` in one line: its message's first line, else its type."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


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


class DatabaseUnreachableFilter(logging.Filter):
    """A request that could not reach the database, as ``django.request`` logs it: one line
    that says so, without the traceback (the outage is the news, not where it surfaced)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and database_unreachable(exc):
            record.msg = f"{record.getMessage()} (the database is unreachable: {first_line(exc)})"
            record.args = ()
            record.exc_info = record.exc_text = None
        return True
