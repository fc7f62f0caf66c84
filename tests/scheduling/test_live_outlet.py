"""The live outlet's batches: shortened only where no dashboard or agent could tell the difference."""

from __future__ import annotations

import os
import time
import uuid

import pytest
from asgiref.sync import async_to_sync

from controlplane.env import redis_db_url
from scheduling.services import job_bus, live, redis_flags
from scheduling.services.live import _merged

REDIS_WHY = "group membership and its expiry are the Redis channel layer's"


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


def test_the_in_memory_layer_delivers_a_batch_in_order_past_a_failed_send(monkeypatch):
    """The embedded default's layer gets a whole batch in one trip to an event loop: every member
    of each group receives its messages in the batch's order, and a send that fails loses only
    its own message."""
    from channels.layers import InMemoryChannelLayer

    class Flaky(InMemoryChannelLayer):
        async def group_send(self, group, message):
            if message.get("fail"):
                raise RuntimeError("full")
            await super().group_send(group, message)

    layer = Flaky()
    monkeypatch.setattr(live, "get_channel_layer", lambda: layer)
    a, b = async_to_sync(layer.new_channel)(), async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)("jobs.tenant.1", a)
    async_to_sync(layer.group_add)("jobs.operators", a)
    async_to_sync(layer.group_add)("jobs.operators", b)
    batch = [
        ("jobs.tenant.1", _job(1, "pending")),
        ("jobs.operators", _job(1, "pending")),
        ("jobs.operators", {**_job(2, "pending"), "fail": True}),
        ("jobs.tenant.1", _job(3, "running")),
        ("jobs.operators", _job(3, "running")),
    ]
    live._send(batch)

    def received(channel: str, n: int) -> list[tuple[int, str]]:
        out = [async_to_sync(layer.receive)(channel) for _ in range(n)]
        assert not layer.channels.get(channel)  # nothing more was sent to it
        return [(m["job"]["id"], m["job"]["state"]) for m in out]

    assert received(a, 4) == [(1, "pending"), (1, "pending"), (3, "running"), (3, "running")]
    assert received(b, 2) == [(1, "pending"), (3, "running")]


@pytest.fixture
def redis_layer(redis_url):
    """channels_redis's layer on the test run's layer database, under a prefix of its own."""
    from channels_redis.core import RedisChannelLayer

    db = int(os.environ.get("TESSERA_REDIS_LAYER_DB", "1"))
    layer = RedisChannelLayer(hosts=[redis_db_url(redis_url, db)], prefix=f"t{uuid.uuid4().hex[:8]}")
    yield layer
    async_to_sync(layer.flush)()


@pytest.mark.redis(REDIS_WHY)
def test_the_outlet_sends_to_groups_with_a_member_and_skips_the_empty_ones(redis_layer, monkeypatch):
    monkeypatch.setattr(live, "get_channel_layer", lambda: redis_layer)
    wake = {"type": "agent.wake", "start": [{"job_id": 1}], "heartbeat": False}

    async def scenario():
        await redis_layer.group_add("agent.3", "agentwake.3")
        await live.Outlet._send_all([("gpus", {"type": "gpu.update", "devices": []}), ("agent.3", wake)])
        connection = redis_layer.connection(0)
        return await redis_layer.receive("agentwake.3"), await connection.keys(f"{redis_layer.prefix}*")

    received, keys = async_to_sync(scenario)()
    assert received == wake
    assert not [key for key in keys if b"gpus" in key]  # nothing written for the empty group


@pytest.mark.redis(REDIS_WHY)
def test_with_the_pipeline_switched_off_the_outlet_uses_group_send_itself(redis_layer, monkeypatch, settings):
    """TESSERA_LIVE_PIPELINE=0: no private helper of channels_redis is called (docs/internals.md)."""
    settings.TESSERA = {**settings.TESSERA, "LIVE_PIPELINE": False}
    monkeypatch.setattr(live, "get_channel_layer", lambda: redis_layer)

    async def not_used(*args, **kwargs):
        raise AssertionError("the pipelined send ran")

    monkeypatch.setattr(live, "_group_send_all", not_used)
    update = {"type": "job.update", "job": {"id": 1, "state": "running"}}

    async def scenario():
        await redis_layer.group_add("jobs.operators", "dash.9")
        await live.Outlet._send_all([("jobs.operators", update)])
        return await redis_layer.receive("dash.9")

    assert async_to_sync(scenario)() == update


