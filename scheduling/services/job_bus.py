"""Which jobs changed, for the API's waiters (``GET /jobs/ID/?wait=S`` and the event streams),
so that they answer when something happens instead of polling the database.

Every commit that changes jobs publishes their keys (``job:<id>``, ``tenant:<id>``, ``jobs``)
once, after commit (``live.publish_jobs``: with the Redis channel layer the live outlet sends them
with the jobs' live updates; else :func:`publish`). A waiter registers its key with
its event loop's :class:`Subscription` and is woken by an ``asyncio.Event``; it then reads the
database, which stays the truth: a lost message costs a waiter its timeout, never a wrong answer.

Across processes (``REDIS_URL`` set: passes in a Celery worker, several web processes) the keys
go through one Redis pub/sub channel, sent by each process's live outlet or publisher thread
(the keys of commits made while either sends go together in its next message), and each event
loop that has waiters holds one subscription. Without Redis (the embedded default: passes run in
the web process) they go straight to this process's loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
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
    """Wake the waiters of ``keys``, in every process. Best effort (see the module).

    Through Redis, by this process's publisher thread (:class:`Publisher`): the caller (a
    request, a pass) does not wait for Redis, and the keys of commits made while one message is
    being sent go together in the next."""
    if enabled():
        _publisher.put(keys)
        return
    with _local_guard:
        subscriptions = list(_local)
    for sub in subscriptions:
        with contextlib.suppress(RuntimeError):  # its loop has closed
            sub.loop.call_soon_threadsafe(sub.dispatch, keys)


def _send(keys: list[str]) -> None:
    try:
        redis_flags.client().publish(channel(), json.dumps(keys))
    except redis.RedisError:
        log.warning("%d job change(s) not published", len(keys))


class Publisher:
    """A thread that sends the keys put since its last message as one message.

    Nothing waits to be coalesced: an idle publisher sends at once; keys put while it sends (a
    burst of submits across request threads, a pass's chunks) go together in its next message.
    A waiter reads the database when woken, so one message naming many jobs wakes each as its
    own would have. Per submit this was a Redis round trip in the request's thread."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._keys: set[str] = set()
        self._ready = threading.Event()
        self._pid = 0  # the thread belongs to the process that started it (not to a fork)

    def put(self, keys: Iterable[str]) -> None:
        with self._guard:
            if self._pid != os.getpid():
                self._keys, self._ready = set(), threading.Event()
                threading.Thread(
                    target=self._run, args=(self._ready,), name="tessera-job-bus", daemon=True
                ).start()
                self._pid = os.getpid()
            self._keys.update(keys)
            self._ready.set()

    def _run(self, ready: threading.Event) -> None:
        while True:
            ready.wait()
            with self._guard:
                ready.clear()
                keys, self._keys = self._keys, set()
            if keys:
                _send(sorted(keys))


_publisher = Publisher()


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
