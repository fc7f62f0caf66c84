"""Node health: silent nodes become not-ready; their jobs are requeued only after the lease."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from scheduling.choices import JobState, NodeState
from scheduling.models import Allocation, Job, Node
from scheduling.services import passes
from scheduling.services.health import sweep_nodes
from scheduling.services.jobs import begin_stop, do_mark_running, do_record_exit
from tests.scheduling import helpers


def _fenced_after(settings) -> float:
    """Seconds after its last heartbeat that a lost node's jobs may be requeued."""
    return settings.TESSERA["LEASE_S"] + settings.TESSERA["FENCE_MARGIN_S"]


def _running_job(world, **fields):
    job = helpers.submit(world.alice, world.vision, **fields)
    passes.run_pass()
    with transaction.atomic():
        do_mark_running(Job.objects.select_for_update().select_related("tenant").get(pk=job.pk))
    job.refresh_from_db()
    return job


def test_a_node_whose_heartbeats_stop_becomes_not_ready(world, settings):
    node = helpers.make_node("a100-01")
    late = timezone.now() - timedelta(seconds=settings.TESSERA["HEARTBEAT_TIMEOUT_S"] + 1)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=late)
    assert sweep_nodes() == ["a100-01"]
    assert Node.objects.get(pk=node.pk).state == NodeState.NOT_READY


def test_a_lost_nodes_jobs_keep_their_gpus_until_the_lease_expires(world, settings):
    node = helpers.make_node("a100-01")
    job = _running_job(world, gpus=2, max_retries=1)
    silent_since = timezone.now() - timedelta(seconds=settings.TESSERA["HEARTBEAT_TIMEOUT_S"] + 1)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=silent_since)
    sweep_nodes()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING  # the lease has not expired: it may still be running
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 2

    expired = timezone.now() - timedelta(seconds=_fenced_after(settings) + 1)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=expired)
    sweep_nodes()
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.attempts == 1 and job.node_losses == 1
    assert job.events.filter(type="requeued", reason="node-lost").exists()  # no retry consumed
    assert not job.events.filter(type="retrying").exists() and job.not_before is None
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_a_lost_nodes_jobs_are_requeued_only_once_the_lease_and_the_fencing_margin_have_passed(
    world, settings
):
    # The agent kills its jobs at its own deadline (sent + LEASE_S, before received + LEASE_S):
    # the margin covers the kill itself and the clocks' differences.
    settings.TESSERA = {**settings.TESSERA, "LEASE_S": 60.0, "FENCE_MARGIN_S": 5.0}
    node = helpers.make_node("a100-01")
    job = _running_job(world, gpus=1, max_retries=1)
    beat = timezone.now() - timedelta(hours=1)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=beat)
    for after in (60.5, 64.9):  # the lease has run out, the margin not yet
        sweep_nodes(now=beat + timedelta(seconds=after))
        job.refresh_from_db()
        assert job.state == JobState.RUNNING, f"requeued {after}s after the last heartbeat"
        assert Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    assert Node.objects.get(pk=node.pk).state == NodeState.NOT_READY
    sweep_nodes(now=beat + timedelta(seconds=65.1))
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.events.filter(type="requeued", reason="node-lost").exists()
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_a_lost_nodes_job_without_retries_is_requeued_not_failed(world, settings):
    node = helpers.make_node("a100-01")
    job = _running_job(world, gpus=1)  # max_retries 0
    expired = timezone.now() - timedelta(seconds=_fenced_after(settings) + 1)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=expired, state=NodeState.NOT_READY)
    sweep_nodes()
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.attempts == 1 and job.node_losses == 1
    assert [e.type for e in job.events.order_by("at", "id")][-1] == "requeued"
    assert job.events.get(type="requeued").reason == "node-lost"


def _lose_node(node, settings):
    expired = timezone.now() - timedelta(seconds=_fenced_after(settings) + 1)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=expired, state=NodeState.NOT_READY)
    sweep_nodes()


def _locked(job):
    return Job.objects.select_for_update().select_related("tenant").get(pk=job.pk)


def _run_again(job):
    passes.run_pass()
    with transaction.atomic():
        do_mark_running(_locked(job))


def test_a_job_fails_with_node_lost_once_its_node_losses_pass_the_cap(world, settings):
    settings.TESSERA = {**settings.TESSERA, "MAX_NODE_LOSSES": 2}
    node = helpers.make_node("a100-01")
    job = _running_job(world, gpus=1, max_retries=5)
    for losses in (1, 2):  # requeued twice, at once, with no retry used
        _lose_node(node, settings)
        job.refresh_from_db()
        assert job.state == JobState.PENDING and job.node_losses == losses and job.not_before is None
        Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now(), state=NodeState.READY)
        _run_again(job)
    _lose_node(node, settings)  # the third loss: past the cap of 2
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.node_losses == 2
    assert job.events.get(type="failed").reason == "node-lost"
    assert job.events.filter(type="requeued", reason="node-lost").count() == 2
    assert not job.events.filter(type="retrying").exists()  # its 5 retries were never touched


