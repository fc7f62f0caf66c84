"""Writes of many rows in one statement, with SQL built once per process from the model's fields.

The ORM builds a statement's SQL on every call: 0.5-1.5 ms of CPU each, more than PostgreSQL
takes to run it. On the paths every job crosses (an agent's exit report settles a job: its row,
its events, its allocations) that was most of the web process's work. These build the statement
once per model, columns and database vendor, from ``Model._meta`` (the models stay the schema's
one truth), and then only convert each row's values as the ORM would (``get_db_prep_save``).

On PostgreSQL the rows travel as one array per column (``UNNEST``, as Django's own
``bulk_create`` does): one statement, one plan, whatever their number; a single row travels as
plain values (psycopg's array conversion costs more CPU than it saves for one). Elsewhere (SQLite, the
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
        self._sql: dict[bool, str] = {}  # one row?, many rows?

    def _statement(self, one: bool) -> tuple[str, list[Field]]:
        fields = [self.model._meta.pk, *_columns(self.model, self.names)]
        if one not in self._sql:
            qn = connection.ops.quote_name
            table = qn(self.model._meta.db_table)
            cols = [qn(f.column) for f in fields]
            if one:
                sets = ", ".join(f"{c} = %s" for c in cols[1:])
                self._sql[one] = f"UPDATE {table} SET {sets} WHERE {cols[0]} = %s"
            else:
                sets = ", ".join(f"{c} = v.{c}" for c in cols[1:])
                arrays = ", ".join(f"%s::{_array_type(f)}" for f in fields)
                self._sql[one] = (
                    f"UPDATE {table} SET {sets} FROM UNNEST({arrays}) AS v({', '.join(cols)}) "
                    f"WHERE {table}.{cols[0]} = v.{cols[0]}"
                )
        return self._sql[one], fields

    def run(self, objs: Sequence[Model]) -> None:
        if not objs:
            return
        if connection.vendor != "postgresql":
            self.model._default_manager.bulk_update(objs, self.names)
            return
        sql, fields = self._statement(len(objs) == 1)
        values = [[f.get_db_prep_save(getattr(o, f.attname), connection) for f in fields] for o in objs]
        with connection.cursor() as cur:
            cur.execute(sql, [*values[0][1:], values[0][0]] if len(objs) == 1 else _by_column(values))


class RowsInsert:
    """``INSERT`` of many new ``model`` objects (columns ``names``, or all but an automatic primary
    key); with ``returning``, each object's primary key is set from the database's."""

    def __init__(
        self, model: type[Model], names: Sequence[str] | None = None, returning: bool = False
    ) -> None:
        if names is None:
            names = [f.name for f in model._meta.concrete_fields if f is not model._meta.auto_field]
        self.model, self.names, self.returning = model, tuple(names), returning
        self._sql: dict[bool, str] = {}

    def _statement(self, one: bool) -> tuple[str, list[Field]]:
        fields = _columns(self.model, self.names)
        if one not in self._sql:
            qn = connection.ops.quote_name
            cols = ", ".join(qn(f.column) for f in fields)
            if one:
                rows = f"VALUES ({', '.join(['%s'] * len(fields))})"
            else:
                rows = f"SELECT * FROM UNNEST({', '.join(f'%s::{_array_type(f)}' for f in fields)})"
            sql = f"INSERT INTO {qn(self.model._meta.db_table)} ({cols}) {rows}"
            if self.returning:
                sql += f" RETURNING {qn(self.model._meta.pk.column)}"
            self._sql[one] = sql
        return self._sql[one], fields

    def run(self, objs: Sequence[Model]) -> None:
        if not objs:
            return
        if connection.vendor != "postgresql":
            self.model._default_manager.bulk_create(objs)  # sets primary keys on SQLite too
            return
        sql, fields = self._statement(len(objs) == 1)
        values = [[f.get_db_prep_save(f.pre_save(o, True), connection) for f in fields] for o in objs]
        with connection.cursor() as cur:
            cur.execute(sql, values[0] if len(objs) == 1 else _by_column(values))
            if self.returning:
                # Rows come back in the order UNNEST gave them, as Django's bulk_create relies on.
                for obj, (pk,) in zip(objs, cur.fetchall(), strict=True):
                    obj.pk = pk
                    obj._state.adding = False


def _by_column(rows: list[list[Any]]) -> list[list[Any]]:
    """Rows of values → one list per column (the arrays UNNEST takes)."""
    return [list(column) for column in zip(*rows, strict=True)]
