"""Tessera's data: tenants and quotas, nodes and devices, jobs, their allocations and history.

Models hold data and derived read-only properties; every write path is in ``scheduling.services``.
"""

from __future__ import annotations

import hashlib
import secrets
from fnmatch import fnmatchcase

from django.conf import settings
from django.db import models
from django.db.models import Q

from scheduling.choices import (
    QUEUE_LEVEL_NAMES,
    DeliveryState,
    EventType,
    IdleMode,
    JobKind,
    JobState,
    NodeState,
    PendingCode,
    Topology,
)


def hash_secret(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def new_secret() -> str:
    return secrets.token_urlsafe(32)


class TenantQuerySet(models.QuerySet["Tenant"]):
    def visible_to(self, user) -> TenantQuerySet:
        if not getattr(user, "is_authenticated", False):
            return self.none()
        if user.is_staff:
            return self.all()
        return self.filter(members__user=user)


class Tenant(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The tenant's overrides of the idle policy (``threshold``, ``exempt_s``, ``act_after_s``),
    # each inside the operator's bounds; written by scheduling/services/idle_policy.py only.
    idle_policy = models.JSONField(default=dict, blank=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    """A user's tenant. Operators (staff) have none and see everything."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="membership")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="members")

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant}"


class Quota(models.Model):
    """GPUs guaranteed to and usable by a tenant on one model (``*`` = any model without a row)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quotas")
    model = models.CharField(max_length=64)
    guaranteed = models.FloatField(default=0)
    limit = models.FloatField(default=0)
    weight = models.FloatField(default=1.0)

    class Meta:
        ordering = ["tenant__name", "model"]
        # Each with words a person acts on: forms (the admin's) show them in place of the raw
        # "Constraint “limit_ge_guaranteed” is violated."
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "model"],
                name="one_quota_per_tenant_model",
                violation_error_message="This team already has a quota for this model: change that one.",
            ),
            models.CheckConstraint(
                condition=Q(limit__gte=models.F("guaranteed")),
                name="limit_ge_guaranteed",
                violation_error_message="The limit must be at least the guarantee.",
            ),
            models.CheckConstraint(
                condition=Q(guaranteed__gte=0),
                name="guaranteed_nonnegative",
                violation_error_message="The guarantee cannot be negative.",
            ),
            models.CheckConstraint(
                condition=Q(weight__gt=0),
                name="weight_positive",
                violation_error_message="The weight must be greater than 0.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant}:{self.model} {self.guaranteed:g}/{self.limit:g}"


class ApiTokenQuerySet(models.QuerySet["ApiToken"]):
    def visible_to(self, user) -> ApiTokenQuerySet:
        """A person sees their own tokens; operators see everyone's (to revoke any)."""
        if not getattr(user, "is_authenticated", False) or getattr(user, "pk", None) is None:
            return self.none()
        if user.is_staff:
            return self.all()
        return self.filter(user=user)


class ApiToken(models.Model):
    """One of a person's named API tokens (``Authorization: Token <key>``).

    Only the key's first characters (``prefix``, to tell tokens apart and find the row) and its
    SHA-256 (``key_hash``) are stored: the key itself is shown once, when it is made. A key is
    random (``tsr_`` and 40 URL-safe characters), so a fast hash is as good as a slow one here.
    """

    PREFIX_LENGTH = 12

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=64)
    prefix = models.CharField(max_length=PREFIX_LENGTH, db_index=True)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["user_id", "name"]
        constraints = [models.UniqueConstraint(fields=["user", "name"], name="one_token_name_per_user")]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class JoinToken(models.Model):
    """Made by an operator; an agent presents it once to register and get its own credential.

    Bounded: it expires, registers at most ``max_nodes`` nodes (empty: any number), and only names
    matching ``names`` (comma-separated shell patterns, ``gpu-*``; empty: any new name). A name
    whose node already exists is registered again with a join token only when the node has been
    silent past its lease and fence margin and the token *names* it (a pattern matches it): the
    operator's consent to hand that name to a new machine.
    """

    name = models.CharField(max_length=64, blank=True)
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)
    max_nodes = models.PositiveIntegerField(
        null=True, blank=True, default=1, help_text="registrations it allows; empty: any number"
    )
    registrations = models.PositiveIntegerField(default=0)
    names = models.CharField(
        max_length=256,
        blank=True,
        help_text="node names it may register: comma-separated patterns (gpu-*, a100-0?); empty: any",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    def __str__(self) -> str:
        return self.name or f"join token {self.pk}"

    @property
    def patterns(self) -> list[str]:
        return [p.strip() for p in self.names.split(",") if p.strip()]

    def covers(self, node_name: str) -> bool:
        """Whether it may register ``node_name`` as a new node."""
        return not self.patterns or self.names_node(node_name)

    def names_node(self, node_name: str) -> bool:
        """Whether it was made for ``node_name`` (a pattern matches it)."""
        return any(fnmatchcase(node_name, p) for p in self.patterns)

    @property
    def used_up(self) -> bool:
        return self.max_nodes is not None and self.registrations >= self.max_nodes


class Node(models.Model):
    name = models.CharField(max_length=128, unique=True)
    rack = models.CharField(max_length=64, default="default")
    kind = models.CharField(max_length=16, default="gpu")
    labels = models.JSONField(default=dict, blank=True)
    taints = models.JSONField(default=list, blank=True)
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.READY)
    nvlink_domain = models.PositiveIntegerField(default=1)
    cpus = models.FloatField(default=0)
    memory_gib = models.FloatField(default=0)
    price_per_gpu_hour = models.FloatField(default=0)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    credential_hash = models.CharField(max_length=64, unique=True, null=True, blank=True)
    # Why the node is cordoned waiting for an operator (new and unapproved, or its GPUs changed
    # at a re-registration); uncordoning it approves and clears this.
    held_reason = models.CharField(max_length=256, blank=True)
    metrics_url = models.CharField(max_length=256, blank=True)
    # Where other nodes reach it (a job's MASTER_ADDR when its master replica runs here).
    address = models.CharField(max_length=253, blank=True)
    # The checkpoint root its agent shares with other nodes (``--checkpoint-root``: its name, or
    # its path), or empty: node-local. Nodes that register the same one reach each other's
    # checkpoints (services/checkpoints.py).
    checkpoint_root = models.CharField(max_length=256, blank=True, default="", db_default="")
    # Bumped on every allocation change: the pass's version check against stale decisions.
    version = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Device(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="devices")
    index = models.PositiveIntegerField()
    uuid = models.CharField(max_length=128)
    model = models.CharField(max_length=64)
    memory_gib = models.FloatField(default=0)
    nvlink_island = models.PositiveIntegerField(default=0)
    healthy = models.BooleanField(default=True)

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="one_device_per_node_index"),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/{self.index} {self.model}"


