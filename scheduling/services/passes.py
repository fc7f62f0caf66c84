"""The scheduling pass: load one snapshot → the engine decides → apply in one transaction.

One pass runs at a time cluster-wide: under a non-blocking PostgreSQL advisory lock (released if
the worker dies with its connection), or an in-process lock on SQLite. A request that arrives
while a pass runs sets a flag, so one more pass follows (see :func:`run_pass` for why none is
lost). Each pass is bounded in starts and in time (``MAX_STARTS_PER_PASS``, ``PASS_BUDGET_S``).
Decisions made on stale state (a node's version moved since the snapshot) are dropped, never
double-booked.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from bisect import bisect_left
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from scheduling.choices import EventType, JobState
from scheduling.engine.collector import collector_paused
from scheduling.engine.config import EngineConfig, KnobError, configure
from scheduling.engine.kept_history import KeptHistory
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import Binding, Deadline, Decisions, Estimate
from scheduling.models import Allocation, Device, Job, Node, SchedulerState
from scheduling.services import checkpoints, live, resizes, triggers
from scheduling.services import memory as stored_memory
from scheduling.services.agents import bindings_by_node
from scheduling.services.bulk import (
    COMMIT,
    RowsInsert,
    RowsUpdate,
    Write,
    column_of,
    field_of,
    riding_transaction,
    statements_together,
    write_together,
)
from scheduling.services.inventory import HOLDERS, Holder, device_rows, holders_of
from scheduling.services.jobs import (
    LOCK_JOBS,
    allocations_payload,
    begin_stop,
    jobs_from_rows,
    locked_jobs,
    transition_writes,
)
from scheduling.services.snapshot import (
    ESTIMATE_FIELDS,
    NO_ESTIMATE,
    LoadedSnapshot,
    PreparedRead,
    StoredEstimate,
    StoredReason,
    load_snapshot,
    pending_rows,
    read_together,
)

log = logging.getLogger("tessera.pass")

PASS_LOCK_KEY = 0x7E55E7A  # the advisory lock's key, arbitrary but fixed
ADJUST_LOCK_KEY = 0x7E55E7B  # the adjustment pass's (services/adjust.py)
_local_locks = {PASS_LOCK_KEY: threading.Lock(), ADJUST_LOCK_KEY: threading.Lock()}  # SQLite
# The pass's clock: its duration and its time budget's deadline (a test may give a fake one).
clock = time.perf_counter


@dataclass
class PassResult:
    seconds: float = 0.0
    bound: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    resized: list[str] = field(default_factory=list)
    pending: int = 0
    # Pending jobs not decided: the pass reached its time budget first (0: it was not cut short).
    undecided: int = 0


def try_lock(key: int = PASS_LOCK_KEY) -> bool:
    """Take the pass lock (or the lock ``key``) if it is free; never waits."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s)", [key])
            return bool(cur.fetchone()[0])
    return _local_locks[key].acquire(blocking=False)


def unlock(key: int = PASS_LOCK_KEY) -> None:
    """Give the pass lock (or the lock ``key``) back. If the connection cannot say so (a Celery
    soft time limit broke into a query), it is closed: PostgreSQL drops a session's advisory locks
    with it, so a pass cut off half-way never keeps the next one out."""
    if connection.vendor != "postgresql":
        _local_locks[key].release()
        return
    try:
        with connection.cursor() as cur:
            cur.execute(_UNLOCK, [key])
    except Exception:
        log.warning("could not release the pass lock: closing the connection", exc_info=True)
        connection.close()


