"""Read one consistent snapshot of the cluster for the engine (database → engine types).

A pass reads every node, device, held allocation and waiting or holding job, so it reads them as
plain rows, never as model instances (building ~300 instances a pass, their JSON columns decoded,
cost more CPU than the engine's whole decision), and with SQL the ORM builds once per process
(:class:`PreparedRead`).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import QuerySet
from django.db.models.sql.compiler import SQLCompiler
from django.utils.dateparse import parse_datetime

from scheduling.choices import HOLDING_STATES, JobState, NodeState
from scheduling.engine.config import KNOBS
from scheduling.engine.memory import BadMemory, EngineMemory
from scheduling.engine.runtimes import KEEP
from scheduling.engine.types import (
    FinishedRun,
    JobRequest,
    NodeSpec,
    Placement,
    QuotaSpec,
    RunningJob,
    Snapshot,
)
from scheduling.models import (
    Allocation,
    Device,
    EngineMemoryRecord,
    Job,
    Node,
    Quota,
    SchedulerSettings,
    Tenant,
)
from scheduling.services import server_prepared
from scheduling.services.bulk import BEGIN, statements_together

log = logging.getLogger("tessera.pass")


def ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


# The job's own columns a JobRequest is made of (besides its tenant's name).
REQUEST_FIELDS = (
    "id",
    "kind",
    "gpus",
    "replicas",
    "min_available",
    "accelerators",
    "topology",
    "priority",
    "preemptible",
    "grace_seconds",
    "checkpoint_seconds",
    "time_limit_seconds",
    "cpus",
    "memory_gib",
    "node_selector",
    "prefer_labels",
    "elastic_min_gpus",
    "elastic_max_gpus",
    "submitted_at",
    "not_before",
    "held",
    "owner_id",
    "name",
)
# A pending job's start estimate beyond ``estimated_start`` (engine/eta.py), as stored.
ESTIMATE_FIELDS = (
    "estimated_start_earliest",
    "estimated_start_latest",
    "estimate_basis",
    "queue_position",
    "jobs_ahead",
)
# What else a pass reads of each job: whether it holds GPUs, and the pending reason it shows.
JOB_FIELDS = (
    *REQUEST_FIELDS,
    "tenant__name",
    "state",
    "started_at",
    "last_checkpoint_at",
    "pending_code",
    "pending_reason",
    "estimated_start",
    *ESTIMATE_FIELDS,
    "attempts",
    "size_cap",
)


def job_request(job: Job) -> JobRequest:
    return request_of(job.tenant.name, {name: getattr(job, name) for name in REQUEST_FIELDS})


def request_of(tenant: str, job: Mapping[str, Any]) -> JobRequest:
    """A JobRequest from a job's ``REQUEST_FIELDS`` values."""
    return JobRequest(
        id=str(job["id"]),
        tenant=tenant,
        kind=job["kind"],
        gpus=float(job["gpus"]),
        replicas=job["replicas"],
        min_available=job["min_available"],
        accelerators=tuple(job["accelerators"] or ()),
        topology=job["topology"],
        priority=job["priority"],
        preemptible=job["preemptible"],
        grace_s=float(job["grace_seconds"]),
        checkpoint_s=float(job["checkpoint_seconds"]) if job["checkpoint_seconds"] else None,
        time_limit_s=float(job["time_limit_seconds"]) if job["time_limit_seconds"] else None,
        cpus=job["cpus"],
        memory_gib=job["memory_gib"],
        node_selector=tuple(sorted((job["node_selector"] or {}).items())),
        prefer_labels=tuple(sorted((job["prefer_labels"] or {}).items())),
        elastic_min_gpus=job["elastic_min_gpus"],
        elastic_max_gpus=job["elastic_max_gpus"],
        submitted_at=job["submitted_at"].timestamp(),
        not_before=ts(job["not_before"]) or 0.0,
        held=bool(job["held"]),
        user=str(job["owner_id"] or ""),
        name=job["name"],
    )