class JobQuerySet(models.QuerySet["Job"]):
    def visible_to(self, user) -> JobQuerySet:
        """The one place tenant scoping lives: operators see all, others their tenant's jobs."""
        return self.filter(tenant__in=Tenant.objects.visible_to(user))


class Job(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="jobs")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="jobs"
    )
    name = models.CharField(max_length=128)
    kind = models.CharField(max_length=16, choices=JobKind.choices)
    command = models.JSONField()
    gpus = models.FloatField(default=1)
    replicas = models.PositiveIntegerField(default=1)
    min_available = models.PositiveIntegerField(default=1)
    accelerators = models.JSONField(default=list, blank=True)
    topology = models.CharField(max_length=8, choices=Topology.choices, default=Topology.ANY)
    priority = models.IntegerField(default=0)
    preemptible = models.BooleanField(default=True)
    grace_seconds = models.PositiveIntegerField(default=30)
    checkpoint_seconds = models.PositiveIntegerField(null=True, blank=True)
    time_limit_seconds = models.PositiveIntegerField(null=True, blank=True)
    cpus = models.FloatField(default=0)
    memory_gib = models.FloatField(default=0)
    env = models.JSONField(default=dict, blank=True)
    node_selector = models.JSONField(default=dict, blank=True)
    prefer_labels = models.JSONField(default=dict, blank=True)  # soft: preferred, not required
    max_retries = models.PositiveIntegerField(default=0)
    elastic_min_gpus = models.PositiveIntegerField(null=True, blank=True)
    elastic_max_gpus = models.PositiveIntegerField(null=True, blank=True)
    # The idle policy (engine/adjust.py): an interactive job is never judged idle; a
    # non-preemptible job is reclaimed when idle only if its owner allows it ("allow"). One
    # column for the API's two fields: a submit's INSERT stays within psycopg's cached size.
    idle_mode = models.CharField(max_length=12, choices=IdleMode.choices, default=IdleMode.NEVER)

    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING)
    queue_level = models.PositiveSmallIntegerField(default=2)
    pending_reason = models.TextField(null=True, blank=True)
    pending_code = models.CharField(max_length=16, choices=PendingCode.choices, null=True, blank=True)
    estimated_start = models.DateTimeField(null=True, blank=True)
    # The pass's start estimate (engine/eta.py): a band around estimated_start, what it rests on
    # (words), and the job's place in the queue. Null for a job not estimated.
    estimated_start_earliest = models.DateTimeField(null=True, blank=True)
    estimated_start_latest = models.DateTimeField(null=True, blank=True)
    estimate_basis = models.TextField(blank=True, default="", db_default="")
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    jobs_ahead = models.PositiveIntegerField(null=True, blank=True)
    submitted_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    node_losses = models.PositiveIntegerField(default=0)  # attempts ended by a lost node
    exit_code = models.IntegerField(null=True, blank=True)
    not_before = models.DateTimeField(null=True, blank=True)  # retry backoff
    held = models.BooleanField(default=False)  # kept from starting until released (services.holds)
    stop_reason = models.CharField(max_length=64, blank=True)  # why it is terminating
    stop_deadline = models.DateTimeField(null=True, blank=True)  # end of the grace period
    last_checkpoint_at = models.DateTimeField(null=True, blank=True)
    # Where that checkpoint is, for the next binding's event to say whether it can be reached:
    # ``{"attempt": n, "line": marker line, "nodes": {node name: its checkpoint root}}``, the nodes
    # that reported one in attempt n (services/checkpoints.py). Null: none reported (or before
    # nodes said where).
    checkpoint_place = models.JSONField(null=True, blank=True)
    # Why a running job holds fewer replicas than its full size (an elastic job below its
    # maximum, a gang started with ``min_available``); empty at full size. ``pending_reason``
    # is for pending jobs.
    size_reason = models.CharField(max_length=256, blank=True, default="", db_default="")
    # What caused a shrink the adjustment loop asked for (its inputs), until the shrink is done
    # and its ``resized`` event carries them.
    shrink_details = models.JSONField(null=True, blank=True)
    # The most GPUs an elastic job may grow back to in one attempt, after a shrink asked for
    # outside the pass (the adjustment loop's idle reclaim): ``{"attempt": n, "gpus": g}``.
    size_cap = models.JSONField(null=True, blank=True)
    log_bytes = models.PositiveBigIntegerField(default=0)
    log_truncated = models.BooleanField(default=False)

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["state", "queue_level"]),
            # A team's jobs newest first, and by state newest first (the portal's and the API's
            # lists): read in order from the index, not sorted after reading every match.
            models.Index(fields=["tenant", "state", "id"], name="job_tenant_state_id"),
            models.Index(fields=["tenant", "id"], name="job_tenant_id"),
            # The runtime history a pass reads: the latest runs of one kind and tenant that
            # ended on their own (services/snapshot.py's _HistoryRead). Kind and name lead, not
            # tenant and owner: no other index starts with them, so the read can use no other.
            models.Index(
                fields=["kind", "tenant", "-finished_at", "-id"],
                name="job_runtime_history",
                condition=models.Q(state__in=["succeeded", "failed"]),
            ),
            # ... and of one name of one owner's jobs (start estimates trust a user's reruns).
            models.Index(
                fields=["name", "owner", "-finished_at", "-id"],
                name="job_named_history",
                condition=models.Q(state__in=["succeeded", "failed"]),
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} {self.name} ({self.state})"

    @property
    def interactive(self) -> bool:
        return self.idle_mode == IdleMode.INTERACTIVE

    @property
    def idle_reclaim(self) -> str:
        return "allow" if self.idle_mode == IdleMode.ALLOW else "never"

    @property
    def queue_level_name(self) -> str:
        return QUEUE_LEVEL_NAMES.get(self.queue_level, str(self.queue_level))

    @property
    def is_elastic(self) -> bool:
        return self.elastic_min_gpus is not None


