"""Which jobs changed, for the API's waiters (``GET /jobs/ID/?wait=S`` and the event streams),
so that they answer when something happens instead of polling the database.

Every commit that changes jobs publishes their keys (``job:<id>``, ``tenant:<id>``, ``jobs``)
once, after commit (``live.publish_jobs`` calls :func:`publish_on_commit`). A waiter registers its key with
its event loop's :class:`Subscription` and is woken by an ``asyncio.Event``; it then reads the
database, which stays the truth: a lost message costs a waiter its timeout, never a wrong answer.

Across processes (``REDIS_URL`` set: passes in a Celery worker, several web processes) the keys
go through one Redis pub/sub channel, and each event loop that has waiters holds one
subscription. Without Redis (the embedded default: passes run in the web process) they go
straight to this process's loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import AsyncIterator, Iterable

import redis
import redis.asyncio
from django.conf import settings
from django.db import transaction

from scheduling.per_loop import PerLoop
from scheduling.services import redis_flags
from scheduling.services.pubsub import READY_TIMEOUT_S, listen_forever

log = logging.getLogger("tessera.live")


ALL_KEY = "jobs"  # any job changed (operators' streams)


def job_key(job_id: int) -> str:
    return f"job:{job_id}"


def tenant_key(tenant_id: int) -> str:
    return f"tenant:{tenant_id}"


def enabled() -> bool:
    """Whether keys travel through Redis (the same answer in every process of a deployment)."""
    return bool(settings.REDIS_URL)


def channel() -> str:
    return redis_flags.key("job-changes")


def publish_on_commit(keys: Iterable[str]) -> None:
    chosen = sorted(set(keys))
    if chosen:
        transaction.on_commit(lambda: publish(chosen))


def publish(keys: list[str]) -> None:
    """Wake the waiters of ``keys``, in every process. Best effort (see the module)."""
    if enabled():
        try:
            redis_flags.client().publish(channel(), json.dumps(keys))
        except redis.RedisError:
            log.warning("%d job change(s) not published", len(keys))
        return
    with _local_guard:
        subscriptions = list(_local)
    for sub in subscriptions:
        with contextlib.suppress(RuntimeError):  # its loop has closed
            sub.loop.call_soon_threadsafe(sub.dispatch, keys)


_local_guard = threading.Lock()
_local: set[Subscription] = set()  # loops with waiters, when keys do not go through Redis


class Subscription:
    """An event loop's waiters: key → the events to set when it changes."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.waiters: dict[str, set[asyncio.Event]] = {}
        self.ready = asyncio.Event()
        self.task: asyncio.Task | None = None

    async def add(self, key: str) -> asyncio.Event:
        """An event set on every change of ``key`` from now on (TimeoutError: Redis is silent)."""
        event = asyncio.Event()
        self.waiters.setdefault(key, set()).add(event)
        if not enabled():
            with _local_guard:
                _local.add(self)
            return event
        if self.task is None or self.task.done():
            self.ready.clear()
            self.task = asyncio.ensure_future(self._listen())
        try:
            await asyncio.wait_for(self.ready.wait(), READY_TIMEOUT_S)
        except TimeoutError:
            self.remove(key, event)
            raise
        return event

    def remove(self, key: str, event: asyncio.Event) -> None:
        events = self.waiters.get(key)
        if events is not None:
            events.discard(event)
            if not events:
                del self.waiters[key]
        if self.waiters:
            return
        with _local_guard:
            _local.discard(self)
        if self.task is not None:
            self.task.cancel()
            self.task = None

    def dispatch(self, keys: list[str]) -> None:
        for key in keys:
            for event in self.waiters.get(key, ()):
                event.set()

    def _wake_all(self) -> None:
        for events in self.waiters.values():
            for event in events:
                event.set()

    async def _listen(self) -> None:
        await listen_forever(
            channel(), self.ready, lambda data: self.dispatch(_keys(data)), self._wake_all, "job change"
        )


def _keys(data) -> list[str]:
    try:
        keys = json.loads(data)
    except (ValueError, TypeError):
        keys = None
    if not isinstance(keys, list):
        log.warning("a malformed job change message was ignored")
        return []
    return [k for k in keys if isinstance(k, str)]


subscription = PerLoop(Subscription).get


@contextlib.asynccontextmanager
async def watching(key: str) -> AsyncIterator[asyncio.Event]:
    """``async with watching(job_key(id)) as changed``: ``changed`` is set on each change of the
    key while inside (clear it before waiting again)."""
    sub = subscription()
    event = await sub.add(key)
    try:
        yield event
    finally:
        sub.remove(key, event)