def capped(request: JobRequest, cap: dict[str, int] | None, attempt: int) -> JobRequest:
    """A running elastic job at most at its ``Job.size_cap`` in this attempt (a shrink the
    adjustment loop asked for is not grown back)."""
    if not cap or cap.get("attempt") != attempt or request.elastic_max_gpus is None:
        return request
    return replace(request, elastic_max_gpus=min(request.elastic_max_gpus, cap["gpus"]))


# A pending job's reason as stored: (code, words, estimated start).
StoredReason = tuple[str | None, str | None, datetime | None]
# ... and its estimate's band, basis and place in the queue (``ESTIMATE_FIELDS``).
StoredEstimate = tuple[datetime | None, datetime | None, str, int | None, int | None]
NO_ESTIMATE: StoredEstimate = (None, None, "", None, None)


class _Written:
    """The engine memory this process stored last, with its document. A pass that reads that
    document back (one worker runs the passes one after another: the usual case) takes the
    memory as it was rather than decoding it again: ``EngineMemory.from_json`` was 440 µs of a
    7 ms pass for ``make bench-e2e``'s 10 KB document (docs/benchmarks/e2e.md). Equal documents
    decode to equal memories (``tests/engine/test_memory_parity.py``), so a document another
    process wrote, or a write that did not commit, is decoded as before."""

    doc: Any = None
    memory: EngineMemory | None = None


_written = _Written()


def remember_written(doc: Any, memory: EngineMemory) -> None:
    """``memory`` is what ``doc`` (its ``to_json``) decodes to: a later read of ``doc`` takes it."""
    _written.doc, _written.memory = doc, memory


def _decoded(doc: Any) -> EngineMemory:
    if _written.memory is not None and doc == _written.doc:
        return _written.memory
    return EngineMemory.from_json(doc)


@dataclass(frozen=True, slots=True)
class StoredMemory:
    """What the last pass left (``services/memory.py``): the engine's memory (None: no pass
    stored one, or not one this engine can read), the jobs it did not reach before its time
    budget, and the row as read (a pass writes the row only if its own differs)."""

    memory: EngineMemory | None = None
    not_reached: frozenset[str] = frozenset()
    doc: Any = None  # the row's memory document, None when there is no row
    ids: tuple[Any, ...] = ()  # the row's not_reached, as stored

    @classmethod
    def of_rows(cls, rows: list[Sequence[Any]]) -> StoredMemory:
        if not rows:
            return cls()
        doc, not_reached = rows[0]
        try:
            memory = _decoded(doc)
        except BadMemory as exc:  # written by another version: plan afresh, and say so
            log.warning("engine memory not loaded, the pass plans afresh: %s", exc)
            memory = None
        ids = tuple(not_reached or ())
        return cls(memory, frozenset(str(j) for j in ids), doc, ids)

    def same(self, doc: object, not_reached: list[str]) -> bool:
        """Is (``doc``, ``not_reached``) what the row holds? (Compared as values: encoding both
        as text to compare them was a twentieth of a pass's CPU.)"""
        return self.doc is not None and doc == self.doc and tuple(not_reached) == self.ids


@dataclass
class LoadedSnapshot:
    snapshot: Snapshot
    node_versions: dict[str, int]
    node_ids: dict[str, int]
    # The pending jobs' reasons as the snapshot read them (a pass writes only those that change).
    reasons: dict[str, StoredReason] = field(default_factory=dict)
    estimates: dict[str, StoredEstimate] = field(default_factory=dict)
    # Each node's devices (``DEVICE_FIELDS``), by node id: what they were at the node's version.
    devices: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    stored: StoredMemory = field(default_factory=StoredMemory)
    # The knobs the operator's scheduler-settings record sets (blank fields left out).
    knobs: dict[str, Any] = field(default_factory=dict)


