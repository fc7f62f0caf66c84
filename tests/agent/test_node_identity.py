"""Node identity: a join token registers only new names within its bounds; an existing node's
name belongs to its own credential. Replays issue 15's attack: an impostor holding the shared join
token tries to take over alice's node to get her job's command and environment.

The world is ``tests/conftest.py``'s (alice in vision); nodes are registered through the real API.
"""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from scheduling.choices import JobState, NodeState
from scheduling.models import JoinToken, Node
from scheduling.services.agents import do_create_join_token
from scheduling.services.operators import do_uncordon_nodes
from tests.agent import helpers as h

AGENT = h.AGENT
SECRET_ENV = {"HF_TOKEN": "alice-secret-hf-token"}


def register(token: str, name: str, **overrides):
    return h.client_with(f"Join {token}").post(
        AGENT + "register", h.node_body(name, **overrides), format="json"
    )


def silence(name: str, seconds: float) -> None:
    Node.objects.filter(name=name).update(last_heartbeat=timezone.now() - timedelta(seconds=seconds))


def test_an_impostor_with_the_join_token_cannot_take_an_active_nodes_name_or_alices_job(world, join_token):
    real, _ = h.register(join_token, "gpu-01")
    job = h.bind(h.submit(world.alice, world.vision, env=SECRET_ENV), "gpu-01", [0, 1])

    taken = register(join_token, "gpu-01")
    assert taken.status_code == 409 and "credential" not in taken.json()
    assert "own credential" in taken.json()["detail"]

    # The real agent keeps its node, its credential and its binding.
    start = h.heartbeat(real)["start"]
    assert [b["job_id"] for b in start] == [job.pk] and start[0]["env"] == SECRET_ENV

    # Registered under a name of its own, the impostor gets nothing of alice's job...
    impostor, _ = h.register(join_token, "gpu-66")
    orders = impostor.post(AGENT + "heartbeat", {"running": []}, format="json").content.decode()
    assert "alice-secret-hf-token" not in orders and str(job.pk) not in orders
    # ...and its fake exit reports, one by one or batched, are refused and change nothing.
    assert h.report(impostor, job.pk, "exited", attempt=0, replica=0, exit_code=0).status_code == 404
    batch = impostor.post(
        AGENT + "exits",
        {"exits": [{"job_id": job.pk, "attempt": 0, "replica": 0, "exit_code": 0}]},
        format="json",
    )
    assert batch.json()["results"] == [{"status": 404, "detail": "No such job on this node."}]
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED and job.exit_code is None
    assert h.report(real, job.pk, "started", attempt=0, replica=0).status_code == 200


def test_a_node_silent_within_its_lease_and_fence_margin_is_still_its_credentials(join_token, settings):
    h.register(join_token, "gpu-01")
    named = do_create_join_token("for gpu-01", names="gpu-01")[1]
    silence("gpu-01", settings.TESSERA["LEASE_S"])  # past the heartbeat timeout, not the fence margin
    assert register(named, "gpu-01").status_code == 409


def test_a_dead_nodes_name_goes_only_to_a_token_made_for_it(join_token, settings):
    old, _ = h.register(join_token, "gpu-01")
    silence("gpu-01", settings.TESSERA["LEASE_S"] + settings.TESSERA["FENCE_MARGIN_S"] + 1)
    refused = register(join_token, "gpu-01")  # a token for any new name is not one for this name
    assert refused.status_code == 409 and "--names gpu-01" in refused.json()["detail"]
    named = do_create_join_token("reinstalled gpu-01", names="gpu-0*", max_nodes=1)[1]
    assert register(named, "gpu-01").status_code == 200
    assert old.post(AGENT + "heartbeat", {}, format="json").status_code == 401  # the old credential is gone


def test_a_single_use_token_registers_one_node(db):
    once = do_create_join_token("once", max_nodes=1)[1]
    assert register(once, "gpu-01").status_code == 201
    again = register(once, "gpu-02")
    assert again.status_code == 401 and "used-up" in again.json()["detail"]
    assert not Node.objects.filter(name="gpu-02").exists()
    assert JoinToken.objects.get().registrations == 1