class Allocation(models.Model):
    """One replica's use of one device of a node: ``share_milli`` of 1000 (fractions are shares
    of one GPU); a CPU-only replica has one row with no device and share 0.

    Active while ``released_at`` is null; kept afterwards as history. ``exited_at``: the replica's
    process ended while other replicas of its job still run; its GPUs stay held until the whole
    job settles (a job's GPUs are freed together, once all its processes have exited) — but a
    replica a shrink removed (``leaving_at``) is released alone once its process has exited.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="allocations")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="allocations")
    # None for a CPU-only replica (``gpus: 0``): it holds a place on the node but no GPU.
    device = models.ForeignKey(
        Device, on_delete=models.PROTECT, related_name="allocations", null=True, blank=True
    )
    replica = models.PositiveIntegerField(default=0)
    share_milli = models.PositiveIntegerField(default=1000)
    attempt = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)
    exited_at = models.DateTimeField(null=True, blank=True)
    # A shrink removed this replica at this time: its agent stops it, and its GPUs stay held
    # until its process has exited (or its node is fenced). Not part of the job's size.
    leaving_at = models.DateTimeField(null=True, blank=True)
    # Added to a running job by a grow and not yet reported started: if its node is lost first,
    # the job falls back to the size it had, it is not lost. A database default too: an INSERT
    # that leaves it out (a process of the release before resizes, mid-upgrade) still works.
    joining = models.BooleanField(default=False, db_default=False)

    class Meta:
        ordering = ["job_id", "replica", "device__index"]
        indexes = [
            models.Index(fields=["device", "released_at"]),
            models.Index(fields=["node", "released_at"]),
        ]
        constraints = [
            models.CheckConstraint(
                condition=(Q(device__isnull=True) & Q(share_milli=0))
                | (Q(device__isnull=False) & Q(share_milli__gte=1) & Q(share_milli__lte=1000)),
                name="share_in_range",
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} replica {self.replica} on device {self.device_id}"

    def save(self, *args, **kwargs) -> None:
        if self.node_id is None and self.device is not None:
            self.node_id = self.device.node_id  # a GPU row's node is its device's
        super().save(*args, **kwargs)

    @property
    def share(self) -> float:
        return self.share_milli / 1000


class JobEvent(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    type = models.CharField(max_length=16, choices=EventType.choices)
    at = models.DateTimeField()
    reason = models.CharField(max_length=256, blank=True)
    allocations = models.JSONField(null=True, blank=True)
    # What caused it, where a pass decided it from measurements (an idle warning's GPUs, their
    # idle times, windows and utilisation): ``engine.adjust.Adjustment.inputs``.
    details = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["job_id", "at", "id"]

    def __str__(self) -> str:
        return f"{self.job_id} {self.type} @ {self.at:%H:%M:%S}"


class LogChunk(models.Model):
    """A piece of a job's output; offsets are bytes from the start of the replica's log."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_chunks")
    replica = models.PositiveIntegerField(default=0)
    offset = models.PositiveBigIntegerField()
    data = models.BinaryField()

    class Meta:
        ordering = ["job_id", "replica", "offset"]
        constraints = [
            models.UniqueConstraint(fields=["job", "replica", "offset"], name="one_chunk_per_offset"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} replica {self.replica} @ {self.offset}"


class IdempotencyKey(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    key = models.CharField(max_length=255)
    body_hash = models.CharField(max_length=64)
    job = models.ForeignKey(Job, on_delete=models.CASCADE)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="one_key_per_user")]

    def __str__(self) -> str:
        return f"{self.key} → job {self.job_id}"


