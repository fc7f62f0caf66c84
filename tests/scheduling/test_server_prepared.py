"""A pass's reads as server-side prepared statements (``services/server_prepared.py``,
docs/internals.md): prepared once per connection and reused, in one round trip, the same rows as
the client-side batch, and nothing prepared with ``TESSERA_SERVER_PREPARED_READS=0``."""

from __future__ import annotations

import time

import pytest
from django.db import DataError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduling.services import passes, server_prepared
from scheduling.services.agents import ExitReport, do_report_exits
from scheduling.services.jobs import LOCK_JOBS
from scheduling.services.snapshot import (
    _DEVICES,
    _HELD,
    _HISTORY,
    _HOLDING,
    _KNOBS,
    _MEMORY,
    _NODES,
    _PENDING,
    _QUOTAS,
    PreparedRead,
    load_snapshot,
    read_together,
)
from tests.scheduling import helpers

# Outside any transaction, as a worker's pass runs (and a test may close the connection).
on_postgres = pytest.mark.django_db(transaction=True)
needs_postgres = pytest.mark.postgresql("prepared statements are PostgreSQL's")
SNAPSHOT_READS = (_PENDING, _HOLDING, _NODES, _DEVICES, _HELD, _QUOTAS, _MEMORY, _HISTORY, _KNOBS)


def _prepared() -> dict[str, str]:
    """This session's prepared statements: their text → their name."""
    with connection.cursor() as cur:
        cur.execute("SELECT statement, name FROM pg_prepared_statements")
        return dict(cur.fetchall())


def _plans(texts: list[str]) -> list[tuple[int, int]]:
    """How often each statement of ``texts`` ran with its generic plan, and with one made for
    its parameters (planned for that run)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement = ANY(%s)",
            [texts],
        )
        plans = {text: (generic, custom) for text, generic, custom in cur.fetchall()}
    return [plans[text] for text in texts]


def _snapshot_texts() -> list[str]:
    """The snapshot's reads as prepared in the current period (``server_prepared.REPLAN_S``)."""
    period = int(server_prepared.clock() // server_prepared.REPLAN_S)
    return [f"/* plan {period} */ " + read.statement().server().sql for read in SNAPSHOT_READS]


@pytest.fixture
def plan_clock(monkeypatch) -> list[float]:
    """The clock that tells when reads are prepared anew: set by the test."""
    now = [1000.0]
    monkeypatch.setattr(server_prepared, "clock", lambda: now[0])
    return now


@pytest.fixture
def busy(world):
    """Two nodes, a job holding GPUs, one that ended (the runtime history), one waiting."""
    node = helpers.make_node("a100-01")
    helpers.make_node("a100-02")
    done = helpers.submit(world.alice, world.vision, gpus=1, name="train")
    passes.run_pass()
    do_report_exits(node, [ExitReport(done.pk, 0, 0, 0, started_at=time.time() - 60)])
    helpers.submit(world.alice, world.vision, gpus=4, name="train")
    passes.run_pass()
    helpers.submit(world.alice, world.vision, gpus=64, name="never-fits")
    return world


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "client-side"])
def test_the_snapshot_reads_give_the_same_rows_prepared_or_not(busy, settings, prepared):
    settings.TESSERA = {**settings.TESSERA, "SERVER_PREPARED_READS": prepared}
    got = read_together(*((read,) for read in SNAPSHOT_READS))
    job_ids = sorted({row[0] for row in got[1]})
    locked = read_together((LOCK_JOBS, job_ids))
    settings.TESSERA = {**settings.TESSERA, "PREPARED_READS": False}  # the ORM's own rows
    orm = read_together(*((read,) for read in SNAPSHOT_READS))
    assert [[tuple(r) for r in rows] for rows in got] == [[tuple(r) for r in rows] for rows in orm]
    assert [tuple(r) for r in locked[0]] == [tuple(r) for r in read_together((LOCK_JOBS, job_ids))[0]]
    pending, holding, nodes, devices, held, _, memory, history, _ = got
    assert pending and holding and nodes and devices and held and memory and history and locked[0]


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "client-side"])
def test_a_snapshot_loads_the_same_either_way(busy, settings, prepared):
    now = timezone.now()
    settings.TESSERA = {**settings.TESSERA, "SERVER_PREPARED_READS": not prepared}
    other = load_snapshot(now)
    settings.TESSERA = {**settings.TESSERA, "SERVER_PREPARED_READS": prepared}
    this = load_snapshot(now)
    assert this.snapshot == other.snapshot and this.knobs == other.knobs
    assert this.snapshot.running and this.snapshot.pending


