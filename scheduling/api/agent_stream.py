"""``/api/v1/agent/stream``: the agent's websocket, one connection for its wakes and exit reports.

What the long-poll (``agent_wait``) and ``POST exits`` do, without an HTTP request each: the
server pushes the node's wakes as they are published (``{"wake": true, "start": [...],
"heartbeat": bool}``, the long-poll's answer), and the agent sends its exit reports as
``{"id": N, "exits": [...]}`` (the ``exits`` body), answered ``{"id": N, "status": 200,
"results": [...]}`` (or ``"status": 400`` with the fields' errors, ``401`` when the credential no
longer holds, after which the server closes the socket). As HTTP requests those two cost the web
process a full request's CPU each, per job, before any work (docs/benchmarks/e2e.md).

The handshake authenticates as every agent call does (``Authorization: Node <credential>``);
a bad credential is refused there (HTTP 403). No Origin check: the credential is a header, never
a cookie a browser would send. The socket registers for its node's wakes with the process's
Redis pub/sub subscription (``scheduling.services.wake_bus``: one message per pass for all nodes;
with the in-memory layer of the embedded default, the consumer's channel joins the node's group
``agent.<id>`` instead), and takes the long-poll's named channel out of that group, so a wake is
not also queued for a long-poll nobody holds. A wake published while no socket is open is not
kept: the agent heartbeats on every (re)connection, which delivers what it
missed; the periodic heartbeat stays the source of truth (docs/agent.md, "Push"). The credential
is checked again before each wake and each report (cached for ``agent_auth.CACHE_S``, as every
agent call's): a socket whose node registered again, or was removed, is closed, so no binding
reaches an agent the control plane no longer knows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import redis
from channels.consumer import AsyncConsumer
from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from rest_framework.exceptions import ValidationError

from scheduling.api.agent_auth import forget_cached_nodes, node_for_credential
from scheduling.api.agent_wait import forget_join, node_id_for_secret, node_secret, wake_channel
from scheduling.api.agents import exit_results
from scheduling.services import redis_outage, wake_bus

STREAM_PATH = "/api/v1/agent/stream"


class AgentStream(AsyncConsumer):
    secret: str = ""
    node_id: int | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tasks: set[asyncio.Task] = set()  # exit reports being answered, wakes being sent

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except redis.RedisError as exc:
            # The layer's Redis went away under an open socket (its channel's read failed): the
            # consumer ends without its websocket_disconnect, so its wake callback goes here (left,
            # it took the node's wakes for a dead socket and kept the subscription open), and
            # the agent is told 4013 as at the handshake; the outage is logged once, not as a
            # traceback per socket from daphne.
            if self.node_id is not None and wake_bus.enabled():
                wake_bus.subscription().remove(self.node_id, self._bus_wake)
            self.node_id = None
            redis_outage.failed("an agent's stream closed (4013)", exc)
            with contextlib.suppress(Exception):  # the socket may be gone already
                await send({"type": "websocket.close", "code": 4013})

    async def websocket_connect(self, message: dict[str, Any]) -> None:
        header = dict(self.scope.get("headers", [])).get(b"authorization", b"").decode("latin1")
        secret = node_secret(header)
        node_id = await node_id_for_secret(secret)
        if secret is None or node_id is None or self.channel_layer is None:
            await self.send({"type": "websocket.close"})  # before the accept: the handshake gets 403
            return
        self.secret, self.node_id = secret, node_id
        group = f"agent.{node_id}"
        try:
            if wake_bus.enabled():  # the pass's wakes by pub/sub (services/wake_bus.py)
                await wake_bus.subscription().add(node_id, self._bus_wake)
            else:
                await self.channel_layer.group_add(group, self.channel_name)
            await self.channel_layer.group_discard(group, wake_channel(node_id))
        except (redis.RedisError, OSError, TimeoutError) as exc:
            # Redis away: no socket without its wakes. Its callback must not outlive it (it kept
            # the subscription open and took every wake of the node, for a socket never opened),
            # and the agent must not read a refusal (403: it would long-poll for 5 minutes), so
            # the socket opens and closes at once with 4013, "try again later" (1013's meaning;
            # daphne sends an application's code only if it is 1000 or 3000-4999): the agent
            # reconnects after its backoff, polling meanwhile; the outage is logged once.
            if wake_bus.enabled():
                wake_bus.subscription().remove(node_id, self._bus_wake)
            self.node_id = None
            redis_outage.failed("an agent's stream closed (4013)", exc)
            await self.send({"type": "websocket.accept"})
            await self.send({"type": "websocket.close", "code": 4013})
            return
        redis_outage.answered()
        forget_join(node_id)
        await self.send({"type": "websocket.accept"})

    def _bus_wake(self, wake: dict[str, Any]) -> None:
        self._spawn(self.agent_wake({"type": "agent.wake", **wake}))

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def websocket_receive(self, message: dict[str, Any]) -> None:
        try:
            request = json.loads(message.get("text") or message.get("bytes") or b"")
        except ValueError:
            request = None
        if not isinstance(request, dict) or not isinstance(request.get("id"), int) or "exits" not in request:
            await self._send({"id": None, "status": 400, "detail": 'Expected {"id": <int>, "exits": [...]}.'})
            return
        # Answered from a task of its own: the consumer handles one message at a time, and a wake
        # must not wait behind the database work of this node's exit reports.
        self._spawn(self._answer_exits(request))

    async def _answer_exits(self, request: dict[str, Any]) -> None:
        answer = await database_sync_to_async(self._exits)(request)
        await self._send({"id": request["id"], **answer})
        if answer["status"] == 401:
            await self.send({"type": "websocket.close", "code": 4401})

    def _exits(self, request: dict[str, Any]) -> dict[str, Any]:
        node = node_for_credential(self.secret)
        if node is None or node.pk != self.node_id:
            return {"status": 401, "detail": "A valid node credential is required."}
        try:
            return {"status": 200, "results": exit_results(node, {"exits": request["exits"]})}
        except ValidationError as exc:
            return {"status": 400, "errors": exc.detail}

    async def agent_wake(self, message: dict[str, Any]) -> None:
        if not await self._credential_holds(recheck=bool(message.get("recheck"))):
            # Replaced (the node registered again) or removed: bindings must not reach this agent.
            await self.send({"type": "websocket.close", "code": 4401})
            return
        await self._send(
            {"wake": True, "start": message.get("start", []), "heartbeat": message.get("heartbeat", True)}
        )

    async def _credential_holds(self, recheck: bool = False) -> bool:
        """Whether the socket's credential is still its node's, looked up as every agent call's
        (cached ``CACHE_S`` seconds; at once in the process that saw the node saved). ``recheck``
        (a rotation's wake): this process's cache is emptied first, so the old credential is
        refused here at once, the socket's and every later request's."""
        if recheck:
            forget_cached_nodes()
        return await node_id_for_secret(self.secret) == self.node_id

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        # Reports being settled finish (their answers are dropped; the agent sends them again by
        # HTTP, and a repeated report is recorded once).
        if self.node_id is not None:
            if wake_bus.enabled():
                wake_bus.subscription().remove(self.node_id, self._bus_wake)
            with contextlib.suppress(Exception):  # Redis gone: the membership expires by itself
                await self.channel_layer.group_discard(f"agent.{self.node_id}", self.channel_name)
        raise StopConsumer

    async def _send(self, body: dict[str, Any]) -> None:
        await self.send({"type": "websocket.send", "text": json.dumps(body)})
