"""The scheduling pass: snapshot → engine → apply, all or nothing, never double-booked."""

from __future__ import annotations

import pytest
from django.utils import timezone

from scheduling.choices import EventType, JobState
from scheduling.engine.types import Binding, Decisions, PendingReason, Placement
from scheduling.models import Allocation, Node
from scheduling.services import passes, triggers
from scheduling.services.snapshot import load_snapshot
from tests.scheduling import helpers


@pytest.fixture
def two_nodes(world):
    return helpers.make_node("a100-01"), helpers.make_node("a100-02")


def test_a_pass_binds_a_pending_job_to_gpus_of_one_node(world, two_nodes):
    job = helpers.submit(world.alice, world.vision, gpus=2)
    result = passes.run_pass()
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED
    assert result.bound == [str(job.pk)]
    allocs = list(Allocation.objects.filter(job=job, released_at__isnull=True))
    assert len(allocs) == 2
    assert len({a.device.node_id for a in allocs}) == 1
    scheduled = job.events.get(type=EventType.SCHEDULED)
    assert scheduled.allocations[0]["gpus"] == sorted(a.device.index for a in allocs)


@pytest.mark.parametrize("pause", [True, False], ids=["collector-paused", "switched-off"])
def test_the_collector_is_paused_while_a_pass_decides_unless_switched_off(world, two_nodes, settings, pause):
    """TESSERA_GC_PAUSE_IN_PASS (docs/internals.md): the engine decides with the collector off."""
    import gc

    settings.TESSERA = {**settings.TESSERA, "GC_PAUSE_IN_PASS": pause}
    seen: list[bool] = []
    make_policy = passes.make_policy

    def watching(loaded):
        policy = make_policy(loaded)
        decide = policy.decide
        policy.decide = lambda *args: (seen.append(gc.isenabled()), decide(*args))[1]
        return policy

    helpers.submit(world.alice, world.vision, gpus=1)
    assert gc.isenabled()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(passes, "make_policy", watching)
        assert passes.run_pass().bound
    assert seen == [not pause] and gc.isenabled()


def test_a_gang_is_bound_whole_or_not_at_all(world, two_nodes):
    job = helpers.submit(world.alice, world.vision, gpus=24, replicas=3, min_available=3)
    passes.run_pass()
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert not Allocation.objects.filter(job=job).exists()
    assert job.pending_code
    assert job.pending_reason


def test_a_decision_on_a_stale_node_is_dropped(world, two_nodes):
    job = helpers.submit(world.alice, world.vision, gpus=1)
    loaded = load_snapshot(timezone.now())
    Node.objects.filter(name="a100-01").update(version=99)  # something moved since the snapshot
    decisions = Decisions(bindings=[Binding(str(job.pk), (Placement(0, "a100-01", (0,)),))])
    result = passes.apply_decisions(loaded, decisions, timezone.now())
    job.refresh_from_db()
    assert result.dropped == [str(job.pk)]
    assert job.state == JobState.PENDING


def test_the_engines_memory_is_stored_even_when_the_first_chunk_binds_nothing(world, two_nodes):
    """The memory rides with the first chunk's writes; a chunk whose bindings are all dropped
    (stale) still stores it: the next pass starts from what this one planned."""
    from scheduling.engine.memory import EngineMemory
    from scheduling.models import EngineMemoryRecord
    from scheduling.services import memory as stored_memory

    job = helpers.submit(world.alice, world.vision, gpus=1)
    loaded = load_snapshot(timezone.now())
    Node.objects.filter(name="a100-01").update(version=99)
    write = stored_memory.memory_write(EngineMemory(), ["17"], loaded.stored, timezone.now())
    assert write is not None
    decisions = Decisions(bindings=[Binding(str(job.pk), (Placement(0, "a100-01", (0,)),))])
    result = passes.apply_decisions(loaded, decisions, timezone.now(), memory=write)
    assert result.dropped == [str(job.pk)]
    assert EngineMemoryRecord.objects.get(pk=1).not_reached == ["17"]


