"""Read and write the trace formats of docs/formats.md: nodes.csv, jobs.csv, quotas.csv.

Bad rows raise :class:`TraceError` naming the file, the line and the column, so a user can fix them.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from agent import profiles
from scheduling.engine.adjust import IDLE_RECLAIM
from scheduling.engine.types import KINDS, MILLI, TOPOLOGIES, JobRequest, NodeSpec, QuotaSpec

NODE_COLUMNS = [
    "node",
    "rack",
    "gpus",
    "model",
    "gpu_memory_gib",
    "nvlink_domain",
    "cpus",
    "memory_gib",
    "price_per_gpu_hour",
]
JOB_COLUMNS = [
    "job",
    "tenant",
    "kind",
    "submit_s",
    "duration_s",
    "gpus",
    "replicas",
    "model",
    "priority",
    "preemptible",
    "time_limit_s",
    "cpus",
    "memory_gib",
]
JOB_OPTIONAL = [
    "topology",
    "min_gpus",
    "max_gpus",
    "checkpoint_s",
    "grace_s",
    "min_available",
    "node_selector",
]
# Optional too, and not written by ``generate``: labels a node should carry (the job's data), in
# node_selector's ``k:v;k:v`` form; preferred by the placer (EngineConfig.delta), never required.
JOB_PREFER = "prefer_labels"
# Optional, read by ``replay --adjust on`` (docs/formats.md, "Utilisation"): the job's utilisation
# profile (default: drawn from its id and kind), its owner's ``idle_reclaim`` and ``interactive``.
JOB_ADJUST = ("util_profile", "idle_reclaim", "interactive")
# Optional: who submitted the job and its name. A user's reruns of one name are the runtime
# history start estimates trust first; written by ``generate --recurring`` and ``export_trace``.
JOB_RECURRING = ["user", "name"]
QUOTA_COLUMNS = ["tenant", "model", "guaranteed", "limit", "weight"]
# How the ``reason`` of a ``start`` begins when the job starts over, its checkpoint out of its new
# nodes' reach (``export_trace``: services/checkpoints.py): ``check`` then takes all its work lost.
START_FROM_SCRATCH = "starts from the beginning"
# The largest time a column may hold, in seconds (~31,700 years; epoch times, ~1.7e9, are well
# within): beyond it a float's step passes the checker's millisecond, and at 1e300 adding a job's
# work to its start changes nothing at all.
MAX_SECONDS = 1e12


class TraceError(ValueError):
    """A trace file that cannot be read; the message names file, line and column."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """A job of JOBS.csv: the engine's request plus what only the simulator knows."""

    request: JobRequest
    submit_s: float
    duration_s: float | None  # work to do on the GPUs asked for; None in some pack files
    util_profile: str = ""  # "" = drawn (scheduling/sim/utilisation.py)
    idle_reclaim: str = "never"
    interactive: bool = False


def parse_labels(text: str) -> tuple[tuple[str, str], ...]:
    """``k:v;k:v`` → sorted pairs. Raises ValueError on an entry without ``:``."""
    pairs = []
    for item in (text or "").split(";"):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition(":")
        if not sep or not key:
            raise ValueError(f"label {item!r} is not key:value")
        pairs.append((key.strip(), value.strip()))
    return tuple(sorted(pairs))


def _rows(path: Path, required: Iterable[str]) -> Iterable[tuple[int, dict[str, str]]]:
    # utf-8-sig: a byte order mark (spreadsheets write one) is not part of the first column's name
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames:  # surrounding spaces are trimmed, in the header as in the values
            reader.fieldnames = [name.strip() for name in reader.fieldnames]
        header = reader.fieldnames or []
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
        for lineno, row in enumerate(reader, start=2):
            yield lineno, {k: (v or "").strip() for k, v in row.items() if k is not None}