def run_pass(now: datetime | None = None, max_rounds: int = 3) -> PassResult | None:
    """Run a pass unless one is running (then make sure one runs after this request), and once
    more for every request made meanwhile, up to ``max_rounds`` (then a task is queued for the
    rest, so that the worker's other tasks get their turn). Returns the last result.

    Why no request is lost, whichever worker processes run what when. A request sets "again"
    (then "queued" NX, queuing a task if it set it); a pass's round is: take the lock, take
    "again", decide and apply, **give the lock back, then** check "again" (clearing "queued"
    atomically if it is not set). "again" is only ever taken by a lock holder that then runs a
    pass, and every holder checks "again" after its unlock. So a request's "again" is either
    taken by a round that starts after it (that round's pass covers it), or still set when the
    lock's current holder — or, if none holds it, the holder of the "queued" flag — checks it:

    1. The holder sees it: it takes the lock again and runs a round; if another process took
       the lock in between, that one took "again" after its lock and checks after its unlock.
    2. A task that finds the lock taken sets "again" (beat's safety pass, the embedded loop
       and tests did not set it before) and tries once more: the lock is free now (it runs
       the round itself), or it is held by a process that took it after "again" was set (that
       one checks after its unlock). Without the second try, a holder that made its final
       check between the first try and "again" being set would leave nothing running.
    3. "queued" is cleared only while "again" is not set: a request that finds "queued" set
       has its "again" seen by the task that set "queued" (queued, running, or checking).

    Checking before the unlock (the old order) lost a request: the holder cleared "queued",
    a request queued a task, that task found the lock still held and left, and the holder
    unlocked without looking again; "queued" then swallowed triggers until it expired.
    """
    result = None
    for round_ in range(max_rounds):
        if not try_lock():
            if round_:
                return result  # the holder took the lock after this round's check: it checks
            triggers.set_again()
            if not try_lock():
                return None
        unlocked = False
        try:
            triggers.take_again()
            at = now or timezone.now()
            result = _one_pass(at)
            if result.undecided:
                triggers.set_again()  # the rest are decided by the next round (or, after max_rounds, task)
            # The pass's record and the lock's release: one round trip where they can share it.
            unlocked = record_pass(result, at, unlock=True)
        finally:
            if not unlocked:
                unlock()
        now = None
        if not triggers.asked_again():
            return result
    triggers.queue_pass()
    return result


# The runtime histories of this process's last pass, updated by the runs that came and went
# since rather than built again (engine/kept_history.py; docs/benchmarks/scheduling-pass.md).
_kept_history = KeptHistory()


def make_policy(loaded: LoadedSnapshot) -> TesseraScheduler:
    """The engine for one pass: the snapshot, and what the last pass's engine left (its
    reservations, held rooms, request mix: ``engine/memory.py``), so that it decides as one
    engine living through every pass would."""
    return TesseraScheduler.from_snapshot(
        loaded.snapshot, engine_config(loaded.knobs), loaded.stored.memory, _kept_history
    )


def engine_config(knobs: Mapping[str, Any] | None = None) -> EngineConfig:
    """The engine's settings: its defaults, the knobs set in the environment
    (``TESSERA_ENGINE_<KNOB>``, checked at start-up), then ``knobs`` (the operator's
    scheduler-settings record). A record that does not check out whole (changed in the database
    behind the admin's back) is not applied at all: the pass runs on the environment's knobs and
    logs why."""
    base = EngineConfig(max_starts_per_pass=settings.TESSERA["MAX_STARTS_PER_PASS"])
    base = configure(base, settings.TESSERA["ENGINE_KNOBS"])
    if not knobs:
        return base
    try:
        return configure(base, knobs)
    except KnobError as exc:
        log.error("scheduler settings not applied, the environment's are: %s", exc)
        return base


