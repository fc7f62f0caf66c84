"""The adjustment pass (services/adjust.py) against the real database: idle jobs warned, an idle
preemptible job sent back to the queue through the stop signal, a service only warned, and a
pass that cannot read utilisation acting on nothing and saying so.

The utilisation source is the pass's reader argument; here it serves points the test writes, as
Prometheus would (tests/monitoring/test_adjust_prometheus.py runs the real one).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from scheduling.choices import EventType, JobState
from scheduling.engine.adjust import GpuSeries
from scheduling.models import AdjustmentState, Allocation, Job
from scheduling.services import passes
from scheduling.services.adjust import IDLE_STOP_REASON, UtilisationUnavailable, run_adjust_pass
from scheduling.services.agents import do_report_started
from tests.scheduling import helpers

STEP = 60.0


@pytest.fixture
def node(world):
    return helpers.make_node("a100-01")


def start(world, node, minutes_ago: float, tenant: str = "vision", **fields) -> Job:
    job = helpers.submit(
        *((world.alice, world.vision) if tenant == "vision" else (world.bob, world.nlp)), **fields
    )
    passes.run_pass()
    job.refresh_from_db()
    do_report_started(node, job.pk, job.attempts, 0, timezone.now().timestamp())
    # The agent's report cannot date a start before its binding: the test moves it back.
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(minutes=minutes_ago))
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    return job


def waiting(world, **fields) -> Job:
    """A job that waits (submitted after the others started, no pass since): what a requeue
    frees could start it."""
    job = helpers.submit(world.alice, world.vision, **{"gpus": 1, **fields})
    assert job.state == JobState.PENDING
    return job


def reader(idle_minutes: dict[int, float], busy: float = 0.9):
    """Every GPU of each job: busy until ``idle_minutes`` ago, then at 1%, one point a minute."""

    def read(held, window_s, step_s):
        now = timezone.now().timestamp()
        out = {}
        for h in held:
            idle = idle_minutes.get(h.job_id, 0) * 60
            pts = tuple(
                (now - k * STEP, 0.01 if k * STEP < idle else busy)
                for k in reversed(range(int(window_s // STEP)))
            )
            out[h.job_id] = [GpuSeries(f"{n}/{i}", pts) for n, i in h.gpus]
        return out

    return read


def events(job: Job, type_: str) -> list:
    return list(job.events.filter(type=type_).order_by("at"))


def test_an_idle_preemptible_job_is_warned_then_requeued_with_its_evidence(world, node):
    job = start(world, node, minutes_ago=120, gpus=2, kind="training")
    waiting(world)
    run_adjust_pass(reader({job.pk: 20}))
    run_adjust_pass(reader({job.pk: 20}))  # the same idle spell: no second first warning
    (warning,) = events(job, EventType.IDLE_WARNING)
    assert warning.details["action"] == "warn" and len(warning.details["gpus"]) == 2
    assert warning.details["gpus"][0]["idle_s"] >= 20 * 60 - 1
    run_adjust_pass(reader({job.pk: 50}))
    assert len(events(job, EventType.IDLE_WARNING)) == 2
    result = run_adjust_pass(reader({job.pk: 61}))
    assert [a.action for a in result.actions] == ["requeue"]
    (reclaim,) = events(job, EventType.IDLE_RECLAIM)
    assert reclaim.details["applied"] is True and reclaim.details["threshold"] == 0.05
    job.refresh_from_db()
    assert job.state == JobState.TERMINATING and job.stop_reason == IDLE_STOP_REASON
    body = world.client("alice").get(f"/api/v1/jobs/{job.pk}/events/").json()
    rows = body["results"] if isinstance(body, dict) else body
    assert any(e["type"] == "idle-reclaim" and e["details"]["gpus"] for e in rows)


def test_an_idle_job_is_not_requeued_while_nothing_waiting_could_use_its_gpus(world, node):
    # Requeued, it would be placed back at once: the requeue would only cost it its grace period.
    job = start(world, node, minutes_ago=120, gpus=2, kind="training")
    too_big = waiting(world, gpus=4)  # more than the job holds on its node
    other_model = waiting(world, accelerators=["H100"])
    assert [a.action for a in run_adjust_pass(reader({job.pk: 90})).actions] == ["warn"]
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and events(job, EventType.IDLE_RECLAIM) == []
    Job.objects.filter(pk__in=[too_big.pk, other_model.pk]).update(state=JobState.CANCELLED)
    waiting(world)
    assert [a.action for a in run_adjust_pass(reader({job.pk: 90})).actions] == ["requeue"]


def test_a_service_is_only_warned_unless_its_owner_allowed_reclaim(world, node):
    service = start(world, node, minutes_ago=120, gpus=1, kind="inference", preemptible=False)
    allowed = start(
        world, node, minutes_ago=120, gpus=1, kind="inference", preemptible=False, idle_mode="allow"
    )
    waiting(world)
    for minutes in (20, 50, 90, 120):
        run_adjust_pass(reader({service.pk: minutes, allowed.pk: minutes}))
    service.refresh_from_db()
    allowed.refresh_from_db()
    assert service.state == JobState.RUNNING and len(events(service, EventType.IDLE_WARNING)) == 2
    assert events(service, EventType.IDLE_RECLAIM) == []
    assert allowed.state == JobState.TERMINATING


def test_interactive_jobs_busy_jobs_and_young_jobs_are_left_alone(world, node):
    notebook = start(world, node, minutes_ago=120, gpus=1, kind="training", idle_mode="interactive")
    busy = start(world, node, minutes_ago=120, gpus=1, kind="training")
    young = start(world, node, minutes_ago=5, gpus=1, kind="training")
    result = run_adjust_pass(reader({notebook.pk: 120, busy.pk: 0, young.pk: 120}))
    assert result.actions == [] and result.jobs == 3


def test_an_idle_elastic_job_is_shrunk_through_the_live_resize_path(world, node):
    job = start(
        world,
        node,
        minutes_ago=120,
        gpus=4,
        replicas=4,
        kind="training",
        elastic_min_gpus=2,
        elastic_max_gpus=4,
    )
    result = run_adjust_pass(reader({job.pk: 70}))
    assert [a.action for a in result.actions] == ["shrink"]
    (reclaim,) = events(job, EventType.IDLE_RECLAIM)
    assert reclaim.details["to_gpus"] == 2 and reclaim.details["applied"] is True
    assert reclaim.details["removed"] == ["a100-01/2", "a100-01/3"]  # its highest replicas
    assert all(g["idle_s"] >= 3600 for g in reclaim.details["gpus"])
    # The removed replicas keep their GPUs until their agent reports them gone.
    leaving = Allocation.objects.filter(job=job, released_at__isnull=True, leaving_at__isnull=False)
    assert sorted(leaving.values_list("replica", flat=True)) == [2, 3]
    assert run_adjust_pass(reader({job.pk: 71})).actions == []  # judged again after a window
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.size_cap == {"attempt": job.attempts, "gpus": 2}
    assert job.shrink_details["to_gpus"] == 2  # for its "resized" event, once they have gone


def test_a_tenants_override_brings_its_jobs_reclaim_forward(world, node):
    from scheduling.services.idle_policy import do_set_idle_overrides

    theirs = start(world, node, minutes_ago=120, gpus=1, kind="training")
    others = start(world, node, minutes_ago=120, gpus=1, kind="training", tenant="nlp")
    waiting(world)
    do_set_idle_overrides(world.vision, {"act_after_s": 1800}, world.admin)
    result = run_adjust_pass(reader({theirs.pk: 31, others.pk: 31}))
    assert {a.job_id: a.action for a in result.actions} == {str(theirs.pk): "requeue", str(others.pk): "warn"}


def test_a_pass_that_cannot_read_utilisation_acts_on_nothing_and_says_so(world, node, caplog):
    job = start(world, node, minutes_ago=120, gpus=1, kind="training")

    def down(held, window_s, step_s):
        raise UtilisationUnavailable("Prometheus at http://127.0.0.1:9 cannot be reached")

    result = run_adjust_pass(down)
    assert not result.metrics_ok and result.actions == []
    assert "cannot be reached" in caplog.text
    assert job.events.filter(type__in=[EventType.IDLE_WARNING, EventType.IDLE_RECLAIM]).count() == 0
    state = AdjustmentState.objects.get(id=1)
    assert state.metrics_ok is False and "cannot be reached" in state.problem
    metrics = Client().get("/metrics").content.decode()
    assert "tessera_adjustment_metrics_available 0.0" in metrics
    run_adjust_pass(reader({job.pk: 20}))
    metrics = Client().get("/metrics").content.decode()
    assert "tessera_adjustment_metrics_available 1.0" in metrics
    assert 'tessera_adjustment_actions_total{action="warn"} 1.0' in metrics
    assert "tessera_gpus_idle_allocated 1.0" in metrics


@pytest.mark.parametrize(
    ("field", "value"),
    [("idle_reclaim", "sometimes"), ("idle_reclaim", True), ("interactive", "yes")],
)
def test_a_bad_idle_field_is_a_400_naming_it(world, field, value):
    body = {"name": "x", "kind": "training", "command": ["true"], field: value}
    response = world.client("alice").post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400 and field in response.json()


def test_the_idle_fields_are_stored_and_shown_and_contradicting_ones_refused(world):
    def post(**fields):
        body = {"name": "x", "kind": "inference", "command": ["true"], **fields}
        return world.client("alice").post("/api/v1/jobs/", body, format="json")

    allowed = post(idle_reclaim="allow").json()
    assert (allowed["idle_reclaim"], allowed["interactive"]) == ("allow", False)
    notebook = post(interactive=True).json()
    assert (notebook["idle_reclaim"], notebook["interactive"]) == ("never", True)
    plain = post().json()
    assert (plain["idle_reclaim"], plain["interactive"]) == ("never", False)
    both = post(interactive=True, idle_reclaim="allow")
    assert both.status_code == 400 and "idle_reclaim" in both.json()


def test_the_dashboard_shows_an_idle_gpu_to_its_team_and_to_no_one_else(world, node):
    from frontend.redaction import viewer_for
    from frontend.state import nodes_state

    job = start(world, node, minutes_ago=120, gpus=1, kind="inference", preemptible=False)
    run_adjust_pass(reader({job.pk: 20}))

    def held_gpu(user) -> dict:
        return next(d for n in nodes_state(viewer_for(user)) for d in n["devices"] if d["state"] != "free")

    assert (held_gpu(world.alice)["util"], held_gpu(world.alice)["idle"]) == (0.01, True)
    assert (held_gpu(world.admin)["util"], held_gpu(world.admin)["idle"]) == (0.01, True)
    assert "util" not in held_gpu(world.bob) and "idle" not in held_gpu(world.bob)
    run_adjust_pass(reader({job.pk: 0}))  # busy again
    assert (held_gpu(world.alice)["util"], held_gpu(world.alice)["idle"]) == (0.9, False)


def test_two_adjustment_passes_at_once_warn_once_and_the_second_warning_still_comes(
    transactional_db, world, node
):
    """Two beats, or a pass slower than its interval on a worker with several processes: the
    second pass, started while the first reads utilisation, stands down. Both used to judge the
    job on the same marks and record warning 1 twice; warning 2 then counted as given and never
    came."""
    import threading

    job = start(world, node, minutes_ago=120, gpus=2, kind="training")
    idle_20 = reader({job.pk: 20})
    second: list = []

    def read_while_another_pass_runs(held, window_s, step_s):
        def other() -> None:
            from django.db import connection

            try:
                second.append(run_adjust_pass(idle_20))
            finally:
                connection.close()

        thread = threading.Thread(target=other)
        thread.start()
        thread.join(30)
        return idle_20(held, window_s, step_s)

    first = run_adjust_pass(read_while_another_pass_runs)
    assert [a.action for a in first.actions] == ["warn"] and not first.skipped
    assert len(second) == 1 and second[0].skipped and second[0].actions == []
    assert len(events(job, EventType.IDLE_WARNING)) == 1
    run_adjust_pass(reader({job.pk: 50}))
    assert [w.reason.rsplit(": ", 1)[1] for w in events(job, EventType.IDLE_WARNING)] == [
        "warning 1",
        "warning 2",
    ]
    run_adjust_pass(idle_20)  # and the lock was given back
    assert AdjustmentState.objects.get(id=1).last_pass_at is not None