class _Field:
    """Typed access to one CSV row with errors that say where."""

    def __init__(self, path: Path, lineno: int, row: dict[str, str]):
        self.path, self.lineno, self.row = path, lineno, row

    def fail(self, column: str, why: str) -> TraceError:
        value = self.row.get(column, "")
        return TraceError(f"{self.path}:{self.lineno}: column {column!r} = {value!r}: {why}")

    def text(self, column: str, default: str = "") -> str:
        return self.row.get(column, "") or default

    def number(
        self,
        column: str,
        default: float | None = None,
        minimum: float = 0.0,
        maximum: float = math.inf,
        unit: str = "",
    ) -> float:
        raw = self.row.get(column, "")
        if raw == "":
            if default is None:
                raise self.fail(column, "a number is required")
            return default
        try:
            value = float(raw)
        except ValueError:
            raise self.fail(column, "not a number") from None
        if not math.isfinite(value):  # nan, inf and what overflows (1e400) mean nothing here
            raise self.fail(column, "must be a finite number")
        if value < minimum:
            raise self.fail(column, f"must be >= {minimum:g}")
        if value > maximum:
            raise self.fail(column, f"must be at most {maximum:g}{unit}")
        return value

    def seconds(self, column: str, default: float) -> float:
        return self.number(column, default, maximum=MAX_SECONDS, unit=" s")

    def optional_seconds(self, column: str) -> float | None:
        return None if self.row.get(column, "") == "" else self.seconds(column, 0.0)

    def integer(self, column: str, default: int | None = None, minimum: int = 0) -> int:
        value = self.number(column, None if default is None else float(default), minimum)
        if value != int(value):
            raise self.fail(column, "must be a whole number")
        return int(value)

    def boolean(self, column: str, default: bool) -> bool:
        raw = self.row.get(column, "").lower()
        if raw == "":
            return default
        if raw in ("true", "1", "yes"):
            return True
        if raw in ("false", "0", "no"):
            return False
        raise self.fail(column, "must be true or false")

    def labels(self, column: str) -> tuple[tuple[str, str], ...]:
        try:
            return parse_labels(self.row.get(column, ""))
        except ValueError as exc:
            raise self.fail(column, str(exc)) from None


def read_nodes(path: str | Path) -> list[NodeSpec]:
    path = Path(path)
    nodes: list[NodeSpec] = []
    seen: set[str] = set()
    for lineno, row in _rows(path, NODE_COLUMNS):
        f = _Field(path, lineno, row)
        name = f.text("node")
        if not name:
            raise f.fail("node", "a node name is required")
        if name in seen:
            raise f.fail("node", "duplicate node name")
        seen.add(name)
        rack = f.text("rack", "default")
        gpus = f.integer("gpus")
        domain = f.integer("nvlink_domain", default=1, minimum=1)
        labels = dict(f.labels("labels"))
        labels["rack"] = rack
        nodes.append(
            NodeSpec(
                name=name,
                rack=rack,
                model=f.text("model"),
                gpus=gpus,
                nvlink_domain=min(domain, gpus) if gpus else 1,
                cpus=f.number("cpus", 0.0),
                memory_gib=f.number("memory_gib", 0.0),
                price_per_gpu_hour=f.number("price_per_gpu_hour", 0.0),
                kind=f.text("kind", "gpu"),
                labels=tuple(sorted(labels.items())),
            )
        )
    return nodes


def read_jobs(path: str | Path) -> list[TraceJob]:
    path = Path(path)
    jobs: list[TraceJob] = []
    for lineno, row in _rows(path, JOB_COLUMNS):
        f = _Field(path, lineno, row)
        job_id = f.text("job")
        if not job_id:
            raise f.fail("job", "a job id is required")
        kind = f.text("kind", "batch")
        if kind not in KINDS:
            raise f.fail("kind", f"must be one of {', '.join(KINDS)}")
        topology = f.text("topology", "any")
        if topology not in TOPOLOGIES:
            raise f.fail("topology", f"must be one of {', '.join(TOPOLOGIES)}")
        gpus, replicas, min_available, min_gpus, max_gpus = _shape(f)
        prefer = f.labels(JOB_PREFER)
        if any(k == "rack" for k, _ in prefer):
            raise f.fail(JOB_PREFER, "may not name rack (use node_selector or topology)")
        request = JobRequest(
            id=job_id,
            tenant=f.text("tenant", "default"),
            kind=kind,
            gpus=gpus,
            replicas=replicas,
            min_available=min_available,
            accelerators=tuple(m for m in f.text("model").split("|") if m),
            topology=topology,
            priority=f.integer("priority", default=0, minimum=-(10**9)),
            preemptible=f.boolean("preemptible", kind != "inference"),
            grace_s=f.seconds("grace_s", 30.0),
            checkpoint_s=f.optional_seconds("checkpoint_s"),
            time_limit_s=f.optional_seconds("time_limit_s"),
            cpus=f.number("cpus", 0.0),
            memory_gib=f.number("memory_gib", 0.0),
            node_selector=f.labels("node_selector"),
            prefer_labels=prefer,
            elastic_min_gpus=min_gpus,
            elastic_max_gpus=max_gpus,
            submitted_at=f.seconds("submit_s", 0.0),
            user=f.text("user"),
            name=f.text("name"),
        )
        profile = f.text("util_profile")
        if profile and not profiles.is_profile(profile):
            raise f.fail("util_profile", f"unknown profile (one of {', '.join(profiles.NAMES)})")
        reclaim = f.text("idle_reclaim", "never")
        if reclaim not in IDLE_RECLAIM:
            raise f.fail("idle_reclaim", f"must be one of {', '.join(IDLE_RECLAIM)}")
        jobs.append(
            TraceJob(
                request,
                request.submitted_at,
                f.optional_seconds("duration_s"),
                profile,
                reclaim,
                f.boolean("interactive", False),
            )
        )
    return jobs