def _one_pass(now: datetime) -> PassResult:
    """Decide and apply, at ``now`` (recorded by the caller, :func:`record_pass`).

    The queue, and whether a running job can grow, are read first (one round trip); the rest of
    the cluster only if there is something to decide. A pass is asked for only while a job is
    pending, but many find it bound already, by the pass that ran as it was asked for (a submit's
    and an exit's request for one job, say): under ``make bench-e2e`` a quarter of the passes.
    Reading the queue with the cluster in one round trip made each of those read the whole
    cluster for nothing (docs/benchmarks/e2e.md)."""
    started = clock()
    pending, growable = pending_rows(resizes.GROWABLE)
    loaded = load_snapshot(now, pending) if pending or growable else None
    if loaded is not None:
        # The time budget bounds the deciding (a slow snapshot read must not leave it no time:
        # it would then decide nothing, pass after pass). What a cut-short pass did not reach is
        # decided first by the next one, so a long queue is worked through in turns.
        deadline = Deadline(clock() + settings.TESSERA["PASS_BUDGET_S"], clock, loaded.stored.not_reached)
        # Full GC collections grew faster than the pass (engine/collector.py).
        with collector_paused() if settings.TESSERA["GC_PAUSE_IN_PASS"] else nullcontext():
            engine = make_policy(loaded)
            decisions: Decisions = engine.decide(loaded.snapshot.now, deadline)
            estimates = _estimates(engine, decisions, loaded.snapshot.now)
        # Stored with the first chunk of bindings (one transaction), or alone before anything is
        # applied: what the engine remembers is what it decided, and a binding dropped as stale
        # is decided again by the next pass either way.
        memory = stored_memory.memory_write(engine.memory(), decisions.not_reached, loaded.stored, now)
        result = apply_decisions(loaded, decisions, now, estimates, memory)
    else:
        # Nothing waits and no running job can grow: there is nothing to bind, resize, preempt
        # for or explain, so the rest of the cluster need not be read (a pass after a job's
        # exit, with an empty queue, ends here).
        result = PassResult()
    result.seconds = clock() - started
    # One line per pass (the benchmark reads the durations from the worker's log).
    log.info(
        "pass took %.1f ms: %d bound, %d dropped, %d preempted, %d pending%s",
        result.seconds * 1000,
        len(result.bound),
        len(result.dropped),
        len(result.preempted),
        result.pending,
        f"; cut short by its time budget, {result.undecided} left for the next pass"
        if result.undecided
        else "",
    )
    return result


# The pass-duration histogram's buckets (seconds), as /metrics exposes them.
PASS_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)


# This process's copy of the ``SchedulerState`` row as it last wrote it (see record_pass).
_recorded: list[SchedulerState] = []


def record_pass(result: PassResult, now: datetime, unlock: bool = False) -> bool:
    """Add the pass to ``SchedulerState``: its record, the duration histogram, the decision totals.
    ``unlock``: give the pass lock back in the same query where the record allows it; returns
    whether it did (if not, the caller does).

    Statistics, not state: on PostgreSQL the commit does not wait for the disk (a crash may lose
    the last few passes' counts, never a job), so recording costs a pass no flush. Passes run one
    at a time (the pass lock), so each adds to the row as the last one left it: this process
    keeps the row it wrote and updates it only if it is still as written (the count and time of
    the last pass); if another process recorded since, the row is read again, locked (after the
    lock was given back, if it was: then other recorders wait on the row's lock instead).
    """
    state = _recorded[0] if _recorded else None
    recorded = unlocked = False
    if state is not None:
        recorded, unlocked = _add_if_unchanged(state, result, now, unlock)
    if state is None or not recorded:
        with transaction.atomic():
            _commit_without_flush()
            state, _ = SchedulerState.objects.select_for_update().get_or_create(id=1)
            _add_pass(state, result, now)
            state.save()
    _recorded[:] = [state]
    return unlocked


def _add_if_unchanged(
    state: SchedulerState, result: PassResult, now: datetime, unlock: bool
) -> tuple[bool, bool]:
    """Add the pass to the row if it is still as ``state`` (as last written here) says; with
    ``unlock``, give the pass lock back in the same query where statements go together. Returns
    (whether the row was updated, whether the lock was given back)."""
    if state.last_pass_at is None:
        return False, False
    seen = {"id": state.pk, "passes": state.passes, "last_pass_at": state.last_pass_at}
    fields = _add_pass(state, result, now)
    field = functools.partial(field_of, SchedulerState)
    params = [field(name).get_db_prep_save(value, connection) for name, value in fields.items()]
    params += [field(name).get_db_prep_value(value, connection) for name, value in seen.items()]
    sql = _update_if_sql(tuple(fields), tuple(seen))
    with connection.cursor() as cur:
        if not statements_together():
            cur.execute(sql, params)
            return cur.rowcount == 1, False
        # One round trip, its own transaction (several statements in one query are one), whose
        # commit does not wait for the disk: not BEGIN, SET LOCAL, UPDATE, COMMIT and the
        # unlock, five. (A session's advisory lock is not transactional: released at once.)
        if unlock:
            cur.execute(f"{_NO_FLUSH}; {sql}; {_UNLOCK}", [*params, PASS_LOCK_KEY])
        else:
            cur.execute(f"{_NO_FLUSH}; {sql}", params)
        cur.nextset()
        updated = cur.rowcount == 1
        if unlock and (not cur.nextset() or not cur.fetchone()[0]):
            log.warning("the pass lock was not held when given back")
        return updated, unlock


