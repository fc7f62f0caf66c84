"""The one outlet for live updates: every push to dashboards and agents leaves here, after commit.

Groups:
- ``jobs.tenant.<tenant_id>``: full job updates for that tenant's users;
- ``jobs.operators``: every job, for operators;
- ``gpus``: per-GPU state (``gpu.update``; consumers redact other tenants' jobs to "in use" before
  sending) and nodes' own fields (``node.update``);
- ``agent.<node_id>``: wake-ups for one node's agent (new bindings, stop orders).

With the Redis channel layer, messages leave from one thread per process (:class:`Outlet`), not
from the request or the pass that made them: the commit hook only queues the message, so a submit
or a pass never waits on Redis, and the thread's one event loop reuses its Redis connections (an
``async_to_sync`` call per message from a plain thread made a new loop and a new connection each
time: docs/benchmarks/e2e.md). Messages keep their order. The thread also sends the job bus's
message for the jobs that changed (``job_bus``), in its first round trip to Redis. The in-memory
layer (the embedded default, and tests) lives inside this process and is fed at once, each batch
in one ``async_to_sync`` call.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.conf import settings
from django.db import transaction

from scheduling.models import Node
from scheduling.services import job_bus, live_seq, redis_outage, wake_bus

log = logging.getLogger("tessera.live")


Message = tuple[str, dict[str, Any]]  # (group, message)


class Outlet:
    """A thread with its own event loop that sends queued ``(group, message)`` pairs, in order,
    and the job bus's keys queued with them.

    A transaction's messages are queued together (one item), so the thread takes them in one
    batch rather than the first few of them while the rest are still being queued."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[list[Message], Sequence[str]]] = queue.SimpleQueue()
        self._guard = threading.Lock()
        self._pid = 0  # the thread belongs to the process that started it (not to a fork)

    def put(self, messages: list[Message], changed: Sequence[str]) -> None:
        if self._pid != os.getpid():
            with self._guard:
                if self._pid != os.getpid():
                    self._queue = queue.SimpleQueue()
                    threading.Thread(target=self._run, name="tessera-outlet", daemon=True).start()
                    self._pid = os.getpid()
        self._queue.put((messages, changed))

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        pending = self._queue
        while True:
            messages, keys = pending.get()
            batch, changed = list(messages), set(keys)
            while not pending.empty() and len(batch) < 500:
                messages, keys = pending.get_nowait()
                batch.extend(messages)
                changed.update(keys)
            loop.run_until_complete(self._send_all(batch, changed))

    @staticmethod
    async def _send_all(batch: list[Message], changed: Iterable[str] = ()) -> None:
        """Send ``batch``; wake the job bus's waiters of the keys ``changed``."""
        layer = get_channel_layer()
        merged = _numbered(_merged(batch))
        keys = sorted(set(changed))
        pipelined = isinstance(layer, RedisChannelLayer) and settings.TESSERA["LIVE_PIPELINE"]
        if keys and not (pipelined and job_bus.enabled()):
            job_bus.publish(keys)  # its own way: its publisher thread, or this process's loops
            keys = []
        if pipelined:
            try:
                await _group_send_all(layer, merged, keys)
            except Exception as exc:  # Redis down: live updates are best-effort, PostgreSQL keeps the truth
                redis_outage.failed(f"{len(merged)} live updates not delivered", exc)
            return
        for group, message in merged:
            try:
                await layer.group_send(group, message)
            except Exception as exc:
                redis_outage.failed(f"live update to {group} not delivered", exc)


# channels_redis's own group_send script (channels_redis/core.py, 4.2 and 4.3): each channel takes
# the message unless it holds ``capacity`` messages already; returns how many did not.
_GROUP_SEND_LUA = """
    local over_capacity = 0
    local current_time = ARGV[#ARGV - 1]
    local expiry = ARGV[#ARGV]
    for i=1,#KEYS do
        if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[i + #KEYS]) then
            redis.call('ZADD', KEYS[i], current_time, ARGV[i])
            redis.call('EXPIRE', KEYS[i], expiry)
        else
            over_capacity = over_capacity + 1
        end
    end
    return over_capacity
"""