class PreparedRead:
    """A read whose SQL the ORM builds once per process (per database vendor), then runs as is.

    Building a query's SQL costs the ORM more CPU than running it; over the dozen reads of a pass
    that was more than the engine's decision (docs/benchmarks/scheduling-pass.md). Rows come back as
    ``values_list`` rows would, each field converted as the ORM would (JSON decoded, times made
    aware).

    ``build`` may take one list of values (ids, names: ``__in``): the SQL is then kept only if
    those values are all of its parameters, in order (any other SQL is built again for every
    read). On PostgreSQL their ``IN (%s, ...)`` becomes ``= ANY(%s)``, one array: one statement
    for any number of values. Elsewhere the SQL is built once per number of values.

    ``kept``: each row is converted once while it stays in the read (:class:`KeptRows`), for a
    read whose rows mostly stay the same from one read to the next and whose callers only read
    the converted values (never change them: the next read hands out the same ones).
    """

    def __init__(self, build: Callable[..., QuerySet], kept: bool = False) -> None:
        self._build = build
        self._kept = KeptRows() if kept else None
        # (vendor, number of values: -1 without, 0 for "any") -> (compiler, SQL, its parameters,
        # the fields' converters)
        self._compiled: dict[tuple[str, int], tuple[SQLCompiler, str, tuple, dict]] = {}
        self._inlined = server_prepared.Inlined()  # the SQL without values, as prepared

    def query(self, *values: Sequence[Any]) -> QuerySet:
        """The read as the ORM's query (what the prepared SQL is built from)."""
        return self._build(*values)

    def rows(self, *values: Sequence[Any]) -> list[Sequence[Any]]:
        return read_together((self, *values))[0]

    def statement(self, *values: Sequence[Any]) -> Statement | None:
        """The read's SQL and parameters for ``values`` (None: ``__in`` an empty list, no row)."""
        if values and not values[0]:
            return None
        vendor = connection.vendor
        # Without repeats, as the ORM's ``__in`` sends them (so that the parameters compare).
        given = tuple(dict.fromkeys(values[0])) if values else None
        params: Sequence[Any]
        if given is not None and (vendor, 0) in self._compiled:
            compiler, sql, _, converters = self._compiled[(vendor, 0)]
            params = ([*given],)
            form = LISTED
        else:
            compiled = self._compiled.get((vendor, -1 if given is None else len(given)))
            form = FIXED if given is None else ""  # a list of values in its SQL: not prepared
            if compiled is None:
                compiled = self._compile(values, given)
                given = None  # this read runs with the parameters just built
            compiler, sql, params, converters = compiled
            if given is not None:
                params = given
        return Statement(sql, params, compiler, converters, form, self._inlined, self._kept)

    def _compile(
        self, values: tuple[Sequence[Any], ...], given: tuple[Any, ...] | None
    ) -> tuple[SQLCompiler, str, tuple, dict]:
        vendor = connection.vendor
        compiler = self._build(*values).query.get_compiler(connection=connection)
        sql, built = compiler.as_sql()
        converters = compiler.get_converters([s[0] for s in compiler.select[: compiler.col_count]])
        compiled = (compiler, sql, tuple(built), converters)
        if given is None:
            self._compiled[(vendor, -1)] = compiled
        elif compiled[2] == given:
            self._compiled[(vendor, len(given))] = compiled
            # The values are the only parameters: the SQL's only placeholders are their list.
            listed = "IN (" + ", ".join(["%s"] * len(given)) + ")"
            if vendor == "postgresql" and sql.count(listed) == 1:
                self._compiled[(vendor, 0)] = (compiler, sql.replace(listed, "= ANY(%s)"), (), converters)
        return compiled


# How a read runs as a server-side prepared statement (``server_prepared.py``): its parameters
# are constants, written into its SQL (FIXED); its one parameter is the values' list (LISTED).
FIXED, LISTED = "fixed", "listed"


@dataclass(frozen=True, slots=True)
class Statement:
    """One read ready to run: its SQL and parameters, and how its rows are converted.

    ``form``: FIXED or LISTED if the read can be prepared on the server, "" if not (its SQL
    differs with the number of values); ``inlined``: where FIXED's SQL with its parameters
    written in is kept."""

    sql: str
    params: Sequence[Any]
    compiler: SQLCompiler
    converters: dict
    form: str = ""
    inlined: server_prepared.Inlined | None = None
    kept: KeptRows | None = None

    def convert(self, rows: list[Sequence[Any]]) -> list[Sequence[Any]]:
        if not self.converters:
            return rows
        if self.kept is not None:
            return self.kept.of(rows, self._convert)
        return self._convert(rows)

    def _convert(self, rows: list[Sequence[Any]]) -> list[Sequence[Any]]:
        return list(self.compiler.apply_converters(rows, self.converters))

    def server(self) -> server_prepared.ServerRead:
        """The read as the server runs it prepared (``form`` is FIXED or LISTED)."""
        if self.form == FIXED and self.inlined is not None:
            return server_prepared.ServerRead(self.inlined.sql(self.sql, self.params), None)
        return server_prepared.ServerRead(self.sql, self.params)


