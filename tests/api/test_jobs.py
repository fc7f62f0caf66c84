"""Jobs over the API: submit, list and filter, read, cancel, history and output."""

from __future__ import annotations

import pytest

from scheduling.choices import JobState
from scheduling.models import Job, JobEvent
from tests.api.helpers import add_log, bind, finish, post_json, run, submit, valid_body

JOBS = "/api/v1/jobs/"


def test_alice_submits_a_job_and_gets_it_back_with_every_field(world):
    body = valid_body(
        name="llama-finetune",
        kind="finetune",
        gpus=8,
        replicas=2,
        accelerators=["H100", "A100"],
        topology="rack",
        priority=10,
        grace_seconds=45,
        checkpoint_seconds=600,
        time_limit_seconds=7200,
        cpus=8,
        memory_gib=64,
        env={"WANDB_MODE": "offline"},
        node_selector={"rack": "r1"},
        max_retries=2,
        elastic={"min_gpus": 8, "max_gpus": 16},
    )
    response = post_json(world.client("alice"), JOBS, body)
    assert response.status_code == 201, response.json()
    job = response.json()
    for field, value in body.items():
        assert job[field] == value, field
    assert job["tenant"] == "vision"
    assert job["state"] == "pending"
    assert job["min_available"] == 2  # elastic: min_gpus / per-replica size
    assert job["preemptible"] is True
    assert job["queue_level"] == 2 and job["queue_level_name"] == "finetune-batch"
    assert job["allocations"] == []
    for field in (
        "pending_reason",
        "pending_code",
        "estimated_start",
        "submitted_at",
        "started_at",
        "finished_at",
        "attempts",
        "exit_code",
    ):
        assert field in job
    stored = Job.objects.get(pk=job["id"])
    assert stored.owner == world.alice and stored.tenant == world.vision
    assert stored.elastic_min_gpus == 8 and stored.elastic_max_gpus == 16


def test_defaults_are_filled_in_and_inference_is_not_preemptible(world):
    response = post_json(
        world.client("alice"), JOBS, {"name": "chat", "kind": "inference", "command": ["serve"]}
    )
    assert response.status_code == 201
    job = response.json()
    assert (job["gpus"], job["replicas"], job["min_available"]) == (1, 1, 1)
    assert job["preemptible"] is False
    assert job["grace_seconds"] == 30 and job["topology"] == "any"
    assert job["queue_level"] == 0 and job["queue_level_name"] == "inference"
    assert job["checkpoint_seconds"] is None and job["elastic"] is None


def test_a_fractional_gpu_and_a_cpu_only_job_are_valid(world):
    client = world.client("carol")
    assert post_json(client, JOBS, valid_body(gpus=0.25)).json()["gpus"] == 0.25
    assert post_json(client, JOBS, valid_body(gpus=0)).json()["gpus"] == 0


@pytest.mark.parametrize(("sent", "kept"), [(0.0014, 0.001), (0.2506, 0.251), (0.9994, 0.999)])
def test_a_fraction_of_a_gpu_is_kept_to_thousandths_the_unit_it_is_allocated_in(world, sent, kept):
    answer = post_json(world.client("alice"), JOBS, valid_body(gpus=sent, kind="inference"))
    assert answer.status_code == 201 and answer.json()["gpus"] == kept
    assert Job.objects.get(pk=answer.json()["id"]).gpus == kept


def test_an_operator_submits_for_the_tenant_named_in_the_body(world):
    client = world.client("admin")
    response = post_json(client, JOBS, valid_body())
    assert response.status_code == 400 and "tenant" in response.json()
    response = post_json(client, JOBS, valid_body(tenant="nlp"))
    assert response.status_code == 201
    assert response.json()["tenant"] == "nlp"
    assert post_json(client, JOBS, valid_body(tenant="nobody")).json() == {"tenant": ["no such tenant"]}


def test_a_user_cannot_submit_for_another_tenant(world):
    before = Job.objects.count()
    response = post_json(world.client("bob"), JOBS, valid_body(tenant="vision"))
    assert response.status_code == 403 and "own tenant" in response.json()["detail"]
    assert Job.objects.count() == before
    assert post_json(world.client("bob"), JOBS, valid_body(tenant="nlp")).status_code == 201