def test_a_job_that_failed_before_its_node_was_lost_uses_a_retry(world, settings):
    settings.TESSERA = {**settings.TESSERA, "RETRY_BACKOFF_S": 10.0}
    node = helpers.make_node("a100-01")
    job = _running_job(world, gpus=1, max_retries=1)
    with transaction.atomic():
        begin_stop(_locked(job), "exit 3")  # one replica failed; the rest are being stopped
    _lose_node(node, settings)
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.node_losses == 0
    assert job.events.get(type="retrying").reason == "exit 3"


def test_a_bound_job_that_never_started_is_requeued_without_consuming_a_retry(world, settings):
    node = helpers.make_node("a100-01")
    job = helpers.submit(world.alice, world.vision, gpus=1)  # max_retries 0
    passes.run_pass()
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED
    _lose_node(node, settings)
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.not_before is None
    assert job.events.filter(type="requeued", reason="node-lost").exists()
    assert not job.events.filter(type="retrying").exists()


def test_preemptions_do_not_consume_retries(world, settings):
    helpers.make_node("a100-01")
    job = _running_job(world, gpus=1, max_retries=1)
    for _ in range(2):  # preempted twice: attempts grow, the one retry stays
        with transaction.atomic():
            begin_stop(_locked(job), "preempted: for a test")
        with transaction.atomic():
            do_record_exit(_locked(job), -15)
        _run_again(job)
    with transaction.atomic():
        do_record_exit(_locked(job), 3)
    job.refresh_from_db()
    assert job.attempts == 3 and job.state == JobState.PENDING  # the failure still had its retry
    assert job.events.filter(type="retrying", reason="exit 3").exists()


def test_a_cancelled_job_on_a_lost_node_ends_cancelled(world, settings):
    node = helpers.make_node("a100-01")
    job = _running_job(world, gpus=1, max_retries=5)
    with transaction.atomic():
        begin_stop(_locked(job), "cancelled")
    _lose_node(node, settings)
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_a_node_going_not_ready_is_pushed_to_dashboards(world, settings, django_capture_on_commit_callbacks):
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)("gpus", channel)
    node = helpers.make_node("a100-01")
    late = timezone.now() - timedelta(seconds=settings.TESSERA["HEARTBEAT_TIMEOUT_S"] + 1)
    Node.objects.filter(pk=node.pk).update(last_heartbeat=late)
    with django_capture_on_commit_callbacks(execute=True):
        sweep_nodes()
    message = async_to_sync(layer.receive)(channel)
    assert message["type"] == "node.update"
    assert message["node"]["name"] == "a100-01" and message["node"]["state"] == "not-ready"


def test_a_wall_clock_stepped_forward_past_the_lease_requeues_no_job_of_a_live_node(
    world, settings, monkeypatch
):
    """NTP stepping the server's clock (or a resumed virtual machine): the agents heartbeat every
    few seconds and are alive, but their last heartbeats were stamped before the step. Only a
    node that then stays silent for a lease and the margin of real time is lost."""
    from scheduling.services import health

    settings.TESSERA = {
        **settings.TESSERA,
        "HEARTBEAT_TIMEOUT_S": 30.0,
        "LEASE_S": 60.0,
        "FENCE_MARGIN_S": 5.0,
    }
    health.clock_steps.forget()
    node = helpers.make_node("a100-01")
    job = _running_job(world, gpus=1, max_retries=1)
    start = timezone.now()
    clocks = {"wall": start, "mono": 1000.0}
    monkeypatch.setattr(health.timezone, "now", lambda: clocks["wall"])
    monkeypatch.setattr(health, "monotonic", lambda: clocks["mono"])

    def at(real_s: float, stepped_s: float = 0.0) -> list[str]:
        clocks["wall"] = start + timedelta(seconds=real_s + stepped_s)
        clocks["mono"] = 1000.0 + real_s
        return sweep_nodes()

    Node.objects.filter(pk=node.pk).update(last_heartbeat=start)
    assert at(1) == []
    assert at(3, stepped_s=120) == []  # two seconds later in real time, the clock 2 minutes on
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert Node.objects.get(pk=node.pk).state == NodeState.READY

    Node.objects.filter(pk=node.pk).update(last_heartbeat=start + timedelta(seconds=124))  # new clock
    assert at(13, stepped_s=120) == []
    # Silent from then on: lost, at worst a step later than without one (then the window is over).
    at(4 + 66 + 120, stepped_s=120)
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.events.filter(type="requeued", reason="node-lost").exists()
    health.clock_steps.forget()