class KeptRows:
    """A read's rows, each converted (its JSON decoded) once while it stays in the read: the
    running jobs a pass reads are the same as the last pass's but for the few that started or
    ended since, and their JSON columns were decoded anew every pass (docs/benchmarks/e2e.md).
    A row's values as read are its key, so a row that changed is converted again; holds only
    the last read's rows."""

    def __init__(self) -> None:
        self._converted: dict[Sequence[Any], Sequence[Any]] = {}

    def of(
        self, rows: list[Sequence[Any]], convert: Callable[[list[Sequence[Any]]], list[Sequence[Any]]]
    ) -> list[Sequence[Any]]:
        last = self._converted
        new = [row for row in rows if row not in last]
        kept = dict(zip(new, convert(new), strict=True)) if new else {}
        out = []
        for row in rows:
            got = kept.get(row)
            if got is None:
                got = kept[row] = last[row]
            out.append(got)
        self._converted = kept
        return out


def read_together(*reads: tuple[Any, ...], begin: bool = False) -> list[list[Sequence[Any]]]:
    """The rows of each ``(PreparedRead, *values)`` of ``reads``, in order.

    On PostgreSQL, in one round trip: as server-side prepared statements in one pipeline
    (``server_prepared.py``), or, with ``TESSERA_SERVER_PREPARED_READS=0`` or where a read
    cannot be prepared (the first read of a list of values in a process), as one query
    (psycopg's client-side binding cursor, Django's default, runs several statements in one
    ``execute``), their results read one after the other. Each is its own statement, as if sent
    alone: a later one sees what an earlier one locked or changed. Elsewhere, one by one.
    ``begin``: a BEGIN goes first, in the same query (``bulk.riding_transaction`` said so).
    """
    if not settings.TESSERA["PREPARED_READS"]:  # the ORM's own way: SQL built per read, one by one
        return [_read_alone(read, *values) for read, *values in reads]
    statements = [read.statement(*values) for read, *values in reads]
    ready = [s for s in statements if s is not None]
    results: dict[int, list[Sequence[Any]]] = {}
    if (ready or begin) and all(s.form for s in ready) and server_prepared.enabled():
        # Prepared on the server, in one round trip (server_prepared.py).
        rows = server_prepared.read([s.server() for s in ready], *_batch(ready, begin), begin)
        for statement, got in zip(ready, rows, strict=True):
            results[id(statement)] = statement.convert(got)
        return [results[id(s)] if s is not None else [] for s in statements]
    together = begin or (len(ready) > 1 and statements_together())
    with connection.cursor() as cur:
        if together:
            cur.execute(*_batch(ready, begin))
            if begin and ready and not cur.nextset():
                raise RuntimeError("a batch of reads after BEGIN gave no result")
            for i, statement in enumerate(ready):
                if i and not cur.nextset():
                    raise RuntimeError("a statement of a batch of reads gave no result")
                results[id(statement)] = statement.convert(cur.fetchall())
        else:
            for statement in ready:
                cur.execute(statement.sql, statement.params)
                results[id(statement)] = statement.convert(cur.fetchall())
    return [results[id(s)] if s is not None else [] for s in statements]


def _batch(ready: list[Statement], begin: bool) -> tuple[str, list[Any]]:
    """The reads as one client-side query: their SQL joined (a BEGIN first if ``begin``), and
    their parameters in order."""
    return ";\n".join([*([BEGIN] if begin else []), *(s.sql for s in ready)]), [
        p for s in ready for p in s.params
    ]


def _read_alone(read: Any, *values: Sequence[Any]) -> list[Sequence[Any]]:
    """``read``'s rows through the ORM's queryset (``TESSERA_PREPARED_READS=0``); a read the ORM
    cannot express (the runtime history's) runs its SQL on its own."""
    if values and not values[0]:
        return []
    if isinstance(read, PreparedRead):
        return list(read.query(*values))
    statement = read.statement(*values)
    with connection.cursor() as cur:
        cur.execute(statement.sql, statement.params)
        return statement.convert(cur.fetchall())


