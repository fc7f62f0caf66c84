"""An agent's credential acts only for its own node, on the agent endpoints only (invariant 7).

Enumerated: every URL pattern of the user API answers 401 to a node credential and to a join
token; every agent endpoint answers 401 to a user's token; a node reporting about another node's
job gets 404.
"""

from __future__ import annotations

import re

import pytest
from django.urls import URLPattern, URLResolver

from scheduling.api import urls as api_urls
from scheduling.choices import JobState
from tests.agent import helpers as h

AGENT = h.AGENT
METHODS = ("get", "post", "put", "patch", "delete")


def user_api_paths() -> list[str]:
    """Every user endpoint of /api/v1/, its parameters filled with plausible values."""
    paths = []
    for entry in api_urls.urlpatterns:
        if isinstance(entry, URLResolver) or entry.name == "api-not-found":
            continue  # the agent's own include, and the JSON 404 catch-all
        assert isinstance(entry, URLPattern)
        route = str(entry.pattern)
        paths.append(
            "/api/v1/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: "gpu-01" if m[1] == "name" else "1", route)
        )
    return paths


def test_the_enumeration_covers_the_user_api():
    paths = user_api_paths()
    assert "/api/v1/jobs/" in paths and "/api/v1/jobs/1/logs/" in paths and "/api/v1/nodes/gpu-01/" in paths
    assert len(paths) >= 10


@pytest.mark.parametrize("path", user_api_paths())
def test_an_agent_credential_gets_401_on_every_user_endpoint(world, join_token, path):
    node, _ = h.register(join_token, "gpu-01")
    job = h.bind(h.submit(world.alice, world.vision), "gpu-01", [0, 1])
    path = path.replace("/1/", f"/{job.pk}/")
    joiner = h.client_with(f"Join {join_token}")
    for method in METHODS:
        for client in (node, joiner):
            answer = getattr(client, method)(path, {}, format="json")
            assert answer.status_code == 401, (method, path, answer.status_code)


@pytest.mark.parametrize("what", ["register", "heartbeat", "jobs/1/started", "jobs/1/logs", "jobs/1/exited"])
def test_a_users_token_or_session_cannot_call_the_agent_endpoints(world, what):
    for who in ("alice", "admin", None):
        answer = world.client(who).post(AGENT + what, {}, format="json")
        assert answer.status_code == 401, (who, what, answer.content)
    session = world.client(None)
    session.force_login(world.admin)
    assert session.post(AGENT + what, {}, format="json").status_code == 401


def test_a_join_token_is_not_a_node_credential(join_token):
    h.register(join_token, "gpu-01")
    for auth in (f"Node {join_token}", f"Join {join_token}"):
        assert h.client_with(auth).post(AGENT + "heartbeat", {}, format="json").status_code == 401


def test_a_node_cannot_report_for_another_nodes_job(world, join_token):
    node_a, _ = h.register(join_token, "gpu-01")
    node_b, _ = h.register(join_token, "gpu-02")
    job = h.bind(h.submit(world.alice, world.vision), "gpu-01", [0, 1])
    assert h.heartbeat(node_b)["start"] == []
    assert h.report(node_b, job.pk, "started", attempt=0, replica=0).status_code == 404
    assert h.report(node_b, job.pk, "logs", attempt=0, replica=0, offset=0, data=b"forged").status_code == 404
    assert h.report(node_b, job.pk, "exited", attempt=0, replica=0, exit_code=0).status_code == 404
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED and job.log_bytes == 0
    assert h.report(node_a, job.pk, "started", attempt=0, replica=0).status_code == 200


def test_a_node_heartbeat_never_lists_another_nodes_processes_as_its_own(world, join_token):
    node_a, _ = h.register(join_token, "gpu-01")
    node_b, _ = h.register(join_token, "gpu-02")
    job = h.bind(h.submit(world.alice, world.vision), "gpu-01", [0, 1])
    h.report(node_a, job.pk, "started", attempt=0, replica=0)
    # gpu-02 claims to run it: it is told to stop its process, and gpu-01's job is untouched.
    claim = [{"job_id": job.pk, "attempt": 0, "replica": 0, "pid": 3}]
    assert [s["job_id"] for s in h.heartbeat(node_b, claim)["stop"]] == [job.pk]
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
