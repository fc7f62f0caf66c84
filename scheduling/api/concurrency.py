"""API views served from a pool of threads under ASGI, so one slow database round trip does not
hold up every other request of the web process.

Django's ASGI handler runs every *sync* view in one thread per process (``thread_sensitive``):
requests are served one after another, and each spends most of its time waiting for PostgreSQL
(a submit is ~10 round trips and a commit). Measured under ``make bench-e2e``, that one thread was
what capped the web process, not its CPU. :func:`in_pool` turns a sync view into an async one that
runs it in a thread of its own pool (``TESSERA_WEB_THREADS``), with its own pooled database
connection, handed back when the view ends (``close_old_connections``, as Django does around a
request). Without PostgreSQL (SQLite takes one writer at a time) or inside pytest (whose test
client shares one connection and one transaction with the test), views are left as they are.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.conf import settings
from django.db import close_old_connections
from django.urls import URLPattern

_executor: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(settings.TESSERA["WEB_THREADS"], thread_name_prefix="tessera-view")
    return _executor


def _with_connection(view: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        close_old_connections()
        try:
            response = view(*args, **kwargs)
            render = getattr(response, "render", None)
            if callable(render) and not getattr(response, "is_rendered", True):
                response = render()  # DRF renders lazily: do it here, not in the shared thread
            return response
        finally:
            close_old_connections()

    return run


def in_pool(view: Callable[..., Any]) -> Callable[..., Any]:
    """``view`` run in the pool when the pool is on (see the module's docstring), else itself."""
    if not settings.TESSERA["WEB_THREADS"] or iscoroutinefunction(view):
        return view
    call = _with_connection(view)

    @functools.wraps(view)
    async def pooled(request: Any, *args: Any, **kwargs: Any) -> Any:
        return await sync_to_async(call, thread_sensitive=False, executor=_pool())(request, *args, **kwargs)

    return pooled


def pooled_patterns(patterns: list[Any]) -> list[Any]:
    """Every view of ``patterns`` (not of its includes, which do this themselves) in the pool."""
    for pattern in patterns:
        if isinstance(pattern, URLPattern):
            pattern.callback = in_pool(pattern.callback)
    return patterns
