"""A job's checkpoint, reported by its agent: what the engine counts as work a preemption loses."""

from __future__ import annotations

import pytest
from django.utils import timezone

from scheduling.choices import JobState
from scheduling.models import Job
from scheduling.services import passes
from scheduling.services.agents import NotYours, Stale, do_report_checkpoint, do_report_started
from scheduling.services.snapshot import load_snapshot
from tests.scheduling import helpers


@pytest.fixture
def running(world):
    node = helpers.make_node("a100-01")
    other = helpers.make_node("a100-02")
    job = helpers.submit(world.alice, world.vision, gpus=8, checkpoint_seconds=600)
    passes.run_pass()
    job.refresh_from_db()
    do_report_started(node, job.pk, job.attempts, 0, timezone.now().timestamp())
    return node, other, job


def test_a_checkpoint_reported_by_the_jobs_agent_reaches_the_engine(running):
    node, _, job = running
    at = timezone.now()  # (kept between the job's binding and now, as its start is)
    do_report_checkpoint(node, job.pk, job.attempts, at.timestamp())
    assert Job.objects.get(pk=job.pk).last_checkpoint_at == at
    (run,) = load_snapshot(timezone.now()).snapshot.running
    assert run.last_checkpoint_at == pytest.approx(at.timestamp())


def test_a_checkpoint_from_another_node_or_an_old_attempt_is_refused(running):
    node, other, job = running
    with pytest.raises(NotYours):
        do_report_checkpoint(other, job.pk, job.attempts, None)
    with pytest.raises(Stale):
        do_report_checkpoint(node, job.pk, job.attempts + 1, None)
    assert Job.objects.get(pk=job.pk).last_checkpoint_at is None
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING


def test_a_checkpoint_is_an_event_at_most_once_a_minute_and_an_older_one_changes_nothing(running):
    from datetime import timedelta

    node, _, job = running
    first = timezone.now()
    do_report_checkpoint(node, job.pk, job.attempts, first.timestamp(), "step 100")
    do_report_checkpoint(node, job.pk, job.attempts, (first + timedelta(seconds=20)).timestamp(), "step 120")
    do_report_checkpoint(node, job.pk, job.attempts, (first - timedelta(seconds=5)).timestamp(), "step 90")
    job.refresh_from_db()
    # The later one moved the time (clamped to now), the older one did not; one event so far
    assert first < job.last_checkpoint_at <= timezone.now()
    assert list(job.events.filter(type="checkpointed").values_list("reason", flat=True)) == ["step 100"]


def _lost(cause: str) -> float:
    from monitoring.job_metrics import _lost_family

    return next(s.value for s in _lost_family().samples if s.labels == {"cause": cause})


LOCAL_ELSEWHERE = (
    "starts from the beginning: its last checkpoint (step 40, at {at}) is on node a100-01's local disk, "
    "not reachable from a100-02"
)
OTHER_SHARE = (
    "starts from the beginning: its last checkpoint (step 40, at {at}) is on checkpoint root 'nfs-a', "
    "not reachable from a100-02"
)


@pytest.mark.parametrize(
    ("roots", "again_on", "reason", "lost_s"),
    [
        # The same shared root on both nodes: the checkpoint is there; the 40 s since it lost.
        (
            ("nfs-a", "nfs-a"),
            1,
            "resumes from its last checkpoint (step 40, at {at}): on checkpoint root 'nfs-a'",
            40,
        ),
        # Node-local checkpoints, back on the node that wrote it: the same.
        (
            ("", ""),
            0,
            "resumes from its last checkpoint (step 40, at {at}): on node a100-01's local disk",
            40,
        ),
        # Node-local checkpoints on another node, or another share: out of reach; all 100 s lost.
        (("", ""), 1, LOCAL_ELSEWHERE, 100),
        (("nfs-a", "nfs-b"), 1, OTHER_SHARE, 100),
    ],
)
def test_a_requeued_job_is_told_at_its_binding_whether_its_checkpoint_is_within_reach(
    running, roots, again_on, reason, lost_s
):
    from datetime import timedelta

    from django.db import transaction

    from scheduling.choices import NodeState
    from scheduling.models import Allocation, Node
    from scheduling.services.jobs import begin_stop, do_record_exit

    nodes = running[:2]
    job = running[2]
    for n, root in zip(nodes, roots, strict=True):
        Node.objects.filter(pk=n.pk).update(checkpoint_root=root)  # as its agent registered
        n.refresh_from_db()
    now = timezone.now()
    Allocation.objects.filter(job=job).update(created_at=now - timedelta(seconds=100))
    at = now - timedelta(seconds=40)
    do_report_checkpoint(nodes[0], job.pk, job.attempts, at.timestamp(), "step 40")
    with transaction.atomic():
        locked = Job.objects.select_for_update().select_related("tenant")
        begin_stop(locked.get(pk=job.pk), "preempted: test", now)
        do_record_exit(locked.get(pk=job.pk), None, at=now)
    Node.objects.filter(pk=nodes[1 - again_on].pk).update(state=NodeState.CORDONED)
    passes.run_pass()

    again = Allocation.objects.filter(job=job, attempt=job.attempts + 1).values_list("node_id", flat=True)
    assert set(again) == {nodes[again_on].pk}
    events = list(Job.objects.get(pk=job.pk).events.values_list("type", "reason"))
    # The requeue promises nothing it cannot know; the binding says what the new node can reach.
    requeued = "from its last checkpoint if its next nodes can reach it, else from the start"
    assert ("requeued", requeued) in events
    assert events[-1] == ("scheduled", reason.format(at=f"{at:%Y-%m-%d %H:%M:%S} UTC"))
    assert _lost("preemption") == pytest.approx(lost_s * job.gpus, abs=0.01)


def test_a_gangs_replicas_each_leave_their_checkpoint_on_their_own_node():
    from datetime import UTC, datetime

    from scheduling.services.checkpoints import binding_note, recorded

    at = datetime(2026, 12, 2, 13, 2, 11, tzinfo=UTC)
    place = recorded(None, 1, "a", "", "step 40")
    place = recorded(place, 1, "b", "", None)  # b's report came with an older time: a's line stays
    assert place == {"attempt": 1, "line": "step 40", "nodes": {"a": "", "b": ""}}
    assert binding_note(at, place, [("b", ""), ("a", "")]) == (
        "resumes from its last checkpoint (step 40, at 2026-12-02 13:02:11 UTC): on the local disks of a, b"
    )
    assert binding_note(at, place, [("a", ""), ("c", "")]) == (
        "resumes from its last checkpoint (step 40, at 2026-12-02 13:02:11 UTC) on a only: "
        "it is on the local disks of a, b, not reachable from c"
    )
    # The next attempt's first report replaces the places of the last one
    assert recorded(place, 2, "c", "nfs-a", "step 50")["nodes"] == {"c": "nfs-a"}