_UNLOCK = "SELECT pg_advisory_unlock(%s)"
_UPDATE_IF: dict[tuple[str, tuple[str, ...], tuple[str, ...]], str] = {}


def _update_if_sql(fields: tuple[str, ...], seen: tuple[str, ...]) -> str:
    """``UPDATE`` of ``SchedulerState``'s ``fields`` where ``seen`` are as given, built once from
    the model (the ORM's ``update()`` built its SQL anew every pass: a third of recording it)."""
    key = (connection.vendor, fields, seen)
    sql = _UPDATE_IF.get(key)
    if sql is None:
        qn, field = connection.ops.quote_name, functools.partial(field_of, SchedulerState)
        sets = ", ".join(f"{qn(column_of(field(name)))} = %s" for name in fields)
        where = " AND ".join(f"{qn(column_of(field(name)))} = %s" for name in seen)
        sql = _UPDATE_IF[key] = f"UPDATE {qn(SchedulerState._meta.db_table)} SET {sets} WHERE {where}"
    return sql


def _add_pass(state: SchedulerState, result: PassResult, now: datetime) -> dict[str, Any]:
    """Add the pass to ``state`` (in memory); returns the fields it changed, with their values."""
    decisions = {
        "bound": len(result.bound),
        "dropped": len(result.dropped),
        "preempted": len(result.preempted),
    }
    buckets = list(state.pass_buckets or []) + [0] * (len(PASS_BUCKETS_S) + 1)
    buckets = buckets[: len(PASS_BUCKETS_S) + 1]
    buckets[bisect_left(PASS_BUCKETS_S, result.seconds)] += 1
    totals = dict(state.decisions_total or {})
    for key, n in decisions.items():
        totals[key] = totals.get(key, 0) + n
    if result.undecided:  # passes cut short by their time budget
        totals["cut_short"] = totals.get("cut_short", 0) + 1
    fields = {
        "last_pass_at": now,
        "last_pass_seconds": result.seconds,
        "last_pass_decisions": {
            **decisions,
            "pending": result.pending,
            "cut_short": bool(result.undecided),
            "undecided": result.undecided,
        },
        "passes": state.passes + 1,
        "pass_seconds_sum": state.pass_seconds_sum + result.seconds,
        "pass_buckets": buckets,
        "decisions_total": totals,
    }
    for name, value in fields.items():
        setattr(state, name, value)
    return fields


# What a waiting job's live update shows (``live.job_payload``), in the model's order (as the
# prepared read's rows come): whole rows, their JSON columns decoded, made storing changed
# reasons ~15% dearer (docs/benchmarks/scheduling-pass.md).
_PAYLOAD_COLUMNS = tuple(f.attname for f in Job._meta.concrete_fields if f.attname in live.PAYLOAD_FIELDS)
_PENDING_PAYLOADS = PreparedRead(
    lambda ids: Job.objects.filter(pk__in=ids).order_by("pk").values_list(*_PAYLOAD_COLUMNS, "tenant__name")
)
# In the model's order: the prepared read's rows come in that order, whatever values_list asks.
_NODE_COLUMNS = tuple(
    f.attname for f in Node._meta.concrete_fields if f.attname in ("id", "name", "checkpoint_root", "version")
)
_LOCK_NODES = PreparedRead(
    lambda names: (
        Node.objects.select_for_update().filter(name__in=names).order_by("pk").values_list(*_NODE_COLUMNS)
    )
)
# Every column of an allocation but its id (not read back: nothing after the insert needs it).
_WRITE_ALLOCATIONS = RowsInsert(
    Allocation, [f.name for f in Allocation._meta.concrete_fields if not f.primary_key]
)
_WRITE_VERSIONS = RowsUpdate(Node, ("version",))
APPLY_CHUNK = 64  # bindings per transaction: few commits, yet node locks held only briefly


