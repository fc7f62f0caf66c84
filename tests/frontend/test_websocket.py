"""The dashboard's websocket: who receives what, over the real consumer stack (session auth,
origin check, groups) and, where Redis answers, over the Redis channel layer.

Who may see what: alice and carol (tenant vision) see vision's jobs; bob (nlp) sees the GPUs that
vision uses only as "in use", never a vision job's id, name or tenant; admin (operator) sees all.
Jobs move through the real services: submitted over the REST API, bound by a scheduling pass,
started and finished through the job services.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator

from tests.frontend.helpers import expanded, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)
REDIS_WHY = "updates cross from the pass's process to the web's only through the Redis channel layer"

TERMINAL = {"succeeded", "failed", "cancelled"}


@pytest.fixture
def redis_layer(redis_url: str, settings: Any) -> Iterator[str]:
    """Channels over Redis, on its own database (/5) and under a prefix of its own, so parallel
    test runs on one machine cannot hear each other; its keys are deleted before and after."""
    import redis

    from controlplane.env import redis_db_url

    url = redis_db_url(redis_url, 5)
    prefix = f"tessera-test-{uuid.uuid4().hex[:12]}"
    client = redis.Redis.from_url(url)

    def flush() -> None:
        for key in client.scan_iter(match=prefix + "*"):
            client.delete(key)

    flush()
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [url], "prefix": prefix},
        }
    }
    yield url
    flush()
    client.close()


def communicator(cookie: str | None) -> WebsocketCommunicator:
    from controlplane.asgi import application

    headers = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
    if cookie is not None:
        headers.append((b"cookie", cookie.encode()))
    return WebsocketCommunicator(application, "/ws/dashboard/", headers=headers)


async def open_socket(user: Any) -> WebsocketCommunicator:
    comm = communicator(await sync_to_async(session_cookie)(user))
    connected, _ = await comm.connect(timeout=5)
    assert connected
    ready = await comm.receive_json_from(timeout=5)
    assert ready["type"] == "ready"
    return comm


async def drain(comm: WebsocketCommunicator, quiet_s: float = 0.5) -> list[dict[str, Any]]:
    """Everything the socket holds until it has been quiet for ``quiet_s``."""
    out = []
    # receive_nothing leaves the consumer running (a timed-out receive would cancel it).
    while not await comm.receive_nothing(timeout=quiet_s):
        out.append(await comm.receive_json_from(timeout=5))
    return out


def submit(world: Any, who: str, name: str, gpus: int = 2) -> int:
    response = world.client(who).post(
        "/api/v1/jobs/",
        {"name": name, "kind": "training", "command": ["python", "-c", "pass"], "gpus": gpus},
        format="json",
    )
    assert response.status_code == 201, response.content
    return response.json()["id"]


def run_job_to_success(job_id: int) -> None:
    """Bind it (a pass), start it and let it exit 0, as the agent's reports would."""
    from django.db import transaction

    from scheduling.models import Job
    from scheduling.services.jobs import do_mark_running, do_record_exit
    from scheduling.services.passes import run_pass

    run_pass()
    for step in (do_mark_running, lambda job: do_record_exit(job, 0)):
        with transaction.atomic():
            job = Job.objects.select_for_update().select_related("tenant").get(pk=job_id)
            step(job)


def states_of(messages: list[dict[str, Any]], job_id: int) -> list[str]:
    return [m["job"]["state"] for m in messages if m["type"] == "job.update" and m["job"]["id"] == job_id]


def test_anonymous_connection_is_refused(db: Any) -> None:
    async def scenario() -> tuple[bool, int | None]:
        return await communicator(None).connect(timeout=5)

    connected, code = async_to_sync(scenario)()
    assert not connected
    assert code == 4401