@pytest.mark.redis(REDIS_WHY)
def test_a_batch_reaches_each_member_as_one_group_send_after_another_would(redis_layer):
    batch = [
        ("jobs.operators", {"type": "job.update", "job": {"id": i, "state": "running"}}) for i in range(5)
    ] + [("gpus", {"type": "gpu.update", "devices": [{"index": 0}]})]

    async def receive_all(channel, n):
        return [await redis_layer.receive(channel) for _ in range(n)]

    async def scenario():
        mine, theirs = await redis_layer.new_channel(), await redis_layer.new_channel()
        for group in ("jobs.operators", "gpus"):
            await redis_layer.group_add(group, mine)
        await live._group_send_all(redis_layer, batch)
        got = await receive_all(mine, len(batch))
        # the same messages through channels_redis's own group_send, to another member
        for group in ("jobs.operators", "gpus"):
            await redis_layer.group_discard(group, mine)
            await redis_layer.group_add(group, theirs)
        for group, message in batch:
            await redis_layer.group_send(group, message)
        return got, await receive_all(theirs, len(batch))

    ours, theirs = async_to_sync(scenario)()
    assert ours == theirs == [message for _, message in batch]


@pytest.mark.redis(REDIS_WHY)
def test_a_group_whose_members_all_expired_has_none(redis_layer):
    async def scenario():
        await redis_layer.group_add("gpus", "dash.1")
        await redis_layer.group_add("jobs.operators", "dash.2")
        stale = time.time() - redis_layer.group_expiry - 5
        await redis_layer.connection(0).zadd(redis_layer._group_key("jobs.operators"), {"dash.2": stale})
        return await live._members(redis_layer, {"gpus", "jobs.operators", "agent.9"})

    assert async_to_sync(scenario)() == {"gpus": ["dash.1"], "jobs.operators": [], "agent.9": []}


@pytest.mark.redis(REDIS_WHY)
def test_the_outlet_wakes_the_job_bus_waiters_of_the_keys_sent_with_its_batch(redis_layer, monkeypatch):
    """The jobs' keys ride in the outlet's first round trip (its layer's connection, another
    database than the job bus's subscribers use): every waiter of the server hears them."""
    monkeypatch.setattr(live, "get_channel_layer", lambda: redis_layer)
    listener = redis_flags.client().pubsub(ignore_subscribe_messages=True)
    listener.subscribe(job_bus.channel())
    try:
        update = {"type": "job.update", "job": {"id": 4, "state": "running"}}
        async_to_sync(live.Outlet._send_all)([("jobs.operators", update)], ["job:4", "jobs", "tenant:1"])
        deadline, heard = time.monotonic() + 5, None
        while heard is None and time.monotonic() < deadline:
            heard = listener.get_message(timeout=0.5)
    finally:
        listener.close()
    assert heard is not None and job_bus._keys(heard["data"]) == ["job:4", "jobs", "tenant:1"]


@pytest.mark.redis(REDIS_WHY)
def test_with_the_pipeline_switched_off_the_keys_go_through_the_job_bus(redis_layer, monkeypatch, settings):
    settings.TESSERA = {**settings.TESSERA, "LIVE_PIPELINE": False}
    monkeypatch.setattr(live, "get_channel_layer", lambda: redis_layer)
    published: list[list[str]] = []
    monkeypatch.setattr(job_bus, "publish", published.append)
    async_to_sync(live.Outlet._send_all)([], {"jobs", "job:4"})
    assert published == [["job:4", "jobs"]]