_estimated_at: list[float] = []  # when this process's passes last planned the estimates


def _estimates(engine: TesseraScheduler, decisions: Decisions, now: float) -> Mapping[str, Estimate] | None:
    """When each job left waiting is expected to start (engine/eta.py: the first
    ``eta_max_jobs`` of the queue), at most every ``ETA_EVERY_S`` (None: not this pass)."""
    began = clock()
    if _estimated_at and began - _estimated_at[0] < settings.TESSERA["ETA_EVERY_S"]:
        return None
    _estimated_at[:] = [began]
    return engine.estimate(decisions, now)


def apply_decisions(
    loaded: LoadedSnapshot,
    decisions: Decisions,
    now: datetime,
    estimates: Mapping[str, Estimate] | None = None,
    memory: Write | None = None,
) -> PassResult:
    """Apply bindings (in chunks, each one transaction; ``memory``, the engine's memory's write,
    goes with the first, or alone first if nothing binds), then resizes
    (``services/resizes.py``), then preemptions, then pending reasons and the start
    ``estimates``."""
    result = PassResult(pending=len(decisions.pending), undecided=decisions.undecided)
    bindings = list(decisions.bindings[: settings.TESSERA["MAX_STARTS_PER_PASS"]])
    if not bindings:
        stored_memory.store(memory)
    for i in range(0, len(bindings), APPLY_CHUNK):
        _apply_bindings(loaded, bindings[i : i + APPLY_CHUNK], now, result, memory if i == 0 else None)
    if decisions.resizes:
        done = set(result.bound)
        bound = {b.job_id: {p.replica for p in b.placements} for b in bindings if b.job_id in done}
        result.resized = resizes.apply_resizes(loaded, decisions.resizes, bound, now)
    for preemption in decisions.preemptions:
        with transaction.atomic():
            job = locked_jobs().filter(pk=int(preemption.job_id), state=JobState.RUNNING).first()
            if job is not None and job.preemptible:
                begin_stop(job, f"preempted: {preemption.reason}"[:64], now)
                result.preempted.append(preemption.job_id)
    _store_pending_reasons(decisions, loaded, estimates)
    return result