class SchedulerState(models.Model):
    """One row: the last pass's record, and every pass's durations and decisions so far.

    Written by whichever process ran the pass (the Celery worker, or the embedded web process), so
    every web process's ``/metrics`` reports them (``monitoring/exporter.py``).
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    last_pass_at = models.DateTimeField(null=True, blank=True)
    last_pass_seconds = models.FloatField(default=0)
    last_pass_decisions = models.JSONField(default=dict, blank=True)
    passes = models.PositiveBigIntegerField(default=0)
    pass_seconds_sum = models.FloatField(default=0)
    # Passes per duration bucket (``services.passes.PASS_BUCKETS_S``, then one past the last).
    pass_buckets = models.JSONField(default=list, blank=True)
    # Decisions of all passes: {"bound": n, "dropped": n, "preempted": n}.
    decisions_total = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return f"last pass {self.last_pass_at}"


class AdjustmentState(models.Model):
    """One row: the adjustment pass's last run (``services/adjust.py``), for ``/metrics``."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    last_pass_at = models.DateTimeField(null=True, blank=True)
    passes = models.PositiveBigIntegerField(default=0)
    # False while the last pass could not read utilisation (Prometheus down): it acted on nothing.
    metrics_ok = models.BooleanField(default=True)
    problem = models.CharField(max_length=512, blank=True)
    idle_gpus = models.PositiveIntegerField(default=0)  # allocated GPUs idle past the first warning
    actions_total = models.JSONField(default=dict, blank=True)  # {"warn": n, "shrink": n, "requeue": n}
    # The dashboard's utilisation of each allocated GPU read by the last pass: "node/index" ->
    # {"util": latest point 0..1, "idle": idle past the first warning, "jobs": [job ids on it]}.
    gpus = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return f"last adjustment pass {self.last_pass_at}"


