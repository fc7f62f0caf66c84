"""Django's ASGI handler, serving sync views as a threaded WSGI server would: each request's
middleware and view run together in one thread of a fixed pool (``TESSERA_WEB_THREADS``).

Django's own ASGI handler gives every request a thread of its own (created for that request) and
runs each sync middleware in it through a separate hop from the event loop, before and after the
view, plus a hop for the ``request_started`` signal, one for closing the response, and a task
listening for the client's disconnect (which cannot interrupt a view already running in a thread
anyway). Under ``make bench-e2e`` those hops and thread starts were a large share of the web
process's CPU, for requests that are mostly a few queries. Here a sync view's request is
one hop: in a pooled thread, the ``request_started`` signal, the request built, the sync
middleware chain (the same middleware, loaded for sync use) and the view, and the response closed
(``request_finished``, which hands the pooled database connection back from the thread that used
it); the event loop only reads the body and sends the answer. The URL is resolved once, on
arrival (to tell sync views from async ones), not again in the chain. The web CPU per request
before and after, from ``make bench-requests``: docs/benchmarks/requests.md.

Async views (the agents' long-poll) run on the event loop, through Django's handler; those marked
``without_middleware`` (the long-poll, which authenticates itself and uses no session) are called
directly, the others through Django's async chain, where each sync middleware costs two thread
hops. Without PostgreSQL (SQLite takes one writer at a time) or
inside pytest, ``controlplane/asgi.py`` uses Django's handler unchanged.
"""

from __future__ import annotations

import asyncio
import contextvars
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.core.handlers.exception import response_for_exception
from django.urls import Resolver404, get_resolver, set_script_prefix
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
        prefix = get_script_prefix(scope)
        match = _resolve(scope["path"].removeprefix(prefix) if prefix else scope["path"])
        if match is not None and iscoroutinefunction(match.func):
            # Django's way: the view runs on the loop (its match handed on, not resolved again)
            await self.handle({**scope, "tessera_match": match}, receive, send)
            return
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(prefix)
        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        try:
            serve = self._serve
            response = await loop.run_in_executor(self._pool, context.run, serve, scope, body_file, match)
            await self.send_response(response, send)
        except asyncio.CancelledError:  # the client went away while its answer was being sent
            return
        finally:
            body_file.close()
        if response.streaming:  # its iterator was consumed by the send: close it now
            await sync_to_async(response.close, thread_sensitive=False, executor=self._pool)()

    def _serve(self, scope: dict[str, Any], body_file: Any, match: Any) -> Any:
        """In a pooled thread: what Django's handler does around a sync view, and the view."""
        signals.request_started.send(sender=self.__class__, scope=scope)  # (closes old connections)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            request.tessera_match = match  # type: ignore[attr-defined]  # read by the URL routing
            response = self._sync.get_response(request)
            response._handler_class = self.__class__  # type: ignore[attr-defined]  # as Django's handler
        assert response is not None  # create_request answers a request or an error response
        if not response.streaming:
            response.close()  # request_finished: this thread's database connection goes back
        return response

    async def get_response_async(self, request: Any) -> Any:
        """The async views' chain (reached through Django's ``handle``, from :meth:`__call__`)."""
        match = request.tessera_match = request.scope["tessera_match"]
        if getattr(match.func, "without_middleware", False):
            return await self._respond_bare(request)
        return await super().get_response_async(request)

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


def _resolve(path: str) -> Any:
    """The URL's match, or None where the chain answers it (a 404, or a redirect to add a slash)."""
    try:
        return get_resolver().resolve(path)
    except Resolver404:
        return None
