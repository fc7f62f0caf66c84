"""Celery tasks: thin, safe to run twice (the pass holds an advisory lock).

The pass runs in a thread next to one long-lived event loop: the live updates it publishes
(``scheduling.services.live``, one ``async_to_sync(group_send)`` per bound job, device and node
wake-up) then reuse that loop's Redis connections. Called from a plain worker thread, each
``async_to_sync`` would make a new event loop and so a new Redis connection (~5 ms a message,
measured), which made a pass binding 50 jobs spend a second on publishing alone.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from celery import shared_task

_loop: asyncio.AbstractEventLoop | None = None
_loop_guard = threading.Lock()


def _event_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_guard:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            # One thread runs the work, so its database connection (and its advisory lock) is one.
            loop.set_default_executor(ThreadPoolExecutor(1, thread_name_prefix="tessera-pass"))
            threading.Thread(target=loop.run_forever, name="tessera-live-loop", daemon=True).start()
            _loop = loop
        return _loop


def _with_connections(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        from django.db import connections

        for conn in connections.all(initialized_only=True):
            if conn.connection is not None and not conn.is_usable():
                conn.close()  # the database dropped it (a restart): the next query reconnects
        return fn()

    return run


def run_near_loop(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in the worker's pass thread, whose ``async_to_sync`` calls use the shared loop."""
    call = sync_to_async(_with_connections(fn), thread_sensitive=False)
    return asyncio.run_coroutine_threadsafe(call(), _event_loop()).result()


@shared_task(bind=True, name="scheduling.tasks.scheduling_pass", ignore_result=True)
def scheduling_pass(self) -> None:
    from scheduling.services.passes import run_pass
    from scheduling.services.redis_flags import take_flag
    from scheduling.services.triggers import QUEUED_FLAG

    # Clear "queued" first: a request arriving from now on queues one more task, which either
    # runs after this pass or, finding the lock taken, makes this pass loop once more.
    take_flag(QUEUED_FLAG)
    if self.request.called_directly:  # a test or a shell: here, on the caller's connection
        run_pass()
    else:
        run_near_loop(run_pass)


@shared_task(bind=True, name="scheduling.tasks.node_health_sweep", ignore_result=True)
def node_health_sweep(self) -> None:
    from scheduling.services.health import sweep_nodes

    if self.request.called_directly:
        sweep_nodes()
    else:
        run_near_loop(sweep_nodes)