async def _group_send_all(
    layer: RedisChannelLayer, batch: list[Message], changed: Sequence[str] = ()
) -> None:
    """``layer.group_send`` of each message of ``batch``, in order, in two round trips per shard
    for the whole batch (``group_send`` takes four per message, one after the other: that, and
    parsing their answers, was most of the outlet's CPU); the job bus's message for the keys
    ``changed`` rides in the first (:func:`_members`).

    The same steps as ``group_send``, with the layer's own helpers: each group's expired members
    are dropped and the rest read (one pipeline); then each message is written to its members'
    channels with the layer's script, after their expired messages are dropped (one pipeline).
    A group with no member (most dashboard groups, most of the time) costs nothing more. Each
    message gets a later time than the one before, as one ``group_send`` after another would
    (a channel's messages are received in the order of their times).
    """
    members = await _members(layer, {group for group, _ in batch}, changed)
    pipes: dict[int, Any] = {}
    evals: list[tuple[int, int, str, int]] = []  # (shard, position in its pipeline, group, members)
    at = 0.0
    for group, message in batch:
        channels = members.get(group)
        if not channels:
            continue
        at = max(time.time(), at + 1e-6)
        by_shard, payloads, capacities = layer._map_channel_keys_to_connection(channels, message)
        for index, keys in by_shard.items():
            pipe = pipes.get(index)
            if pipe is None:
                pipe = pipes[index] = layer.connection(index).pipeline(transaction=False)
            for key in keys:
                pipe.zremrangebyscore(key, min=0, max=int(at) - int(layer.expiry))
            evals.append((index, len(pipe), group, len(channels)))
            pipe.eval(
                _GROUP_SEND_LUA,
                len(keys),
                *keys,
                *(payloads[k] for k in keys),
                *(capacities[k] for k in keys),
                at,
                layer.expiry,
            )
    results = {index: await pipe.execute() for index, pipe in pipes.items()}
    for index, position, group, count in evals:
        if results[index][position]:
            log.info("%s of %s channels over capacity in group %s", results[index][position], count, group)


async def _members(
    layer: RedisChannelLayer, groups: set[str], changed: Sequence[str] = ()
) -> dict[str, list[str]]:
    """Each group's member channels (its expired ones dropped, as ``group_send`` drops them):
    one round trip per shard.

    With keys ``changed``, the job bus's message for them goes first in shard 0's
    pipeline: that shard is the Redis of ``REDIS_URL`` (settings.py), and a PUBLISH reaches every
    subscriber of the server whatever database its connection uses. (From the job bus's own
    thread it was a round trip more, and a thread woken, per commit: docs/benchmarks/requests.md.)"""
    oldest = int(time.time()) - layer.group_expiry
    by_shard: dict[int, list[str]] = {0: []} if changed else {}
    for group in sorted(groups):
        by_shard.setdefault(layer.consistent_hash(group), []).append(group)
    members: dict[str, list[str]] = {}
    for index, names in by_shard.items():
        pipe = layer.connection(index).pipeline(transaction=False)
        if index == 0 and changed:
            pipe.publish(job_bus.channel(), json.dumps(list(changed)))
        for group in names:
            key = layer._group_key(group)  # the layer's own name for the group's sorted set
            pipe.zremrangebyscore(key, min=0, max=oldest)
            pipe.zrange(key, 0, -1)
        answers = await pipe.execute()
        if index == 0 and changed:
            answers = answers[1:]  # the PUBLISH's: how many heard it
        for group, found in zip(names, answers[1::2], strict=True):
            members[group] = [name.decode("utf8") for name in found]
    return members


