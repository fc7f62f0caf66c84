"""Writes of many rows in one statement, with SQL built once per process from the model's fields.

The ORM builds a statement's SQL on every call: 0.5-1.5 ms of CPU each, more than PostgreSQL
takes to run it. On the paths every job crosses (an agent's exit report settles a job: its row,
its events, its allocations) that was most of the web process's work. These build the statement
once per model, columns and database vendor, from ``Model._meta`` (the models stay the schema's
one truth), and then only convert each row's values as the ORM would (``get_db_prep_save``).

On PostgreSQL the rows travel as one array per column (``UNNEST``, as Django's own
``bulk_create`` does): one statement, one plan, whatever their number. Elsewhere (SQLite, the
embedded default) the ORM's own ``bulk_update``/``bulk_create`` run instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection
from django.db.models import Field, Model


def _array_type(field: Field) -> str:
    # No length or precision (varchar, not varchar(16)): arrays cast to a bare type truncate nothing.
    return field.db_type(connection).split("(")[0] + "[]"


def _columns(model: type[Model], names: Sequence[str]) -> list[Field]:
    return [model._meta.get_field(name) for name in names]


class RowsUpdate:
    """``UPDATE`` of the columns ``names`` of many rows of ``model``, each set to its object's own
    values, matched by primary key."""

    def __init__(self, model: type[Model], names: Sequence[str]) -> None:
        self.model, self.names = model, tuple(names)
        self._sql: str | None = None

    def _statement(self) -> tuple[str, list[Field]]:
        fields = [self.model._meta.pk, *_columns(self.model, self.names)]
        if self._sql is None:
            qn = connection.ops.quote_name
            table = qn(self.model._meta.db_table)
            cols = [qn(f.column) for f in fields]
            sets = ", ".join(f"{c} = v.{c}" for c in cols[1:])
            arrays = ", ".join(f"%s::{_array_type(f)}" for f in fields)
            self._sql = (
                f"UPDATE {table} SET {sets} FROM UNNEST({arrays}) AS v({', '.join(cols)}) "
                f"WHERE {table}.{cols[0]} = v.{cols[0]}"
            )
        return self._sql, fields

    def run(self, objs: Sequence[Model]) -> None:
        if not objs:
            return
        if connection.vendor != "postgresql":
            self.model._default_manager.bulk_update(objs, self.names)
            return
        sql, fields = self._statement()
        params = [[f.get_db_prep_save(getattr(o, f.attname), connection) for o in objs] for f in fields]
        with connection.cursor() as cur:
            cur.execute(sql, params)


class RowsInsert:
    """``INSERT`` of many new ``model`` objects (columns ``names``; their primary keys are not read
    back)."""

    def __init__(self, model: type[Model], names: Sequence[str]) -> None:
        self.model, self.names = model, tuple(names)
        self._sql: str | None = None

    def _statement(self) -> tuple[str, list[Field]]:
        fields = _columns(self.model, self.names)
        if self._sql is None:
            qn = connection.ops.quote_name
            cols = ", ".join(qn(f.column) for f in fields)
            arrays = ", ".join(f"%s::{_array_type(f)}" for f in fields)
            self._sql = f"INSERT INTO {qn(self.model._meta.db_table)} ({cols}) SELECT * FROM UNNEST({arrays})"
        return self._sql, fields

    def run(self, objs: Sequence[Model]) -> None:
        if not objs:
            return
        if connection.vendor != "postgresql":
            self.model._default_manager.bulk_create(objs)
            return
        sql, fields = self._statement()
        params: list[list[Any]] = [
            [f.get_db_prep_save(f.pre_save(o, True), connection) for o in objs] for f in fields
        ]
        with connection.cursor() as cur:
            cur.execute(sql, params)
