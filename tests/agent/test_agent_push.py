"""The push half of the agent protocol: the ``wait`` long-poll answers when the node has news.

The server side runs through Django's real async request path (``AsyncClient``) on the in-memory
channel layer; the agent side drives the real loop against the recording fake.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.test import AsyncClient

from agent.client import ServerError
from tests.agent import fakes
from tests.agent import helpers as h

WAIT = h.AGENT + "wait"


@pytest.fixture
def node_credential(transactional_db, settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    _, answer = h.register(h.new_join_token(), "push-01")
    return answer["node_id"], answer["credential"]


# A plain wake (a stop order): no bindings carried, so the agent heartbeats for its orders.
WOKEN = {"wake": True, "start": [], "heartbeat": True}


def _auth(credential: str) -> dict[str, str]:
    # Per request: AsyncClient(headers=...) defaults do not reach an ASGI request's headers.
    return {"Authorization": f"Node {credential}"}


def _wait(credential: str, timeout: float, wake_after: float | None = None, node_id: int = 0):
    """GET wait; optionally publish a wake to the node's group after ``wake_after`` seconds."""

    async def go():
        client = AsyncClient()

        async def wake():
            await asyncio.sleep(wake_after)
            await get_channel_layer().group_send(f"agent.{node_id}", {"type": "agent.wake"})

        task = asyncio.ensure_future(wake()) if wake_after is not None else None
        started = time.monotonic()
        response = await client.get(WAIT, {"timeout": timeout}, headers=_auth(credential))
        if task is not None:
            await task
        return response, time.monotonic() - started

    return async_to_sync(go)()


def test_wait_answers_within_milliseconds_of_a_wake(node_credential):
    node_id, credential = node_credential
    response, took = _wait(credential, 5, wake_after=0.2, node_id=node_id)
    assert response.status_code == 200 and response.json() == WOKEN
    assert 0.2 <= took < 2.5, took  # woken, not answered at the 5 s timeout


def test_a_wake_from_another_thread_of_the_process_answers_promptly(node_credential):
    # The embedded default: passes run in a thread of the web process, with their own event loop.
    node_id, credential = node_credential
    sent: list[float] = []

    def publish_later():
        time.sleep(0.3)
        sent.append(time.monotonic())
        async_to_sync(get_channel_layer().group_send)(f"agent.{node_id}", {"type": "agent.wake"})

    publisher = threading.Thread(target=publish_later)
    publisher.start()
    response, _ = _wait(credential, 5)
    answered = time.monotonic()
    publisher.join()
    assert response.json() == WOKEN
    assert answered - sent[0] < 2.5, answered - sent[0]  # not at the 5 s timeout


def test_wait_answers_no_news_at_its_timeout(node_credential):
    _, credential = node_credential
    response, took = _wait(credential, 0.3)
    assert response.status_code == 200 and response.json() == {"wake": False}
    assert 0.3 <= took < 2.5


def test_a_wake_published_between_two_waits_is_not_lost(node_credential):
    node_id, credential = node_credential
    _wait(credential, 0.05)  # joins the node's group, then returns: the agent is "between waits"
    async_to_sync(get_channel_layer().group_send)(f"agent.{node_id}", {"type": "agent.wake"})
    response, took = _wait(credential, 5)
    assert response.json() == WOKEN and took < 2.5  # the kept wake, not the 5 s timeout


def test_a_burst_of_wakes_is_answered_once(node_credential):
    node_id, credential = node_credential
    _wait(credential, 0.05)
    for _ in range(5):
        async_to_sync(get_channel_layer().group_send)(f"agent.{node_id}", {"type": "agent.wake"})
    assert _wait(credential, 5)[0].json() == WOKEN
    assert _wait(credential, 0.2)[0].json() == {"wake": False}


def test_the_bindings_of_a_burst_of_wakes_come_in_one_answer(node_credential):
    node_id, credential = node_credential
    _wait(credential, 0.05)
    send = async_to_sync(get_channel_layer().group_send)
    send(f"agent.{node_id}", {"type": "agent.wake", "start": [{"job_id": 1}], "heartbeat": False})
    send(f"agent.{node_id}", {"type": "agent.wake", "start": [{"job_id": 2}], "heartbeat": False})
    assert _wait(credential, 5)[0].json() == {
        "wake": True,
        "start": [{"job_id": 1}, {"job_id": 2}],
        "heartbeat": False,
    }
    # A stop order's wake among them still asks for a heartbeat.
    send(f"agent.{node_id}", {"type": "agent.wake", "start": [{"job_id": 3}], "heartbeat": False})
    send(f"agent.{node_id}", {"type": "agent.wake", "heartbeat": True})
    assert _wait(credential, 5)[0].json() == {"wake": True, "start": [{"job_id": 3}], "heartbeat": True}


def test_another_nodes_wake_does_not_answer_this_node(node_credential):
    node_id, credential = node_credential
    response, _ = _wait(credential, 0.3, wake_after=0.05, node_id=node_id + 1000)
    assert response.json() == {"wake": False}


@pytest.mark.parametrize("auth", [None, "Node not-a-credential", "Token abc", "Node"])
def test_wait_refuses_anything_but_a_node_credential(transactional_db, auth):
    async def go():
        headers = {"Authorization": auth} if auth else {}
        return await AsyncClient().get(WAIT, {"timeout": 0}, headers=headers)

    response = async_to_sync(go)()
    assert response.status_code == 401 and "detail" in response.json()


