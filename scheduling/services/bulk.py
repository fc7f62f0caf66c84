"""Writes of many rows in one statement, with SQL built once per process from the model's fields.

The ORM builds a statement's SQL on every call, which costs more CPU than PostgreSQL takes to run it
(docs/benchmarks/requests.md). On the paths every job crosses (an agent's exit report settles a job:
its row, its events, its allocations) that was most of the web process's work. These build the
statement once per model, columns and database vendor, from ``Model._meta`` (the models stay the
schema's one truth), and then only convert each row's values as the ORM would
(``get_db_prep_save``).

On PostgreSQL the rows travel as one array per column (``UNNEST``, as Django's own
``bulk_create`` does): one statement, one plan, whatever their number; a single row travels as
plain values (psycopg's array conversion costs more CPU than it saves for one). Statements that
belong together (a settlement's job rows, events and allocations) go in one round trip
(:func:`write_together`). Elsewhere (SQLite, the
embedded default) the ORM's own ``bulk_update``/``bulk_create`` run instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Field, Model


def _array_type(field: Field) -> str:
    # No length or precision (varchar, not varchar(16)): arrays cast to a bare type truncate nothing.
    column = cast(str, field.db_type(connection))  # a concrete column's field: it has a type
    return column.split("(")[0] + "[]"


def field_of(model: type[Model], name: str) -> Field[Any, Any]:
    """``model``'s field ``name``, one of its table's columns (not a reverse relation)."""
    field = model._meta.get_field(name)
    assert isinstance(field, Field), f"{model.__name__}.{name} is not a column"
    return field


def column_of(field: Field[Any, Any] | None) -> str:
    """The column of a concrete field (a model's primary key, or one :func:`field_of` gave)."""
    assert field is not None and field.column is not None, f"{field!r} has no column"
    return field.column


def _columns(model: type[Model], names: Sequence[str]) -> list[Field[Any, Any]]:
    return [field_of(model, name) for name in names]


@dataclass(frozen=True)
class Write:
    """One statement and its parameters (``fallback``: the ORM's way, off PostgreSQL)."""

    sql: str
    params: list[Any]
    fallback: Callable[[], Any] | None = None


def statements_together() -> bool:
    """Can several statements go to the database as one query? On PostgreSQL with psycopg's
    client-side binding cursor (Django's default), yes: each runs as if sent alone. A
    server-side binding cursor takes one statement at a time."""
    return connection.vendor == "postgresql" and not connection.settings_dict.get("OPTIONS", {}).get(
        "server_side_binding"
    )


@contextmanager
def riding_transaction() -> Iterator[bool]:
    """``transaction.atomic()`` whose BEGIN and COMMIT ride on the block's first and last queries:
    two round trips fewer (psycopg sends each as a query of its own, and each waits for a
    PostgreSQL process to get a CPU on a busy host). Yields whether they ride: if so, the block's
    first query must start with :data:`BEGIN` (``read_together(..., begin=True)``) and its last
    write end with :data:`COMMIT`; after that COMMIT nothing more belongs to the transaction.

    They ride where several statements go as one query (:func:`statements_together`), outside
    any other atomic block, with prepared reads on, unless ``TESSERA_RIDING_TRANSACTIONS=0``.
    Django's block stays what it is (its commit hooks run after the commit, an exception rolls
    back, a nested ``atomic`` is a savepoint-less part of it); only psycopg is told it is in
    autocommit mode, so that it sends no BEGIN of its own: the explicit BEGIN opens the
    transaction, and Django's commit or rollback at the block's end is a round trip only while it
    is still open (psycopg skips it otherwise).
    docs/internals.md lists this with its canary."""
    rides = (
        settings.TESSERA["RIDING_TRANSACTIONS"]
        and settings.TESSERA["PREPARED_READS"]  # the reads that carry the BEGIN
        and statements_together()
        and not connection.in_atomic_block
    )
    with transaction.atomic():
        if rides:
            connection.ensure_connection()
            connection.connection.autocommit = True  # no transaction open yet: psycopg allows it
        yield rides


BEGIN = "BEGIN"
COMMIT = Write("COMMIT", [])


def write_together(*writes: Write | None) -> None:
    """Run ``writes`` in order; in one round trip where :func:`statements_together`."""
    ready = [w for w in writes if w is not None]
    if not ready:
        return
    if connection.vendor != "postgresql":
        for w in ready:
            if w.fallback is not None:
                w.fallback()
        return
    with connection.cursor() as cur:
        if statements_together():
            cur.execute(";\n".join(w.sql for w in ready), [p for w in ready for p in w.params])
        else:
            for w in ready:
                cur.execute(w.sql, w.params)


class RowsUpdate:
    """``UPDATE`` of the columns ``names`` of many rows of ``model``, each set to its object's own
    values, matched by primary key; ``where``: (a column's name, a value), only the rows where the
    column holds the value."""

    def __init__(
        self, model: type[Model], names: Sequence[str], where: tuple[str, Any] | None = None
    ) -> None:
        self.model, self.names, self.where = model, tuple(names), where
        self._sql: dict[bool, str] = {}  # one row?, many rows?

    def _statement(self, one: bool) -> tuple[str, list[Field]]:
        fields = [self.model._meta.pk, *_columns(self.model, self.names)]
        if one not in self._sql:
            qn = connection.ops.quote_name
            table = qn(self.model._meta.db_table)
            cols = [qn(column_of(f)) for f in fields]
            also = f" AND {table}.{qn(self.where[0])} = %s" if self.where else ""
            if one:
                sets = ", ".join(f"{c} = %s" for c in cols[1:])
                self._sql[one] = f"UPDATE {table} SET {sets} WHERE {table}.{cols[0]} = %s{also}"
            else:
                sets = ", ".join(f"{c} = v.{c}" for c in cols[1:])
                arrays = ", ".join(f"%s::{_array_type(f)}" for f in fields)
                self._sql[one] = (
                    f"UPDATE {table} SET {sets} FROM UNNEST({arrays}) AS v({', '.join(cols)}) "
                    f"WHERE {table}.{cols[0]} = v.{cols[0]}{also}"
                )
        return self._sql[one], fields

    def write(self, objs: Sequence[Model]) -> Write | None:
        """The statement for ``objs`` (None if there are none), to run or to send together."""
        if not objs:
            return None
        if connection.vendor != "postgresql":
            rows = (
                self.model._default_manager.filter(**dict([self.where]))
                if self.where
                else self.model._default_manager
            )
            return Write("", [], lambda: rows.bulk_update(objs, self.names))
        sql, fields = self._statement(len(objs) == 1)
        values = [[f.get_db_prep_save(getattr(o, f.attname), connection) for f in fields] for o in objs]
        return self._write(sql, values)

    def write_values(self, rows: Sequence[Sequence[Any]]) -> Write | None:
        """:meth:`write` for rows given as values, each (primary key, then one value per name, in
        order), already as the database takes them (str, int, an aware datetime, None): no model
        object is made per row on PostgreSQL (a pass rewrites hundreds of waiting jobs' reasons;
        making a ``Job`` for each and preparing its fields took ~0.1 ms a row,
        docs/benchmarks/e2e.md)."""
        if not rows:
            return None
        if connection.vendor != "postgresql":
            pk = self.model._meta.pk.attname
            return self.write(
                [self.model(**{pk: row[0], **dict(zip(self.names, row[1:], strict=True))}) for row in rows]
            )
        sql, _fields = self._statement(len(rows) == 1)
        return self._write(sql, [list(row) for row in rows])

    def _write(self, sql: str, values: list[list[Any]]) -> Write:
        also = [self.where[1]] if self.where else []
        params = [*values[0][1:], values[0][0]] if len(values) == 1 else _by_column(values)
        return Write(sql, [*params, *also])

    def run(self, objs: Sequence[Model]) -> None:
        write_together(self.write(objs))


class RowsInsert:
    """``INSERT`` of many new ``model`` objects (columns ``names``; their primary keys are not read
    back)."""

    def __init__(self, model: type[Model], names: Sequence[str]) -> None:
        self.model, self.names = model, tuple(names)
        self._sql: dict[bool, str] = {}  # one row?, many rows?

    def _statement(self, one: bool) -> tuple[str, list[Field]]:
        fields = _columns(self.model, self.names)
        if one not in self._sql:
            qn = connection.ops.quote_name
            cols = ", ".join(qn(column_of(f)) for f in fields)
            if one:
                rows = f"VALUES ({', '.join(['%s'] * len(fields))})"
            else:
                rows = f"SELECT * FROM UNNEST({', '.join(f'%s::{_array_type(f)}' for f in fields)})"
            self._sql[one] = f"INSERT INTO {qn(self.model._meta.db_table)} ({cols}) {rows}"
        return self._sql[one], fields

    def write(self, objs: Sequence[Model]) -> Write | None:
        """The statement for ``objs`` (None if there are none), to run or to send together."""
        if not objs:
            return None
        if connection.vendor != "postgresql":
            return Write("", [], lambda: self.model._default_manager.bulk_create(objs))
        sql, fields = self._statement(len(objs) == 1)
        values = [[f.get_db_prep_save(f.pre_save(o, True), connection) for f in fields] for o in objs]
        return Write(sql, values[0] if len(objs) == 1 else _by_column(values))

    def run(self, objs: Sequence[Model]) -> None:
        write_together(self.write(objs))


def _by_column(rows: list[list[Any]]) -> list[list[Any]]:
    """Rows of values → one list per column (the arrays UNNEST takes)."""
    return [list(column) for column in zip(*rows, strict=True)]


class InsertWithChildren:
    """``INSERT`` of one new ``model`` object and of rows of other models that point at it (each
    child's foreign key filled with the new primary key) in ONE statement: one round trip, and
    nothing half-stored if any row fails (a unique key, a constraint). Sets the object's primary
    key and the children's foreign keys."""

    def __init__(
        self,
        model: type[Model],
        children: Sequence[tuple[type[Model], str]],
        where: Callable[[], str] | None = None,
        null_columns: Sequence[str] = (),
        unset_columns: Sequence[str] = (),
    ) -> None:
        """``where``: builds (once) a condition the new row must meet, or nothing is stored; its
        parameters are given to :meth:`run`. ``null_columns``: nullable fields of the children
        this statement never sets (left NULL): fewer parameters (psycopg caches the parsing of
        statements of at most 50). ``unset_columns``: the same for ``model``'s own fields, left
        to their database default (NULL, or the field's ``db_default``), which the new object
        must hold."""
        self.model = model
        self.children = tuple(children)  # (model, name of its foreign key to ``model``)
        self.where = where
        self.null_columns = frozenset(null_columns)
        self.unset_columns = frozenset(unset_columns)
        self._sql: dict[tuple[bool, ...], str] = {}

    def _fields(self, model: type[Model], skip: str | None = None) -> list[Field]:
        omit = self.null_columns if skip is not None else self.unset_columns
        return [
            f
            for f in model._meta.concrete_fields
            if f is not model._meta.auto_field and f.name != skip and f.name not in omit
        ]

    def _statement(self, present: tuple[bool, ...]) -> str:
        if present not in self._sql:
            qn = connection.ops.quote_name
            pk = qn(column_of(self.model._meta.pk))

            def into(model: type[Model], fields: list[Field[Any, Any]]) -> str:
                columns = ", ".join(qn(column_of(f)) for f in fields)
                return f"INSERT INTO {qn(model._meta.db_table)} ({columns})"

            fields = self._fields(self.model)
            values = ", ".join(["%s"] * len(fields))
            row = f"SELECT {values} WHERE {self.where()}" if self.where else f"VALUES ({values})"
            parts = [f"p AS ({into(self.model, fields)} {row} RETURNING {pk})"]
            for n, ((child, fk), here) in enumerate(zip(self.children, present, strict=True)):
                if here:
                    cols = [field_of(child, fk), *self._fields(child, skip=fk)]
                    values = ", ".join(["%s"] * (len(cols) - 1))
                    parts.append(f"c{n} AS ({into(child, cols)} SELECT p.{pk}, {values} FROM p)")
            self._sql[present] = f"WITH {', '.join(parts)} SELECT {pk} FROM p"
        return self._sql[present]

    def run(
        self, obj: Model, children: Callable[[], Sequence[Model | None]], where: Sequence[Any] = ()
    ) -> bool:
        """``children``: called once ``obj``'s own values are final (its ``auto_now_add`` fields
        set), it gives one object (or None: no row of that model) per child model, in order.
        ``where``: the condition's parameters. False if the condition stored nothing (PostgreSQL
        only: elsewhere the caller checks first, and there is no condition)."""
        if connection.vendor != "postgresql":
            # Several statements here: one transaction (a savepoint inside a caller's), so that a
            # child refused (an idempotency key's unique key) takes the object back with it. In
            # autocommit the object had stayed: a retried submit left a second job.
            with transaction.atomic():
                obj.save(force_insert=True)
                for (_, fk), child in zip(self.children, children(), strict=True):
                    if child is not None:
                        setattr(child, fk, obj)
                        child.save(force_insert=True)
            return True
        for name in self.unset_columns:
            field = field_of(self.model, name)
            if getattr(obj, field.attname) != field.get_default():
                raise ValueError(f"{self.model.__name__}: {sorted(self.unset_columns)} are not written here")
        params = [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in self._fields(self.model)]
        params += where  # the condition follows the new row's values, before its children's
        rows = children()
        for (model, fk), child in zip(self.children, rows, strict=True):
            if child is not None:
                params += [
                    f.get_db_prep_save(f.pre_save(child, True), connection)
                    for f in self._fields(model, skip=fk)
                ]
                if any(getattr(child, name, None) is not None for name in self.null_columns):
                    raise ValueError(f"{model.__name__}: {sorted(self.null_columns)} are not written here")
        with connection.cursor() as cur:
            cur.execute(self._statement(tuple(child is not None for child in rows)), params)
            stored = cur.fetchone()
        if stored is None:
            return False
        obj.pk = stored[0]
        obj._state.adding = False
        for (_, fk), child in zip(self.children, rows, strict=True):
            if child is not None:
                setattr(child, fk, obj)
        return True
