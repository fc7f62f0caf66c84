"""Django's ASGI handler, serving sync views as a threaded WSGI server would: each request's
middleware and view run together in one thread of a fixed pool (``TESSERA_WEB_THREADS``).

Django's own ASGI handler gives every request a thread of its own (created for that request) and
runs each sync middleware in it through a separate hop from the event loop, before and after the
view: measured under ``make bench-e2e``, those hops and thread starts were about a quarter of the
web process's CPU, for requests that are mostly a few queries. Here a request costs one hop: the
sync middleware chain (the same middleware, loaded for sync use) and the view run in a pooled
thread, with a pooled database connection that is handed back when the request ends
(``close_old_connections``, as Django does around a request). Async views (the agents' long-poll)
still run on the event loop through Django's async chain. Without PostgreSQL (SQLite takes one
writer at a time) or inside pytest, ``controlplane/asgi.py`` uses Django's handler unchanged.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.db import close_old_connections
from django.urls import Resolver404, get_resolver


class PooledASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()  # the async chain, for async views
        self._sync = BaseHandler()
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
        if _is_async_view(request.path_info):
            return await super().get_response_async(request)
        return await sync_to_async(self._respond, thread_sensitive=False, executor=self._pool)(request)

    def _respond(self, request: Any) -> Any:
        close_old_connections()
        try:
            return self._sync.get_response(request)
        finally:
            close_old_connections()


def _is_async_view(path: str) -> bool:
    try:
        return iscoroutinefunction(get_resolver().resolve(path).func)
    except Resolver404:
        return False