# The messages a dashboard reconciles with its snapshot by their number (``live_seq``).
DASHBOARD_TYPES = frozenset({"job.update", "gpu.update", "node.update"})


def _numbered(batch: list[Message]) -> list[Message]:
    """The batch's dashboard messages, numbered with the next live sequence number (taken after
    commit and before any is sent: ``live_seq``)."""
    if any(message.get("type") in DASHBOARD_TYPES for _, message in batch):
        seq = live_seq.take()
        if seq is not None:
            for _, message in batch:
                if message.get("type") in DASHBOARD_TYPES:
                    message["seq"] = seq
    return batch


def _merged(batch: list[Message]) -> list[Message]:
    """The batch, shortened where nothing is lost:

    - each agent's wakes merged into its first: bindings concatenated, and a heartbeat asked for
      if any of them asked (one answer wakes the agent anyway);
    - a group's updates of one job reduced to the last (each carries the job's whole state, which
      a dashboard applies over the one before): a job that starts and ends within one exit report
      costs one send per group, not two.
    """
    out: list[Message | None] = []
    wakes: dict[str, dict[str, Any]] = {}
    job_at: dict[tuple[str, Any], int] = {}
    for group, message in batch:
        kind = message.get("type")
        if kind == "job.update":
            key = (group, message["job"]["id"])
            if key in job_at:
                out[job_at[key]] = None
            job_at[key] = len(out)
            out.append((group, message))
            continue
        if kind != "agent.wake":
            out.append((group, message))
            continue
        merged = wakes.get(group)
        if merged is None:
            wakes[group] = merged = {"type": "agent.wake", "start": [], "heartbeat": False}
            out.append((group, merged))
        merged["start"] = merged["start"] + list(message.get("start", []))
        merged["heartbeat"] = merged["heartbeat"] or message.get("heartbeat", True)
    return [item for item in out if item is not None]


_outlet = Outlet()


def _send(messages: list[Message], changed: Sequence[str] = ()) -> None:
    """Send ``messages`` and wake the job bus's waiters of the keys ``changed`` (after commit)."""
    layer = get_channel_layer()
    if layer is not None and not isinstance(layer, InMemoryChannelLayer):
        _outlet.put(messages, changed)
        return
    if layer is not None:
        async_to_sync(_send_all)(layer, _numbered(messages))
    if changed:
        job_bus.publish(list(changed))


async def _send_all(layer: Any, messages: list[Message]) -> None:
    """Deliver ``messages`` in order through the in-memory layer, in one trip to an event loop: an
    ``async_to_sync`` call per message cost ~0.8 ms each (a thread hop), 0.5 s for a pass that
    changed 300 waiting jobs' reasons (two messages a job; docs/benchmarks/scheduling-pass.md)."""
    for group, message in messages:
        try:
            await layer.group_send(group, message)
        except Exception:
            log.warning("live update to %s not delivered", group, exc_info=True)


def publish_on_commit(*messages: Message) -> None:
    """Send ``messages`` after commit, in order, with one commit hook: registering a hook looks
    the connection up through asgiref's ``Local``, which cost a pass more than building the
    messages did when every message had a hook of its own."""
    if messages:
        transaction.on_commit(lambda: _send(list(messages)))


# The job's columns :func:`job_payload` reads (besides its tenant's name).
PAYLOAD_FIELDS = frozenset(
    {
        "id",
        "name",
        "tenant_id",
        "kind",
        "state",
        "gpus",
        "queue_level",
        "priority",
        "pending_reason",
        "pending_code",
        "submitted_at",
        "started_at",
        "finished_at",
        "exit_code",
    }
)


