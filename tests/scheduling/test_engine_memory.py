"""The engine's memory and runtime history through the database: the live pass stores what its
engine leaves and the next pass loads it, and finished jobs feed the runtime predictor."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from scheduling.choices import JobState
from scheduling.engine.config import EngineConfig
from scheduling.engine.memory import VERSION, EngineMemory
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import Decisions
from scheduling.models import EngineMemoryRecord, Job, Node
from scheduling.services import passes
from scheduling.services.agents import do_report_exit, do_report_started
from scheduling.services.memory import store_memory
from scheduling.services.snapshot import _MEMORY, HISTORY_KEEP, StoredMemory, load_snapshot
from scheduling.sim.generate import generate
from scheduling.sim.perpass import PerPassScheduler
from scheduling.sim.replay import replay
from scheduling.sim.traces import read_jobs, read_nodes, read_quotas
from tests.engine.engine_world import Recorded
from tests.scheduling import helpers


class ThroughTheTable(PerPassScheduler):
    """Rebuilt every pass, its memory stored in and loaded from the real table each time."""

    def decide(self, now: float) -> Decisions:
        stored = StoredMemory.of_rows(_MEMORY.rows())
        engine = TesseraScheduler.from_snapshot(self.snapshot(now), self.config, stored.memory)
        d = engine.decide(now)
        store_memory(engine.memory(), d.not_reached, stored, timezone.now())
        self.passes += 1
        self.apply(d, now)
        return d


def test_an_engine_whose_memory_goes_through_the_table_decides_as_the_long_lived_one(db, tmp_path: Path):
    generate(tmp_path, seed=3, days=0.25, load=1.2, gpus=48)
    nodes, jobs = read_nodes(tmp_path / "nodes.csv"), read_jobs(tmp_path / "jobs.csv")
    quotas = read_quotas(tmp_path / "quotas.csv")
    config = EngineConfig(resizes=False)
    long_lived = Recorded(TesseraScheduler(tuple(nodes), tuple(quotas), config))
    rebuilt = Recorded(ThroughTheTable(nodes, quotas, config, shuffle=True))
    replay(nodes, jobs, long_lived)
    replay(nodes, jobs, rebuilt)
    assert len(rebuilt.log) > 50
    assert EngineMemoryRecord.objects.get().memory["recent"]
    assert [i for i, (a, b) in enumerate(zip(long_lived.log, rebuilt.log, strict=True)) if a != b] == []


@pytest.fixture
def full_node(world):
    """One 8-GPU node, all of it held by alice's running job (no time limit), started 10 min ago."""
    helpers.make_node("a100-01", gpus=8)
    running = helpers.submit(world.alice, world.vision, name="long", gpus=8)
    passes.run_pass()
    Job.objects.filter(pk=running.pk).update(
        state=JobState.RUNNING, started_at=timezone.now() - timedelta(minutes=10)
    )
    return running


def finished(world, minutes: float, ended_ago_h: float, state=JobState.SUCCEEDED, kind="training", **kw):
    end = timezone.now() - timedelta(hours=ended_ago_h)
    job = helpers.submit(world.alice, world.vision, kind=kind, **kw)
    Job.objects.filter(pk=job.pk).update(
        state=state, started_at=end - timedelta(minutes=minutes), finished_at=end
    )
    return job


def test_a_waiting_job_is_estimated_from_its_tenants_finished_runs(world, full_node):
    for i in range(12):  # the ten latest: 30 min each; two older ones of 10 h are forgotten
        finished(world, minutes=30 if i < 10 else 600, ended_ago_h=1 + i)
    waiting = helpers.submit(world.alice, world.vision, name="next", gpus=8)
    passes.run_pass()
    waiting.refresh_from_db()
    # the running job is expected to run 30 min as its tenant's training runs did, 10 min are
    # gone: ~20 min, not the 4 h assumed without history
    assert waiting.pending_code == "reserved"
    assert "expected to start in ~20 min" in waiting.pending_reason


