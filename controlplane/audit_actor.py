"""Middleware: the audit log's acting user is the user of the request being served.

It keeps the request in a context variable (``scheduling.services.audit.acting_for``) while the
request is handled, so that changes recorded by signals (users and tenant memberships edited in the
admin) name who made them. It is both sync and async capable (``controlplane.sync_and_async``).
Context variables follow a request into the threads that run its sync views.
"""

from __future__ import annotations

from django.http import HttpRequest
from django.http.response import HttpResponseBase

from controlplane.sync_and_async import SyncAndAsyncMiddleware
from scheduling.services.audit import acting_for


class AuditActorMiddleware(SyncAndAsyncMiddleware):
    def call(self, request: HttpRequest) -> HttpResponseBase:
        with acting_for(request):
            response: HttpResponseBase = self.get_response(request)
            return response

    async def acall(self, request: HttpRequest) -> HttpResponseBase:
        with acting_for(request):
            return await self.get_async_response(request)
