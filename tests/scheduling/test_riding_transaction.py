"""A pass's bindings in a transaction whose BEGIN and COMMIT ride on its read and its writes
(``bulk.riding_transaction``, docs/internals.md): all or nothing, locks held to the end, live
updates and wakes only after the commit."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from psycopg.pq import TransactionStatus

from scheduling.choices import EventType, JobState
from scheduling.models import Allocation, Job
from scheduling.services import live, passes
from scheduling.services.bulk import COMMIT, Write, riding_transaction, write_together
from scheduling.services.jobs import LOCK_JOBS
from scheduling.services.snapshot import read_together
from tests.scheduling import helpers

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgresql("the BEGIN and COMMIT ride on PostgreSQL's multi-statement queries"),
    pytest.mark.usefixtures("require_postgres"),
]


def _status() -> TransactionStatus:
    return connection.connection.info.transaction_status


def _sent(statements: list[str]):
    def wrapper(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    return connection.execute_wrapper(wrapper)


def test_a_pass_binds_with_the_begin_on_its_read_and_the_commit_on_its_writes(world):
    helpers.make_node("a100-01")
    job = helpers.submit(world.alice, world.vision, gpus=2)
    at_commit: list[tuple[TransactionStatus, str]] = []
    wake_agents = live.wake_agents

    def waking(starts):
        # Registered after the writes: runs at the block's end, the job stored by then.
        transaction.on_commit(lambda: at_commit.append((_status(), Job.objects.get(pk=job.pk).state)))
        wake_agents(starts)

    statements: list[str] = []
    with pytest.MonkeyPatch.context() as patch, _sent(statements):
        patch.setattr(live, "wake_agents", waking)
        assert passes.run_pass().bound == [str(job.pk)]
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED
    assert Allocation.objects.filter(job=job).count() == 2
    assert job.events.filter(type=EventType.SCHEDULED).exists()
    assert [s for s in statements if s.startswith("BEGIN;")], "the read carried no BEGIN"
    assert [s for s in statements if s.endswith(";\nCOMMIT")], "the writes carried no COMMIT"
    assert at_commit == [(TransactionStatus.IDLE, JobState.SCHEDULED)]


def test_an_error_after_the_riding_begin_writes_nothing_and_releases_the_locks(world):
    job = helpers.submit(world.alice, world.vision, gpus=1)
    hooks: list[int] = []
    with pytest.raises(RuntimeError), riding_transaction() as rides:
        assert rides
        (rows,) = read_together((LOCK_JOBS, [job.pk]), begin=True)
        assert rows and _status() == TransactionStatus.INTRANS
        write_together(Write('UPDATE "scheduling_job" SET "priority" = 99 WHERE "id" = %s', [job.pk]))
        transaction.on_commit(lambda: hooks.append(1))
        raise RuntimeError("the pass failed between its read and its commit")
    assert _status() == TransactionStatus.IDLE
    job.refresh_from_db()
    assert job.priority != 99 and hooks == []
    with connection.cursor() as cur:  # the row lock is gone with the transaction
        cur.execute('SELECT "id" FROM "scheduling_job" WHERE "id" = %s FOR UPDATE NOWAIT', [job.pk])


def test_the_commit_rides_on_the_last_write_and_the_hooks_run_after_it(world):
    job = helpers.submit(world.alice, world.vision, gpus=1)
    seen: list[TransactionStatus] = []
    with riding_transaction() as rides:
        assert rides
        read_together((LOCK_JOBS, [job.pk]), begin=True)
        transaction.on_commit(lambda: seen.append(_status()))
        write_together(Write('UPDATE "scheduling_job" SET "priority" = 99 WHERE "id" = %s', [job.pk]), COMMIT)
        assert _status() == TransactionStatus.IDLE and seen == []
    assert seen == [TransactionStatus.IDLE]
    assert Job.objects.get(pk=job.pk).priority == 99
    assert connection.get_autocommit() and connection.connection.autocommit


def test_no_riding_inside_another_atomic_block_or_when_switched_off(world, settings):
    with transaction.atomic(), riding_transaction() as rides:
        assert not rides
    settings.TESSERA = {**settings.TESSERA, "RIDING_TRANSACTIONS": False}
    with riding_transaction() as rides:
        assert not rides
    assert connection.get_autocommit()


def _advisory_locks_held() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
        return cur.fetchone()[0]


def test_a_binding_pass_stores_its_memory_with_its_first_commit_and_unlocks_with_its_record(world):
    """The engine's memory rides in the first chunk's transaction (never stored apart from the
    bindings it planned), and the pass's record carries the lock's release: no round trip of
    their own."""
    helpers.make_node("a100-01")
    helpers.submit(world.alice, world.vision, gpus=1)
    passes.run_pass()  # the first record reads the row (locked); later ones update it as written
    job = helpers.submit(world.alice, world.vision, gpus=2)
    statements: list[str] = []
    with _sent(statements):
        assert passes.run_pass().bound == [str(job.pk)]
    memory = [s for s in statements if "scheduling_enginememoryrecord" in s and "INSERT" in s]
    assert len(memory) == 1, statements
    assert '"scheduling_allocation"' in memory[0] and memory[0].endswith(";\nCOMMIT")
    record = [s for s in statements if '"scheduling_schedulerstate"' in s]
    assert len(record) == 1 and record[0].endswith("SELECT pg_advisory_unlock(%s)")
    assert not [s for s in statements if s.startswith("SELECT pg_advisory_unlock")], "a separate unlock"
    assert _advisory_locks_held() == 0
    from scheduling.models import EngineMemoryRecord

    assert EngineMemoryRecord.objects.get(pk=1).updated_at is not None


def test_a_pass_reads_the_queue_first_and_the_cluster_only_when_a_job_waits(world):
    """Every pass reads the queue, and whether a running job can grow, in one round trip; the
    rest of the cluster only when something waits. A pass asked for whose job an earlier pass
    bound (a quarter of the passes under ``make bench-e2e``) reads nothing more."""
    from scheduling.services import triggers

    helpers.make_node("a100-01")
    job = helpers.submit(world.alice, world.vision, gpus=1)
    triggers.set_again()
    statements: list[str] = []
    with _sent(statements):
        assert passes.run_pass().bound == [str(job.pk)]
    selects = [s for s in statements if s.lstrip().startswith("SELECT")]
    first = selects[1]  # after the lock's
    assert '"scheduling_job"' in first and '"scheduling_node"' not in first, first
    assert first.count(";\n") == 1 and "'pending'" not in first  # two reads; parameters, not literals
    cluster = [s for s in selects if '"scheduling_node"' in s]
    assert len(cluster) == 1 and cluster[0].count(";\n") >= 7, cluster
    for asked in (True, False):  # the job is bound: asked for or not, the pass reads the queue alone
        if asked:
            triggers.set_again()
        statements.clear()
        with _sent(statements):
            assert passes.run_pass() is not None
        assert not [s for s in statements if '"scheduling_node"' in s], "an empty pass read the cluster"
