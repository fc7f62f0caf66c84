"""Live resizes: the pass grows and shrinks running jobs through their agents (services/resizes.py).

A shrink keeps the removed replicas' GPUs held until their agent reports them exited (invariant
8); a grow's replicas are bindings like any other; the running replicas learn the new world in
the heartbeat's ``worlds``; a running job below its full size says why (``size_reason``).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from scheduling.choices import JobState
from scheduling.models import Allocation, Job, Node
from scheduling.services import health, passes
from scheduling.services.agents import (
    ExitReport,
    Reported,
    do_heartbeat,
    do_report_exits,
    do_report_started,
)
from scheduling.services.jobs import do_mark_running
from scheduling.services.resizes import CannotShrink, request_shrink
from tests.scheduling import helpers


def _run(job: Job, started_minutes_ago: float = 10) -> None:
    with transaction.atomic():
        do_mark_running(Job.objects.select_for_update().select_related("tenant").get(pk=job.pk))
    # past the minimum run time before a job may be preempted or shrunk
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(minutes=started_minutes_ago))


@pytest.fixture
def elastic_on_every_gpu(world):
    helpers.make_node("a100-01")  # 8 GPUs
    job = helpers.submit(
        world.alice, world.vision, gpus=8, replicas=8, min_available=2, elastic_min_gpus=2, elastic_max_gpus=8
    )
    assert passes.run_pass().bound == [str(job.pk)]
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 8  # its max
    _run(job)
    job.refresh_from_db()
    assert job.size_reason == ""
    return job


def _held(job) -> int:
    return Allocation.objects.filter(job=job, released_at__isnull=True).count()


def _leaving(job) -> list[int]:
    rows = Allocation.objects.filter(job=job, released_at__isnull=True, leaving_at__isnull=False)
    return sorted(rows.values_list("replica", flat=True))


def _exit(node: Node, job: Job, replicas: list[int], code: int = 143) -> None:
    reports = [ExitReport(job.pk, job.attempts, r, code) for r in replicas]
    assert all(isinstance(r, tuple) for r in do_report_exits(node, reports))


def test_a_service_shrinks_a_running_elastic_job_and_starts_once_the_removed_replicas_exit(
    world, elastic_on_every_gpu
):
    el, node = elastic_on_every_gpu, Node.objects.get(name="a100-01")
    serve = helpers.submit(world.bob, world.nlp, kind="inference", gpus=1, preemptible=False)
    result = passes.run_pass()
    assert result.bound == [] and result.preempted == [] and result.resized == [str(el.pk)]
    serve.refresh_from_db()
    el.refresh_from_db()
    assert serve.pending_code == "reserved" and "shrinking 1 elastic job" in serve.pending_reason
    # serve is nlp's, el vision's: el is told why, but not of nlp's job
    assert el.state == JobState.RUNNING
    assert el.size_reason.endswith("shrunk to make room for another tenant's job"), el.size_reason
    assert el.size_reason.startswith("elastic: 2 of at most 8 GPUs")
    assert _leaving(el) == [2, 3, 4, 5, 6, 7] and _held(el) == 8  # held until they exit

    # Their agent is told to stop them (the job's grace), the running ones their new world.
    running = [{"job_id": el.pk, "attempt": 0, "replica": r, "pid": 100 + r} for r in range(8)]
    answer = do_heartbeat(node, [Reported(**r) for r in running])
    assert sorted(o["replica"] for o in answer["stop"]) == [2, 3, 4, 5, 6, 7]
    assert {o["reason"] for o in answer["stop"]} == {"resize"} and answer["start"] == []
    assert [(w["replica"], w["world_size"], w["rank"]) for w in answer["worlds"]] == [(0, 2, 0), (1, 2, 1)]
    again = passes.run_pass()  # invariant 8: not on GPUs whose processes still run...
    assert again.bound == [] and again.preempted == []  # ... and it waits for them, no preemption

    _exit(node, el, [2, 3, 4, 5, 6])  # each released as it exits; one still runs
    assert passes.run_pass().bound == [str(serve.pk)]
    still = Allocation.objects.get(job=el, replica=7, released_at__isnull=True).device_id
    assert Allocation.objects.get(job=serve).device_id != still
    _exit(node, el, [7])
    el.refresh_from_db()
    assert el.state == JobState.RUNNING and _held(el) == 2 and _leaving(el) == []
    resized = el.events.get(type="resized")
    assert resized.reason == "shrunk from 8 to 2 replicas"
    assert resized.details["lost_work_s"] == 0 and resized.details["to_gpus"] == 2
    assert [a["replica"] for a in resized.allocations] == [0, 1]
    assert not el.events.filter(type__in=["preempted", "terminating"]).exists()


def test_a_running_job_below_its_full_size_grows_when_capacity_frees(world):
    helpers.make_node("a100-01")
    other = helpers.submit(world.bob, world.nlp, gpus=6)
    assert passes.run_pass().bound == [str(other.pk)]
    _run(other)
    gang = helpers.submit(world.alice, world.vision, gpus=4, replicas=4, min_available=2)
    assert passes.run_pass().bound == [str(gang.pk)]
    _run(gang)
    gang.refresh_from_db()
    assert gang.size_reason == "2 of 4 replicas placed: the rest join as capacity frees"
    node = Node.objects.get(name="a100-01")
    _exit(node, other, [0], code=0)  # capacity frees; the queue is empty: the pass still runs
    result = passes.run_pass()
    assert result.resized == [str(gang.pk)]
    gang.refresh_from_db()
    assert gang.size_reason == "" and _held(gang) == 4
    assert gang.events.get(type="resized").reason == "grown from 2 to 4 replicas"
    answer = do_heartbeat(node, [Reported(gang.pk, 0, r, 10 + r) for r in (0, 1)])
    starts = {b["replica"]: b["rendezvous"] for b in answer["start"]}
    assert all(b["resizable"] for b in answer["start"])  # the grown replicas keep a world file
    assert sorted(starts) == [2, 3] and {m["world_size"] for m in starts.values()} == {4}
    assert [w["world_size"] for w in answer["worlds"]] == [4, 4]
    # A replica that fails to join is a failed replica
    do_report_started(node, gang.pk, 0, 2)
    _exit(node, gang, [3], code=1)
    gang.refresh_from_db()
    assert gang.state == JobState.TERMINATING and gang.stop_reason == "exit 1"


def test_a_grow_whose_agent_is_gone_falls_back_to_the_old_size_without_losing_the_job(world, settings):
    helpers.make_node("a100-01", gpus=2)
    helpers.make_node("a100-02", gpus=2)
    hold = helpers.submit(world.bob, world.nlp, gpus=2)
    el = helpers.submit(world.alice, world.vision, gpus=4, replicas=4, elastic_min_gpus=2, elastic_max_gpus=4)
    assert sorted(passes.run_pass().bound) == sorted([str(hold.pk), str(el.pk)])
    _run(hold)
    _run(el)
    hold_node = Allocation.objects.filter(job=hold).first().node
    _exit(hold_node, hold, [0], code=0)
    assert passes.run_pass().resized == [str(el.pk)]  # two more replicas, on the freed node
    # That node's agent dies before it starts them: once the node is fenced, they are dropped
    Node.objects.filter(pk=hold_node.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=5))
    health.sweep_nodes()
    health.sweep_nodes()
    el.refresh_from_db()
    assert el.state == JobState.RUNNING and el.attempts == 0 and _held(el) == 2
    assert el.events.filter(type="resized").latest("at").reason == "fell back from 4 to 2 replicas"
    assert "back to the size it had" in el.size_reason


def test_the_adjustment_loop_shrinks_through_the_same_path(world, elastic_on_every_gpu):
    el = elastic_on_every_gpu
    with pytest.raises(CannotShrink, match="cannot shrink to 1 "):
        request_shrink(el, 1, "idle")  # below its minimum
    request_shrink(el, 4, "idle: GPUs 4-7 idle for 60 min", {"idle_s": 3600})
    el.refresh_from_db()
    assert _leaving(el) == [4, 5, 6, 7] and "idle" in el.size_reason
    with pytest.raises(CannotShrink, match="already shrinking"):
        request_shrink(el, 2, "idle")
    _exit(Node.objects.get(name="a100-01"), el, [4, 5, 6, 7])
    resized = el.events.get(type="resized")
    assert resized.details["inputs"] == {"idle_s": 3600} and resized.details["to_gpus"] == 4
    # Its four GPUs are free, but it is not grown back in this attempt.
    assert passes.run_pass().resized == [] and _held(el) == 4