def test_a_token_registers_only_the_names_its_patterns_match(db):
    token = do_create_join_token("rack 2", names="a100-*, t4-0?")[1]
    refused = register(token, "h100-01")
    assert refused.status_code == 403 and "a100-*" in refused.json()["detail"]
    assert register(token, "a100-07").status_code == 201
    assert register(token, "t4-03").status_code == 201
    assert not Node.objects.filter(name="h100-01").exists()


def test_a_node_whose_gpus_grew_waits_cordoned_until_an_operator_uncordons_it(join_token):
    node, _ = h.register(join_token, "gpu-01", gpus=4)
    again = node.post(AGENT + "register", h.node_body("gpu-01", gpus=8), format="json")
    assert again.status_code == 200
    held = Node.objects.get(name="gpu-01")
    assert held.state == NodeState.CORDONED and "4×A100 → 8×A100" in held.held_reason
    renewed = h.client_with(f"Node {again.data['credential']}")
    h.heartbeat(renewed)  # heartbeats do not lift the hold
    assert Node.objects.get(name="gpu-01").state == NodeState.CORDONED
    assert do_uncordon_nodes([held.pk]) == 1
    approved = Node.objects.get(name="gpu-01")
    assert approved.state == NodeState.READY and approved.held_reason == ""


@pytest.mark.parametrize("change", [{"model": "H100"}, {"nvlink_domain": 8}])
def test_another_gpu_model_or_island_size_is_held_too(join_token, change):
    node, _ = h.register(join_token, "gpu-01", gpus=4)
    assert (
        node.post(AGENT + "register", h.node_body("gpu-01", gpus=4, **change), format="json").status_code
        == 200
    )
    assert Node.objects.get(name="gpu-01").state == NodeState.CORDONED


def test_fewer_gpus_at_reregistration_need_no_operator(join_token):
    node, _ = h.register(join_token, "gpu-01", gpus=8)
    assert node.post(AGENT + "register", h.node_body("gpu-01", gpus=6), format="json").status_code == 200
    assert Node.objects.get(name="gpu-01").state == NodeState.READY


def test_with_approval_on_a_new_node_gets_no_jobs_until_approved(join_token, settings):
    settings.TESSERA = {**settings.TESSERA, "APPROVE_NODES": True}
    h.register(join_token, "gpu-01")
    node = Node.objects.get(name="gpu-01")
    assert node.state == NodeState.CORDONED and "approval" in node.held_reason


def test_create_join_token_is_single_use_unless_told_and_keeps_its_patterns(db):
    out, err = io.StringIO(), io.StringIO()
    call_command("create_join_token", "--names", "gpu-*", stdout=out, stderr=err)
    token = JoinToken.objects.get()
    assert (token.max_nodes, token.names) == (1, "gpu-*") and "1 node(s)" in err.getvalue()
    call_command("create_join_token", "--max-nodes", "0", stdout=io.StringIO(), stderr=io.StringIO())
    assert JoinToken.objects.order_by("-pk").first().max_nodes is None


@pytest.mark.parametrize("names", [",", " ", " , "])
def test_create_join_token_refuses_names_that_hold_no_pattern(db, names):
    # Taken, they made a token for *any* new name while its line said "names ,": an operator
    # who meant to restrict it got the widest token there is.
    with pytest.raises(CommandError, match="--names"):
        call_command("create_join_token", "--names", names, stdout=io.StringIO(), stderr=io.StringIO())
    assert not JoinToken.objects.exists()


def test_a_restarted_agent_uses_its_credential_and_the_join_token_only_when_the_server_forgot_it(
    live_server, join_token
):
    from agent.client import AgentClient

    body = h.node_body("gpu-01")
    first = AgentClient(live_server.url)
    created = first.register(body, join_token)  # no credential yet: the join token
    restarted = AgentClient(live_server.url)
    restarted.credential = created["credential"]
    # With the join token too, it re-registers with its credential (the join token would be a 409).
    renewed = restarted.register(body, join_token)
    assert renewed["node_id"] == created["node_id"] and renewed["credential"] != created["credential"]
    Node.objects.filter(name="gpu-01").delete()  # the server forgot the node (a new database)
    again = AgentClient(live_server.url)
    again.credential = renewed["credential"]
    assert again.register(body, join_token)["node"] == "gpu-01"
