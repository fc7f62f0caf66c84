"""The engine's memory, kept in the database between passes (``engine/memory.py``).

Each pass builds a new engine, in whichever worker runs it. What that engine remembers of its own
past is stored in one row, :class:`~scheduling.models.EngineMemoryRecord`, once the pass has
decided, and the next pass's snapshot loads it (``snapshot.load_snapshot``, with the runtime
history, read from the jobs that ended). A pass after a restart, or in another worker, so
decides exactly what the last pass's engine would have, had it lived on.
"""

from __future__ import annotations

import functools
from datetime import datetime

from django.db import connection

from scheduling.engine.memory import EngineMemory
from scheduling.models import EngineMemoryRecord
from scheduling.services.bulk import Write, column_of, field_of, statements_together, write_together
from scheduling.services.snapshot import StoredMemory, remember_written


def memory_write(
    memory: EngineMemory, not_reached: list[str], before: StoredMemory, now: datetime
) -> Write | None:
    """The statement storing what a pass left, or None if it is what the pass loaded (a quiet
    pass leaves the same). Only the pass lock's holder writes the row, so nothing else changed
    it in between. A pass that binds sends it with its first chunk's writes (``passes.py``: one
    transaction, no round trip of its own); :func:`store_memory` sends it alone."""
    doc = memory.to_json()
    remember_written(doc, memory)
    ids = sorted(not_reached)
    if before.same(doc, ids):
        return None
    field = functools.partial(field_of, EngineMemoryRecord)
    values = {"id": 1, "memory": doc, "not_reached": ids, "updated_at": now}
    params = [field(name).get_db_prep_save(value, connection) for name, value in values.items()]
    sql = _upsert_sql()

    def alone() -> None:  # off PostgreSQL (write_together's fallback)
        with connection.cursor() as cur:
            cur.execute(sql, params)

    return Write(sql, params, alone)


def store_memory(memory: EngineMemory, not_reached: list[str], before: StoredMemory, now: datetime) -> None:
    """Store what a pass left, if it differs from what it loaded, in a statement of its own.
    The commit does not wait for the disk: a worker killed right after loses nothing (the
    database has it); a database crash may lose the last passes' memory, and the next pass then
    plans afresh from the jobs and allocations, which are flushed."""
    store(memory_write(memory, not_reached, before, now))


def store(write: Write | None) -> None:
    """Send a :func:`memory_write` alone: one statement (on PostgreSQL one round trip with its
    no-flush setting: several statements in one query are one transaction)."""
    if write is not None:
        write_together(Write(_NO_FLUSH, []) if statements_together() else None, write)


_NO_FLUSH = "SET LOCAL synchronous_commit TO OFF"


def _upsert_sql() -> str:
    """Insert the row, or update it where it is (PostgreSQL and SQLite alike)."""
    qn, field = connection.ops.quote_name, functools.partial(field_of, EngineMemoryRecord)
    names = ("id", "memory", "not_reached", "updated_at")
    columns = [qn(column_of(field(name))) for name in names]
    sets = ", ".join(
        f"{c} = EXCLUDED.{c}" if connection.vendor == "postgresql" else f"{c} = excluded.{c}"
        for c in columns[1:]
    )
    return (
        f"INSERT INTO {qn(EngineMemoryRecord._meta.db_table)} ({', '.join(columns)}) "
        f"VALUES ({', '.join(['%s'] * len(columns))}) ON CONFLICT ({columns[0]}) DO UPDATE SET {sets}"
    )
