"""The job body (docs/api.md, "The job body"): its validation, and the job as the API returns it.

``JobSubmitSerializer`` checks every field's JSON type and bound and the rules between fields
(gang sizes, elastic range); ``JobSerializer`` renders a stored job: the body's fields echoed back
plus its state, queue level, pending reason and active allocations.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from scheduling.api.fields import (
    FieldTemplates,
    GpuCountField,
    RejectsUnknownFields,
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    StringListField,
    StringMapField,
    is_json_int,
    json_safe,
    kept,
)
from scheduling.choices import IdleMode, JobKind, Topology
from scheduling.models import Allocation, Job, JobEvent
from scheduling.services.history import placements_payload
from scheduling.services.jobs import allocations_payload, gpu_sharing

MAX_PRIORITY = 1_000_000
MAX_SECONDS = 10 * 365 * 24 * 3600  # ten years: far beyond any real limit, within a 32-bit column
MAX_GRACE_SECONDS = 24 * 3600
MAX_REPLICAS = 4096
MAX_CPUS = 1_000_000.0
MAX_MEMORY_GIB = 1_000_000_000.0


def max_job_gpus() -> int:
    return settings.TESSERA["MAX_JOB_GPUS"]


@extend_schema_field(
    {
        "type": "object",
        # At most TESSERA_MAX_JOB_GPUS each (a setting, so not in the schema).
        "properties": {
            "min_gpus": {"type": "integer", "minimum": 1},
            "max_gpus": {"type": "integer", "minimum": 1},
        },
        "required": ["min_gpus", "max_gpus"],
        "additionalProperties": False,
    }
)
class ElasticField(serializers.Field):
    """``{"min_gpus": int, "max_gpus": int}``; the range checks against ``gpus`` come later."""

    def to_internal_value(self, data: Any) -> dict[str, int]:
        if not isinstance(data, dict):
            raise serializers.ValidationError("must be an object with min_gpus and max_gpus")
        unknown = sorted(set(data) - {"min_gpus", "max_gpus"})
        if unknown:
            raise serializers.ValidationError("unknown key(s): " + ", ".join(json_safe(unknown)))
        out = {}
        for key in ("min_gpus", "max_gpus"):
            if key not in data:
                raise serializers.ValidationError(f"{key} is required")
            if not is_json_int(data[key]):
                raise serializers.ValidationError(f"{key} must be an integer")
            if not 1 <= data[key] <= max_job_gpus():
                raise serializers.ValidationError(f"{key} must be 1 to {max_job_gpus()}")
            out[key] = data[key]
        if out["min_gpus"] > out["max_gpus"]:
            raise serializers.ValidationError("min_gpus must not exceed max_gpus")
        return out

    def to_representation(self, value: Any) -> Any:
        return value


class JobSubmitSerializer(RejectsUnknownFields, FieldTemplates, serializers.Serializer):
    """Validates a submitted job body (:func:`validated_submit`); :func:`model_fields` gives the
    values to store."""

    tenant = StrictCharField(
        required=False,
        max_length=64,
        help_text="Operators only (they belong to no tenant): the tenant to submit for. "
        "A tenant's user may omit it or name their own tenant.",
    )
    name = StrictCharField(min_length=1, max_length=128, printable=True)
    kind = StrictCharField(choices=tuple(JobKind.values))
    command = StringListField(
        min_items=1,
        max_items=4096,
        max_bytes=256 * 1024,
        help_text="The program, then its arguments, run as is (no shell); the program may not be blank.",
    )
    gpus = GpuCountField(required=False)
    replicas = StrictIntegerField(required=False, min_value=1, max_value=MAX_REPLICAS)
    min_available = StrictIntegerField(required=False, min_value=1, max_value=MAX_REPLICAS)
    accelerators = StringListField(
        required=False, max_items=64, max_bytes=64 * 64, item_min_length=1, item_max_length=64
    )
    topology = StrictCharField(required=False, choices=tuple(Topology.values))
    priority = StrictIntegerField(required=False, min_value=-MAX_PRIORITY, max_value=MAX_PRIORITY)
    preemptible = StrictBooleanField(required=False)
    grace_seconds = StrictIntegerField(required=False, min_value=0, max_value=MAX_GRACE_SECONDS)
    checkpoint_seconds = StrictIntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_SECONDS
    )
    time_limit_seconds = StrictIntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_SECONDS
    )
    cpus = StrictFloatField(required=False, min_value=0, max_value=MAX_CPUS)
    memory_gib = StrictFloatField(required=False, min_value=0, max_value=MAX_MEMORY_GIB)
    env = StringMapField(required=False, max_entries=256, max_bytes=64 * 1024)
    node_selector = StringMapField(required=False, max_entries=64, max_bytes=16 * 1024, key_max_length=253)
    prefer_labels = StringMapField(
        required=False,
        max_entries=64,
        max_bytes=16 * 1024,
        key_max_length=253,
        help_text="Labels a node should carry (where the job's data lives): nodes carrying more "
        "of them are preferred (docs/placement.md, δ), never required. Not `rack`: use "
        "node_selector or topology for racks.",
    )
    max_retries = StrictIntegerField(required=False, min_value=0, max_value=100)
    elastic = ElasticField(required=False, allow_null=True)
    interactive = StrictBooleanField(
        required=False, help_text="A person is at it (a notebook, a debug session): never judged idle."
    )
    idle_reclaim = StrictCharField(
        required=False,
        choices=(IdleMode.NEVER, IdleMode.ALLOW),
        help_text="`allow`: the adjustment pass may requeue this non-preemptible job once its GPUs "
        "have been idle for the policy's window (default `never`: it is only warned).",
    )

    def validate_command(self, value: list[str]) -> list[str]:
        # The program, run as is: blank, no node could ever start it (its arguments may be "").
        if not value[0].strip():
            raise serializers.ValidationError("item 0, the program to run, must not be blank")
        return value

    def validate_prefer_labels(self, value: dict[str, str]) -> dict[str, str]:
        # Nodes alike share a placement group across racks, so the placer scores labels per
        # node class, and the rack is not part of it: refused rather than silently ignored.
        if "rack" in value:
            raise serializers.ValidationError("may not name rack (use node_selector or topology for racks)")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        errors: dict[str, list[str]] = {}
        limit = max_job_gpus()
        gpus = attrs.get("gpus", 1.0)
        replicas = attrs.get("replicas", 1)
        elastic = attrs.get("elastic")
        fraction = 0 < gpus < 1
        if gpus > limit:
            errors["gpus"] = [f"must be at most {limit}"]
        elif fraction and replicas != 1:
            errors["replicas"] = ["must be 1 when gpus is a fraction of one GPU"]
        elif not fraction and int(gpus) % replicas:
            errors["replicas"] = ["must divide gpus (each replica gets gpus / replicas GPUs)"]
        if errors:
            raise serializers.ValidationError(errors)
        per_replica = gpus / replicas
        min_available = attrs.get("min_available")
        if elastic is not None:
            if gpus < 1:
                raise serializers.ValidationError({"elastic": ["needs gpus of at least 1"]})
            per = int(per_replica)
            if not elastic["min_gpus"] <= gpus <= elastic["max_gpus"]:
                raise serializers.ValidationError({"elastic": ["min_gpus ≤ gpus ≤ max_gpus must hold"]})
            if elastic["min_gpus"] % per or elastic["max_gpus"] % per:
                raise serializers.ValidationError(
                    {"elastic": [f"min_gpus and max_gpus must be multiples of the per-replica size {per}"]}
                )
            derived = elastic["min_gpus"] // per
            if min_available is not None and min_available != derived:
                raise serializers.ValidationError(
                    {"min_available": [f"disagrees with elastic: min_gpus / per-replica size = {derived}"]}
                )
            min_available = derived
        elif min_available is None:
            min_available = replicas
        if min_available > replicas:
            raise serializers.ValidationError({"min_available": ["must be at most replicas"]})
        attrs["gpus"], attrs["replicas"], attrs["min_available"] = gpus, replicas, min_available
        if attrs.get("interactive") and attrs.get("idle_reclaim") == IdleMode.ALLOW:
            raise serializers.ValidationError({"idle_reclaim": ["an interactive job is never judged idle"]})
        return attrs


def validated_submit(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` checked by ``JobSubmitSerializer`` (its ``validated_data``), or the
    ``ValidationError`` (400, naming each field at fault) that ``is_valid`` would raise."""
    return kept(JobSubmitSerializer).run_validation(body)


