"""Export the live cluster's history in the simulator's formats (docs/formats.md), so the same
checker (``python -m scheduling.sim check``) judges live runs and simulated ones.

Event mapping: ``submitted``→``submit``, ``scheduled``→``start`` (with allocations),
``preempted``→``preempt``, ``resized``→``resize``, ``succeeded``→``finish``, ``failed``→``fail``,
``cancelled``→``cancel``, ``checkpointed``→``checkpoint`` (reason: the job's marker line; the
checker then counts what a preemption loses from it). A retry after a failed attempt, and a
requeue after a lost node, release the job's GPUs and put it back in the queue: they become
``preempt`` with ``reason`` ``retry: …`` or ``node-lost`` (the checker does not count those as
preemptions of non-preemptible jobs).
A ``scheduled`` event's reason (a job that checkpointed: whether its new nodes reach its
checkpoint, services/checkpoints.py) goes with its ``start``; one that ``starts from the
beginning`` makes the checker take the job's work back to zero.
``started``, ``terminating`` and the ``requeued`` that follows a preemption add nothing.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.db import connection, transaction

from scheduling.choices import TERMINAL_STATES
from scheduling.models import Job, JobEvent, Node, Quota
from scheduling.sim.traces import (
    JOB_COLUMNS,
    JOB_OPTIONAL,
    JOB_PREFER,
    JOB_RECURRING,
    NODE_COLUMNS,
    QUOTA_COLUMNS,
)

SIMPLE = {
    "submitted": "submit",
    "scheduled": "start",
    "preempted": "preempt",
    "resized": "resize",
    "succeeded": "finish",
    "failed": "fail",
    "cancelled": "cancel",
    "checkpointed": "checkpoint",
}


def _num(value: float | int | None) -> str:
    if value is None:
        return ""
    if not isinstance(value, float):
        return str(value)
    # Microseconds, like the events' times: ``:g`` kept 6 significant digits, so past 10 s a
    # submit_s could round above its own submit event's time.
    return f"{value:.6f}".rstrip("0").rstrip(".") or "0"


TRACE_NODE_KINDS = ("gpu", "tpu", "npu")


def node_rows() -> Iterator[dict[str, Any]]:
    for node in Node.objects.prefetch_related("devices").order_by("name"):
        devices = sorted(node.devices.all(), key=lambda d: d.index)
        labels = ";".join(f"{k}:{v}" for k, v in sorted((node.labels or {}).items()) if k != "rack")
        yield {
            "node": node.name,
            "rack": node.rack,
            "gpus": len(devices),
            "model": devices[0].model if devices else "",
            "gpu_memory_gib": _num(devices[0].memory_gib if devices else 0),
            "nvlink_domain": node.nvlink_domain,
            "cpus": _num(node.cpus),
            "memory_gib": _num(node.memory_gib),
            "price_per_gpu_hour": _num(node.price_per_gpu_hour),
            # The formats know accelerator kinds only (gpu, tpu, npu): a CPU-only node (no devices)
            # is written with the default.
            "kind": node.kind if node.kind in TRACE_NODE_KINDS else "gpu",
            "labels": labels,
        }


def _last_attempt_seconds(job: Job, events: list[JobEvent]) -> float | None:
    """The work of its last attempt, in seconds at its full size: its run time, where a resize
    left it on k of its g GPUs counted at k/g (as the simulator counts work)."""
    starts = [i for i, e in enumerate(events) if e.type == "scheduled"]
    if not starts or job.finished_at is None:
        return None
    first = events[starts[-1]]
    started = job.started_at if job.started_at and job.started_at >= first.at else first.at
    work, since, rate = 0.0, started, _rate(job, first.allocations)
    for e in events[starts[-1] + 1 :]:
        if e.type == "resized" and e.at <= job.finished_at:
            at = max(since, e.at)
            work += rate * (at - since).total_seconds()
            since, rate = at, _rate(job, e.allocations)
    return max(0.0, work + rate * (job.finished_at - since).total_seconds())


def _rate(job: Job, allocations: list[dict[str, Any]] | None) -> float:
    """The share of its full speed a job runs at on ``allocations`` (an event's)."""
    if not allocations or job.gpus <= 0:
        return 1.0
    held = sum(len(a.get("gpus", [])) * float(a.get("share", 1.0)) for a in allocations)
    return min(1.0, held / float(job.gpus))


def job_rows(origin, events_by_job: dict[int, list[JobEvent]]) -> Iterator[dict[str, Any]]:
    for job in Job.objects.select_related("tenant", "owner").order_by("id"):
        yield {
            "job": str(job.pk),
            "tenant": job.tenant.name,
            "kind": job.kind,
            "submit_s": _num((job.submitted_at - origin).total_seconds()),
            "duration_s": _num(_last_attempt_seconds(job, events_by_job.get(job.pk, []))),
            "gpus": _num(job.gpus),
            "replicas": job.replicas,
            "model": "|".join(job.accelerators or []),
            "priority": job.priority,
            "preemptible": "true" if job.preemptible else "false",
            "time_limit_s": _num(job.time_limit_seconds),
            "cpus": _num(job.cpus),
            "memory_gib": _num(job.memory_gib),
            "topology": job.topology,
            "min_gpus": _num(job.elastic_min_gpus),
            "max_gpus": _num(job.elastic_max_gpus),
            "checkpoint_s": _num(job.checkpoint_seconds),
            "grace_s": _num(job.grace_seconds),
            "min_available": job.min_available,
            "node_selector": ";".join(f"{k}:{v}" for k, v in sorted((job.node_selector or {}).items())),
            JOB_PREFER: ";".join(f"{k}:{v}" for k, v in sorted((job.prefer_labels or {}).items())),
            "user": job.owner.username if job.owner is not None else "",
            "name": job.name,
        }


def sim_event(event: JobEvent, origin) -> dict[str, Any] | None:
    t = round((event.at - origin).total_seconds(), 6)
    out: dict[str, Any] = {"t": t, "job": str(event.job_id)}
    if event.type in SIMPLE:
        out["event"] = SIMPLE[event.type]
        if event.type in ("scheduled", "resized"):
            out["allocations"] = event.allocations or []
    elif event.type == "retrying":
        out["event"], out["reason"] = "preempt", f"retry: {event.reason}"
    elif event.type == "requeued" and event.reason == "node-lost":
        out["event"] = "preempt"
    else:
        return None
    if event.reason and "reason" not in out:
        out["reason"] = event.reason
    return out


def export_trace(directory: str | Path) -> dict[str, int]:
    """Write nodes.csv, jobs.csv, quotas.csv and events.jsonl into ``directory``; return counts
    (``unfinished``: jobs still waiting or running).

    Every table is read in one snapshot (:func:`one_snapshot`): a job submitted while a live
    cluster is exported is in all of the files or in none (read apart, it could be in jobs.csv
    without its ``submit`` event)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    with one_snapshot():
        return _write_trace(out)


@contextmanager
def one_snapshot() -> Iterator[None]:
    """Read every query inside in one snapshot of the database, without holding up writers.

    PostgreSQL: a repeatable-read, read-only transaction. SQLite: a deferred transaction, whose
    snapshot is taken by its first read; in WAL mode (the embedded database's, see
    ``controlplane/env.py``) writers go on committing meanwhile, unseen by it. Django's
    ``atomic()`` cannot open it: the embedded database's transactions begin IMMEDIATE (they take
    the write lock at once, so that a read-then-write never fails on a busy database), which would
    stop every submit for the length of the export. Inside a caller's transaction, that one is
    the snapshot."""
    if connection.in_atomic_block:
        yield
    elif connection.vendor == "postgresql":
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield
    else:
        with connection.cursor() as cur:
            cur.execute("BEGIN DEFERRED")
        try:
            yield
        finally:
            with connection.cursor() as cur:
                cur.execute("COMMIT")  # read only: nothing to keep or undo


def _write_trace(out: Path) -> dict[str, int]:
    first = Job.objects.order_by("submitted_at").values_list("submitted_at", flat=True).first()
    events = list(JobEvent.objects.order_by("at", "id"))
    origin = min([e.at for e in events] + ([first] if first else [])) if (events or first) else None
    by_job: dict[int, list[JobEvent]] = {}
    for e in events:
        by_job.setdefault(e.job_id, []).append(e)

    with open(out / "nodes.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, [*NODE_COLUMNS, "kind", "labels"])
        writer.writeheader()
        nodes = list(node_rows())
        writer.writerows(nodes)
    with open(out / "jobs.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, [*JOB_COLUMNS, *JOB_OPTIONAL, JOB_PREFER, *JOB_RECURRING])
        writer.writeheader()
        jobs = list(job_rows(origin, by_job)) if origin else []
        writer.writerows(jobs)
    with open(out / "quotas.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, QUOTA_COLUMNS)
        writer.writeheader()
        for q in Quota.objects.select_related("tenant").order_by("tenant__name", "model"):
            writer.writerow(
                {
                    "tenant": q.tenant.name,
                    "model": q.model,
                    "guaranteed": _num(q.guaranteed),
                    "limit": _num(q.limit),
                    "weight": _num(q.weight),
                }
            )
    written = 0
    with open(out / "events.jsonl", "w", encoding="utf-8") as fh:
        for event in events:
            row = sim_event(event, origin)
            if row is not None:
                fh.write(json.dumps(row, separators=(",", ":")) + "\n")
                written += 1
    # Jobs still waiting or running: the checker then needs ``--unfinished-ok`` (they never end).
    unfinished = Job.objects.exclude(state__in=TERMINAL_STATES).count()
    return {"nodes": len(nodes), "jobs": len(jobs), "events": written, "unfinished": unfinished}