@on_postgres
@needs_postgres
@pytest.mark.usefixtures("require_postgres")
def test_the_snapshot_reads_are_prepared_once_per_connection_and_reused(busy, plan_clock):
    load_snapshot(timezone.now())
    first, texts = _prepared(), _snapshot_texts()
    assert all(text in first for text in texts), "a snapshot read was not prepared"
    before = _plans(texts)
    for _ in range(3):
        plan_clock[0] += server_prepared.REPLAN_S / 4  # within the period
        load_snapshot(timezone.now())
    assert _prepared() == first, "prepared again, or prepared anew: not reused"
    # Their constants written in, each has one plan, used by every run (none planned per run).
    assert _plans(texts) == [(generic + 3, 0) for generic, _ in before]
    assert connection.connection.prepare_threshold is None, "Django's own queries would be prepared"


@on_postgres
@needs_postgres
@pytest.mark.usefixtures("require_postgres")
def test_each_period_the_reads_are_prepared_and_planned_anew(busy, plan_clock):
    now = timezone.now()
    before = load_snapshot(now)
    old = _snapshot_texts()
    plan_clock[0] += server_prepared.REPLAN_S
    after = load_snapshot(now)
    new, prepared = _snapshot_texts(), _prepared()
    assert all(text in prepared for text in new) and not set(new) & set(old)
    assert {prepared[text] for text in new}.isdisjoint(prepared.get(text) for text in old)
    assert _plans(new) == [(1, 0)] * len(new)  # planned for the tables as they are now
    assert after.snapshot == before.snapshot


@on_postgres
@needs_postgres
@pytest.mark.usefixtures("require_postgres")
def test_a_new_connection_prepares_them_again(busy, plan_clock):
    now = timezone.now()
    before = load_snapshot(now)
    connection.close()  # as Django closes a connection (its age, an error): a new session
    after = load_snapshot(now)
    assert after.snapshot == before.snapshot
    assert all(text in _prepared() for text in _snapshot_texts())


@on_postgres
@needs_postgres
@pytest.mark.usefixtures("require_postgres")
def test_with_the_switch_off_nothing_is_prepared(busy, settings):
    settings.TESSERA = {**settings.TESSERA, "SERVER_PREPARED_READS": False}
    connection.close()
    load_snapshot(timezone.now())
    assert _prepared() == {}


@on_postgres
@needs_postgres
@pytest.mark.usefixtures("require_postgres")
def test_a_failed_batch_raises_djangos_error_and_the_connection_goes_on(busy):
    from scheduling.models import Job

    by_ids = PreparedRead(lambda ids: Job.objects.filter(pk__in=ids).values_list("id"))
    by_ids.rows([1, 2])  # its first read builds the ``= ANY(%s)`` form the next ones use
    with pytest.raises(DataError):  # Django's error, as from its own cursor
        read_together((_NODES,), (by_ids, ["not a number"]))
    assert len(load_snapshot(timezone.now()).snapshot.nodes) == 2


@on_postgres
@needs_postgres
@pytest.mark.usefixtures("require_postgres")
def test_a_binding_passs_locking_read_rides_its_begin_prepared(world, plan_clock):
    helpers.make_node("a100-01")
    for _ in range(2):  # a read of a list is prepared from its second run in a process on
        job = helpers.submit(world.alice, world.vision, gpus=1)
        with CaptureQueriesContext(connection) as queries:
            assert passes.run_pass().bound == [str(job.pk)]
    period = int(server_prepared.clock() // server_prepared.REPLAN_S)
    # psycopg sends the list as the statement's one parameter, $1
    locking = f"/* plan {period} */ " + LOCK_JOBS.statement([job.pk]).sql.replace("%s", "$1")
    assert locking in _prepared()
    # Django's query log and hooks see the batch as one query, its text as the client-side one.
    assert [q["sql"] for q in queries.captured_queries if q["sql"].startswith("BEGIN;")]
