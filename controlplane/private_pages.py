"""Pages answered to a signed-in person are kept by no cache, the browser's included.

Without a ``Cache-Control`` header the portal's pages (the dashboard, the jobs list, a job's page,
the team page) were stored like any other page: after signing out, Back brought them back from
the browser's back/forward cache, names, commands and all, for whoever uses the machine next
(``tests/frontend/test_browser_session.py``). A response that says nothing of caching gets
Django's never-cache headers (``no-store`` among them) when the request had a session; one that
sets its own (static files, the admin's) keeps it.
"""

from __future__ import annotations

from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.utils.cache import add_never_cache_headers

from controlplane.sync_and_async import SyncAndAsyncMiddleware


class PrivatePagesNotStored(SyncAndAsyncMiddleware):
    def call(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        user = getattr(request, "user", None)
        if not response.has_header("Cache-Control") and user is not None and user.is_authenticated:
            add_never_cache_headers(response)
        return response

    async def acall(self, request: HttpRequest) -> HttpResponseBase:
        response = await self.get_async_response(request)
        if not response.has_header("Cache-Control") and (await request.auser()).is_authenticated:
            add_never_cache_headers(response)
        return response
