"""Rotating a node's credential (``manage.py rotate_node_credential``, services/node_credentials.py).

What an operator relies on: once rotated, the old credential is refused (401) and the node's open
stream is closed; the new one works; the node's running job is not settled as lost (no
re-registration happens); the audit log says it was done; and an agent refused with the new
credential already in its ``STATE/credential`` switches to it and keeps its jobs, while one with
nothing new there stops (exit 3), as before.
"""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.core.management import CommandError, call_command

from agent import state
from agent.client import Rejected
from agent.identity import resolve_run_as
from agent.inventory import simulated_inventory
from agent.node import Agent, CredentialRevoked
from agent.process import job_path
from agent.spec import parse_spec
from tests.agent import fakes
from tests.agent import helpers as h
from tests.agent.agent_process import alive

REDIS_WHY = "a rotation reaches other processes' agent streams only by Redis pub/sub"


def _rotate(name: str, *args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    call_command("rotate_node_credential", name, *args, stdout=out, stderr=err)
    return out.getvalue().strip()


@pytest.mark.django_db(transaction=True)
def test_a_rotated_credential_is_refused_and_the_new_one_works_with_the_running_job_kept(world, join_token):
    from scheduling.models import AuditEntry

    old_client, answer = h.register(join_token, "gpu-01")
    job = h.submit(world.alice, world.vision, gpus=1)
    h.bind(job, "gpu-01", [0])
    assert h.report(old_client, job.pk, "started", attempt=0, replica=0, pid=123).status_code == 200

    new = _rotate("gpu-01")

    assert new and new != answer["credential"]
    refused = old_client.post(h.AGENT + "heartbeat", {"running": []}, format="json")
    assert refused.status_code == 401
    running = [{"job_id": job.pk, "attempt": 0, "replica": 0}]
    h.heartbeat(h.client_with(f"Node {new}"), running)
    assert h.state_of(job) == "running"
    entry = AuditEntry.objects.get(action="node.credential.rotate")
    assert entry.object_repr == "gpu-01" and entry.actor == "manage.py rotate_node_credential"


@pytest.fixture
def saved_elsewhere():
    """This process does not hear the node saved, as a web process does not hear a rotation made
    by ``manage.py`` (it keeps a credential's node for ``agent_auth.CACHE_S``)."""
    from django.db.models.signals import post_save

    from scheduling.api import agent_auth
    from scheduling.models import Node

    uid = "tessera-node-credential-save"
    post_save.disconnect(sender=Node, dispatch_uid=uid)
    yield
    post_save.connect(agent_auth._cache.forget, sender=Node, dispatch_uid=uid)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("layer", ["in-memory", pytest.param("redis", marks=pytest.mark.redis(REDIS_WHY))])
def test_a_rotation_made_in_another_process_closes_the_nodes_open_stream_at_once(
    join_token, settings, request, layer
):
    if layer == "redis":
        request.getfixturevalue("redis_channel_layer")  # the wake goes by pub/sub (wake_bus)
    else:
        settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    _, answer = h.register(join_token, "gpu-01")
    request.getfixturevalue("saved_elsewhere")

    async def go() -> dict[str, Any]:
        from controlplane.asgi import application

        headers = [(b"host", b"127.0.0.1"), (b"authorization", f"Node {answer['credential']}".encode())]
        talk = WebsocketCommunicator(application, "/api/v1/agent/stream", headers=headers)
        connected, _ = await talk.connect()  # the handshake caches the credential's node
        assert connected
        await sync_to_async(_rotate)("gpu-01")
        closed = await talk.receive_output(timeout=5)
        await talk.disconnect()
        return closed

    assert async_to_sync(go)() == {"type": "websocket.close", "code": 4401}


@pytest.mark.django_db(transaction=True)
def test_a_credential_from_a_file_is_stored_and_not_printed(join_token, tmp_path: Path):
    h.register(join_token, "gpu-01")
    made = tmp_path / "new"
    made.write_text("x" * 43 + "\n")
    assert _rotate("gpu-01", "--credential-file", str(made)) == ""
    h.heartbeat(h.client_with("Node " + "x" * 43))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("gpu-02",), "no node named 'gpu-02'"),
        (("gpu-01", "--credential-file", "/nonexistent/new"), "--credential-file /nonexistent/new"),
    ],
)
def test_a_bad_rotation_is_a_message_not_a_traceback(join_token, args, message):
    h.register(join_token, "gpu-01")
    with pytest.raises(CommandError, match=message):
        _rotate(*args)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("content", ["short", "has space" * 8, "é" * 40])
def test_a_credential_file_that_is_not_a_credential_is_refused(join_token, tmp_path: Path, content):
    _, answer = h.register(join_token, "gpu-01")
    made = tmp_path / "new"
    made.write_text(content, encoding="utf-8")
    with pytest.raises(CommandError, match="--credential-file"):
        _rotate("gpu-01", "--credential-file", str(made))
    h.heartbeat(h.client_with(f"Node {answer['credential']}"))  # the old one still holds


# --- the agent's side ---------------------------------------------------------------------------


class RotatingServer(fakes.FakeServer):
    """Accepts only ``accepted`` as the node's credential, as the server does after a rotation."""

    def __init__(self, accepted: str) -> None:
        super().__init__()
        self.credential: str | None = "old-credential"
        self.accepted = accepted

    def heartbeat(self, running, utilisation=None, checkpoints=None):
        if self.credential != self.accepted:
            self._record("refused", credential=self.credential)
            raise Rejected(401, {"detail": "Invalid node credential."})
        return super().heartbeat(running, utilisation, checkpoints)


def _agent(server: fakes.FakeServer, state_dir: Path) -> Agent:
    run_as = resolve_run_as("nobody")
    return Agent(
        server,
        simulated_inventory("rot", parse_spec("1xT4")),
        state_dir,
        run_as,
        job_path(state_dir, run_as),
        poll_interval=0.05,
    )


def _run(node: Agent) -> tuple[threading.Event, threading.Thread, list[BaseException]]:
    stop, raised = threading.Event(), []

    def loop() -> None:
        try:
            node.run(stop)
        except BaseException as exc:  # noqa: BLE001 - the test reads what ended the loop
            raised.append(exc)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return stop, thread, raised


def test_a_refused_agent_switches_to_the_new_credential_in_its_state_dir_and_keeps_its_job(state_dir):
    server = RotatingServer(accepted="new-credential")
    state.write_credential(state_dir, "new-credential")  # the operator wrote it before rotating
    node = _agent(server, state_dir)
    node.apply({"start": [fakes.binding(job_id=3, command=["sleep", "30"])]})
    pid = fakes.wait_for(lambda: node.jobs[(3, 0, 0)].pid, 5)
    stop, thread, raised = _run(node)
    try:
        assert fakes.wait_for(lambda: [c for c in server.calls if c[0] == "heartbeat"], 5)
        assert server.credential == "new-credential" and alive(pid) and raised == []
    finally:
        stop.set()
        thread.join(5)
        node.shutdown(0.5)


def test_a_refused_agent_with_nothing_new_in_its_state_dir_stops(state_dir):
    server = RotatingServer(accepted="new-credential")
    state.write_credential(state_dir, "old-credential")
    node = _agent(server, state_dir)
    stop, thread, raised = _run(node)
    try:
        thread.join(5)
        assert [type(e) for e in raised] == [CredentialRevoked]
    finally:
        stop.set()
        node.shutdown(0.5)