def model_fields(validated: dict[str, Any]) -> dict[str, Any]:
    """A validated body (:func:`validated_submit`) as ``Job`` field values (defaults filled in)."""
    data = dict(validated)
    data.pop("tenant", None)
    elastic = data.pop("elastic", None)
    kind = data["kind"]
    data.setdefault("preemptible", kind != JobKind.INFERENCE)
    for key in ("accelerators",):
        data.setdefault(key, [])
    for key in ("env", "node_selector", "prefer_labels"):
        data.setdefault(key, {})
    if data["gpus"] == 0 and not data.get("cpus"):
        # A CPU-only job asking for no CPUs would be bounded by nothing on its node.
        data["cpus"] = settings.TESSERA["CPU_JOB_CPUS"] * data["replicas"]
    data["elastic_min_gpus"] = elastic["min_gpus"] if elastic else None
    data["elastic_max_gpus"] = elastic["max_gpus"] if elastic else None
    interactive, reclaim = data.pop("interactive", False), data.pop("idle_reclaim", IdleMode.NEVER)
    data["idle_mode"] = IdleMode.INTERACTIVE if interactive else reclaim
    return data


ALLOCATIONS_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "node": {"type": "string"},
            "gpus": {"type": "array", "items": {"type": "integer"}},
            "share": {"type": "number"},
            "replica": {"type": "integer"},
        },
    },
}