def _apply_bindings(
    loaded: LoadedSnapshot,
    bindings: list[Binding],
    now: datetime,
    result: PassResult,
    memory: Write | None = None,
) -> None:
    """Bind jobs, each all replicas or none, if nothing it touches moved since the snapshot.

    One transaction for the chunk, a handful of queries for all of it: the jobs and then the
    nodes are locked (the lock order everywhere), each node's version is checked against the
    snapshot's, and the capacity the database already holds is checked again per device
    (defence in depth: a GPU is never over-committed even by a wrong decision). ``memory``: a
    write that goes with the chunk's (the engine's memory), whether or not anything binds.
    """
    if not bindings:
        stored_memory.store(memory)
        return
    node_names = sorted({p.node for b in bindings for p in b.placements})
    # Two round trips in all where the transaction's BEGIN and COMMIT ride on them (bulk.py).
    with riding_transaction() as rides:
        # One round trip: the jobs locked, then the nodes (for their versions, and checkpoint
        # roots for the events; the pass needs no more of them, nor their JSON columns), then
        # who holds the devices the bindings want now (the capacity check below, then the device
        # rows published).
        job_rows, node_rows, holder_rows = read_together(
            (LOCK_JOBS, sorted({int(b.job_id) for b in bindings})),
            (_LOCK_NODES, node_names),
            (HOLDERS, _device_ids(loaded, bindings)),
            begin=rides,
        )
        # A job held since the snapshot was read is not bound (holds.py: it waits for a release).
        jobs = {str(j.pk): j for j in jobs_from_rows(job_rows) if j.state == JobState.PENDING and not j.held}
        nodes = {row[1]: Node.from_db("default", _NODE_COLUMNS, row) for row in node_rows}
        fresh = {name for name, n in nodes.items() if n.version == loaded.node_versions.get(name)}
        devices = _devices(loaded, bindings, nodes, fresh)
        held = holders_of(holder_rows)
        used = {device_id: sum(h[3] for h in hs) for device_id, hs in held.items()}
        bound: list[tuple[Job, list[tuple[Node, Device | None, int, int]]]] = []
        for binding in bindings:
            job = jobs.get(binding.job_id)
            wanted = _placements(binding, job, nodes, fresh, devices, used)
            if job is None or wanted is None:
                result.dropped.append(binding.job_id)
                continue
            for _, device, _, share in wanted:
                if device is not None:
                    used[device.pk] = used.get(device.pk, 0) + share
            bound.append((job, wanted))
            result.bound.append(binding.job_id)
        if not bound:
            write_together(memory, COMMIT if rides and memory is not None else None)
            return
        allocs: list[Allocation] = []
        events: dict[int, list[dict]] = {}
        reasons: dict[int, str] = {}  # whether a job that checkpointed can reach its checkpoint
        for job, wanted in bound:
            mine = [
                Allocation(job=job, node=n, device=d, replica=r, share_milli=s, attempt=job.attempts)
                for n, d, r, s in wanted
            ]
            allocs.extend(mine)
            events[job.pk] = allocations_payload(mine)
            if job.last_checkpoint_at is not None:
                on = [(n.name, n.checkpoint_root) for n, _, _, _ in wanted]
                reasons[job.pk] = checkpoints.binding_note(job.last_checkpoint_at, job.checkpoint_place, on)
        # Stamped now, not at the pass's start: a job committed while the snapshot was being
        # read is bound by this pass, and its history must not start before its submission. And
        # before the allocations are written: their ``created_at`` is never before the binding's
        # event, so an agent's reported start, kept after them, is after it too.
        at = max(now, timezone.now())
        # The nodes are locked: their versions as read, plus one.
        touched = {n.pk: n for _, wanted in bound for n, _, _, _ in wanted}
        for node in touched.values():
            node.version += 1
            # This pass made that change and its engine already counted it: the pass's next
            # chunk on the same node is not stale (a change by anyone else still is).
            loaded.node_versions[node.name] = node.version
        jobs_bound = [job for job, _ in bound]
        writes = [
            _WRITE_ALLOCATIONS.write(allocs),
            _WRITE_VERSIONS.write(sorted(touched.values(), key=lambda n: n.pk)),
            *transition_writes(jobs_bound, JobState.SCHEDULED, EventType.SCHEDULED, events, at, reasons),
            resizes.bound_sizes(jobs_bound, allocs),
        ]
        devices_after = _rows_after(allocs, held)
        # Each agent's wake carries its new bindings: it starts them without asking first.
        wakes = bindings_by_node(jobs_bound, allocs)
        # Everything that reads or may fail is done: the writes and the COMMIT, one round trip.
        # (A time limit striking after it leaves the chunk whole but drops the block's commit
        # hooks: its agents then start its jobs at their next heartbeat.)
        write_together(memory, *writes, COMMIT if rides else None)
        # Published by the block's commit hooks.
        live.publish_devices(devices_after)
        live.wake_agents(wakes)


def _device_ids(loaded: LoadedSnapshot, bindings: list[Binding]) -> list[int]:
    """The ids of the devices ``bindings`` place, as the snapshot read them (those of a node that
    changed since may be others: its bindings are dropped, whoever holds them)."""
    wanted = {(p.node, i) for b in bindings for p in b.placements for i in p.gpus}
    ids: list[int] = []
    for name in {name for name, _ in wanted}:
        node_id = loaded.node_ids.get(name)
        if node_id is None:
            continue
        ids.extend(d["id"] for d in loaded.devices.get(node_id, []) if (name, d["index"]) in wanted)
    return sorted(ids)