_PENDING = PreparedRead(lambda: Job.objects.filter(state=JobState.PENDING).values_list(*JOB_FIELDS))
# The jobs holding GPUs: the same from pass to pass but for the few that started or ended.
_HOLDING = PreparedRead(
    lambda: Job.objects.filter(state__in=HOLDING_STATES).values_list(*JOB_FIELDS), kept=True
)


def pending_rows(also: PreparedRead) -> tuple[list[dict[str, Any]], list[Sequence[Any]]]:
    """The pending jobs, as ``JOB_FIELDS`` rows (none: the pass has nothing to decide), and the
    rows of ``also``, in one round trip."""
    queued, rows = read_together((_PENDING,), (also,))
    return _job_rows(queued), rows


def _job_rows(rows: list[Sequence[Any]]) -> list[dict[str, Any]]:
    """``_PENDING`` rows as dicts of ``JOB_FIELDS``."""
    return [_job_row(row) for row in rows]


def _job_row(row: Sequence[Any]) -> dict[str, Any]:
    """A ``_PENDING`` or ``_HOLDING`` row as a dict of ``JOB_FIELDS``."""
    return dict(zip(JOB_FIELDS, row, strict=True))


def _requested(job: dict[str, Any]) -> tuple[dict[str, Any], JobRequest]:
    """A job's ``JOB_FIELDS`` dict with its request."""
    return job, request_of(job["tenant__name"], job)


NODE_FIELDS = (
    "id",
    "name",
    "rack",
    "kind",
    "labels",
    "taints",
    "state",
    "nvlink_domain",
    "cpus",
    "memory_gib",
    "price_per_gpu_hour",
    "last_heartbeat",
    "version",
)


# A device's columns as the snapshot reads them (its node's id aside).
DEVICE_FIELDS = ("id", "index", "uuid", "model", "memory_gib", "nvlink_island", "healthy")


def node_spec(
    node: Mapping[str, Any], devices: list[dict[str, Any]], now: datetime, held: Set[int] = frozenset()
) -> NodeSpec:
    """``node``: its ``NODE_FIELDS``; ``devices``: its ``DEVICE_FIELDS``, by index; ``held``: the
    indices of its devices a live allocation holds.

    The engine indexes a node's GPUs 0..gpus-1 and takes every held one as it finds it. An agent
    restarted with fewer GPUs leaves rows that break both (``services/agents._sync_devices``): a
    gone device nothing ever held is deleted (a gap in the indices), one history holds is kept,
    unhealthy, even while a bound job still holds it. So the node spans every index up to its
    highest, a missing index counts as unhealthy, and an unhealthy device a job holds counts as
    healthy until it is let go (its holder's share is taken; applying checks each device's
    health again, so no binding lands on it)."""
    timeout = timedelta(seconds=settings.TESSERA["HEARTBEAT_TIMEOUT_S"])
    heartbeat = node["last_heartbeat"]
    fresh = heartbeat is not None and heartbeat >= now - timeout
    healthy = {d["index"]: d["healthy"] for d in devices}
    size = max(healthy, default=-1) + 1
    labels = dict(node["labels"] or {})
    labels["rack"] = node["rack"]
    return NodeSpec(
        name=node["name"],
        rack=node["rack"],
        model=devices[0]["model"] if devices else "",
        gpus=size,
        nvlink_domain=max(1, min(node["nvlink_domain"], size or 1)),
        cpus=node["cpus"],
        memory_gib=node["memory_gib"],
        price_per_gpu_hour=node["price_per_gpu_hour"],
        kind=node["kind"],
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        taints=tuple(node["taints"] or ()),
        schedulable=node["state"] == NodeState.READY and fresh,
        unhealthy_gpus=tuple(i for i in range(size) if not healthy.get(i, False) and i not in held),
    )