# What a job holds now: each allocation also says whether its GPU is shared (fractional GPUs
# have no memory isolation), never with whom.
ACTIVE_ALLOCATIONS_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            **ALLOCATIONS_SCHEMA["items"]["properties"],  # type: ignore[index]
            "shared_with": {
                "type": "integer",
                "description": "other allocations (of any job) holding a share of this GPU now",
            },
            "other_tenants": {
                "type": "boolean",
                "description": "whether one of them is another tenant's (whose is never said)",
            },
        },
    },
}


@extend_schema_field(ACTIVE_ALLOCATIONS_SCHEMA)
class AllocationsField(serializers.Field):
    def __init__(self, **kwargs: Any):
        kwargs["read_only"] = True
        kwargs.setdefault("source", "*")
        super().__init__(**kwargs)

    def to_representation(self, job: Job) -> list[dict[str, Any]]:
        every = getattr(job, "all_allocations", None)  # prefetched by services.history.with_history
        allocs: Iterable[Allocation] | None = (
            None if every is None else [a for a in every if a.released_at is None]
        )
        if allocs is None:  # not prefetched (one job): read them now
            allocs = list(job.allocations.filter(released_at__isnull=True).select_related("node", "device"))
        sharing = gpu_sharing(job, allocs)
        per_gpu = {
            (a.replica, a.node.name, a.device.index): sharing.get(a.device.pk, (0, False))
            for a in allocs
            if a.device is not None
        }
        out = allocations_payload(allocs)
        for entry in out:
            shared = [per_gpu[(entry["replica"], entry["node"], g)] for g in entry["gpus"]]
            entry["shared_with"] = sum(n for n, _ in shared)
            entry["other_tenants"] = any(other for _, other in shared)
        return out


@extend_schema_field(
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "attempt": {"type": "integer"},
                "allocations": ALLOCATIONS_SCHEMA,
                "started_at": {"type": "string", "format": "date-time"},
                "ended_at": {"type": "string", "format": "date-time", "nullable": True},
                "outcome": {"type": "string"},
                "reason": {"type": "string", "nullable": True},
            },
        },
    }
)
class PlacementsField(serializers.Field):
    """Where the job ran, per attempt (``services.history``), kept after it ends."""

    def __init__(self, **kwargs: Any):
        kwargs["read_only"] = True
        kwargs.setdefault("source", "*")
        super().__init__(**kwargs)

    def to_representation(self, job: Job) -> list[dict[str, Any]]:
        when = serializers.DateTimeField()
        return [
            {
                **p,
                "started_at": when.to_representation(p["started_at"]),
                "ended_at": when.to_representation(p["ended_at"]) if p["ended_at"] else None,
            }
            for p in placements_payload(job)
        ]


