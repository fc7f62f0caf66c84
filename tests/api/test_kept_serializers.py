"""The API's kept serializers (``scheduling.api.fields.kept``): one instance per process renders
every job and checks every submitted job and agent body, exactly as a fresh serializer per
request would, from many threads at once (the web's pooled request threads)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from rest_framework.exceptions import ValidationError

from scheduling.api.agents import CheckpointedIn, ExitedIn, HeartbeatIn, LogsIn, RegisterIn
from scheduling.api.fields import kept
from scheduling.api.job_serializers import JobSerializer, JobSubmitSerializer, job_data, validated_submit
from scheduling.models import Job
from scheduling.services.history import with_history
from tests.api.bad_bodies import CASES
from tests.api.helpers import bind, run, submit, valid_body

VALID = [
    valid_body(),
    valid_body(gpus=0.5, kind="inference", interactive=True, env={"A": "b"}),
    valid_body(gpus=8, replicas=2, topology="node", elastic={"min_gpus": 4, "max_gpus": 8}),
    valid_body(gpus=0, cpus=2.5, prefer_labels={"zone": "a"}, idle_reclaim="allow", tenant="vision"),
]
BODIES = VALID + [body for _, body, _, _ in CASES if isinstance(body, dict)]


def fresh_check(body: dict[str, Any]) -> tuple[bool, Any]:
    serializer = JobSubmitSerializer(data=body)
    ok = serializer.is_valid()
    return ok, _plain(serializer.validated_data if ok else serializer.errors)


def kept_check(body: dict[str, Any]) -> tuple[bool, Any]:
    try:
        return True, _plain(validated_submit(body))
    except ValidationError as invalid:
        return False, _plain(invalid.detail)


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def test_a_submitted_body_is_checked_as_a_fresh_serializer_checks_it():
    assert len(BODIES) > 40
    for body in BODIES:
        assert kept_check(body) == fresh_check(body), body


def test_bodies_checked_from_many_threads_at_once_get_their_own_answers():
    expected = [fresh_check(body) for body in BODIES]
    with ThreadPoolExecutor(8) as pool:
        for _ in range(5):
            assert list(pool.map(kept_check, BODIES)) == expected


RUNNING = {"job_id": 3, "attempt": 0, "replica": 1, "pid": 42}
DEVICE = {"index": 0, "uuid": "GPU-0", "model": "H100", "memory_gib": 80}
AGENT_BODIES: list[tuple[type, dict[str, Any]]] = [
    (HeartbeatIn, {}),
    (HeartbeatIn, {"running": [RUNNING, {**RUNNING, "replica": 2}], "checkpoints": [7]}),
    (HeartbeatIn, {"running": [{**RUNNING, "job_id": "3"}, {"attempt": -1}], "checkpoints": [0]}),
    (HeartbeatIn, {"utilisation": [{"gpu": 0, "job_ids": [3], "util": 50.5}, {"gpu": 0, "util": 101}]}),
    (HeartbeatIn, {"running": None, "utilisation": "x"}),
    (RegisterIn, {"name": "n01", "devices": [DEVICE, {**DEVICE, "index": 1, "uuid": "GPU-1"}]}),
    (RegisterIn, {"name": "-bad", "labels": {"a": 1}, "devices": [DEVICE, DEVICE]}),
    (CheckpointedIn, {"attempt": 0, "at": 1.5, "line": "  step 10  "}),
    (ExitedIn, {"attempt": 0, "exit_code": 300, "reason": "nope"}),
    (LogsIn, {"attempt": 0, "offset": 0, "data": "aGVsbG8="}),
    (LogsIn, {"attempt": 0, "offset": -1, "data": "not base64!"}),
]


@pytest.mark.parametrize(("serializer_class", "body"), AGENT_BODIES)
def test_an_agents_body_is_checked_as_a_fresh_serializer_checks_it(serializer_class, body):
    serializer = serializer_class(data=body)
    ok = serializer.is_valid()
    try:
        kept_answer = True, _plain(kept(serializer_class).run_validation(body))
    except ValidationError as invalid:
        kept_answer = False, _plain(invalid.detail)
    assert kept_answer == (ok, _plain(serializer.validated_data if ok else serializer.errors))


@pytest.fixture
def jobs(world, cluster) -> list[Job]:
    """alice's running elastic gang with a fractional neighbour on its GPUs' node, her pending
    job, and bob's CPU-only job."""
    gang = submit(
        world.alice, world.vision, name="gang", gpus=4, replicas=2, elastic={"min_gpus": 2, "max_gpus": 4}
    )
    bind(gang, cluster["n01"], [0, 1, 2, 3])
    run(gang)
    share = submit(world.bob, world.nlp, name="share", gpus=0.5, kind="inference")
    bind(share, cluster["n01"], [0], share=0.5)
    pending = submit(world.alice, world.vision, name="waits", priority=7, env={"K": "v"})
    cpu = submit(world.bob, world.nlp, name="cpu", gpus=0, kind="batch")
    return [Job.objects.get(pk=job.pk) for job in (gang, share, pending, cpu)]


def test_a_job_renders_as_a_fresh_serializer_renders_it(jobs):
    for job in jobs:  # read alone (its allocations read then), and in a page (prefetched)
        assert job_data(job) == JobSerializer(job).data
    page = _page(jobs)
    assert [job_data(job) for job in page] == list(JobSerializer(page, many=True).data)
    assert job_data(page[0])["allocations"] and job_data(page[0])["elastic"] == {"min_gpus": 2, "max_gpus": 4}


def _page(jobs: list[Job]) -> list[Job]:
    """``jobs`` as a page of the list reads them (allocations and history prefetched)."""
    chosen = Job.objects.filter(pk__in=[job.pk for job in jobs]).select_related("tenant", "owner")
    return list(with_history(chosen).order_by("pk"))


def test_jobs_rendered_from_many_threads_at_once_get_their_own_answers(jobs):
    # Not the GPU share: its neighbours are read from the database, which the test's other
    # threads do not see (the test's transaction is not committed).
    page = _page([job for job in jobs if job.gpus >= 1 or job.gpus == 0])
    assert len(page) == 3
    expected = list(JobSerializer(page, many=True).data)
    with ThreadPoolExecutor(8) as pool:
        for _ in range(20):
            assert list(pool.map(job_data, page)) == expected
