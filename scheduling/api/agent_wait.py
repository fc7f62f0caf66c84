"""``GET /api/v1/agent/wait?timeout=S``: the agent's long-poll, the push half of the protocol.

The view is ``async``: Django's ASGI handler runs every *sync* view in one shared thread, so a
sync view that waited 25 s would stall the whole web process. This one parks an asyncio task
instead, and answers as soon as the channel layer delivers a message to the node's group
``agent.<node_id>`` (``scheduling.services.live.wake_agent`` publishes ``{"type": "agent.wake"}``
there after the commit of a binding or a stop order), or when the timeout runs out. A pass's wake
carries its bindings (``start``), which the agent starts at once; any other wake (a stop order)
asks for a heartbeat (``heartbeat: true``), which fetches the orders (docs/operations.md, "Push").
The heartbeat stays the source of truth: a lost wake costs latency, never a job.

No wake is lost between two waits: the view listens on a *named* channel per node
(``agentwake.<node_id>``, not a per-request one), which stays a member of the group, so a wake
published while the agent is between two requests waits in the channel (the layer keeps it for
its expiry, 60 s) and the next request returns at once. Stale wakes cost one heartbeat, no more.

Authentication is the node credential only (``Authorization: Node <credential>``), checked in a
worker thread through ``sync_to_async``, as everywhere else on the agent API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import connection
from django.http import HttpRequest, JsonResponse

from scheduling.api.agent_auth import NODE_KEYWORD, cached_node, node_for_credential
from scheduling.per_loop import PerLoop

log = logging.getLogger("tessera.agents")

DEFAULT_TIMEOUT_S = 25.0
MAX_TIMEOUT_S = 55.0  # below common proxies' 60 s idle limit
IN_PROCESS_SLICE_S = 0.05  # see _receive
DRAIN_S = 0.002  # after a wake, take the wakes right behind it too (one heartbeat for a burst)
REJOIN_S = 60.0  # how often a node's wake channel joins its group again (see _LoopState)


def wake_channel(node_id: int) -> str:
    return f"agentwake.{node_id}"


def node_secret(header: str) -> str | None:
    parts = header.split()
    if len(parts) != 2 or parts[0].lower() != NODE_KEYWORD.lower():
        return None
    return parts[1]


def _node_id_for(secret: str) -> int | None:
    node = node_for_credential(secret)
    # Give the connection back now, not when this request ends 25 s later: with a connection
    # pool, sixteen waiting agents would otherwise hold sixteen connections doing nothing.
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        connection.close()
    return node.pk if node is not None else None


async def node_id_for_secret(secret: str | None) -> int | None:
    """The node whose credential ``secret`` is (:func:`node_secret` of a header), or None: from
    this process's cache when it can (no thread hop, no query), else looked up in a thread."""
    if not secret:
        return None
    cached = cached_node(secret)
    return cached.pk if cached is not None else await sync_to_async(_node_id_for)(secret)


def _timeout_of(request: HttpRequest) -> float | None:
    raw = request.GET.get("timeout", "")
    if raw == "":
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        return None
    if not 0 <= value <= MAX_TIMEOUT_S:  # NaN fails this too
        return None
    return value


class _Receiver:
    """One ``receive`` on a node's wake channel (Redis layer), never cancelled.

    Cancelling the Redis layer's ``receive`` (at a wait's timeout, or after a short drain) can
    drop a wake that Redis handed over just then, and it closes that Redis connection (a new one
    for the next wait: measured, every wait reconnected). So a wait that times out leaves its
    receive running, and the node's next wait in this process takes it up. A message that
    arrives while no wait is attached is sent back to the channel, for the next wait here or in
    another web process.
    """

    def __init__(self, layer, channel: str, receivers: dict[str, _Receiver]) -> None:
        self.layer, self.channel, self.receivers = layer, channel, receivers
        self.waiters = 0
        self.task = asyncio.ensure_future(layer.receive(channel))
        self.task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        failed = task.cancelled() or task.exception() is not None  # (marks the error as seen)
        if self.receivers.get(self.channel) is self and (self.waiters == 0 or failed):
            del self.receivers[self.channel]
        if self.waiters == 0 and not failed:
            asyncio.ensure_future(self._put_back(task.result()))

    async def _put_back(self, message: dict) -> None:
        try:
            await self.layer.send(self.channel, message)
        except Exception:  # noqa: BLE001 - Redis down: the wake is lost, the heartbeat is not
            log.warning("wake for %s not put back", self.channel)

    async def next(self, timeout: float) -> dict:
        self.waiters += 1
        try:
            done, _ = await asyncio.wait({self.task}, timeout=max(0.0, timeout))
        finally:
            self.waiters -= 1
        if not done:
            raise TimeoutError
        if self.receivers.get(self.channel) is self:
            del self.receivers[self.channel]
        return self.task.result()


