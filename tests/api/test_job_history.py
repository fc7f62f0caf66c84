"""A job's owner, where it ran attempt by attempt (``placements``), and the submit's dry run.

alice and carol (vision) see each other's jobs with their owner; bob (nlp) gets 404 for them.
"""

from __future__ import annotations

from django.db import transaction

from scheduling.models import Job
from scheduling.services.jobs import begin_stop, do_record_exit
from tests.api.helpers import bind, finish, post_json, run, submit, valid_body

JOBS = "/api/v1/jobs/"


def test_a_job_names_its_owner_to_her_teammates(world):
    job = submit(world.alice, world.vision)
    seen = world.client("carol").get(f"{JOBS}{job.pk}/").json()
    assert seen["owner"] == "alice"
    listed = world.client("carol").get(JOBS).json()["results"]
    assert [j["owner"] for j in listed] == ["alice"]
    assert world.client("bob").get(f"{JOBS}{job.pk}/").status_code == 404
    assert "alice" not in world.client("bob").get(JOBS).content.decode()


def test_a_finished_job_keeps_where_it_ran(world, cluster):
    job = submit(world.alice, world.vision, name="ran-once")
    bind(job, cluster["n01"], [2, 3])
    run(job)
    finish(job, 3)
    seen = world.client("alice").get(f"{JOBS}{job.pk}/").json()
    assert seen["state"] == "failed" and seen["allocations"] == []
    [placement] = seen["placements"]
    assert placement["attempt"] == 0
    assert placement["allocations"] == [{"node": "n01", "gpus": [2, 3], "share": 1.0, "replica": 0}]
    assert placement["outcome"] == "failed" and placement["reason"] == "exit 3"
    assert placement["started_at"] and placement["ended_at"]


def test_each_attempt_keeps_its_own_placement_and_outcome(world, cluster):
    job = submit(world.alice, world.vision, name="preempted-then-done")
    bind(job, cluster["n01"], [0, 1])
    run(job)
    with transaction.atomic():
        begin_stop(
            Job.objects.select_for_update().select_related("tenant").get(pk=job.pk), "preempted: for job 9"
        )
    finish(job, 143)  # its process exits after the stop signal: back to pending, attempt 1
    bind(Job.objects.get(pk=job.pk), cluster["n02"], [0, 1])
    seen = world.client("alice").get(f"{JOBS}{job.pk}/").json()
    assert [(p["attempt"], p["outcome"]) for p in seen["placements"]] == [(0, "preempted"), (1, "scheduled")]
    assert seen["placements"][0]["allocations"][0]["node"] == "n01"
    assert seen["placements"][1]["allocations"][0]["node"] == "n02"
    assert seen["placements"][1]["ended_at"] is None
    now = [{k: a[k] for k in ("node", "gpus", "share", "replica")} for a in seen["allocations"]]
    assert now == seen["placements"][1]["allocations"]


def test_the_list_reads_history_in_a_fixed_number_of_queries(world, cluster, django_assert_max_num_queries):
    for i in range(4):
        job = submit(world.alice, world.vision, name=f"j{i}", gpus=2)
        bind(job, cluster["n01"], [2 * i, 2 * i + 1])
        with transaction.atomic():
            do_record_exit(Job.objects.select_for_update().select_related("tenant").get(pk=job.pk), 0)
    client = world.client("alice")
    with django_assert_max_num_queries(6):  # token, count, jobs (+ tenant, owner), allocations, events
        page = client.get(JOBS).json()
    assert all(len(j["placements"]) == 1 for j in page["results"])


def test_a_dry_run_says_where_a_job_would_start_and_stores_nothing(world, cluster):
    response = post_json(
        world.client("alice"), f"{JOBS}?dry_run=true", valid_body(gpus=8, accelerators=["H100"])
    )
    assert response.status_code == 200, response.json()
    answer = response.json()
    assert answer["dry_run"] is True and answer["would_start"] is True
    assert answer["allocations"] == [{"node": "n01", "gpus": list(range(8)), "share": 1.0, "replica": 0}]
    assert Job.objects.count() == 0


def test_a_dry_run_says_why_a_job_would_wait(world, cluster):
    answer = post_json(
        world.client("alice"), f"{JOBS}?dry_run=true", valid_body(gpus=16, accelerators=["A100"])
    ).json()
    assert answer["would_start"] is False
    assert answer["pending_code"] and answer["pending_reason"]
    assert Job.objects.count() == 0


def test_a_dry_run_answers_bad_bodies_as_a_submit_does(world, cluster):
    client = world.client("alice")
    bad = post_json(client, f"{JOBS}?dry_run=true", valid_body(gpus=3, replicas=2))
    assert bad.status_code == 400 and "replicas" in bad.json()
    assert post_json(client, f"{JOBS}?dry_run=maybe", valid_body()).json() == {
        "dry_run": ["must be true or false"]
    }
    assert Job.objects.count() == 0