def _optional_integer(f: _Field, column: str, minimum: int) -> int | None:
    return None if f.row.get(column, "") == "" else f.integer(column, minimum=minimum)


def _shape(f: _Field) -> tuple[float, int, int | None, int | None, int | None]:
    """``gpus``, ``replicas``, ``min_available``, ``min_gpus``, ``max_gpus`` under the API's rules
    (scheduling/api/job_serializers.py): what the live cluster refuses, a replay would run wrong."""
    gpus = f.number("gpus", 1.0)
    replicas = f.integer("replicas", default=1, minimum=1)
    if 0 < gpus < 1:
        milli = round(gpus * MILLI)  # fractions are allocated in thousandths, as the API keeps them
        if not 1 <= milli <= MILLI - 1:
            raise f.fail("gpus", "a fraction must be between 0.001 and 0.999")
        gpus = milli / MILLI
        if replicas != 1:
            raise f.fail("replicas", "a fractional job has exactly one replica")
    elif gpus != int(gpus):
        raise f.fail("gpus", "above 1 a GPU count is a whole number")
    elif int(gpus) % replicas:
        raise f.fail("replicas", "must divide gpus (each replica gets gpus / replicas GPUs)")
    min_available = _optional_integer(f, "min_available", 1)
    min_gpus = _optional_integer(f, "min_gpus", 1)
    max_gpus = _optional_integer(f, "max_gpus", 1)
    if (min_gpus is None) != (max_gpus is None):
        raise f.fail(
            "max_gpus" if max_gpus is None else "min_gpus", "give min_gpus and max_gpus both or neither"
        )
    if min_gpus is not None and max_gpus is not None:
        if gpus < 1:
            raise f.fail("min_gpus", "an elastic job needs gpus of at least 1")
        if not min_gpus <= gpus <= max_gpus:
            raise f.fail(
                "min_gpus", f"min_gpus <= gpus <= max_gpus must hold (gpus {gpus:g}, max_gpus {max_gpus})"
            )
        per = int(gpus) // replicas
        if min_gpus % per or max_gpus % per:
            raise f.fail("min_gpus", f"min_gpus and max_gpus must be multiples of the per-replica size {per}")
        if min_available is not None and min_available != min_gpus // per:
            raise f.fail("min_available", f"disagrees with min_gpus / per-replica size = {min_gpus // per}")
    if min_available is not None and min_available > replicas:
        raise f.fail("min_available", "must be at most replicas")
    return gpus, replicas, min_available, min_gpus, max_gpus


def read_quotas(path: str | Path) -> list[QuotaSpec]:
    path = Path(path)
    quotas: list[QuotaSpec] = []
    seen: set[tuple[str, str]] = set()
    for lineno, row in _rows(path, QUOTA_COLUMNS):
        f = _Field(path, lineno, row)
        tenant, model = f.text("tenant"), f.text("model", "*")
        if not tenant:
            raise f.fail("tenant", "a tenant is required")
        if (tenant, model) in seen:  # which of the two would hold is anyone's guess: refuse both
            raise f.fail("model", f"duplicate quota row for tenant {tenant!r}, model {model!r}")
        seen.add((tenant, model))
        guaranteed = f.number("guaranteed", 0.0)
        limit = f.number("limit", guaranteed)
        if limit < guaranteed:
            raise f.fail("limit", "must be at least the guaranteed amount")
        quotas.append(
            QuotaSpec(
                tenant=tenant,
                model=model,
                guaranteed=guaranteed,
                limit=limit,
                weight=f.number("weight", 1.0),
            )
        )
    return quotas