class _LoopState:
    """Per event loop (daphne runs one): receives in flight, and when each channel last joined its
    node's group (re-joined every ``REJOIN_S``: the group's membership lasts a day in the layer)."""

    def __init__(self) -> None:
        self.receivers: dict[str, _Receiver] = {}
        self.joined: dict[str, float] = {}


_state = PerLoop(_LoopState).get


async def _join(layer, node_id: int, channel: str) -> None:
    joined = _state().joined
    now = time.monotonic()
    if now - joined.get(channel, -REJOIN_S) >= REJOIN_S:
        await layer.group_add(f"agent.{node_id}", channel)
        joined[channel] = now


def forget_join(node_id: int) -> None:
    """The node's wake channel was taken out of its group (its agent streams now): a later wait in
    this process joins it again at once. (Another web process may take up to ``REJOIN_S`` to.)"""
    _state().joined.pop(wake_channel(node_id), None)


async def _receive(layer, channel: str, deadline: float) -> dict:
    """Wait for a message on ``channel`` until ``deadline`` (raises TimeoutError).

    The Redis layer: through the channel's :class:`_Receiver`, never cancelled. The in-memory
    layer (the embedded default) is fed by the scheduling thread of this same process, from
    another event loop: its put does not wake this loop, so it is looked at in short slices
    (50 ms; cancelling its receive loses nothing).
    """
    if not isinstance(layer, InMemoryChannelLayer):
        receivers = _state().receivers
        receiver = receivers.get(channel)
        if receiver is None:
            receiver = receivers[channel] = _Receiver(layer, channel, receivers)
        return await receiver.next(deadline - time.monotonic())
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        try:
            return await asyncio.wait_for(layer.receive(channel), min(IN_PROCESS_SLICE_S, left))
        except TimeoutError:
            continue


def _answer(messages: list[dict]) -> dict:
    """The wake answer for what arrived: the bindings they carried, and whether the agent must
    heartbeat (a stop order, or a wake from an older server that carried no bindings)."""
    start = [b for m in messages for b in m.get("start", [])]
    return {"wake": True, "start": start, "heartbeat": any(m.get("heartbeat", True) for m in messages)}


async def agent_wait(request: HttpRequest) -> JsonResponse:
    """Answer ``{"wake": true, "start": [...], "heartbeat": bool}`` when the node has news,
    ``{"wake": false}`` on timeout."""
    if request.method != "GET":
        return JsonResponse({"detail": f'Method "{request.method}" not allowed.'}, status=405)
    node_id = await node_id_for_secret(node_secret(request.headers.get("Authorization", "")))
    if node_id is None:
        response = JsonResponse({"detail": "A valid node credential is required."}, status=401)
        response["WWW-Authenticate"] = NODE_KEYWORD
        return response
    timeout = _timeout_of(request)
    if timeout is None:
        return JsonResponse({"timeout": [f"A number of seconds, 0..{MAX_TIMEOUT_S:g}."]}, status=400)
    layer = get_channel_layer()
    if layer is None:  # no channel layer: nothing can push; the agent keeps polling
        await asyncio.sleep(timeout)
        return JsonResponse({"wake": False})
    channel = wake_channel(node_id)
    deadline = time.monotonic() + timeout
    errors = 0
    while True:
        try:
            await _join(layer, node_id, channel)
            messages = [await _receive(layer, channel, deadline)]
            break
        except TimeoutError:
            return JsonResponse({"wake": False})
        except Exception as exc:  # noqa: BLE001 - a Redis read timed out under load, or Redis is down
            _state().joined.pop(channel, None)
            errors += 1
            if errors >= 3 or time.monotonic() + 0.5 >= deadline:
                log.warning("agent wait for node %s failed: %s", node_id, exc)
                # The agent falls back to its periodic heartbeat until the layer answers again.
                return JsonResponse({"detail": "The live channel is unavailable."}, status=503)
            await asyncio.sleep(0.2)
    with contextlib.suppress(Exception):
        while True:  # a burst of wakes (one per binding) → one answer
            messages.append(await _receive(layer, channel, time.monotonic() + DRAIN_S))
    return JsonResponse(_answer(messages))


# Served without Django's middleware by the pooled handler (controlplane/pooled_handler.py): this
# view authenticates the node itself and needs no session, CSRF or frame headers.
agent_wait.without_middleware = True  # type: ignore[attr-defined]
