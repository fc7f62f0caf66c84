"""Django's ASGI handler, serving sync views as a threaded WSGI server would: each request's
middleware and view run together in one thread of a fixed pool (``TESSERA_WEB_THREADS``).

Django's own ASGI handler gives every request a thread of its own (created for that request) and
runs each sync middleware in it through a separate hop from the event loop, before and after the
view: measured under ``make bench-e2e``, those hops and thread starts were about a quarter of the
web process's CPU, for requests that are mostly a few queries. Here a request costs one hop: the
sync middleware chain (the same middleware, loaded for sync use) and the view run in a pooled
thread, with a pooled database connection that is handed back when the request ends
(``close_old_connections``, as Django does around a request); the URL is resolved once, on
arrival (to tell sync views from async ones), not again in the chain. Async views (the agents'
long-poll) run on the event loop; those marked ``without_middleware`` (the long-poll, which
authenticates itself and uses no session) are called directly, the others through Django's async
chain, where each sync middleware costs two thread hops (12 per long-poll, profiled). Without
PostgreSQL (SQLite takes one writer at a time) or inside pytest, ``controlplane/asgi.py`` uses
Django's handler unchanged.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.core.handlers.exception import response_for_exception
from django.db import close_old_connections
from django.urls import Resolver404, get_resolver
from django.utils.log import log_response


class _Resolved:
    """A handler that takes the URL match made when the request arrived (``request.tessera_match``)
    instead of resolving the path a second time."""

    def resolve_request(self, request: Any) -> Any:
        match = getattr(request, "tessera_match", None)
        if match is None or hasattr(request, "urlconf"):  # unresolved, or a middleware's own URLs
            return super().resolve_request(request)  # type: ignore[misc]
        request.resolver_match = match
        return match


class _SyncHandler(_Resolved, BaseHandler):
    pass


class PooledASGIHandler(_Resolved, ASGIHandler):
    def __init__(self) -> None:
        super().__init__()  # the async chain, for async views
        self._sync = _SyncHandler()
        self._sync.load_middleware(is_async=False)
        self._pool = ThreadPoolExecutor(settings.TESSERA["WEB_THREADS"], thread_name_prefix="tessera-web")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        # Without Django's per-request ThreadSensitiveContext: what still runs "thread-sensitive"
        # (the request signals, closing the response) is brief and shares one thread, instead of
        # starting a thread for every request.
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        await self.handle(scope, receive, send)

    async def get_response_async(self, request: Any) -> Any:
        try:
            request.tessera_match = get_resolver().resolve(request.path_info)
        except Resolver404:  # answered by the chain below (404, or a redirect to add a slash)
            request.tessera_match = None
        view = request.tessera_match.func if request.tessera_match is not None else None
        if view is not None and iscoroutinefunction(view):
            if getattr(view, "without_middleware", False):
                return await self._respond_bare(request)
            return await super().get_response_async(request)
        return await sync_to_async(self._respond, thread_sensitive=False, executor=self._pool)(request)

    async def _respond_bare(self, request: Any) -> Any:
        """The async view alone, with what Django's chain adds around any view: the match on the
        request, a 500 (not a dropped connection) for an exception, error responses logged."""
        match = request.resolver_match = request.tessera_match
        try:
            response = await match.func(request, *match.args, **match.kwargs)
        except Exception as exc:  # noqa: BLE001 - as Django's chain: the error becomes a response
            response = await sync_to_async(response_for_exception, thread_sensitive=False)(request, exc)
        response._resource_closers.append(request.close)
        if response.status_code >= 400:
            log_response("%s: %s", response.reason_phrase, request.path, response=response, request=request)
        return response

    def _respond(self, request: Any) -> Any:
        close_old_connections()
        try:
            return self._sync.get_response(request)
        finally:
            close_old_connections()
