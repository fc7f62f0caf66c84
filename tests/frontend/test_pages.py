"""The people-facing pages: session login and logout, the dashboard, and its JSON snapshot.

Who may see what: alice and carol (vision) see vision's jobs with their ids; bob (nlp) sees the GPUs
vision uses only as "in use"; admin (operator) sees every job and tenant.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from tests.frontend.helpers import expanded, make_node


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def submit(world: Any, who: str, **body: Any) -> int:
    body = {"name": f"{who}-job", "kind": "training", "command": ["true"], **body}
    response = world.client(who).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


@pytest.fixture
def running_world(world: Any, cluster: Any) -> Any:
    """alice holds 2 H100 and has a job waiting; bob holds half a T4."""
    from scheduling.services.passes import run_pass

    world.alice_job = submit(world, "alice", gpus=2, accelerators=["H100"])
    world.bob_job = submit(world, "bob", gpus=0.5, accelerators=["T4"], kind="inference")
    world.alice_waiting = submit(world, "alice", name="alice-waits", gpus=64)
    run_pass()
    return world


def test_the_dashboard_sends_an_anonymous_visitor_to_the_login_page(db: Any) -> None:
    response = Client().get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=/")


def test_alice_signs_in_with_her_password_and_out_again(world: Any) -> None:
    client = Client()
    assert client.get("/login/").status_code == 200
    response = client.post("/login/", {"username": "alice", "password": "alice-pass-123"})
    assert response.status_code == 302 and response["Location"] == "/"
    page = client.get("/")
    assert page.status_code == 200
    assert b"vision" in page.content and b'id="heatmap"' in page.content
    assert client.post("/logout/").status_code == 302
    assert client.get("/").status_code == 302


@pytest.mark.parametrize(
    "form",
    [
        {"username": "alice", "password": "wrong"},
        {"username": "alice\x00", "password": "x"},
        {"username": "a" * 10_000, "password": ""},
        {},
    ],
)
def test_a_bad_login_is_refused_with_the_form_again_never_an_error(world: Any, form: dict[str, str]) -> None:
    response = Client().post("/login/", form)
    assert response.status_code == 200
    assert b"Sign in" in response.content
    assert "_auth_user_id" not in Client().session


def test_a_login_body_that_is_not_utf8_is_refused_with_the_form_again(world: Any) -> None:
    body = b"username=%ED%A0%80%FF&password=%80"  # a lone surrogate and stray bytes, percent-encoded
    response = Client().post("/login/", body, content_type="application/x-www-form-urlencoded")
    assert response.status_code == 200
    assert b"did not match" in response.content


def test_the_snapshot_answers_401_without_a_session(db: Any) -> None:
    response = Client().get("/dashboard/state.json")
    assert response.status_code == 401
    assert "detail" in response.json()


def test_alice_sees_her_tenants_jobs_on_the_gpus_and_in_the_queue(running_world: Any) -> None:
    state = expanded(signed_in(running_world.alice).get("/dashboard/state.json").json())
    assert state["viewer"] == {"username": "alice", "operator": False, "tenant": "vision"}
    assert {j["id"] for j in state["jobs"]} == {running_world.alice_job, running_world.alice_waiting}
    waiting = next(j for j in state["jobs"] if j["id"] == running_world.alice_waiting)
    assert waiting["state"] == "pending" and waiting["pending_reason"]
    devices = [d for n in state["nodes"] for d in n["devices"]]
    mine = [d for d in devices if d["jobs"]]
    assert {(d["node"], j["job_id"]) for d in mine for j in d["jobs"]} == {("n01", running_world.alice_job)}
    assert len(mine) == 2
    t4 = next(d for d in devices if d["node"] == "n02" and d["others"] > 0)
    assert t4["others"] == 0.5 and t4["jobs"] == [] and t4["state"] == "shared"


def test_bob_sees_alices_gpus_only_as_in_use(running_world: Any) -> None:
    state = expanded(signed_in(running_world.bob).get("/dashboard/state.json").json())
    assert {j["id"] for j in state["jobs"]} == {running_world.bob_job}
    raw = json.dumps(state)
    assert "vision" not in raw and "alice" not in raw
    held = [d for n in state["nodes"] for d in n["devices"] if d["node"] == "n01" and d["state"] != "free"]
    assert len(held) == 2 and all(d["jobs"] == [] and d["others"] == 1.0 for d in held)
    for d in held:
        assert set(d) >= {"node", "index", "model", "state", "others"}
        assert "tenant" not in json.dumps(d["jobs"])


def test_an_operator_sees_every_job_with_its_tenant(running_world: Any) -> None:
    state = expanded(signed_in(running_world.admin).get("/dashboard/state.json").json())
    assert state["viewer"]["operator"] is True
    assert {j["id"] for j in state["jobs"]} == {
        running_world.alice_job,
        running_world.bob_job,
        running_world.alice_waiting,
    }
    tenants = {j["tenant"] for n in state["nodes"] for d in n["devices"] for j in d["jobs"]}
    assert tenants == {"vision", "nlp"}


def test_the_snapshot_sends_a_free_gpu_as_its_index_alone(running_world: Any) -> None:
    """What the page puts back (the node, its one model, the defaults) is left out of the rows:
    at 8,000 mostly free GPUs they were nearly all of the snapshot's megabyte."""
    state = signed_in(running_world.alice).get("/dashboard/state.json").json()
    rows = [d for n in state["nodes"] for d in n["devices"] if len(n["models"]) == 1]
    free = [d for d in rows if "state" not in d]
    assert free and all(d == {"index": d["index"]} for d in free)
    assert all("node" not in d for d in rows)


def test_the_snapshot_takes_the_same_few_queries_however_big_the_cluster(
    running_world: Any, django_assert_max_num_queries: Any
) -> None:
    for i in range(20):
        make_node(f"extra-{i}", "r9", 8, "A100")
    client = signed_in(running_world.alice)
    with django_assert_max_num_queries(10):
        state = expanded(client.get("/dashboard/state.json").json())
    assert len(state["nodes"]) == 22


def test_the_dashboard_says_when_utilisation_cannot_be_read(world: Any) -> None:
    from scheduling.models import AdjustmentState

    client = signed_in(world.alice)
    page = client.get("/").content.decode()
    assert 'id="utilisation-banner" class="banner" role="status" hidden' in page
    AdjustmentState.objects.update_or_create(
        id=1, defaults={"metrics_ok": False, "problem": "Prometheus at http://prom:9090 does not answer"}
    )
    page = client.get("/").content.decode()
    assert 'id="utilisation-banner" class="banner" role="status">' in page
    assert "Prometheus at http://prom:9090 does not answer" in page
    state = json.loads(client.get("/dashboard/state.json").content)
    assert state["utilisation_problem"] == "Prometheus at http://prom:9090 does not answer"


def test_every_page_alice_is_shown_is_kept_by_no_cache(running_world: Any) -> None:
    alice = signed_in(running_world.alice)
    job = running_world.alice_job
    for url in ("/", "/jobs/", "/jobs/new/", f"/jobs/{job}/", f"/jobs/{job}/?fragment=status", "/team/"):
        response = alice.get(url)
        assert response.status_code == 200, url
        assert "no-store" in response["Cache-Control"] and "private" in response["Cache-Control"], url


def test_a_page_served_asynchronously_is_kept_by_no_cache_either(running_world: Any) -> None:
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    async def get() -> Any:
        client = AsyncClient()
        await client.aforce_login(running_world.alice)
        return await client.get(f"/jobs/{running_world.alice_job}/")

    response = async_to_sync(get)()
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