def test_a_gpu_is_never_bound_twice_even_by_a_wrong_decision(world, two_nodes):
    first = helpers.submit(world.alice, world.vision, gpus=1)
    second = helpers.submit(world.bob, world.nlp, gpus=1)
    loaded = load_snapshot(timezone.now())
    same_gpu = (Placement(0, "a100-01", (3,)),)
    decisions = Decisions(bindings=[Binding(str(first.pk), same_gpu)])
    passes.apply_decisions(loaded, decisions, timezone.now())
    # A decision from the same (now stale) snapshot for the same GPU must be refused.
    loaded.node_versions["a100-01"] = Node.objects.get(name="a100-01").version
    passes.apply_decisions(loaded, Decisions(bindings=[Binding(str(second.pk), same_gpu)]), timezone.now())
    second.refresh_from_db()
    assert second.state == JobState.PENDING
    assert Allocation.objects.filter(device__index=3, released_at__isnull=True).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_pass_that_finds_the_lock_taken_asks_for_one_more(two_nodes):
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    def other_worker():  # another thread: another database connection, like another worker
        try:
            return passes.run_pass()
        finally:
            connection.close()

    assert passes.try_lock()
    try:
        with ThreadPoolExecutor(1) as pool:
            assert pool.submit(other_worker).result(timeout=30) is None  # it does not wait
    finally:
        passes.unlock()
    assert triggers.take_again() is True


def test_every_pending_job_gets_a_reason(world, two_nodes):
    jobs = [helpers.submit(world.alice, world.vision, gpus=8) for _ in range(3)]
    passes.run_pass()
    states = {j.pk: j for j in type(jobs[0]).objects.filter(pk__in=[j.pk for j in jobs])}
    pending = [j for j in states.values() if j.state == JobState.PENDING]
    assert len(pending) == 1
    assert pending[0].pending_code and pending[0].pending_reason


def test_a_waiting_job_gets_a_start_estimate_with_its_band_basis_and_place_and_loses_it_once_held(
    world, two_nodes, settings
):
    from scheduling.services.holds import do_hold_job

    settings.TESSERA = {**settings.TESSERA, "ETA_EVERY_S": 0.0}  # every pass plans them

    jobs = [helpers.submit(world.alice, world.vision, gpus=8, time_limit_seconds=3600) for _ in range(5)]
    passes.run_pass()
    waiting = sorted(
        (j for j in type(jobs[0]).objects.filter(pk__in=[j.pk for j in jobs]) if j.state == JobState.PENDING),
        key=lambda j: j.queue_position or 0,
    )
    assert [(j.queue_position, j.jobs_ahead) for j in waiting] == [(1, 0), (2, 1), (3, 2)]
    for job in waiting:
        assert job.estimated_start_earliest <= job.estimated_start <= job.estimated_start_latest
        assert job.estimated_start > timezone.now()
        assert "its time limit of 1 h (no history yet)" in job.estimate_basis
    # two start when the two running jobs end (typically half their limit); the third after one of them
    assert waiting[0].estimated_start == waiting[1].estimated_start < waiting[2].estimated_start
    settings.TESSERA = {**settings.TESSERA, "ETA_EVERY_S": 3600.0}  # a pass between plans: kept
    passes.run_pass()
    first = type(jobs[0]).objects.get(pk=waiting[0].pk)
    assert (first.estimated_start, first.queue_position) == (waiting[0].estimated_start, 1)
    do_hold_job(waiting[1].pk)
    passes.run_pass()
    waiting[1].refresh_from_db()
    assert (waiting[1].queue_position, waiting[1].estimate_basis, waiting[1].estimated_start_latest) == (
        None,
        "",
        None,
    )


def test_a_cpu_only_job_is_bound_to_a_node_without_gpus(world, two_nodes):
    job = helpers.submit(world.alice, world.vision, gpus=0, cpus=4)
    passes.run_pass()
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED
    (alloc,) = Allocation.objects.filter(job=job, released_at__isnull=True)
    assert alloc.device is None and alloc.node.name in {"a100-01", "a100-02"}
    assert job.events.get(type=EventType.SCHEDULED).allocations == [
        {"node": alloc.node.name, "gpus": [], "share": 1.0, "replica": 0}
    ]


