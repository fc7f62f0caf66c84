"""Batches of reads as server-side prepared statements, still in one round trip (PostgreSQL).

Django's psycopg cursor binds parameters on the client and sends a batch of reads as one
multi-statement query (``snapshot.read_together``): PostgreSQL parses and plans every statement
of it every time. A pass's snapshot read is nine statements, planned in ~1.1 ms and run in
~0.5 ms on an idle database (docs/benchmarks/e2e.md). Here the same batch goes through psycopg's
pipeline mode, each statement prepared on the server by psycopg (``prepare=True``: psycopg names
the statement, per connection, prepares it there the first time the connection runs it and
reuses it after; a new connection prepares again), with one Sync at the end: one round trip, and
no parsing or planning but every ``REPLAN_S`` seconds.

What a statement's plan may depend on is its text: a read without values (the snapshot's) has
its constant parameters (the states it filters on, a primary key) written into the SQL as
literals, as the client-side cursor writes them, so the one plan PostgreSQL keeps is the plan for
those constants (bound as parameters they would get a generic plan, or be planned again every
time). A read of a list of values (``= ANY(%s)``) keeps that list as its one parameter.

Django leaves psycopg's ``prepare_threshold`` None (nothing prepared, so that transaction-mode
poolers keep working); it is set only while a batch is sent, so that nothing else Django sends is
counted or prepared. Django's cursor wrapper still runs the batch (its execute wrappers, query
log and error translation see one execute per round trip, as before). docs/internals.md lists
this with its canary; ``TESSERA_SERVER_PREPARED_READS=0`` turns it off (the client-side batch).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection

from scheduling.services.bulk import BEGIN, statements_together

# psycopg prepares a statement run this many times on its own; only ``prepare=True`` ones here.
_ONLY_WHEN_ASKED = sys.maxsize

# A prepared statement's plan is kept until PostgreSQL invalidates it (an ANALYZE or VACUUM of a
# table it reads), while a query sent afresh is planned for its tables' current size: a plan
# made when the job table was nearly empty was kept while it grew (the runtime history's read
# ran 9.5 ms where a fresh plan ran 1.3: docs/benchmarks/e2e.md, Session 16). So every
# REPLAN_S seconds each read is prepared anew, its text carrying the period's number (psycopg
# deallocates older statements as they leave its cache of ``prepared_max``, 100).
REPLAN_S = 5.0
clock = time.monotonic


@dataclass(frozen=True, slots=True)
class ServerRead:
    """One read as the server runs it: its SQL (``%s`` placeholders for ``params``, or none
    when ``params`` is None)."""

    sql: str
    params: Sequence[Any] | None


def enabled() -> bool:
    """Do batches of reads go as prepared statements here? On PostgreSQL where they go together
    (the client-side binding cursor, Django's default), unless switched off."""
    return bool(settings.TESSERA["SERVER_PREPARED_READS"]) and statements_together()


def inline(sql: str, params: Sequence[Any]) -> str:
    """``sql`` with ``params`` written in as literals, as Django's client-side cursor sends it."""
    connection.ensure_connection()
    return psycopg.ClientCursor(connection.connection).mogrify(sql, params)


class Inlined:
    """One read's SQL with its constant parameters written in (:func:`inline`), once per vendor:
    the read is built once per process, and so are its parameters."""

    def __init__(self) -> None:
        self._sql: dict[str, str] = {}

    def sql(self, sql: str, params: Sequence[Any]) -> str:
        vendor = connection.vendor
        if vendor not in self._sql:
            self._sql[vendor] = inline(sql, params)
        return self._sql[vendor]


class _Query:
    """What Django's query log reads of the cursor that ran a query (``last_executed_query``)."""

    def __init__(self, text: str) -> None:
        self.query = text.encode()


class _Batch:
    """The object Django's cursor wrapper runs: ``execute`` sends the reads in one pipeline and
    keeps each one's rows (``rows``); the wrapper's ``sql`` is the batch's text, for its hooks
    and log only."""

    def __init__(self, reads: Sequence[ServerRead], begin: bool) -> None:
        self.reads, self.begin = reads, begin
        self.rows: list[list[Any]] = []
        self._query: _Query | None = None

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> None:
        raw = connection.connection
        threshold = raw.prepare_threshold
        cursors = [psycopg.Cursor(raw) for _ in range(len(self.reads) + self.begin)]
        raw.prepare_threshold = _ONLY_WHEN_ASKED if threshold is None else threshold
        try:
            with raw.pipeline():
                if self.begin:
                    cursors[0].execute(BEGIN, prepare=False)
                reading = cursors[1:] if self.begin else cursors
                period = f"/* plan {int(clock() // REPLAN_S)} */ "
                for cur, read in zip(reading, self.reads, strict=True):
                    cur.execute(period + read.sql, read.params, prepare=True)
            # The pipeline's end sent the Sync and read every result.
            self.rows = [cur.fetchall() for cur in reading]
        finally:
            raw.prepare_threshold = threshold
            for cur in cursors:
                cur.close()
        if connection.queries_logged:
            self._query = _Query(sql)

    def close(self) -> None:
        pass


def read(reads: Sequence[ServerRead], text: str, params: Sequence[Any], begin: bool) -> list[list[Any]]:
    """The rows of each of ``reads``, in order, in one round trip (``begin``: a BEGIN first).
    ``text`` and ``params``: the batch as the client-side cursor would send it, shown to
    Django's execute wrappers and query log."""
    connection.ensure_connection()
    connection.validate_thread_sharing()
    batch = _Batch(reads, begin)
    wrap = connection.make_debug_cursor if connection.queries_logged else connection.make_cursor
    # Django's wrapper (its hooks, its log, its database errors) around what it takes for a
    # DB-API cursor (the stubs type that argument as the wrapper itself).
    with wrap(batch) as cur:  # type: ignore[arg-type]
        cur.execute(text, params)
    return batch.rows
