"""The agent's websocket, server side (``scheduling/api/agent_stream.py``), through the deployment's
websocket router (``controlplane.asgi``) on the in-memory channel layer.

What an agent relies on: a bad credential is refused at the handshake; a wake published to its
node's group arrives as the long-poll's answer would; exit reports are settled and answered per
report, as ``POST exits`` answers them; a bad message is a 400 naming the field, never a dropped
socket; a credential that stops holding gets 401 and the socket is closed.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from tests.agent import helpers as h

pytestmark = pytest.mark.django_db(transaction=True)
REDIS_WHY = "a pass reaches other processes' agent streams only by Redis pub/sub"


@pytest.fixture(autouse=True)
def in_memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


def _communicator(auth: str | None) -> WebsocketCommunicator:
    from controlplane.asgi import application

    headers = [(b"host", b"127.0.0.1")] + ([(b"authorization", auth.encode())] if auth else [])
    return WebsocketCommunicator(application, "/api/v1/agent/stream", headers=headers)


def _session(auth: str, *steps) -> list[Any]:
    """Connect with ``auth``, run each step (an async function of the communicator, whose result
    is kept), disconnect. Returns the connect result first."""

    async def go() -> list[Any]:
        talk = _communicator(auth)
        connected, _ = await talk.connect()
        out: list[Any] = [connected]
        if connected:
            for step in steps:
                out.append(await step(talk))
            await talk.disconnect()
        return out

    return async_to_sync(go)()


def _send(body: Any):
    async def step(talk: WebsocketCommunicator) -> Any:
        await talk.send_json_to(body) if not isinstance(body, str) else await talk.send_to(text_data=body)
        return await talk.receive_json_from(timeout=5)

    return step


@pytest.mark.parametrize("auth", [None, "Node nope", "Token abc", "Node"])
def test_a_socket_without_a_valid_node_credential_is_refused_at_the_handshake(join_token, auth):
    h.register(join_token, "gpu-01")
    assert _session(auth) == [False]


def test_a_user_token_cannot_open_a_nodes_stream(world):
    assert _session(f"Token {world.tokens['alice']}") == [False]


def test_a_wake_for_the_node_arrives_as_the_long_polls_answer(join_token):
    _, answer = h.register(join_token, "gpu-01")
    _, other = h.register(join_token, "gpu-02")
    binding = {"job_id": 5, "attempt": 0, "replica": 0, "command": ["true"]}

    async def wakes(talk: WebsocketCommunicator) -> list[Any]:
        layer = get_channel_layer()
        await layer.group_send(f"agent.{other['node_id']}", {"type": "agent.wake", "heartbeat": True})
        await layer.group_send(
            f"agent.{answer['node_id']}", {"type": "agent.wake", "start": [binding], "heartbeat": False}
        )
        first = await talk.receive_json_from(timeout=5)
        nothing_else = await talk.receive_nothing(timeout=0.2)
        return [first, nothing_else]

    connected, (wake, nothing_else) = _session(f"Node {answer['credential']}", wakes)
    assert connected and nothing_else  # the other node's wake did not come here
    assert wake == {"wake": True, "start": [binding], "heartbeat": False}


def test_exit_reports_are_settled_and_answered_each_on_its_own(world, join_token):
    _, answer = h.register(join_token, "gpu-01")
    h.register(join_token, "gpu-02")
    done = h.bind(h.submit(world.alice, world.vision), "gpu-01", [0])
    elsewhere = h.bind(h.submit(world.alice, world.vision), "gpu-02", [0])
    now = timezone.now().timestamp()
    body = {
        "id": 7,
        "exits": [
            {"job_id": done.pk, "attempt": 0, "replica": 0, "exit_code": 0, "started_at": now, "pid": 5},
            {"job_id": elsewhere.pk, "attempt": 0, "replica": 0, "exit_code": 0},  # another node's job
        ],
    }
    connected, reply, again = _session(f"Node {answer['credential']}", _send(body), _send({**body, "id": 8}))
    assert connected and reply["id"] == 7 and reply["status"] == 200
    assert [r["status"] for r in reply["results"]] == [200, 404]
    assert reply["results"][0] == {"status": 200, "state": "succeeded", "recorded": True}
    assert again["id"] == 8 and again["results"][0]["recorded"] is False  # a repeat: recorded once
    done.refresh_from_db()
    elsewhere.refresh_from_db()
    assert (done.state, elsewhere.state) == ("succeeded", "scheduled")


@pytest.mark.parametrize(
    "body, field",
    [
        ({"id": 1, "exits": []}, "exits"),
        ({"id": 2, "exits": [{"job_id": 1, "attempt": 0}]}, "exits"),
        ({"id": 3, "exits": [{"job_id": 0, "attempt": 0, "exit_code": 0}]}, "exits"),
    ],
)
def test_a_bad_report_is_a_400_naming_the_field_and_the_socket_stays_open(join_token, body, field):
    _, answer = h.register(join_token, "gpu-01")
    connected, reply, after = _session(
        f"Node {answer['credential']}", _send(body), _send({"id": 9, "exits": [_exit(1)]})
    )
    assert connected and reply["id"] == body["id"] and reply["status"] == 400 and field in reply["errors"]
    assert after["id"] == 9 and after["results"][0]["status"] == 404  # still answering


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"exits": []}', '{"id": "x", "exits": []}'])
def test_a_message_that_is_not_a_request_is_a_400(join_token, text):
    _, answer = h.register(join_token, "gpu-01")
    connected, reply = _session(f"Node {answer['credential']}", _send(text))
    assert connected and reply["status"] == 400 and reply["id"] is None and "detail" in reply


def test_a_credential_replaced_while_the_socket_is_open_gets_401_and_the_socket_closes(join_token):
    _, answer = h.register(join_token, "gpu-01")

    async def replace_then_report(talk: WebsocketCommunicator) -> list[Any]:
        from asgiref.sync import sync_to_async

        # Re-registered (its agent restarted): a new credential (this process forgets the old at once).
        await sync_to_async(h.reregister)(answer["credential"], "gpu-01")
        await talk.send_json_to({"id": 1, "exits": [_exit(1)]})
        reply = await talk.receive_json_from(timeout=5)
        closed = await talk.receive_output(timeout=5)
        return [reply, closed]

    connected, (reply, closed) = _session(f"Node {answer['credential']}", replace_then_report)
    assert connected and reply["status"] == 401
    assert closed["type"] == "websocket.close"


def test_no_wake_reaches_a_socket_whose_node_registered_again(join_token):
    _, answer = h.register(join_token, "gpu-01")

    async def replace_then_wake(talk: WebsocketCommunicator) -> dict[str, Any]:
        from asgiref.sync import sync_to_async

        await sync_to_async(h.reregister)(answer["credential"], "gpu-01")  # a new credential for the node
        await get_channel_layer().group_send(
            f"agent.{answer['node_id']}", {"type": "agent.wake", "start": [{"job_id": 1}], "heartbeat": False}
        )
        return await talk.receive_output(timeout=5)

    connected, out = _session(f"Node {answer['credential']}", replace_then_wake)
    assert connected and out["type"] == "websocket.close"  # closed, not the binding


def _exit(job_id: int) -> dict[str, Any]:
    return {"job_id": job_id, "attempt": 0, "replica": 0, "exit_code": 0}


# --- wakes by Redis pub/sub (services/wake_bus.py), where the channel layer is Redis -------------


@pytest.fixture
def redis_nodes(join_token, redis_channel_layer):
    _, mine = h.register(join_token, "bus-01")
    _, other = h.register(join_token, "bus-02")
    return mine, other


def _wake_after_commit(starts: dict[int, list[dict[str, Any]]]) -> None:
    from django.db import transaction

    from scheduling.services import live

    with transaction.atomic():  # as a pass: published once its bindings are committed
        live.wake_agents(starts)


@pytest.mark.redis(REDIS_WHY)
def test_a_pass_wakes_reach_the_nodes_stream_by_pub_sub_and_no_other_node_s(redis_nodes):
    from asgiref.sync import sync_to_async

    from scheduling.services import wake_bus

    mine, other = redis_nodes
    binding = {"job_id": 31, "attempt": 0, "replica": 0, "command": ["true"]}

    async def go() -> list[Any]:
        talk = _communicator(f"Node {mine['credential']}")
        connected, _ = await talk.connect()
        assert connected and wake_bus.enabled()
        starts = {other["node_id"]: [{"job_id": 30}], mine["node_id"]: [binding]}
        await sync_to_async(_wake_after_commit)(starts)
        got = await talk.receive_json_from(timeout=5)
        nothing_else = await talk.receive_nothing(timeout=0.3)  # not twice (the group), not node 2's
        await talk.disconnect()
        return [got, nothing_else, wake_bus.subscription().task]

    got, nothing_else, task = async_to_sync(go)()
    assert got == {"wake": True, "start": [binding], "heartbeat": False} and nothing_else
    assert task is None  # the last socket gone: the subscription closed with it


@pytest.mark.redis(REDIS_WHY)
def test_after_the_subscription_breaks_every_socket_is_asked_to_heartbeat(redis_nodes, redis_url):
    import redis

    mine, _ = redis_nodes

    async def go() -> dict[str, Any]:
        talk = _communicator(f"Node {mine['credential']}")
        connected, _ = await talk.connect()
        assert connected
        redis.Redis.from_url(redis_url).client_kill_filter(_type="pubsub")  # as a Redis restart
        got = await talk.receive_json_from(timeout=10)
        await talk.disconnect()
        return got

    assert async_to_sync(go)() == {"wake": True, "start": [], "heartbeat": True}


def _closed_with(auth: str) -> Any:
    """Connect with ``auth``; what the server sends first (a close names its code)."""

    async def go() -> Any:
        talk = _communicator(auth)
        connected, _ = await talk.connect()
        assert connected  # not a refusal: a 403 makes the agent long-poll for 5 minutes
        return await talk.receive_output(timeout=5)

    return async_to_sync(go)()


def test_a_stream_opened_while_redis_is_away_closes_with_try_again_later(join_token, settings, caplog):
    """The layer's Redis out of reach (no other change): the socket is told 4013, "try again
    later" (the agent reconnects after its backoff, heartbeating meanwhile), not a traceback in
    daphne's log per agent per attempt; the outage is logged once."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "tests.agent.helpers.UnreachableLayer"}}
    _, answer = h.register(join_token, "gpu-01")
    from scheduling.services import redis_outage

    redis_outage.forget()  # no outage left over from another test
    caplog.clear()
    _communicator(None)  # the ASGI app's set-up configures logging afresh: done before listening
    logger = logging.getLogger("tessera.redis")
    logger.addHandler(caplog.handler)
    try:
        for _ in range(3):
            assert _closed_with(f"Node {answer['credential']}") == {"type": "websocket.close", "code": 4013}
    finally:
        logger.removeHandler(caplog.handler)
    # one record (seen once or twice: by the root's handler too when nothing reset it)
    said = list(
        {
            id(r): r for r in caplog.records if r.levelno >= logging.WARNING and "Redis" in r.getMessage()
        }.values()
    )
    assert len(said) == 1 and not said[0].exc_info, [r.getMessage() for r in said]


@pytest.mark.redis(REDIS_WHY)
def test_a_stream_that_could_not_open_leaves_no_callback_taking_its_nodes_wakes(redis_nodes, monkeypatch):
    """Pub/sub answered but the layer did not (Redis going away between the two): the socket's
    wake callback, registered first, went with it (it kept the subscription open and took every
    wake of its node for a socket never opened)."""
    import redis
    from channels_redis.core import RedisChannelLayer

    from scheduling.services import wake_bus

    mine, _ = redis_nodes

    async def unreachable(*_: Any) -> None:
        raise redis.ConnectionError("Connection closed by server.")

    monkeypatch.setattr(RedisChannelLayer, "group_discard", unreachable)

    async def go() -> tuple[Any, Any]:
        talk = _communicator(f"Node {mine['credential']}")
        connected, _ = await talk.connect()
        closed = await talk.receive_output(timeout=5)
        subscription = wake_bus.subscription()
        return connected and closed, (subscription.sockets, subscription.task)

    closed, left = async_to_sync(go)()
    assert closed == {"type": "websocket.close", "code": 4013}
    assert left == ({}, None)