def test_a_user_without_a_tenant_may_not_submit(world):
    from django.contrib.auth.models import User
    from rest_framework.test import APIClient

    from scheduling.services.tokens import do_create_api_token

    loner = User.objects.create_user("loner", password="loner-pass-123")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {do_create_api_token(loner, 'test')[1]}")
    assert post_json(client, JOBS, valid_body()).status_code == 403
    assert client.get(JOBS).json()["count"] == 0


def test_a_job_no_quota_could_ever_admit_is_refused_naming_accelerators(world):
    from scheduling.models import Quota

    Quota.objects.filter(tenant=world.vision).delete()
    Quota.objects.create(tenant=world.vision, model="A100", guaranteed=4, limit=8)
    client = world.client("alice")
    before = Job.objects.count()
    for body in (
        valid_body(accelerators=["H100"]),  # no row for H100 and no "*" row
        valid_body(gpus=16),  # above every applicable limit
        valid_body(gpus=16, replicas=2, min_available=2),
    ):
        response = post_json(client, JOBS, body)
        assert response.status_code == 400, body
        assert list(response.json()) == ["accelerators"]
    assert Job.objects.count() == before
    # What the A100 row admits is accepted; so is a gang that may start with one 8-GPU replica.
    assert post_json(client, JOBS, valid_body(accelerators=["H100", "A100"], gpus=8)).status_code == 201
    assert post_json(client, JOBS, valid_body(gpus=16, replicas=2, min_available=1)).status_code == 201
    assert post_json(client, JOBS, valid_body(gpus=0, accelerators=["H100"])).status_code == 201


def test_a_job_that_may_not_borrow_must_fit_in_the_guarantee_and_blocks_count_whole(world):
    from scheduling.models import Quota

    Quota.objects.filter(tenant=world.vision).update(guaranteed=2, limit=3)
    client = world.client("alice")
    # Not preemptible: it may never borrow, so the guarantee (2) is its ceiling.
    response = post_json(client, JOBS, valid_body(gpus=3, preemptible=False))
    assert response.status_code == 400 and "guarantee" in response.json()["accelerators"][0]
    assert post_json(client, JOBS, valid_body(gpus=2, kind="inference")).status_code == 201
    # 3 GPUs on one node take a block of 4, which is above the limit of 3.
    response = post_json(client, JOBS, valid_body(gpus=3))
    assert response.status_code == 400 and "4" in response.json()["accelerators"][0]
    assert post_json(client, JOBS, valid_body(gpus=0.5, kind="inference")).status_code == 201


def test_the_star_quota_covers_models_without_their_own_row(world):
    from scheduling.models import Quota

    Quota.objects.create(tenant=world.vision, model="T4", guaranteed=0, limit=1)
    client = world.client("alice")
    assert post_json(client, JOBS, valid_body(gpus=4, accelerators=["T4"])).status_code == 400
    assert post_json(client, JOBS, valid_body(gpus=4, accelerators=["H100"])).status_code == 201  # "*": 64


def test_list_shows_only_the_callers_tenant_and_filters(world):
    a1 = submit(world.alice, world.vision, name="a1", kind="training")
    a2 = submit(world.carol, world.vision, name="a2", kind="batch")
    b1 = submit(world.bob, world.nlp, name="b1")
    alice = world.client("alice")
    ids = [j["id"] for j in alice.get(JOBS).json()["results"]]
    assert ids == [a2.pk, a1.pk]
    assert [j["id"] for j in alice.get(JOBS, {"kind": "batch"}).json()["results"]] == [a2.pk]
    assert [j["id"] for j in alice.get(JOBS, {"name": "a1"}).json()["results"]] == [a1.pk]
    assert alice.get(JOBS, {"name": "b1"}).json()["count"] == 0
    assert alice.get(JOBS, {"state": "running"}).json()["count"] == 0
    assert alice.get(JOBS, {"state": "pending"}).json()["count"] == 2
    assert [j["id"] for j in world.client("bob").get(JOBS).json()["results"]] == [b1.pk]
    assert world.client("admin").get(JOBS).json()["count"] == 3


