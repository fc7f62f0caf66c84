"""States and kinds as choice classes (the API's words, exactly: docs/api.md)."""

from django.db import models


class JobKind(models.TextChoices):
    INFERENCE = "inference"
    TRAINING = "training"
    FINETUNE = "finetune"
    BATCH = "batch"


class JobState(models.TextChoices):
    PENDING = "pending"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    TERMINATING = "terminating"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
# States in which a job holds GPUs.
HOLDING_STATES = frozenset({JobState.SCHEDULED, JobState.RUNNING, JobState.TERMINATING})


class Topology(models.TextChoices):
    ANY = "any"
    RACK = "rack"
    NODE = "node"
    NVLINK = "nvlink"


class NodeState(models.TextChoices):
    READY = "ready"
    NOT_READY = "not-ready"
    CORDONED = "cordoned"
    DRAINING = "draining"


class DeviceState(models.TextChoices):
    FREE = "free"
    ALLOCATED = "allocated"
    SHARED = "shared"
    UNHEALTHY = "unhealthy"


class EventType(models.TextChoices):
    SUBMITTED = "submitted"
    SCHEDULED = "scheduled"
    STARTED = "started"
    TERMINATING = "terminating"
    PREEMPTED = "preempted"
    REQUEUED = "requeued"
    RETRYING = "retrying"
    RESIZED = "resized"
    CHECKPOINTED = "checkpointed"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    HELD = "held"
    RELEASED = "released"
    IDLE_WARNING = "idle-warning"  # the adjustment pass found the job's GPUs idle
    IDLE_RECLAIM = "idle-reclaim"  # ... long enough to shrink or requeue it


class IdleMode(models.TextChoices):
    """How the adjustment pass treats a job's idle GPUs (the API's ``interactive`` and
    ``idle_reclaim``, stored in one column)."""

    NEVER = "never"  # judged; requeued when idle only if preemptible
    ALLOW = "allow"  # judged; requeued when idle even if not preemptible
    INTERACTIVE = "interactive"  # never judged


class DeliveryState(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


class PendingCode(models.TextChoices):
    QUOTA = "quota"
    BORROW_LIMIT = "borrow-limit"
    CAPACITY = "capacity"
    MODEL = "model"
    NODE_SELECTOR = "node-selector"
    TOPOLOGY = "topology"
    FRAGMENTATION = "fragmentation"
    GANG = "gang"
    RESERVED = "reserved"
    PRIORITY = "priority"
    BACKOFF = "backoff"
    HELD = "held"


# Queue levels: 0 is the highest. The engine's config may remap kinds to levels.
QUEUE_LEVELS = {"inference": 0, "training": 1, "finetune": 2, "batch": 2}
QUEUE_LEVEL_NAMES = {0: "inference", 1: "training", 2: "finetune-batch"}
