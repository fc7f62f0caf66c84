"""``POST /jobs/{id}/hold/`` and ``/release/``: a waiting job kept from starting, then let go.

The real scheduling pass runs over a node with room: a held job stays pending with the code
``held``, even when the pass decided on a snapshot read before the hold; released, it starts.
"""

from __future__ import annotations

from django.utils import timezone

from scheduling.models import Job
from scheduling.services import passes
from scheduling.services.holds import do_hold_job
from scheduling.services.snapshot import load_snapshot
from tests.api.helpers import submit


def hold(world, who, job, action="hold"):
    return world.client(who).post(f"/api/v1/jobs/{job.pk}/{action}/")


def event_types(job) -> list[str]:
    return list(job.events.order_by("at", "id").values_list("type", flat=True))


def test_a_held_job_stays_pending_until_released_then_starts(world, cluster):
    job = submit(world.alice, world.vision, gpus=1)
    answer = hold(world, "alice", job)
    assert answer.status_code == 200, answer.content
    assert answer.json()["held"] is True and answer.json()["pending_code"] == "held"
    passes.run_pass()
    job.refresh_from_db()
    assert (job.state, job.pending_code) == ("pending", "held")

    answer = hold(world, "carol", job, "release")  # a teammate may release it
    assert answer.status_code == 200 and answer.json()["held"] is False
    passes.run_pass()
    job.refresh_from_db()
    assert job.state == "scheduled"
    assert event_types(job) == ["submitted", "held", "released", "scheduled"]


def test_a_pass_that_read_the_queue_before_the_hold_does_not_start_the_job(world, cluster):
    job = submit(world.alice, world.vision, gpus=1)
    now = timezone.now()
    loaded = load_snapshot(now)  # the pass has read the job as startable...
    decisions = passes.make_policy(loaded).decide(loaded.snapshot.now)
    assert [b.job_id for b in decisions.bindings] == [str(job.pk)]
    do_hold_job(job.pk)  # ...then the hold commits, before the pass applies its decision
    passes.apply_decisions(loaded, decisions, now)
    job.refresh_from_db()
    assert job.state == "pending" and job.held
    assert not job.allocations.exists()


def test_hold_and_release_are_idempotent(world, cluster):
    job = submit(world.alice, world.vision, gpus=1)
    for _ in range(2):
        assert hold(world, "alice", job).status_code == 200
    for _ in range(2):
        assert hold(world, "alice", job, "release").status_code == 200
    assert event_types(job) == ["submitted", "held", "released"]


def test_a_job_that_is_no_longer_waiting_cannot_be_held(world, alice_job):
    answer = hold(world, "alice", alice_job)
    assert answer.status_code == 409
    assert "running" in answer.json()["detail"]
    assert Job.objects.get(pk=alice_job.pk).held is False


def test_bob_can_neither_hold_nor_release_alices_job(world, cluster):
    job = submit(world.alice, world.vision, gpus=1)
    assert hold(world, "bob", job).status_code == 404
    do_hold_job(job.pk)
    assert hold(world, "bob", job, "release").status_code == 404
    assert Job.objects.get(pk=job.pk).held is True


def test_a_released_job_says_why_it_waits_until_the_next_pass(world, cluster):
    job = submit(world.alice, world.vision, gpus=1)
    hold(world, "alice", job)
    answer = hold(world, "alice", job, "release").json()
    assert answer["state"] == "pending"
    assert (answer["pending_code"], answer["pending_reason"]) == (
        "priority",
        "waiting for the next scheduling pass",
    )


def test_a_held_job_cancelled_is_no_longer_held_and_cannot_be_released_after_its_end(world, cluster):
    job = submit(world.alice, world.vision, gpus=1)
    hold(world, "alice", job)
    cancelled = world.client("alice").post(f"/api/v1/jobs/{job.pk}/cancel/").json()
    assert (cancelled["state"], cancelled["held"]) == ("cancelled", False)
    answer = hold(world, "alice", job, "release")
    assert answer.status_code == 200 and answer.json()["state"] == "cancelled"
    assert event_types(job) == ["submitted", "held", "cancelled"]  # nothing after its end