def test_jobs_filter_by_owner_tenant_and_queue_and_filters_combine(world):
    a1 = submit(world.alice, world.vision, name="a1", kind="inference")
    c1 = submit(world.carol, world.vision, name="c1", kind="training")
    c2 = submit(world.carol, world.vision, name="c2", kind="batch")
    b1 = submit(world.bob, world.nlp, name="b1", kind="training")

    def ids(who: str, **params: str) -> list[int]:
        return [j["id"] for j in world.client(who).get(JOBS, params).json()["results"]]

    assert ids("alice", owner="carol") == [c2.pk, c1.pk]
    assert ids("alice", owner="carol", kind="batch") == [c2.pk]
    assert ids("alice", queue="inference") == [a1.pk]
    assert ids("alice", queue="training") == [c1.pk]
    assert ids("admin", tenant="nlp") == [b1.pk]
    assert ids("admin", queue="training") == [b1.pk, c1.pk]
    assert ids("admin", tenant="vision", owner="alice") == [a1.pk]
    # naming another tenant, or its users, finds nothing, as a name that does not exist
    assert ids("alice", tenant="nlp") == ids("alice", owner="bob") == ids("alice", tenant="nobody") == []
    assert ids("alice", state="", kind="") == [c2.pk, c1.pk, a1.pk]  # an empty value filters nothing


@pytest.mark.parametrize(
    "param",
    [
        {"state": "sleeping"},
        {"kind": "x"},
        {"queue": "2"},
        {"name": "a\x00b"},
        {"name": "n" * 129},
        {"owner": "u\x00"},
        {"tenant": "t" * 65},
    ],
)
def test_a_bad_filter_is_a_400_naming_it(world, param):
    response = world.client("alice").get(JOBS, param)
    assert response.status_code == 400
    assert list(response.json()) == list(param)


@pytest.mark.parametrize(
    ("path", "query"),
    [
        (JOBS, "state=pending&state=running"),
        (JOBS, "owner=alice&owner=carol"),
        (JOBS, "queue=training&queue=training"),
        ("/api/v1/nodes/", "rack=r1&rack=r2"),
        ("/api/v1/audit/", "action=quota.update&action=job.cancel"),
    ],
)
def test_a_filter_given_twice_is_a_400_naming_it_not_silently_its_last_value(world, path, query):
    submit(world.alice, world.vision)  # pending: a filter read as its last value would hide it
    response = world.client("admin").get(f"{path}?{query}")
    name = query.split("=")[0]
    assert response.status_code == 400 and response.json() == {name: ["give it at most once"]}


def test_a_bad_choice_says_what_is_allowed_without_echoing_the_value(world):
    response = world.client("alice").get(JOBS, {"state": "<script>", "name": "ok"})
    assert response.json() == {
        "state": ["must be one of: pending, scheduled, running, terminating, succeeded, failed, cancelled"]
    }


def test_the_list_is_paginated(world):
    for i in range(5):
        submit(world.alice, world.vision, name=f"j{i}")
    client = world.client("alice")
    page = client.get(JOBS, {"limit": 2}).json()
    assert page["count"] == 5 and len(page["results"]) == 2 and page["next"]
    second = client.get(page["next"]).json()
    assert len(second["results"]) == 2
    assert not {j["id"] for j in page["results"]} & {j["id"] for j in second["results"]}
    assert client.get(JOBS, {"offset": 10**6}).json()["results"] == []
    assert client.get(JOBS, {"limit": 10**6}).status_code == 200  # at most max_limit used


@pytest.mark.parametrize(
    "query",
    [
        "offset=null",
        "offset=-1",
        "offset=1.5",
        "offset=",
        "offset=1&offset=2",
        "limit=false",
        "limit=2.2e-308",
    ]
    + [f"offset={10**30}", "limit=null&limit=null"],
)
def test_a_bad_offset_or_limit_is_a_400_naming_it_not_the_default(world, query):
    response = world.client("alice").get(f"{JOBS}?{query}")
    assert response.status_code == 400
    assert set(response.json()) == {query.split("=")[0]}


def test_listing_many_jobs_takes_a_fixed_number_of_queries(world, cluster, django_assert_max_num_queries):
    for i in range(4):
        job = submit(world.alice, world.vision, name=f"j{i}", gpus=2)
        bind(job, cluster["n01"], [2 * i, 2 * i + 1])
    for i in range(20):
        submit(world.alice, world.vision, name=f"p{i}")
    client = world.client("alice")
    # token (and its first use), count, jobs + tenant, allocations + devices + nodes
    with django_assert_max_num_queries(6):
        page = client.get(JOBS).json()
    assert page["count"] == 24
    bound = [j for j in page["results"] if j["allocations"]]
    assert len(bound) == 4
    assert bound[-1]["allocations"] == [
        {"node": "n01", "gpus": [0, 1], "share": 1.0, "replica": 0, "shared_with": 0, "other_tenants": False}
    ]


