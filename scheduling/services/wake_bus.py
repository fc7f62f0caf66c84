"""The agents' wakes over one Redis pub/sub channel, for their streams (``api/agent_stream.py``).

A pass publishes the wakes of all the nodes it bound jobs to as ONE message; each web process
holds ONE subscription and hands each wake to its own sockets of that node. Through the channel
layer instead, each wake was a message to the node's group, and each web process took it with
four Redis round trips one after another on its busy event loop (``channels_redis``: EVAL,
BZPOPMIN, ZADD, ZPOPMIN): under ``make bench-e2e`` that hop was the largest part of a job's
bound→started (docs/benchmarks/e2e.md).

Pub/sub keeps nothing for a process that is not subscribed: a wake published then is lost, and
the agent's heartbeat delivers its bindings (a stream's agent heartbeats when it connects, and
every poll interval). A subscription that breaks (Redis restarting) is made again, and every
socket of the process is then sent a wake that asks its agent to heartbeat at once. The agents'
long-polls keep the channel layer's groups (a named channel keeps a wake between two waits), so a
wake is published both ways. Used only where the channel layer is Redis: the embedded default's
in-memory layer carries the streams' wakes through groups, as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.conf import settings

from scheduling.per_loop import PerLoop
from scheduling.services import redis_flags
from scheduling.services.pubsub import listen_forever

log = logging.getLogger("tessera.agents")

Wake = dict[str, Any]  # {"start": [binding, ...], "heartbeat": bool}
POKE: Wake = {"start": [], "heartbeat": True}  # heartbeat now: wakes may have been missed


def enabled() -> bool:
    """Wakes go by pub/sub where the channel layer is Redis (the same in every process)."""
    return bool(settings.REDIS_URL) and isinstance(get_channel_layer(), RedisChannelLayer)


def channel() -> str:
    return redis_flags.key("agent-wakes")


def publish(wakes: dict[int, Wake]) -> None:
    """Publish ``wakes`` (node id → wake) as one message. Best effort: on a Redis error the
    agents' heartbeats deliver what the wakes carried."""
    try:
        redis_flags.client().publish(channel(), json.dumps({str(n): w for n, w in wakes.items()}))
    except redis.RedisError:
        log.warning("%d agent wake(s) not published", len(wakes))


# How long a socket's handshake waits for the subscription: under daphne's 5 s websocket handshake
# timeout, so that with Redis away the agent is told to come back later (scheduling/api/
# agent_stream.py) before daphne drops the half-open connection without a word.
SOCKET_READY_TIMEOUT_S = 3.0


class Subscription:
    """A web process's subscription (one per event loop): node id → the callbacks of its sockets.
    Subscribed while a socket is registered; closed with the last one."""

    def __init__(self) -> None:
        self.sockets: dict[int, set[Callable[[Wake], None]]] = {}
        self.ready = asyncio.Event()
        self.task: asyncio.Task | None = None

    async def add(self, node_id: int, deliver: Callable[[Wake], None]) -> None:
        """Hand ``node_id``'s wakes to ``deliver`` from now on; returns once subscribed (so nothing
        published after this returns is missed). TimeoutError if Redis does not answer."""
        self.sockets.setdefault(node_id, set()).add(deliver)
        if self.task is None or self.task.done():
            self.ready.clear()
            self.task = asyncio.ensure_future(self._listen())
        try:
            await asyncio.wait_for(self.ready.wait(), SOCKET_READY_TIMEOUT_S)
        except TimeoutError:
            self.remove(node_id, deliver)
            raise

    def remove(self, node_id: int, deliver: Callable[[Wake], None]) -> None:
        callbacks = self.sockets.get(node_id)
        if callbacks is not None:
            callbacks.discard(deliver)
            if not callbacks:
                del self.sockets[node_id]
        if not self.sockets and self.task is not None:
            self.task.cancel()
            self.task = None

    async def _listen(self) -> None:
        # on a new subscription (what was published meanwhile is lost) every socket heartbeats now
        await listen_forever(
            channel(),
            self.ready,
            lambda data: self._dispatch(_wakes(data)),
            lambda: self._dispatch({n: POKE for n in self.sockets}),
            "agent wake",
        )

    def _dispatch(self, wakes: dict[int, Wake]) -> None:
        for node_id, wake in wakes.items():
            for deliver in list(self.sockets.get(node_id, ())):
                deliver(wake)


def _wakes(data: Any) -> dict[int, Wake]:
    try:
        body = json.loads(data)
        return {int(n): w for n, w in body.items() if isinstance(w, dict)}
    except (ValueError, TypeError, AttributeError):
        log.warning("a malformed agent wake message was ignored")
        return {}


subscription = PerLoop(Subscription).get  # this event loop's (daphne runs one loop per process)
