"""Pages answered to a signed-in person are kept by no cache, the browser's included.

Without a ``Cache-Control`` header the portal's pages (the dashboard, the jobs list, a job's page,
the team page) were stored like any other page: after signing out, Back brought them back from
the browser's back/forward cache, names, commands and all, for whoever uses the machine next
(``tests/frontend/test_browser_session.py``). A response that says nothing of caching gets
Django's never-cache headers (``no-store`` among them) when the request had a session; one that
sets its own (static files, the admin's) keeps it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.utils.cache import add_never_cache_headers


class PrivatePagesNotStored:
    """Both sync and async capable, as ``controlplane.audit_actor``: a sync-only middleware would
    put every async view behind it (the jobs' long polls and streams) on a thread of its own,
    where a wait no longer hears the change it waits for (``tests/api/test_job_wait.py``)."""

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
        response = self.get_response(request)
        user = getattr(request, "user", None)
        if not response.has_header("Cache-Control") and user is not None and user.is_authenticated:
            add_never_cache_headers(response)
        return response

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        get_response: Callable[[HttpRequest], Awaitable[HttpResponse]] = self.get_response
        response = await get_response(request)
        if not response.has_header("Cache-Control") and (await request.auser()).is_authenticated:
            add_never_cache_headers(response)
        return response