def test_a_pass_takes_the_same_few_queries_however_many_jobs_and_nodes(world, django_assert_max_num_queries):
    # The pass reads each table once and writes each once per chunk of bindings, whatever their
    # number: 1 job on 2 nodes and 20 jobs (of them gangs and fractions) on 8 take the same.
    for i in range(8):
        helpers.make_node(f"a100-{i:02d}", rack=f"r{i % 2}")
    passes.run_pass()  # a worker's first pass also makes the pass record's row
    helpers.submit(world.alice, world.vision, gpus=1)
    with django_assert_max_num_queries(QUERIES_PER_PASS):
        assert len(passes.run_pass().bound) == 1
    for i in range(20):
        shape = [{"gpus": 1}, {"gpus": 0.5}, {"gpus": 2, "replicas": 2, "min_available": 2}][i % 3]
        helpers.submit(world.bob, world.nlp, **shape)
    with django_assert_max_num_queries(QUERIES_PER_PASS):
        assert len(passes.run_pass().bound) == 20


def test_a_pass_with_no_job_pending_reads_only_the_queue(world, two_nodes, django_assert_max_num_queries):
    passes.run_pass()
    with django_assert_max_num_queries(QUERIES_IDLE):
        passes.run_pass()


# Counted inside the test's transaction, where each transaction of the pass is a savepoint.
QUERIES_PER_PASS = 24  # SQLite: the engine memory and runtime history reads, the memory write
QUERIES_IDLE = 7  # lock, the pending jobs, the pass's record (4), unlock


def test_each_pass_is_recorded_once_even_when_another_process_recorded_in_between(world, two_nodes):
    from scheduling.models import SchedulerState

    passes._recorded.clear()  # as a fresh worker process: the row is read, locked, first
    passes.run_pass()
    passes.run_pass()  # updated in place: the row is still as this process left it
    assert SchedulerState.objects.get(id=1).passes == 2
    # another worker process records a pass of its own: this one's copy is stale now
    SchedulerState.objects.filter(id=1).update(passes=3, last_pass_at=timezone.now())
    passes.run_pass()
    state = SchedulerState.objects.get(id=1)
    assert state.passes == 4
    assert sum(state.pass_buckets) == 3  # the other process's pass left no bucket: it was faked


def test_a_reason_is_rewritten_when_its_text_changes_or_its_estimate_moves_a_minute_not_milliseconds():
    from datetime import UTC, datetime, timedelta

    from scheduling.services.passes import ESTIMATE_SLACK, reason_changed

    t = datetime(2026, 1, 1, tzinfo=UTC)
    reserved = ("reserved", "reserved: 1 node(s) held for it, expected to start in ~240 min")
    assert not reason_changed((*reserved, t), (*reserved, t + timedelta(milliseconds=130)))  # pass to pass
    assert reason_changed((*reserved, t), (*reserved, t + ESTIMATE_SLACK))
    assert reason_changed((*reserved, t), ("reserved", "reserved: ... in ~239 min", t))
    assert reason_changed(("quota", "quota: full", None), (*reserved, None))
    assert reason_changed((*reserved, None), (*reserved, t))
    assert reason_changed((*reserved, t), (*reserved, None))
    assert not reason_changed(("quota", "quota: full", None), ("quota", "quota: full", None))


def test_a_changed_reason_reaches_dashboards_with_the_jobs_whole_payload(
    world, two_nodes, monkeypatch, django_capture_on_commit_callbacks, django_assert_max_num_queries
):
    """The pass reads back only the columns a dashboard's job update shows; the update is the same
    as one built from the whole row, and reading it back costs no query per job."""
    from scheduling.models import Job
    from scheduling.services import live

    jobs = [helpers.submit(world.alice, world.vision, gpus=8, priority=p) for p in (1, 2, 3, 4)]
    passes.run_pass()  # two run, two wait
    sent: list = []
    monkeypatch.setattr(live, "_send", lambda messages, changed=(): sent.extend(messages))
    loaded = load_snapshot(timezone.now())
    decisions = Decisions()
    for job in loaded.snapshot.pending:
        decisions.pending[job.id] = PendingReason("capacity", f"capacity: job {job.id} still waits")
    with django_capture_on_commit_callbacks(execute=True), django_assert_max_num_queries(4):
        passes._store_pending_reasons(decisions, loaded, None)
    waiting = Job.objects.select_related("tenant").filter(pk__in=[j.pk for j in jobs], state=JobState.PENDING)
    expected = {(f"jobs.tenant.{j.tenant_id}", j.pk): live.job_payload(j) for j in waiting}
    assert len(expected) == 2
    got = {(group, m["job"]["id"]): m["job"] for group, m in sent if group.startswith("jobs.tenant.")}
    assert got == expected
    assert all(p["pending_reason"] == f"capacity: job {p['id']} still waits" for p in got.values())