@pytest.mark.parametrize("timeout", ["-1", "nan", "abc", "1e9", "56"])
def test_wait_refuses_a_bad_timeout_naming_it(node_credential, timeout):
    _, credential = node_credential

    async def go():
        return await AsyncClient().get(WAIT, {"timeout": timeout}, headers=_auth(credential))

    response = async_to_sync(go)()
    assert response.status_code == 400 and "timeout" in response.json()


def test_a_user_token_cannot_wait_as_a_node(world):
    async def go():
        headers = {"Authorization": f"Token {world.tokens['alice']}"}
        return await AsyncClient().get(WAIT, {"timeout": 0}, headers=headers)

    assert async_to_sync(go)().status_code == 401


# --- The agent's side ---------------------------------------------------------------------------


def start_reports(server: fakes.FakeServer) -> list[dict]:
    """Each reported process start: a ``started`` report, or an exit report carrying the start
    (a process that ended at once is reported once)."""
    return [
        body
        for kind, body in server.calls
        if kind == "started" or (kind == "exited" and body.get("started_at") is not None)
    ]


@pytest.fixture
def running_agent():
    server = fakes.FakeServer()
    with fakes.agent_running_against(server) as node:
        yield node, server


def test_the_agent_heartbeats_at_once_when_woken_not_at_its_next_poll(running_agent):
    node, server = running_agent
    server.orders.append(fakes.binding(job_id=7, command=["true"], gpus=[0]))
    woken_at = time.monotonic()
    server.wake()
    started = fakes.wait_for(lambda: start_reports(server), 5)
    assert started and time.monotonic() - woken_at < 2.0  # the poll interval is 30 s
    assert started[0]["job_id"] == 7
    assert abs(started[0]["started_at"] - time.time()) < 5  # the wall-clock spawn time
    assert len([c for c in server.calls if c[0] == "heartbeat"]) == 2  # the first, and the wake's


def test_bindings_carried_by_the_wake_start_at_once_without_a_heartbeat(running_agent):
    node, server = running_agent
    heartbeats = len([c for c in server.calls if c[0] == "heartbeat"])
    server.wake(start=[fakes.binding(job_id=8, command=["sleep", "30"], gpus=[1])])
    started = fakes.wait_for(lambda: start_reports(server), 5)
    assert [s["job_id"] for s in started] == [8]
    assert [r["job_id"] for r in node.running_reports()] == [8]
    assert len([c for c in server.calls if c[0] == "heartbeat"]) == heartbeats
    # Delivered again by the next heartbeat (at least once): still started only once.
    node.apply({"start": [fakes.binding(job_id=8, command=["sleep", "30"], gpus=[1])]})
    assert [r["job_id"] for r in node.running_reports()] == [8]


def test_a_process_that_ends_at_once_is_reported_by_one_exit_report_with_its_start(running_agent):
    node, server = running_agent
    server.wake(start=[fakes.binding(job_id=9, command=["true"], gpus=[0])])
    exit_ = server.exit_of(9)
    assert exit_["exit_code"] == 0 and abs(exit_["started_at"] - time.time()) < 5
    assert [c for c in server.calls if c[0] == "started"] == []


class FailsOneWait(fakes.FakeServer):
    """A long-poll that fails once (a Redis hiccup took the wake with it), then waits normally."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = threading.Event()

    def wait(self, timeout_s: float) -> dict:
        if self.orders and not self.failed.is_set():
            self.failed.set()
            raise ServerError("wait: HTTP 503")
        return super().wait(min(timeout_s, 0.2))


def test_a_failed_long_poll_makes_the_agent_fetch_its_orders_at_once():
    server = FailsOneWait()
    with fakes.agent_running_against(server) as node:
        server.orders.append(fakes.binding(job_id=11, command=["sleep", "30"], gpus=[0]))
        assert fakes.wait_for(server.failed.is_set, 5)
        # Not 30 s later at the periodic heartbeat: the heartbeat after the failure fetched it.
        assert fakes.wait_for(lambda: [r["job_id"] for r in node.running_reports()] == [11], 3)


class SlowHeartbeats(fakes.FakeServer):
    """Heartbeats after the first hang until released (a server too busy to answer them)."""

    def __init__(self) -> None:
        super().__init__()
        self.hanging = threading.Event()
        self.release = threading.Event()

    def heartbeat(
        self, running: list[dict[str, int]], utilisation: list[dict] | None = None, checkpoints=None
    ) -> dict:
        if [c for c in self.calls if c[0] == "heartbeat"]:
            self.hanging.set()
            self.release.wait(10)
        return super().heartbeat(running, utilisation)


def test_a_hanging_heartbeat_does_not_hold_up_a_pushed_binding():
    server = SlowHeartbeats()
    try:
        with fakes.agent_running_against(server) as node:
            server.wake()  # news without bindings: the agent heartbeats, which hangs
            assert fakes.wait_for(server.hanging.is_set, 5)
            server.wake(start=[fakes.binding(job_id=12, command=["sleep", "30"], gpus=[0])])
            assert fakes.wait_for(lambda: [r["job_id"] for r in node.running_reports()] == [12], 3)
            assert not server.release.is_set()
            server.release.set()
    finally:
        server.release.set()