def _devices(
    loaded: LoadedSnapshot, bindings: list[Binding], nodes: dict[str, Node], fresh: set[str]
) -> dict[tuple[str, int], Device]:
    """The devices ``bindings`` place on fresh nodes, by (node name, index).

    A node's devices change only with its version (an agent's registration), so a fresh node's
    are as the snapshot read them."""
    wanted = {(p.node, i) for b in bindings for p in b.placements if p.node in fresh for i in p.gpus}
    devices = {}
    for name in sorted({name for name, _ in wanted}):
        node = nodes[name]
        for d in loaded.devices.get(node.pk, []):
            if (name, d["index"]) in wanted:
                devices[(name, d["index"])] = Device(node=node, **d)
    return devices


def _rows_after(allocs: list[Allocation], held: dict[int, list[Holder]]) -> list[dict]:
    """The device rows of the devices ``allocs`` took: ``held`` (read before) plus them."""
    taken = {a.device.pk: a.device for a in allocs if a.device is not None}
    for a in allocs:
        if a.device is not None:
            held.setdefault(a.device.pk, []).append(
                (a.job_id, a.job.tenant_id, a.job.tenant.name, a.share_milli, a.replica)
            )
    for device_id in taken:
        held[device_id].sort(key=lambda h: (h[0], h[4]))
    return device_rows(taken.values(), held)


def _placements(
    binding: Binding,
    job: Job | None,
    nodes: dict[str, Node],
    fresh: set[str],
    devices: dict[tuple[str, int], Device],
    used: dict[int, int],
) -> list[tuple[Node, Device | None, int, int]] | None:
    """(node, device, replica, share) rows for ``binding``, or None if it must be dropped."""
    if job is None:
        return None
    if any(p.node not in fresh for p in binding.placements):
        log.info("dropping stale binding of job %s", binding.job_id)
        return None
    wanted: list[tuple[Node, Device | None, int, int]] = []
    extra: dict[int, int] = {}
    for p in binding.placements:
        share = round(p.share * 1000)
        if not p.gpus:  # a CPU-only replica: a place on the node, no GPU
            wanted.append((nodes[p.node], None, p.replica, 0))
        for index in p.gpus:
            device = devices.get((p.node, index))
            if device is None or not device.healthy:
                return None
            extra[device.pk] = extra.get(device.pk, 0) + share
            if used.get(device.pk, 0) + extra[device.pk] > 1000:
                log.error("refusing binding of job %s: device over-committed", binding.job_id)
                return None
            wanted.append((nodes[p.node], device, p.replica, share))
    return wanted


def _store_pending_reasons(
    decisions: Decisions, loaded: LoadedSnapshot, estimates: Mapping[str, Estimate] | None
) -> None:
    """Write the reasons and estimates that changed since the snapshot (most stay the same pass
    after pass). A job with an estimate gets its start, band, basis and place in the queue; one
    without, the reason's own estimated start (a backoff's end) and none of the rest. Without
    ``estimates`` (not planned this pass) the stored ones stay."""
    kept: list[ReasonRow] = []  # a new reason, the stored estimate kept
    rows: list[ReasonRow] = []  # a new reason with a new estimate, or with none (cleared)
    for job_id, reason in decisions.pending.items():
        stored = loaded.reasons.get(job_id)  # None: not pending when the snapshot was read
        if stored is None:
            continue
        had = loaded.estimates.get(job_id, NO_ESTIMATE)
        if estimates is None and had != NO_ESTIMATE:
            new = (reason.code, reason.message, stored[2])  # keep the stored estimate
            if reason_changed(stored, new):
                kept.append(_reason_row(job_id, new))
            continue
        est = estimates.get(job_id) if estimates is not None else None
        if est is not None:
            new = (reason.code, reason.message, estimate_at(est.start))
            band = (estimate_at(est.earliest), estimate_at(est.latest), est.basis, est.position, est.ahead)
            if reason_changed(stored, new) or estimate_changed(had, band):
                rows.append(_reason_row(job_id, new, band))
            continue
        new = (reason.code, reason.message, estimate_at(reason.estimated_start))
        if reason_changed(stored, new) or had != NO_ESTIMATE:
            rows.append(_reason_row(job_id, new, NO_ESTIMATE))
    for job_id, why in decisions.rejections.items():
        # The live cluster keeps such jobs pending (nodes may join later): say why.
        stored = loaded.reasons.get(job_id)
        if stored is not None and stored[1] != why:
            rows.append(_reason_row(job_id, ("capacity", why, None), NO_ESTIMATE))
    if not kept and not rows:
        return
    # Each table's rows in one statement from arrays (not bulk_update's CASE per row, far slower:
    # docs/benchmarks/scheduling-pass.md), and on PostgreSQL both in one round trip, one
    # transaction (several statements in one query are one). Reasons are recomputed by every
    # pass, so their commit need not wait for the disk.
    together = statements_together()
    with nullcontext() if together else transaction.atomic():
        write_together(
            Write(_NO_FLUSH, []) if connection.vendor == "postgresql" else None,
            _WRITE_REASONS.write_values(kept),
            _WRITE_ESTIMATES.write_values(rows),
        )
        changed = sorted(row[0] for row in (*kept, *rows))
        shown = jobs_from_rows(_PENDING_PAYLOADS.rows(changed), _PAYLOAD_COLUMNS)
        jobs = [job for job in shown if job.state == JobState.PENDING]
        live.publish_jobs(jobs)


