"""``prefer_labels`` over the API and through the live pass: accepted, returned, refused with a
400 naming the field, handed to the placer (the job lands on the node carrying the labels), and
written by ``export_trace`` in the simulator's format."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from scheduling.models import Allocation, Job
from scheduling.services import passes
from scheduling.sim.traces import read_jobs
from tests.api.helpers import post_json, valid_body
from tests.scheduling import helpers

JOBS = "/api/v1/jobs/"


def test_alice_submits_prefer_labels_and_gets_them_back(world):
    body = valid_body(prefer_labels={"data": "eu-west", "disk": "nvme"}, node_selector={"zone": "a"})
    response = post_json(world.client("alice"), JOBS, body)
    assert response.status_code == 201, response.json()
    assert response.json()["prefer_labels"] == {"data": "eu-west", "disk": "nvme"}
    got = world.client("alice").get(f"{JOBS}{response.json()['id']}/").json()
    assert got["prefer_labels"] == {"data": "eu-west", "disk": "nvme"}
    assert got["node_selector"] == {"zone": "a"}


def test_prefer_labels_default_to_none(world):
    response = post_json(world.client("alice"), JOBS, valid_body())
    assert response.status_code == 201
    assert response.json()["prefer_labels"] == {}


@pytest.mark.parametrize(
    "value",
    [
        {"data": 1},
        ["data:eu"],
        "data:eu",
        {"": "eu"},
        {"rack": "r1"},
        {f"k{i}": "v" for i in range(65)},
        {"data": "x" * 20_000},
    ],
)
def test_bad_prefer_labels_are_a_400_naming_the_field_and_store_nothing(world, value):
    response = post_json(world.client("alice"), JOBS, valid_body(prefer_labels=value))
    assert response.status_code == 400
    assert "prefer_labels" in response.json()
    assert not Job.objects.exists()


def test_the_pass_puts_the_job_on_the_node_carrying_its_preferred_labels(world):
    for name in ("far-1", "far-2", "far-3"):
        helpers.make_node(name)
    near = helpers.make_node("near")
    near.labels = {"data": "eu"}
    near.save(update_fields=["labels"])
    job = helpers.submit(world.alice, world.vision, gpus=2, prefer_labels={"data": "eu"})
    passes.run_pass()
    assert {a.node.name for a in Allocation.objects.filter(job=job)} == {"near"}


def test_export_trace_writes_prefer_labels_for_the_simulator(world, tmp_path):
    helpers.submit(world.alice, world.vision, gpus=1, prefer_labels={"disk": "nvme", "data": "eu"})
    helpers.submit(world.alice, world.vision, gpus=1)
    call_command("export_trace", str(tmp_path))
    got = [j.request.prefer_labels for j in read_jobs(tmp_path / "jobs.csv")]
    assert got == [(("data", "eu"), ("disk", "nvme")), ()]