def job_payload(job) -> dict[str, Any]:
    """What a dashboard shows of a job (the tenant's own users and operators only)."""
    return {
        "id": job.pk,
        "name": job.name,
        "tenant": job.tenant.name,
        "tenant_id": job.tenant_id,
        "kind": job.kind,
        "state": job.state,
        "gpus": job.gpus,
        "queue_level": job.queue_level,
        "queue_level_name": job.queue_level_name,
        "priority": job.priority,
        "pending_reason": job.pending_reason,
        "pending_code": job.pending_code,
        "submitted_at": job.submitted_at.isoformat() if job.submitted_at else None,
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        "exit_code": job.exit_code,
    }


def publish_job(job) -> None:
    publish_jobs([job])


def publish_jobs(jobs) -> None:
    """Publish ``jobs`` after commit, in one commit hook; their API waiters are woken too (by the
    outlet, with the Redis layer: its one round trip carries both)."""
    messages = [message for job in jobs for message in job_messages(job)]
    if not messages:
        return
    keys = {key for job in jobs for key in (job_bus.job_key(job.pk), job_bus.tenant_key(job.tenant_id))}
    changed = sorted({*keys, job_bus.ALL_KEY})
    transaction.on_commit(lambda: _send(messages, changed))


def job_messages(job) -> list[Message]:
    """A job's live update: to its tenant's users and to operators."""
    payload = job_payload(job)
    return [
        (f"jobs.tenant.{job.tenant_id}", {"type": "job.update", "job": payload}),
        ("jobs.operators", {"type": "job.update", "job": payload}),
    ]


def publish_log(job_id: int) -> None:
    """A job's output grew: its streams (``GET /jobs/{id}/stream/``) read on, after commit."""
    job_bus.publish_on_commit([job_bus.job_key(job_id)])


def publish_devices(devices: list[dict[str, Any]]) -> None:
    """``devices``: [{"node", "index", "state", "job_id", "tenant_id", "tenant"}]."""
    if devices:
        publish_on_commit(("gpus", {"type": "gpu.update", "devices": devices}))


def node_payload(node) -> dict[str, Any]:
    """What every signed-in person may see of a node (nodes are shared: nothing to redact)."""
    return {
        "name": node.name,
        "rack": node.rack,
        "state": node.state,
        "kind": node.kind,
        "nvlink_domain": node.nvlink_domain,
    }


def publish_node(node) -> None:
    """A node's own fields changed (state: ready, not-ready, cordoned, draining; rack; ...)."""
    publish_on_commit(("gpus", {"type": "node.update", "node": node_payload(node)}))


def publish_nodes(**filters: Any) -> None:
    """Publish every node matching ``filters`` (after a bulk state change)."""
    for node in Node.objects.filter(**filters):
        publish_node(node)


def wake_agent(node_id: int, start: list[dict[str, Any]] | None = None) -> None:
    """Wake the node's agent after commit. ``start``: the bindings to start, carried in the wake
    so that the agent starts them at once; without them the agent heartbeats to get its orders."""
    _wake_on_commit({node_id: {"start": start or [], "heartbeat": start is None}})


def recheck_agent(node_id: int) -> None:
    """After commit: the node's streams look their credential up again, past every process's cache
    (a rotation, ``services/node_credentials.py``): one that no longer holds is closed."""
    _wake_on_commit({node_id: {"start": [], "heartbeat": True, "recheck": True}})


def wake_agents(starts: dict[int, list[dict[str, Any]]]) -> None:
    """:func:`wake_agent` with its bindings for each node of ``starts``, with one commit hook."""
    _wake_on_commit({node_id: {"start": start, "heartbeat": False} for node_id, start in starts.items()})


def _wake_on_commit(wakes: dict[int, dict[str, Any]]) -> None:
    """After commit: each wake to its node's group (the long-polls'), and all of them as one
    pub/sub message for the agents' streams where the layer is Redis (wake_bus.py)."""
    publish_on_commit(
        *((f"agent.{node_id}", {"type": "agent.wake", **wake}) for node_id, wake in sorted(wakes.items()))
    )
    if wakes and wake_bus.enabled():
        transaction.on_commit(lambda: wake_bus.publish(wakes))