# A job's row for :data:`_WRITE_REASONS` or :data:`_WRITE_ESTIMATES`: its primary key, then the
# columns' values in their order.
ReasonRow = tuple[Any, ...]


def _reason_row(job_id: str, reason: StoredReason, band: StoredEstimate | None = None) -> ReasonRow:
    """A job's new reason (code, message, estimated start) and, unless None, estimate band."""
    return (int(job_id), *reason) if band is None else (int(job_id), *reason, *band)


# The last instant an estimate may name, a day short of what a datetime holds (so that a page
# may still show it in any time zone). An estimate past it is no estimate: a default runtime or
# time limits summed over a long queue can reach it, and converting it raised OverflowError,
# failing every pass.
LATEST_ESTIMATE = (datetime.max.replace(tzinfo=UTC) - timedelta(days=1)).timestamp()


def estimate_at(t: float | None) -> datetime | None:
    """Epoch seconds ``t`` as a datetime; None for none, or past :data:`LATEST_ESTIMATE`."""
    return datetime.fromtimestamp(t, tz=UTC) if t is not None and t <= LATEST_ESTIMATE else None


_WRITE_REASONS = RowsUpdate(
    Job, ("pending_code", "pending_reason", "estimated_start"), where=("state", JobState.PENDING)
)
_WRITE_ESTIMATES = RowsUpdate(
    Job,
    ("pending_code", "pending_reason", "estimated_start", *ESTIMATE_FIELDS),
    where=("state", JobState.PENDING),
)


def estimate_changed(stored: StoredEstimate, new: StoredEstimate) -> bool:
    """A band edge moved by :data:`ESTIMATE_SLACK` or more, or the basis or place changed."""
    if stored[2:] != new[2:]:
        return True
    for before, after in zip(stored[:2], new[:2], strict=True):
        if before is None or after is None:
            if before is not after:
                return True
        elif abs(after - before) >= ESTIMATE_SLACK:
            return True
    return False


# An estimated start that moved less than this is not rewritten: every pass recomputes it from
# "now", so a waiting job's estimate moved a few milliseconds each pass, and each pass wrote it
# (and published the job) again for nothing. Its reason's text (minutes) is compared as before.
ESTIMATE_SLACK = timedelta(seconds=60)


def reason_changed(stored: StoredReason, new: StoredReason) -> bool:
    if stored[:2] != new[:2]:
        return True
    before, after = stored[2], new[2]
    if before is None or after is None:
        return before is not after
    return abs(after - before) >= ESTIMATE_SLACK


_NO_FLUSH = "SET LOCAL synchronous_commit TO OFF"


def _commit_without_flush() -> None:
    """This transaction's commit does not wait for the disk (PostgreSQL): for derived data only,
    which a crash may lose and the next pass writes again."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute(_NO_FLUSH)
