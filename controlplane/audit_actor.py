"""Middleware: the audit log's acting user is the user of the request being served.

It keeps the request in a context variable (``scheduling.services.audit.acting_for``) while the
request is handled, so that changes recorded by signals (users and tenant memberships edited in the
admin) name who made them. It is both sync and async capable: a sync-only middleware would put
every async view behind it (the jobs' long polls and streams) on a thread of its own. Context
variables follow a request into the threads that run its sync views.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest

from scheduling.services.audit import acting_for


class AuditActorMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        with acting_for(request):
            return self.get_response(request)

    async def _acall(self, request: HttpRequest) -> Any:
        get_response: Callable[[HttpRequest], Awaitable[Any]] = self.get_response
        with acting_for(request):
            return await get_response(request)