class JobSerializer(FieldTemplates, serializers.ModelSerializer):
    """A job as the API returns it: the body echoed, plus its state and placement (``allocations``:
    what it holds now; ``placements``: where each attempt ran, kept after it ends)."""

    tenant = serializers.CharField(source="tenant.name", read_only=True)
    # Who submitted it (a username): seen only by the job's own tenant and operators, since the
    # job itself is (``visible_to``).
    owner = serializers.CharField(source="owner.username", read_only=True, allow_null=True, default=None)
    queue_level_name = serializers.CharField(read_only=True)
    gpus = GpuCountField(read_only=True)
    command = StringListField(max_items=4096, max_bytes=256 * 1024, read_only=True)
    accelerators = StringListField(max_items=64, max_bytes=4096, read_only=True)
    env = StringMapField(max_entries=256, max_bytes=65536, read_only=True)
    node_selector = StringMapField(max_entries=64, max_bytes=16384, read_only=True)
    prefer_labels = StringMapField(max_entries=64, max_bytes=16384, read_only=True)
    elastic = serializers.SerializerMethodField()
    allocations = AllocationsField()
    placements = PlacementsField()

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "kind",
            "tenant",
            "owner",
            "state",
            "queue_level",
            "queue_level_name",
            "pending_reason",
            "pending_code",
            "size_reason",
            "held",
            "estimated_start",
            "estimated_start_earliest",
            "estimated_start_latest",
            "estimate_basis",
            "queue_position",
            "jobs_ahead",
            "allocations",
            "placements",
            "submitted_at",
            "started_at",
            "finished_at",
            "attempts",
            "node_losses",
            "last_checkpoint_at",
            "exit_code",
            "command",
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
            "env",
            "node_selector",
            "prefer_labels",
            "max_retries",
            "elastic",
            "interactive",
            "idle_reclaim",
            "log_truncated",
        ]
        read_only_fields = fields

    @extend_schema_field(ElasticField(allow_null=True))
    def get_elastic(self, job: Job) -> dict[str, int | None] | None:
        if job.elastic_min_gpus is None:
            return None
        return {"min_gpus": job.elastic_min_gpus, "max_gpus": job.elastic_max_gpus}


def job_data(job: Job) -> dict[str, Any]:
    """The job as the API returns it: ``JobSerializer(job).data``, by one kept serializer."""
    return kept(JobSerializer).to_representation(job)


class JobEventSerializer(FieldTemplates, serializers.ModelSerializer):
    reason = serializers.SerializerMethodField()

    class Meta:
        model = JobEvent
        fields = ["type", "at", "reason", "allocations", "details"]
        read_only_fields = fields

    def get_reason(self, event: JobEvent) -> str | None:
        return event.reason or None


class LogPageSerializer(serializers.Serializer):
    """A page of a job's output (the schema of ``/jobs/{id}/logs/``)."""

    offset = serializers.IntegerField()
    next_offset = serializers.IntegerField()
    # DRF's metaclass takes declared fields out of the class: Serializer.data stays the property.
    data = serializers.CharField()  # type: ignore[assignment]
    eof = serializers.BooleanField()
    truncated = serializers.BooleanField()


class DryRunSerializer(serializers.Serializer):
    """``POST /api/v1/jobs/?dry_run=true``: what a submit would lead to now (nothing stored)."""

    dry_run = serializers.BooleanField()
    would_start = serializers.BooleanField()
    allocations = serializers.JSONField(required=False, help_text="where it would start (if it would)")
    preemptions = serializers.IntegerField(
        required=False, help_text="running jobs it would stop first (their number only)"
    )
    pending_code = serializers.CharField(required=False)
    pending_reason = serializers.CharField(required=False)
    estimated_start = serializers.DateTimeField(required=False, allow_null=True)