def test_the_history_is_the_latest_runs_that_ended_on_their_own_of_what_waits(world, full_node):
    # what holds GPUs: alice's training job "long"; the keys read: (vision, training), (alice, "long")
    kept = [finished(world, minutes=5 + i, ended_ago_h=1 + i) for i in range(HISTORY_KEEP - 1)]
    finished(world, minutes=99, ended_ago_h=50)  # past the latest of vision's training runs
    finished(world, minutes=1, ended_ago_h=0.5, state=JobState.CANCELLED)  # says nothing of runtime
    finished(world, minutes=1, ended_ago_h=0.5, kind="batch")  # no batch job waits: not read
    rerun = finished(world, minutes=40, ended_ago_h=70, kind="batch", name="long")  # alice's "long"
    failed = finished(world, minutes=3, ended_ago_h=0.2, state=JobState.FAILED)
    # the keys' neighbours: carol's "long" (a batch job), nlp's training runs, alice's "longer"
    helpers.submit(world.carol, world.vision, kind="batch", name="long")
    finished(world, minutes=7, ended_ago_h=0.1, kind="batch", name="longer")
    Job.objects.filter(owner=world.carol).update(
        state=JobState.SUCCEEDED, started_at=timezone.now() - timedelta(hours=1), finished_at=timezone.now()
    )
    bob = helpers.submit(world.bob, world.nlp, kind="training", name="other")
    Job.objects.filter(pk=bob.pk).update(
        state=JobState.SUCCEEDED, started_at=timezone.now() - timedelta(hours=1), finished_at=timezone.now()
    )
    history = load_snapshot(timezone.now()).snapshot.history
    assert sorted(int(r.job_id) for r in history) == sorted([j.pk for j in kept] + [failed.pk, rerun.pk])
    run = next(r for r in history if r.job_id == str(kept[0].pk))
    assert (run.tenant, run.kind, run.outcome, run.runtime_s) == ("vision", "training", "succeeded", 300.0)
    assert run.user == str(world.alice.pk) and run.gpus == 1.0
    assert next(r for r in history if r.job_id == str(rerun.pk)).name == "long"


def test_a_pass_stores_what_its_engine_left_and_memory_unchanged_is_not_written_again(world, full_node):
    helpers.submit(world.alice, world.vision, name="next", gpus=8)
    passes.run_pass()
    row = EngineMemoryRecord.objects.get()
    assert [r[0] for r in row.memory["reservations"]] == [str(Job.objects.get(name="next").pk)]
    stored = load_snapshot(timezone.now()).stored
    store_memory(stored.memory, sorted(stored.not_reached), stored, timezone.now() + timedelta(hours=1))
    assert EngineMemoryRecord.objects.get().updated_at == row.updated_at


def test_a_pass_takes_the_memory_it_stored_as_it_was_and_decodes_another_writers(
    world, full_node, monkeypatch
):
    helpers.submit(world.alice, world.vision, name="next", gpus=8)
    passes.run_pass()
    decoded: list[object] = []
    real = EngineMemory.from_json
    monkeypatch.setattr(
        EngineMemory, "from_json", classmethod(lambda cls, doc: decoded.append(doc) or real(doc))
    )
    stored = load_snapshot(timezone.now()).stored
    assert decoded == [] and [r.job_id for r in stored.memory.reservations] == [
        str(Job.objects.get(name="next").pk)
    ]
    # Another process wrote the row since: its document is decoded, not taken for this one's
    doc = {**EngineMemoryRecord.objects.get().memory, "rack_gang_gpus": 16.0}
    EngineMemoryRecord.objects.filter(pk=1).update(memory=doc)
    stored = load_snapshot(timezone.now()).stored
    assert len(decoded) == 1 and stored.memory.rack_gang_gpus == 16.0


def test_a_memory_this_engine_cannot_read_is_set_aside_with_a_warning(world, full_node, caplog):
    EngineMemoryRecord.objects.update_or_create(pk=1, defaults={"memory": {"version": 0}})
    waiting = helpers.submit(world.alice, world.vision, name="next", gpus=8)
    with caplog.at_level(logging.WARNING, logger="tessera.pass"):
        passes.run_pass()
    waiting.refresh_from_db()
    assert waiting.pending_code == "reserved"
    assert "engine memory not loaded" in caplog.text
    assert EngineMemoryRecord.objects.get().memory["version"] == VERSION