_NODES = PreparedRead(lambda: Node.objects.values_list(*NODE_FIELDS))
_DEVICES = PreparedRead(
    lambda: Device.objects.order_by("node_id", "index").values_list("node_id", *DEVICE_FIELDS)
)
_HELD = PreparedRead(
    lambda: (
        Allocation.objects.filter(released_at__isnull=True)
        .order_by()
        .values_list("job_id", "replica", "node__name", "share_milli", "device__index", "leaving_at")
    )
)
_QUOTAS = PreparedRead(
    lambda: Quota.objects.values_list("tenant__name", "model", "guaranteed", "limit", "weight")
)


_KNOBS = PreparedRead(lambda: SchedulerSettings.objects.filter(pk=1).values_list(*KNOBS))
_MEMORY = PreparedRead(lambda: EngineMemoryRecord.objects.filter(pk=1).values_list("memory", "not_reached"))

HISTORY_KEEP = KEEP  # finished runs per (tenant, kind) and per (user, name): as the predictors keep
_PREDICTED = (JobState.SUCCEEDED, JobState.FAILED)  # runs that ended on their own


class _HistoryRead:
    """The runtime history: the latest :data:`HISTORY_KEEP` runs that ended on their own
    (succeeded, failed) of each tenant and kind, and of each owner and name, that a job waiting
    or holding GPUs has (backfill's predictor keeps the latest few per tenant and kind; start
    estimates' predictor, ``engine/runtimes.py``, both). On PostgreSQL a ``LATERAL`` join reads
    at most that many rows per key, from the ``job_runtime_history`` and ``job_named_history``
    indexes; SQLite (the embedded default, a small cluster) numbers the rows with a window.

    Each key is (a column no other index starts with, a foreign key), and those indexes start
    with the first. The foreign key is matched as a row range, ``(kind, tenant_id) BETWEEN`` the
    key and itself, which the foreign key's own index cannot serve: so the only index the lookup
    can use is the history's, whatever the planner's statistics say. (With ``tenant_id = ...``
    a table not yet analysed was read through the small ``tenant_id``/``owner_id`` indexes, every
    run of the tenant or owner filtered at each lookup: docs/benchmarks/e2e.md.)"""

    COLUMNS = "id, kind, owner_id, name, gpus, started_at, finished_at, state"
    KEYS = (("kind", "tenant_id"), ("name", "owner_id"))  # as the two indexes start

    def __init__(self) -> None:
        self._inlined = server_prepared.Inlined()

    def statement(self) -> Statement:
        job, tenant = (
            connection.ops.quote_name(Job._meta.db_table),
            connection.ops.quote_name(Tenant._meta.db_table),
        )
        waiting = [JobState.PENDING.value, *sorted(s.value for s in HOLDING_STATES)]
        done = [s.value for s in _PREDICTED]
        marks = ", ".join(["%s"] * len(waiting))
        ended = (
            f"j.state IN ({', '.join(['%s'] * len(done))}) "
            "AND j.started_at IS NOT NULL AND j.finished_at IS NOT NULL"
        )
        columns = ", ".join("r." + c for c in self.COLUMNS.split(", "))
        if connection.vendor == "postgresql":
            # The runtime and the end as epoch seconds, computed exactly (numeric) and rounded
            # once to a float, as Python's ``total_seconds()`` and ``timestamp()`` round them:
            # the same values, without decoding two timestamps per row in Python (a tenth of a
            # pass's CPU, docs/benchmarks/e2e.md).
            columns = columns.replace(
                "r.started_at, r.finished_at",
                "EXTRACT(EPOCH FROM r.finished_at - r.started_at)::float8, "
                "EXTRACT(EPOCH FROM r.finished_at)::float8",
            )
        parts = []
        for a, b in self.KEYS:
            keys = f"SELECT DISTINCT {a}, {b} FROM {job} WHERE state IN ({marks}) AND {b} IS NOT NULL"
            if connection.vendor == "postgresql":
                pair, key = f"(j.{a}, j.{b})", f"(k.{a}, k.{b})"
                parts.append(
                    f"SELECT t.name, {columns} FROM ({keys}) k CROSS JOIN LATERAL "
                    f"(SELECT {self.COLUMNS}, tenant_id FROM {job} j WHERE j.{a} = k.{a} "
                    f"AND {pair} >= {key} AND {pair} <= {key} AND {ended} "
                    f"ORDER BY j.{b}, j.finished_at DESC, j.id DESC LIMIT {HISTORY_KEEP}) r "
                    f"JOIN {tenant} t ON t.id = r.tenant_id"
                )
            else:
                parts.append(
                    f"SELECT t.name, {columns} FROM "
                    f"(SELECT j.*, ROW_NUMBER() OVER (PARTITION BY j.{a}, j.{b} "
                    f"ORDER BY j.finished_at DESC, j.id DESC) AS n FROM {job} j "
                    f"JOIN ({keys}) k ON j.{a} = k.{a} AND j.{b} = k.{b} WHERE {ended}) r "
                    f"JOIN {tenant} t ON t.id = r.tenant_id WHERE r.n <= {HISTORY_KEEP}"
                )
        params = [*waiting, *done] * len(parts)
        return Statement(" UNION ".join(parts), params, None, {}, FIXED, self._inlined)  # type: ignore[arg-type]