class EngineMemoryRecord(models.Model):
    """One row: what the last scheduling pass left for the next (``engine/memory.py``).

    The engine is rebuilt every pass, in whichever worker runs it; this row is what makes it
    decide as one engine that had lived through every pass: its reservations and their nodes,
    the room held for preemptors, the last pending codes, its request mix. Written by the pass
    after it decided (``services/memory.py``), read by the next; ``not_reached``: the jobs a pass
    cut short by its time budget did not reach, decided first by the next pass.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    memory = models.JSONField(default=dict)
    not_reached = models.JSONField(default=list)
    updated_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"engine memory of {self.updated_at}"


class SchedulerSettings(models.Model):
    """One row: the scheduler's knobs as an operator set them (admin), each overriding its
    environment default (``TESSERA_ENGINE_<KNOB>``) when set; blank = the default. Checked whole
    before it is saved (``engine.config.configure``), read by every pass: effective from the
    next one. ``updated_by`` and ``updated_at``: who changed it last, and when."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    alpha = models.FloatField(null=True, blank=True, help_text="weight of a node's price per GPU-hour")
    beta = models.FloatField(null=True, blank=True, help_text="weight of consolidation (busy nodes first)")
    gamma = models.FloatField(
        null=True, blank=True, help_text="cost per hour of waiting for a preferred model (blank: never wait)"
    )
    delta = models.FloatField(null=True, blank=True, help_text="weight of data locality (prefer_labels)")
    aging_s = models.FloatField(null=True, blank=True, help_text="wait after which a job is promoted")
    starve_s = models.FloatField(null=True, blank=True, help_text="starvation bound (0: off)")
    reclaim_after_s = models.FloatField(null=True, blank=True)
    reclaim_checkpoint_window_s = models.FloatField(null=True, blank=True)
    room_hold_s = models.FloatField(null=True, blank=True)
    preempt_min_run_s = models.FloatField(null=True, blank=True)
    spare_ending_s = models.FloatField(null=True, blank=True)
    max_reservations = models.PositiveIntegerField(null=True, blank=True)
    default_runtime_s = models.FloatField(null=True, blank=True)
    min_split_gpus = models.PositiveIntegerField(null=True, blank=True)
    kind_accelerators = models.JSONField(
        null=True, blank=True, help_text='preferred models per kind, e.g. {"inference": ["T4", "A100"]}'
    )
    preemptor_levels = models.JSONField(
        null=True, blank=True, help_text="queue levels whose jobs may preempt lower ones, e.g. [0]"
    )
    backfill = models.BooleanField(null=True, blank=True)
    preemption = models.BooleanField(null=True, blank=True)
    exclusive_gpu_shares = models.BooleanField(
        null=True,
        blank=True,
        help_text="fractions of different tenants never share a GPU (shares have no memory "
        "isolation: on where tenants do not trust each other)",
    )
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    updated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "scheduler settings"

    def __str__(self) -> str:
        return "scheduler settings"