@pytest.mark.postgresql("the plan of PostgreSQL's LATERAL history read, on a table never analysed")
def test_the_history_is_read_by_key_from_its_indexes_whatever_the_statistics(
    transactional_db, require_postgres
):
    """On a young job table (no statistics yet) each waiting job's key is looked up in the history
    indexes, not among every job of its owner or tenant (that took a pass 200 ms on the
    benchmark's table: docs/benchmarks/e2e.md). Each step commits, as the services' do."""
    from django.contrib.auth.models import User
    from django.db import connection

    from scheduling.models import Tenant
    from scheduling.services.snapshot import _HISTORY

    tenant, user = Tenant.objects.create(name="bench"), User.objects.create(username="bench")
    now = timezone.now()
    jobs = Job.objects.bulk_create(
        Job(tenant=tenant, owner=user, name=f"bench-{i}", kind="batch", command=["true"]) for i in range(600)
    )
    ran = [j.pk for j in jobs[:300]]  # half ran (pending, scheduled, running, succeeded), half wait
    for state in (JobState.SCHEDULED, JobState.RUNNING):
        Job.objects.filter(pk__in=ran).update(state=state)
    Job.objects.filter(pk__in=ran).update(
        state=JobState.SUCCEEDED, started_at=now - timedelta(minutes=5), finished_at=now
    )
    statement = _HISTORY.statement()
    with connection.cursor() as cur:
        cur.execute("EXPLAIN " + statement.sql, statement.params)
        plan = "\n".join(row[0] for row in cur.fetchall())
    scans = [line.split(" on ")[0].split("using ")[-1] for line in plan.splitlines() if "Index Scan" in line]
    assert "job_runtime_history" in scans and "job_named_history" in scans, plan
    assert not [s for s in scans if "owner_id" in s or "tenant_id" in s], plan


def test_the_history_gives_each_runs_length_and_end_to_the_microsecond(world, full_node):
    """The runs' lengths and ends the pass reads (as epoch seconds computed by PostgreSQL, or
    from the timestamps elsewhere) are exactly the seconds Python computes from the rows."""
    runs = [
        finished(world, minutes=m, ended_ago_h=h) for m, h in ((7.123457, 1.000001), (0.000017, 2.5), (61, 3))
    ]
    Job.objects.filter(pk=runs[0].pk).update(finished_at=timezone.now() - timedelta(hours=1, microseconds=3))
    history = {r.job_id: r for r in load_snapshot(timezone.now()).snapshot.history}
    for job in Job.objects.filter(pk__in=[r.pk for r in runs]):
        run = history[str(job.pk)]
        assert run.runtime_s == (job.finished_at - job.started_at).total_seconds()
        assert run.ended_at == job.finished_at.timestamp()


def test_the_live_pass_keeps_first_estimates_and_learns_from_them_once_the_jobs_start(
    world, full_node, settings
):
    """The start estimates' record (engine/eta_learnt.py) rides in the stored memory: a waiting
    job's first estimate is kept from pass to pass, and once the job runs, how it turned out."""
    settings.TESSERA = {**settings.TESSERA, "ETA_EVERY_S": 0.0}  # every pass plans them
    first = helpers.submit(world.alice, world.vision, name="next", gpus=8)
    second = helpers.submit(world.alice, world.vision, name="after", gpus=8)
    passes.run_pass()
    memory = EngineMemoryRecord.objects.get().memory
    kept = {row[0]: row for row in memory["eta_first"]}
    assert set(kept) == {str(first.pk), str(second.pk)} and memory["eta_seen"] == []
    passes.run_pass()  # a pass later: the first estimates are still the ones first made
    assert {row[0]: row for row in EngineMemoryRecord.objects.get().memory["eta_first"]} == kept
    node = Node.objects.get(name="a100-01")
    full_node.refresh_from_db()
    do_report_exit(node, full_node.pk, full_node.attempts, 0, 0)  # the running job ends
    passes.run_pass()  # "next" is bound to the freed node
    first.refresh_from_db()
    do_report_started(node, first.pk, first.attempts, 0)
    passes.run_pass()
    memory = EngineMemoryRecord.objects.get().memory
    assert [row[0] for row in memory["eta_first"]] == [str(second.pk)]
    learnt = dict(memory["eta_seen"])
    assert set(learnt) == {kept[str(first.pk)][3], "all"} and all(len(r) == 1 for r in learnt.values())