@pytest.mark.services
@pytest.mark.redis(REDIS_WHY)
def test_alice_receives_her_jobs_changes_and_bob_receives_none_of_its_details(
    world: Any, cluster: Any, redis_layer: str
) -> None:
    from channels.layers import get_channel_layer
    from channels_redis.core import RedisChannelLayer

    assert isinstance(get_channel_layer(), RedisChannelLayer)

    async def scenario() -> tuple[int, list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        alice, bob, admin = [await open_socket(u) for u in (world.alice, world.bob, world.admin)]
        job_id = await sync_to_async(submit)(world, "alice", "vision-secret-run")
        await sync_to_async(run_job_to_success)(job_id)
        got = [await drain(c) for c in (alice, bob, admin)]
        for c in (alice, bob, admin):
            await c.disconnect()
        return job_id, *got

    job_id, to_alice, to_bob, to_admin = async_to_sync(scenario)()

    assert states_of(to_alice, job_id) == ["pending", "scheduled", "running", "succeeded"]
    assert states_of(to_admin, job_id)[-1] == "succeeded"
    # bob saw the GPUs being taken and freed, as "in use" only...
    bob_gpus = [d for m in to_bob if m["type"] == "gpu.update" for d in m["devices"]]
    assert any(d["others"] > 0 for d in bob_gpus)
    assert any(d["state"] == "free" for d in bob_gpus)
    # ...and nothing of alice's job: no update, no id, no name, no tenant.
    assert [m for m in to_bob if m["type"] == "job.update"] == []
    assert all(d["jobs"] == [] for d in bob_gpus)
    raw = json.dumps(to_bob)
    assert "vision-secret-run" not in raw and "vision" not in raw


def test_carol_sees_her_teammates_job_on_the_gpus_it_holds(world: Any, cluster: Any) -> None:
    async def scenario() -> tuple[int, list[dict[str, Any]]]:
        carol = await open_socket(world.carol)
        job_id = await sync_to_async(submit)(world, "alice", "shared-by-the-team")
        from scheduling.services.passes import run_pass

        await sync_to_async(run_pass)()
        got = await drain(carol)
        await carol.disconnect()
        return job_id, got

    job_id, to_carol = async_to_sync(scenario)()
    held = [d for m in to_carol if m["type"] == "gpu.update" for d in m["devices"] if d["jobs"]]
    assert len(held) == 2
    assert {j["job_id"] for d in held for j in d["jobs"]} == {job_id}
    assert states_of(to_carol, job_id) == ["pending", "scheduled"]


def test_a_job_update_outside_the_viewers_tenant_is_dropped_even_if_it_reaches_its_group(
    world: Any, cluster: Any
) -> None:
    """Defence in depth: a misrouted message (a bug in a publisher) still never reaches bob."""
    from channels.layers import get_channel_layer

    async def scenario() -> list[dict[str, Any]]:
        bob = await open_socket(world.bob)
        layer = get_channel_layer()
        misrouted = {
            "id": 1,
            "name": "vision-job",
            "tenant": "vision",
            "tenant_id": world.vision.pk,
            "state": "running",
        }
        await layer.group_send(f"jobs.tenant.{world.nlp.pk}", {"type": "job.update", "job": misrouted})
        got = await drain(bob)
        await bob.disconnect()
        return got

    assert async_to_sync(scenario)() == []


# --- snapshot plus deltas (docs/websockets.md) -------------------------------------------------


def apply_delta(model: dict[str, Any], message: dict[str, Any]) -> None:
    """The page's rule (frontend/static/frontend/dashboard.js, applyDelta), restated."""
    if message["type"] == "job.update":
        job = message["job"]
        if job["state"] in TERMINAL:
            model["jobs"].pop(job["id"], None)
        else:
            model["jobs"][job["id"]] = job
    elif message["type"] == "node.update":
        model["nodes"][message["node"]["name"]].update(message["node"])
    elif message["type"] == "gpu.update":
        for row in message["devices"]:
            model["nodes"][row["node"]]["devices"][row["index"]] = row


def as_model(snapshot: dict[str, Any]) -> dict[str, Any]:
    nodes = {n["name"]: {**n, "devices": {d["index"]: d for d in n["devices"]}} for n in snapshot["nodes"]}
    return {"nodes": nodes, "jobs": {j["id"]: j for j in snapshot["jobs"]}}


def cordon(name: str) -> None:
    """An operator cordons a node (no service owns this write yet: the outlet is called here)."""
    from django.db import transaction

    from scheduling.models import Node
    from scheduling.services import live

    with transaction.atomic():
        node = Node.objects.select_for_update().get(name=name)
        node.state = "cordoned"
        node.save(update_fields=["state"])
        live.publish_node(node)


@pytest.mark.parametrize("who", ["alice", "bob", "admin"])
def test_applying_pushed_deltas_to_a_snapshot_equals_fetching_again(
    world: Any, cluster: Any, who: str
) -> None:
    from django.test import Client

    user = getattr(world, who)
    browser = Client()
    browser.force_login(user)

    def fetch() -> dict[str, Any]:
        response = browser.get("/dashboard/state.json")
        assert response.status_code == 200
        return expanded(response.json())

    async def scenario() -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
        comm = await open_socket(user)
        before = await sync_to_async(fetch)()
        finished = await sync_to_async(submit)(world, "alice", "finishes", gpus=2)
        await sync_to_async(run_job_to_success)(finished)
        await sync_to_async(submit)(world, "alice", "keeps-running", gpus=4)
        await sync_to_async(submit)(world, "bob", "bobs-share", gpus=1)
        await sync_to_async(submit)(world, "bob", "too-big-to-fit", gpus=8)
        from scheduling.services.passes import run_pass

        await sync_to_async(run_pass)()
        await sync_to_async(cordon)("n02")
        deltas = await drain(comm)
        after = await sync_to_async(fetch)()
        await comm.disconnect()
        return before, deltas, after

    before, deltas, after = async_to_sync(scenario)()
    assert deltas, "the scenario must push something"
    model = as_model(before)
    for message in deltas:
        apply_delta(model, message)
    assert model == as_model(after)
    assert model != as_model(before)


def newer_than(snapshot: dict[str, Any], deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The page's reconciling rule: a frame numbered at most the snapshot's is shown by it already."""
    return [m for m in deltas if m["seq"] > snapshot["seq"]]


def test_a_snapshot_asked_for_while_the_socket_joins_loses_no_change(world: Any, cluster: Any) -> None:
    """The page asks for its snapshot and opens its socket side by side. A snapshot read before
    the socket joined, with a change in between, is numbered below the socket's "ready" (so the
    page fetches again); the next is not, and it plus the frames numbered above it equals a
    fresh fetch, whether a frame came before it was read or after."""
    from django.test import Client

    from scheduling.services.passes import run_pass

    browser = Client()
    browser.force_login(world.alice)

    def fetch() -> dict[str, Any]:
        response = browser.get("/dashboard/state.json")
        assert response.status_code == 200
        return expanded(response.json())

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[Any], dict[str, Any]]:
        early = await sync_to_async(fetch)()
        await sync_to_async(submit)(world, "alice", "while-joining", gpus=2)
        await sync_to_async(run_pass)()  # its GPUs taken before the socket joined: missed by it
        comm = communicator(await sync_to_async(session_cookie)(world.alice))
        assert (await comm.connect(timeout=5))[0]
        ready = await comm.receive_json_from(timeout=5)
        await sync_to_async(submit)(world, "alice", "before-the-second-read", gpus=1)
        await sync_to_async(run_pass)()
        second = await sync_to_async(fetch)()
        await sync_to_async(submit)(world, "alice", "after-it", gpus=4)
        await sync_to_async(run_pass)()
        deltas = await drain(comm)
        after = await sync_to_async(fetch)()
        await comm.disconnect()
        return early, ready, second, deltas, after

    early, ready, second, deltas, after = async_to_sync(scenario)()
    assert early["seq"] < ready["seq"], "the early snapshot missed a change: its number must say so"
    assert second["seq"] >= ready["seq"]
    assert all(m["seq"] > ready["seq"] for m in deltas)  # none the socket could have missed
    assert any(m["seq"] <= second["seq"] for m in deltas)  # shown by the second snapshot already
    model = as_model(second)
    for message in newer_than(second, deltas):
        apply_delta(model, message)
    assert model == as_model(after)


def test_garbage_from_a_client_is_ignored_and_the_socket_keeps_answering(world: Any) -> None:
    async def scenario() -> dict[str, Any]:
        comm = await open_socket(world.alice)
        await comm.send_to(text_data="not json {")
        await comm.send_to(bytes_data=b"\xff\x00")
        await comm.send_to(text_data='["a list"]')
        await comm.send_json_to({"type": "ping"})
        answer = await comm.receive_json_from(timeout=5)
        await comm.disconnect()
        return answer

    assert async_to_sync(scenario)() == {"type": "pong"}


async def closed_while_the_other_answers(
    comm: WebsocketCommunicator, other: WebsocketCommunicator, timeout: float = 5
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What ``comm`` is sent next (its close, if closed) and ``other``'s answer to a ping."""
    closed = await comm.receive_output(timeout=timeout)
    await other.send_json_to({"type": "ping"})
    answer = await other.receive_json_from(timeout=5)
    await other.disconnect()
    return closed, answer


def test_signing_out_closes_that_sessions_sockets_and_no_other(world: Any) -> None:
    """A socket authenticated its session once, at the handshake: signing out must end it (close
    code 4401, as a refused handshake), or a tab left open keeps receiving the team's jobs."""
    from django.test import Client

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        cookie = await sync_to_async(session_cookie)(world.alice)
        comm = communicator(cookie)
        assert (await comm.connect(timeout=5))[0]
        assert (await comm.receive_json_from(timeout=5))["type"] == "ready"
        other = await open_socket(world.alice)  # alice signed in elsewhere: another session

        def sign_out() -> int:
            client = Client()
            name, _, value = cookie.partition("=")
            client.cookies[name] = value
            return client.post("/logout/").status_code

        assert await sync_to_async(sign_out)() == 302
        return await closed_while_the_other_answers(comm, other)

    closed, answer = async_to_sync(scenario)()
    assert closed == {"type": "websocket.close", "code": 4401}
    assert answer == {"type": "pong"}  # her other session's socket is left open


def test_a_socket_ends_when_its_session_expires_without_a_sign_out(world: Any) -> None:
    """A tab left open past its session's expiry (no sign-out to tell the socket) must stop
    receiving the team's jobs: the socket is closed as a refused handshake (4401), and a socket
    of a session that still stands is left open."""
    from django.conf import settings
    from django.test import Client

    def short_session() -> str:
        client = Client()
        client.force_login(world.alice)
        session = client.session
        session.set_expiry(2)
        session.save()
        return f"{settings.SESSION_COOKIE_NAME}={session.session_key}"

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        comm = communicator(await sync_to_async(short_session)())
        assert (await comm.connect(timeout=5))[0]
        assert (await comm.receive_json_from(timeout=5))["type"] == "ready"
        lasting = await open_socket(world.alice)
        return await closed_while_the_other_answers(comm, lasting, timeout=10)

    closed, answer = async_to_sync(scenario)()
    assert closed == {"type": "websocket.close", "code": 4401}
    assert answer == {"type": "pong"}


def test_a_socket_is_closed_when_its_users_team_changes_and_rejoins_as_the_new_viewer(
    world: Any, cluster: Any
) -> None:
    """A socket picks its groups (its viewer's tenant) once, when it joins: moving bob from nlp to
    vision must end his socket (it reconnects as a member of vision), or it goes on receiving
    nlp's jobs. The close code is not 4401: the page reconnects rather than signing out."""
    from scheduling.models import Membership, Tenant

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
        bob = await open_socket(world.bob)
        alice = await open_socket(world.alice)

        def move_bob() -> None:
            membership = Membership.objects.get(user=world.bob)
            membership.tenant = Tenant.objects.get(name="vision")
            membership.save()

        await sync_to_async(move_bob)()
        closed = await bob.receive_output(timeout=5)
        again = await open_socket(world.bob)
        alice_left = await drain(alice)  # alice's membership did not change: her socket stays
        await alice.disconnect()
        job_id = await sync_to_async(submit)(world, "bob", name="bob-now-in-vision")
        frames = await drain(again)
        await again.disconnect()
        return closed, {"job": job_id, "alice": alice_left}, frames

    closed, seen, frames = async_to_sync(scenario)()
    assert closed["type"] == "websocket.close" and closed["code"] not in (None, 1000, 4401)
    assert seen["alice"] == []
    assert any(f["type"] == "job.update" and f["job"]["id"] == seen["job"] for f in frames)