def test_a_job_shows_only_its_active_allocations(world, alice_job):
    client = world.client("carol")
    url = f"{JOBS}{alice_job.pk}/"
    assert client.get(url).json()["allocations"] == [
        {"node": "n01", "gpus": [0, 1], "share": 1.0, "replica": 0, "shared_with": 0, "other_tenants": False}
    ]
    finish(alice_job, 0)
    job = client.get(url).json()
    assert job["state"] == "succeeded" and job["exit_code"] == 0 and job["allocations"] == []
    assert job["started_at"] and job["finished_at"]


def test_a_job_says_its_gpu_is_shared_and_whether_with_another_tenant_never_whose(world, cluster):
    n01 = cluster["n01"]
    mine = bind(submit(world.alice, world.vision, gpus=0.25), n01, [3], share=0.25)
    bind(submit(world.carol, world.vision, gpus=0.25), n01, [3], share=0.25)
    url = f"{JOBS}{mine.pk}/"

    def seen() -> dict:
        [alloc] = world.client("alice").get(url).json()["allocations"]
        return alloc

    assert (seen()["shared_with"], seen()["other_tenants"]) == (1, False)  # her teammate's share
    bobs = bind(submit(world.bob, world.nlp, gpus=0.5), n01, [3], share=0.5)
    assert (seen()["shared_with"], seen()["other_tenants"]) == (2, True)
    page = world.client("alice").get(JOBS).content.decode()
    assert '"other_tenants":true' in page and "nlp" not in page and "bob" not in page
    finish(bobs, 0)
    assert (seen()["shared_with"], seen()["other_tenants"]) == (1, False)


def test_an_unknown_or_absurd_job_id_is_a_json_404(world):
    client = world.client("alice")
    for url in (f"{JOBS}999999/", f"{JOBS}{10**30}/", f"{JOBS}abc/", f"{JOBS}-1/cancel/"):
        response = client.get(url) if "cancel" not in url else client.post(url)
        assert response.status_code == 404, url
        assert "detail" in response.json()


def test_cancel_a_pending_job_then_again_is_idempotent(world):
    job = submit(world.alice, world.vision)
    client = world.client("carol")
    first = client.post(f"{JOBS}{job.pk}/cancel/")
    assert first.status_code == 200 and first.json()["state"] == "cancelled"
    again = client.post(f"{JOBS}{job.pk}/cancel/")
    assert again.status_code == 200 and again.json()["state"] == "cancelled"
    assert JobEvent.objects.filter(job=job, type="cancelled").count() == 1


def test_cancel_a_running_job_sends_the_stop_signal_and_it_ends_cancelled(world, alice_job):
    client = world.client("alice")
    response = client.post(f"{JOBS}{alice_job.pk}/cancel/")
    assert response.status_code == 200
    assert response.json()["state"] == "terminating"
    assert response.json()["allocations"]  # GPUs held through the grace period
    finish(alice_job, 143)
    assert client.get(f"{JOBS}{alice_job.pk}/").json()["state"] == "cancelled"
    assert client.post(f"{JOBS}{alice_job.pk}/cancel/").status_code == 200


@pytest.mark.parametrize("exit_code, state", [(0, "succeeded"), (1, "failed")])
def test_cancelling_a_finished_job_is_a_409(world, alice_job, exit_code, state):
    finish(alice_job, exit_code)
    response = world.client("alice").post(f"{JOBS}{alice_job.pk}/cancel/")
    assert response.status_code == 409
    assert state in response.json()["detail"]
    assert Job.objects.get(pk=alice_job.pk).state == state


def test_events_record_the_jobs_history_in_order(world, alice_job):
    finish(alice_job, 3)
    events = world.client("alice").get(f"{JOBS}{alice_job.pk}/events/").json()
    assert [e["type"] for e in events] == ["submitted", "scheduled", "started", "failed"]
    assert events[1]["allocations"] == [{"node": "n01", "gpus": [0, 1], "share": 1.0, "replica": 0}]
    assert events[3]["reason"] == "exit 3"
    assert events[0]["reason"] is None and events[0]["allocations"] is None
    assert all(set(e) == {"type", "at", "reason", "allocations", "details"} for e in events)