_HISTORY = _HistoryRead()


def finished_run(row: Sequence[Any]) -> FinishedRun:
    """A row of the runtime history read (its tenant's name, then ``_HistoryRead.COLUMNS``;
    on PostgreSQL the runtime and the end in epoch seconds in place of the two timestamps)."""
    tenant, job_id, kind, owner, name, gpus, started, finished, state = row
    if isinstance(finished, float):
        runtime_s, ended_at = started, finished
    else:
        began, ended = _aware(started), _aware(finished)
        runtime_s, ended_at = (ended - began).total_seconds(), ended.timestamp()
    return FinishedRun(
        job_id=str(job_id),
        tenant=tenant,
        kind=kind,
        runtime_s=runtime_s,
        ended_at=ended_at,
        outcome=state,
        user=str(owner or ""),
        name=name,
        gpus=float(gpus),
    )


class _Runs:
    """The history rows' runs, each built once while its row stays in the read: a pass reads
    the same runs as the last but for the few that ended since (the row's values are its key,
    so a run whose row changed is built again). Holds only the last read's runs."""

    def __init__(self) -> None:
        self._built: dict[tuple[Any, ...], FinishedRun] = {}

    def of(self, rows: Sequence[Sequence[Any]]) -> tuple[FinishedRun, ...]:
        built = self._built
        kept: dict[tuple[Any, ...], FinishedRun] = {}
        runs: list[FinishedRun] = []
        for row in rows:
            key = tuple(row)
            run = kept.get(key) or built.get(key) or finished_run(key)
            kept[key] = run
            runs.append(run)
        self._built = kept
        return tuple(runs)


_runs = _Runs()


class _HoldingJobs:
    """Each holding row's fields and request, built once while the holding read hands out the
    same row (``KeptRows``: the same object for a row that did not change). Holds only the last
    read's rows, each with the row itself, so that no other object takes its id meanwhile."""

    def __init__(self) -> None:
        self._built: dict[int, tuple[Sequence[Any], dict[str, Any], JobRequest]] = {}

    def of(self, rows: list[Sequence[Any]]) -> list[tuple[dict[str, Any], JobRequest]]:
        built = self._built
        kept: dict[int, tuple[Sequence[Any], dict[str, Any], JobRequest]] = {}
        out = []
        for row in rows:
            got = built.get(id(row))
            if got is None or got[0] is not row:
                got = (row, *_requested(_job_row(row)))
            kept[id(row)] = got
            out.append((got[1], got[2]))
        self._built = kept
        return out


_holding_jobs = _HoldingJobs()


def _aware(value: datetime | str) -> datetime:
    """SQLite gives raw SQL's timestamps back as text (UTC); PostgreSQL as aware datetimes."""
    if isinstance(value, str):
        parsed = parse_datetime(value)
        if parsed is None:
            raise ValueError(f"not a timestamp: {value!r}")
        value = parsed
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _placements(rows: list[tuple[int, str, int, int | None]]) -> tuple[Placement, ...]:
    """(replica, node name, share, GPU index) rows of one job → its placements, by replica."""
    if not rows:  # most running jobs have no leaving replicas: nothing to group
        return ()
    grouped: dict[tuple[int, str, int], list[int]] = defaultdict(list)
    for replica, node_name, share, index in rows:
        gpus = grouped[(replica, node_name, share)]
        if index is not None:
            gpus.append(index)
    return tuple(
        Placement(replica=r, node=n, gpus=tuple(sorted(g)), share=s / 1000 if g else 1.0)
        for (r, n, s), g in sorted(grouped.items())
    )


