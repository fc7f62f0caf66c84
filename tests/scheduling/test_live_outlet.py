"""The live outlet's batches: shortened only where no dashboard or agent could tell the difference."""

from __future__ import annotations

import os
import time
import uuid

import pytest
from asgiref.sync import async_to_sync

from controlplane.env import redis_db_url
from scheduling.services import live
from scheduling.services.live import _merged


def _job(job_id: int, state: str) -> dict:
    return {"type": "job.update", "job": {"id": job_id, "state": state}}


def test_a_groups_updates_of_one_job_are_reduced_to_the_last():
    batch = [
        ("jobs.tenant.1", _job(7, "running")),
        ("jobs.operators", _job(7, "running")),
        ("jobs.tenant.1", _job(8, "pending")),
        ("jobs.tenant.1", _job(7, "succeeded")),
        ("jobs.operators", _job(7, "succeeded")),
        ("gpus", {"type": "gpu.update", "devices": []}),
    ]
    assert _merged(batch) == [
        ("jobs.tenant.1", _job(8, "pending")),
        ("jobs.tenant.1", _job(7, "succeeded")),
        ("jobs.operators", _job(7, "succeeded")),
        ("gpus", {"type": "gpu.update", "devices": []}),
    ]


def test_an_agents_wakes_are_merged_into_one_carrying_every_binding():
    batch = [
        ("agent.3", {"type": "agent.wake", "start": [{"job_id": 1}], "heartbeat": False}),
        ("agent.4", {"type": "agent.wake", "heartbeat": True}),
        ("agent.3", {"type": "agent.wake", "start": [{"job_id": 2}], "heartbeat": False}),
    ]
    assert _merged(batch) == [
        ("agent.3", {"type": "agent.wake", "start": [{"job_id": 1}, {"job_id": 2}], "heartbeat": False}),
        ("agent.4", {"type": "agent.wake", "start": [], "heartbeat": True}),
    ]


@pytest.fixture
def redis_layer(redis_url):
    """channels_redis's layer on the test run's layer database, under a prefix of its own."""
    from channels_redis.core import RedisChannelLayer

    db = int(os.environ.get("TESSERA_REDIS_LAYER_DB", "1"))
    layer = RedisChannelLayer(hosts=[redis_db_url(redis_url, db)], prefix=f"t{uuid.uuid4().hex[:8]}")
    yield layer
    async_to_sync(layer.flush)()


def test_the_outlet_sends_to_groups_with_a_member_and_skips_the_empty_ones(redis_layer, monkeypatch):
    sent: list[str] = []
    send = redis_layer.group_send

    async def spy(group, message):
        sent.append(group)
        await send(group, message)

    monkeypatch.setattr(redis_layer, "group_send", spy)
    monkeypatch.setattr(live, "get_channel_layer", lambda: redis_layer)
    wake = {"type": "agent.wake", "start": [{"job_id": 1}], "heartbeat": False}

    async def scenario():
        await redis_layer.group_add("agent.3", "agentwake.3")
        await live.Outlet._send_all([("gpus", {"type": "gpu.update", "devices": []}), ("agent.3", wake)])
        return await redis_layer.receive("agentwake.3")

    assert async_to_sync(scenario)() == {"type": "agent.wake", "start": [{"job_id": 1}], "heartbeat": False}
    assert sent == ["agent.3"]


def test_a_group_whose_members_all_expired_is_not_heard(redis_layer):
    async def scenario():
        await redis_layer.group_add("gpus", "dash.1")
        await redis_layer.group_add("jobs.operators", "dash.2")
        stale = time.time() - redis_layer.group_expiry - 5
        await redis_layer.connection(0).zadd(redis_layer._group_key("jobs.operators"), {"dash.2": stale})
        return await live._groups_heard(redis_layer, {"gpus", "jobs.operators", "agent.9"})

    assert async_to_sync(scenario)() == {"gpus"}


def test_without_redis_the_outlet_sends_to_every_group():
    from channels.layers import InMemoryChannelLayer

    assert async_to_sync(live._groups_heard)(InMemoryChannelLayer(), {"gpus"}) is None