def test_logs_are_read_from_an_offset_and_end_with_eof(world, alice_job):
    add_log(alice_job, "ünïcode ✓\n".encode())
    client = world.client("alice")
    url = f"{JOBS}{alice_job.pk}/logs/"
    page = client.get(url).json()
    assert page == {
        "offset": 0,
        "next_offset": len(b"epoch 1\n") + len("ünïcode ✓\n".encode()),
        "data": "epoch 1\nünïcode ✓\n",
        "eof": False,
        "truncated": False,
    }
    tail = client.get(url, {"offset": 6}).json()
    assert tail["data"].startswith("1\n") and tail["next_offset"] == page["next_offset"]
    empty = client.get(url, {"offset": page["next_offset"]}).json()
    assert empty["data"] == "" and empty["eof"] is False  # still running: more may come
    finish(alice_job, 0)
    done = client.get(url, {"offset": page["next_offset"]}).json()
    assert done["data"] == "" and done["eof"] is True


def test_logs_never_split_a_character_between_pages(world, alice_job, monkeypatch):
    from scheduling.api import logs

    add_log(alice_job, "é".encode() * 4)  # 8 bytes after the 8 of "epoch 1\n"
    monkeypatch.setattr(logs, "MAX_PAGE_BYTES", 9)
    job = Job.objects.get(pk=alice_job.pk)
    page = logs.read_log(job, 0, 0, limit=9)
    assert page.data == "epoch 1\n" and page.next_offset == 8  # the half "é" waits for the next page
    page = logs.read_log(job, 0, 8, limit=3)
    assert page.data == "é" and page.next_offset == 10


def test_logs_of_invalid_utf8_are_replaced_not_refused(world, alice_job):
    add_log(alice_job, b"\xff\xfe ok\n")
    finish(alice_job, 0)
    page = world.client("alice").get(f"{JOBS}{alice_job.pk}/logs/").json()
    assert page["data"] == "epoch 1\n\ufffd\ufffd ok\n" and page["eof"] is True


def test_logs_of_each_replica_are_apart_and_truncation_is_reported(world, cluster):
    job = submit(world.alice, world.vision, gpus=2, replicas=2)
    add_log(job, b"zero\n", replica=0)
    add_log(job, b"one\n", replica=1)
    Job.objects.filter(pk=job.pk).update(log_truncated=True)
    client = world.client("alice")
    page = client.get(f"{JOBS}{job.pk}/logs/", {"replica": 1}).json()
    assert page["data"] == "one\n" and page["truncated"] is True


@pytest.mark.parametrize(
    "params, field",
    [
        ({"offset": "-1"}, "offset"),
        ({"offset": "x"}, "offset"),
        ({"offset": str(10**40)}, "offset"),
        ({"replica": "1"}, "replica"),
        ({"replica": "y"}, "replica"),
    ],
)
def test_a_bad_log_offset_or_replica_is_a_400_naming_it(world, alice_job, params, field):
    response = world.client("alice").get(f"{JOBS}{alice_job.pk}/logs/", params)
    assert response.status_code == 400
    assert list(response.json()) == [field]


def test_a_long_log_comes_in_pages_of_at_most_a_mebibyte(world, alice_job):
    for _ in range(3):
        add_log(alice_job, b"x" * 700_000)
    finish(alice_job, 0)
    client = world.client("alice")
    url = f"{JOBS}{alice_job.pk}/logs/"
    offset, total, pages = 0, 0, 0
    while True:
        page = client.get(url, {"offset": offset}).json()
        assert len(page["data"].encode()) <= 1024 * 1024
        total += len(page["data"].encode())
        pages += 1
        offset = page["next_offset"]
        if page["eof"]:
            break
    assert total == 8 + 3 * 700_000 and pages == 3


def test_state_changes_are_reflected_in_the_api(world, cluster):
    job = submit(world.alice, world.vision)
    bind(job, cluster["n02"], [3])
    client = world.client("alice")
    assert client.get(f"{JOBS}{job.pk}/").json()["state"] == JobState.SCHEDULED
    run(job)
    assert client.get(f"{JOBS}{job.pk}/").json()["state"] == JobState.RUNNING
