"""A base for middleware that serves sync and async requests alike, each on its own path.

A sync-only middleware puts every async view behind it (the jobs' long polls and streams) on a
thread of its own, where a wait no longer hears the change it waits for
(``tests/api/test_job_wait.py``). Django's ``MiddlewareMixin`` is both, but runs the async path's
hooks in a thread and has no hook around the whole call, which ``controlplane.audit_actor`` needs.
A subclass writes ``call`` and ``acall``; Django's loader picks the one that matches the chain.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest
from django.http.response import HttpResponseBase


class SyncAndAsyncMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.acall(request)
        return self.call(request)

    def call(self, request: HttpRequest) -> HttpResponseBase:
        """The sync path: ``self.get_response(request)`` returns the response."""
        raise NotImplementedError

    async def acall(self, request: HttpRequest) -> HttpResponseBase:
        """The async path: ``await self.get_async_response(request)`` returns the response."""
        raise NotImplementedError

    async def get_async_response(self, request: HttpRequest) -> HttpResponseBase:
        get_response: Callable[[HttpRequest], Awaitable[HttpResponseBase]] = self.get_response
        return await get_response(request)