class AuditEntryQuerySet(models.QuerySet["AuditEntry"]):
    def visible_to(self, user) -> AuditEntryQuerySet:
        """Operators read the audit log; nobody else does."""
        if getattr(user, "is_authenticated", False) and getattr(user, "is_staff", False):
            return self.all()
        return self.none()


class AuditEntry(models.Model):
    """Who changed what, when: one operator or security-relevant action, with the object's values
    before and after. Written only by ``scheduling.services.audit.record``, never changed."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    # The person who acted (kept as words in ``actor`` too, should the user be deleted).
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    actor = models.CharField(max_length=160)  # "user admin", "node gpu-01", "join token 3 (rack-2)", "system"
    action = models.CharField(max_length=64, db_index=True)  # "quota.update", "node.cordon", ...
    object_type = models.CharField(max_length=32, blank=True)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    note = models.CharField(max_length=256, blank=True)

    objects = AuditEntryQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["object_type", "object_id"])]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor}: {self.action} {self.object_repr}"


class WebhookQuerySet(models.QuerySet["Webhook"]):
    def visible_to(self, user) -> WebhookQuerySet:
        return self.filter(tenant__in=Tenant.objects.visible_to(user))


class Webhook(models.Model):
    """A URL a tenant registered for its jobs' events (``services.webhooks``)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="webhooks")
    url = models.URLField(max_length=2000)
    # The HMAC key of its deliveries' signatures: shown once, when it is made. Kept as it is,
    # since each delivery is signed with it.
    secret = models.CharField(max_length=64)
    events = models.JSONField(default=list, blank=True)  # event types; empty: every one sent
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = WebhookQuerySet.as_manager()

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.tenant.name}: {self.url}"


class WebhookDelivery(models.Model):
    """One event sent (or to send) to one webhook: retried with backoff, then ``failed``."""

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=32)
    payload = models.JSONField()
    state = models.CharField(max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_status = models.IntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=256, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["state", "next_attempt_at"])]

    def __str__(self) -> str:
        return f"{self.event} → webhook {self.webhook_id} ({self.state})"