def load_snapshot(now: datetime, pending: list[dict[str, Any]] | None = None) -> LoadedSnapshot:
    """The cluster at ``now``; ``pending``: :func:`pending_rows` when the caller has read them
    (else they are read in the same round trip as the rest).

    No transaction: at READ COMMITTED one would not make the reads one snapshot either. What
    moves between them is caught when the decisions are applied (each node's version, and each
    device's capacity, are checked again under the node's lock).
    """
    reads: list[tuple[Any, ...]] = [(_HOLDING,), (_NODES,), (_DEVICES,), (_HELD,), (_QUOTAS,), (_MEMORY,)]
    reads += [(_HISTORY,), (_KNOBS,)]
    if pending is None:  # read with the rest: one round trip
        queued, *rows = read_together((_PENDING,), *reads)
        pending = _job_rows(queued)
    else:
        rows = read_together(*reads)
    holding, node_rows, device_rows, held, quotas, memory, history, knobs = rows
    jobs = _holding_jobs.of(holding) + [_requested(job) for job in pending]
    nodes = [dict(zip(NODE_FIELDS, row, strict=True)) for row in node_rows]
    devices: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for node_id, *device in device_rows:
        devices[node_id].append(dict(zip(DEVICE_FIELDS, device, strict=True)))
    by_job: dict[int, list[tuple[int, str, int, int | None]]] = defaultdict(list)
    leaving: dict[int, list[tuple[int, str, int, int | None]]] = defaultdict(list)
    left_at: dict[int, datetime] = {}  # when a shrink removed the job's leaving replicas
    held_at: dict[str, set[int]] = defaultdict(set)  # node name -> indices of its held devices
    for job_id, replica, node_name, share, index, leaving_at in held:
        if index is not None:
            held_at[node_name].add(index)
        if leaving_at is None:
            by_job[job_id].append((replica, node_name, share, index))
        else:
            leaving[job_id].append((replica, node_name, share, index))
            left_at[job_id] = max(leaving_at, left_at.get(job_id, leaving_at))
    running, waiting, reasons, estimates = [], [], {}, {}
    for job, request in jobs:
        if job["state"] == JobState.PENDING:
            waiting.append(request)
            reasons[request.id] = (job["pending_code"], job["pending_reason"], job["estimated_start"])
            estimates[request.id] = tuple(job[f] for f in ESTIMATE_FIELDS)
            continue
        placements = _placements(by_job.get(job["id"], []))
        removed = left_at.get(job["id"])
        running.append(
            RunningJob(
                job=capped(request, job["size_cap"], job["attempts"]),
                placements=placements,
                started_at=ts(job["started_at"]) or now.timestamp(),
                last_checkpoint_at=ts(job["last_checkpoint_at"]),
                terminating=job["state"] == JobState.TERMINATING,
                leaving=_placements(leaving.get(job["id"], [])),
                leaving_until=removed.timestamp() + request.grace_s if removed is not None else None,
            )
        )
    snapshot = Snapshot(
        now=now.timestamp(),
        nodes=tuple(
            node_spec(n, devices.get(n["id"], []), now, held_at.get(n["name"], frozenset())) for n in nodes
        ),
        running=tuple(running),
        pending=tuple(sorted(waiting, key=lambda j: (j.submitted_at, int(j.id)))),
        quotas=tuple(QuotaSpec(*q) for q in quotas),
        history=_runs.of(history),
    )
    return LoadedSnapshot(
        snapshot=snapshot,
        node_versions={n["name"]: n["version"] for n in nodes},
        node_ids={n["name"]: n["id"] for n in nodes},
        reasons=reasons,
        estimates=estimates,
        devices=devices,
        stored=StoredMemory.of_rows(memory),
        knobs={k: v for row in knobs for k, v in zip(KNOBS, row, strict=True) if v is not None},
    )
