"""The agents' long-poll on the Redis channel layer, as daphne runs it: one event loop per process.

A wait that times out leaves its receive running for the node's next wait (a cancelled Redis
receive could drop a wake handed over just then); a wake that arrives while no wait is attached
goes back to the channel, so the node's next wait gets it even in another web process (here:
another event loop).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.test import AsyncClient

from tests.agent import helpers as h

WAIT = h.AGENT + "wait"
WOKEN = {"wake": True, "start": [{"job_id": 7}], "heartbeat": False}

pytestmark = [
    pytest.mark.services,
    pytest.mark.redis("a wake crosses web processes only through the Redis channel layer"),
]


@pytest.fixture
def node(transactional_db, redis_channel_layer):
    _, answer = h.register(h.new_join_token(), "wait-01")
    return answer["node_id"], {"Authorization": f"Node {answer['credential']}"}


async def _wait(auth: dict[str, str], timeout: float):
    started = time.monotonic()
    response = await AsyncClient().get(WAIT, {"timeout": timeout}, headers=auth)
    return response.json(), time.monotonic() - started


def _wake() -> dict:
    return {"type": "agent.wake", "start": [{"job_id": 7}], "heartbeat": False}


def test_a_wake_after_a_timed_out_wait_answers_the_next_wait_in_the_same_process(node):
    node_id, auth = node

    async def go():
        assert (await _wait(auth, 0.05))[0] == {"wake": False}
        await get_channel_layer().group_send(f"agent.{node_id}", _wake())
        return await _wait(auth, 5)

    answer, took = async_to_sync(go)()
    assert answer == WOKEN and took < 1.0


def test_a_wake_no_wait_was_attached_for_goes_back_to_the_channel_for_another_process(node):
    node_id, auth = node

    async def first_process():
        assert (await _wait(auth, 0.05))[0] == {"wake": False}  # its receive stays, unattached
        await get_channel_layer().group_send(f"agent.{node_id}", _wake())
        await asyncio.sleep(0.3)  # the receive takes the wake and, no wait attached, puts it back

    async_to_sync(first_process)()
    answer, took = async_to_sync(_wait)(auth, 5)  # another event loop: another web process
    assert answer == WOKEN and took < 1.0
