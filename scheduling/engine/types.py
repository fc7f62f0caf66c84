"""The engine boundary: frozen inputs and the decisions that come out.

Everything a driver (live pass or simulator) hands the engine, and everything it gets back, is one
of these plain dataclasses. GPU capacity is counted in integer milli-GPU (1 GPU = 1000) inside the
engine so that fractional shares sum exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

MILLI = 1000

KINDS = ("inference", "training", "finetune", "batch")
TOPOLOGIES = ("any", "rack", "node", "nvlink")

PENDING_CODES = (
    "quota",
    "borrow-limit",
    "capacity",
    "model",
    "node-selector",
    "topology",
    "fragmentation",
    "gang",
    "reserved",
    "priority",
    "backoff",
    "held",
)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node as the engine sees it. Every GPU of a node is of one model."""

    name: str
    rack: str
    model: str  # short accelerator model, e.g. "H100"; "" for a CPU-only node
    gpus: int
    nvlink_domain: int = 1  # GPUs per NVLink island: islands are [k*d, (k+1)*d)
    cpus: float = 0.0  # 0 = not tracked (unlimited)
    memory_gib: float = 0.0  # 0 = not tracked (unlimited)
    price_per_gpu_hour: float = 0.0
    kind: str = "gpu"  # gpu | tpu | npu | cpu
    labels: tuple[tuple[str, str], ...] = ()  # includes ("rack", rack)
    taints: tuple[str, ...] = ()
    schedulable: bool = True  # False when not-ready, cordoned or draining
    unhealthy_gpus: tuple[int, ...] = ()  # device indices not to be used


@dataclass(frozen=True, slots=True)
class QuotaSpec:
    """A tenant's quota on one model (``*`` = every model without its own row)."""

    tenant: str
    model: str
    guaranteed: float
    limit: float
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A job as submitted (the API's job body, docs/api.md, in engine units)."""

    id: str
    tenant: str
    kind: str  # inference | training | finetune | batch
    gpus: float  # total over replicas; 0 < gpus < 1 = share of one GPU
    replicas: int = 1
    min_available: int | None = None  # None = replicas (or derived from elastic)
    accelerators: tuple[str, ...] = ()  # acceptable models in preference order; () = any
    topology: str = "any"
    priority: int = 0
    preemptible: bool = True
    grace_s: float = 30.0
    checkpoint_s: float | None = None
    time_limit_s: float | None = None  # user's limit/estimate
    cpus: float = 0.0  # whole job, spread evenly over replicas
    memory_gib: float = 0.0
    node_selector: tuple[tuple[str, str], ...] = ()
    # Labels a node should carry (where the job's data lives): preferred, never required.
    prefer_labels: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[str, ...] = ()
    elastic_min_gpus: int | None = None
    elastic_max_gpus: int | None = None
    submitted_at: float = 0.0
    not_before: float = 0.0  # retry backoff: not startable before this time
    held: bool = False
    # Who submitted it and under what name: a user's reruns of one name are the runtime
    # history that start estimates trust first (:mod:`.runtimes`); decisions never read them.
    user: str = ""
    name: str = ""

    @property
    def per_replica_gpus(self) -> float:
        return self.gpus / self.replicas if self.replicas else 0.0


@dataclass(frozen=True, slots=True)
class Placement:
    """One replica on one node: GPU indices and the share of each (1.0 unless fractional)."""

    replica: int
    node: str
    gpus: tuple[int, ...]
    share: float = 1.0


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding GPUs: running, or terminating (grace period, GPUs still held)."""

    job: JobRequest
    placements: tuple[Placement, ...]
    started_at: float  # start of the current attempt
    last_checkpoint_at: float | None = None  # wall time of the last checkpoint (None = none yet)
    terminating: bool = False
    # Replicas a shrink removed whose processes have not exited yet: their GPUs stay held (by
    # no size of the job's) until ``leaving_until`` at the latest (the shrink's grace period).
    leaving: tuple[Placement, ...] = ()
    leaving_until: float | None = None


# How a run ended: on its own (succeeded, failed: what runtime predictions learn from), or stopped
# by the scheduler or a person (preempted, cancelled: says nothing about how long it needs).
RUN_OUTCOMES = ("succeeded", "failed", "preempted", "cancelled")
PREDICTED_OUTCOMES = ("succeeded", "failed")


@dataclass(frozen=True, slots=True)
class FinishedRun:
    """One attempt of a job that has ended, for the runtime predictor."""

    job_id: str
    tenant: str
    kind: str
    runtime_s: float  # from its start to its processes' exit
    ended_at: float
    outcome: str  # one of RUN_OUTCOMES
    user: str = ""
    name: str = ""
    gpus: float = 0.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One consistent view of the cluster, handed to the engine by a driver."""

    now: float
    nodes: tuple[NodeSpec, ...]
    running: tuple[RunningJob, ...]
    pending: tuple[JobRequest, ...]
    quotas: tuple[QuotaSpec, ...] = ()  # empty = no quotas (every tenant unlimited, equal weight)
    # Recently finished runs (at least the last few per tenant and kind): the runtime history
    # that backfill and estimates use when a job gives no time limit.
    history: tuple[FinishedRun, ...] = ()


@dataclass(frozen=True, slots=True)
class Binding:
    job_id: str
    placements: tuple[Placement, ...]


@dataclass(frozen=True, slots=True)
class Preemption:
    job_id: str
    reason: str  # e.g. "priority: for job 812" or "reclaim: vision needs its guarantee"
    for_job: str | None = None


@dataclass(frozen=True, slots=True)
class Resize:
    job_id: str
    placements: tuple[Placement, ...]  # the full new set
    reason: str = ""  # why, in words (``shrunk to make room for job 12``)


def job_named(job_id: str, tenant: str | None, told: str) -> str:
    """Job ``job_id`` (of ``tenant``) as a reason given to a job of ``told`` names it: by its id
    when it is the same tenant's; else only as another tenant's, whose jobs (their ids, names and
    runtimes) a tenant may not learn of (docs/api.md, "Who sees what")."""
    return f"job {job_id}" if tenant == told else "another tenant's job"


# A held job's reason, from the pass and from the hold itself (scheduling/services/holds.py).
HELD_REASON = "held: until its owner or an operator releases it"


@dataclass(frozen=True, slots=True)
class PendingReason:
    code: str  # one of PENDING_CODES
    message: str  # words a person can act on
    estimated_start: float | None = None


@dataclass(frozen=True, slots=True)
class Estimate:
    """When a pending job is expected to start (:mod:`.eta`): a start, a band around it, what it
    rests on, and its place in the queue."""

    start: float
    earliest: float
    latest: float
    basis: str  # words: what the estimate rests on
    position: int  # 1 = first in the queue
    ahead: int  # jobs before it in the queue


@dataclass(frozen=True, slots=True)
class Deadline:
    """When a pass stops deciding more jobs: ``at`` on the scale of ``clock``, the driver's own
    clock (the live pass passes a monotonic one; tests a fake one). The engine reads no clock
    of its own, so a pass without a deadline (the simulator) decides exactly as before."""

    at: float
    clock: Callable[[], float]
    # The jobs the last pass cut short did not reach: decided first (in queue order among them),
    # then the rest, so that a queue longer than one pass can decide is worked through in turns
    # instead of its tail never being reached.
    first: frozenset[str] = frozenset()

    def passed(self) -> bool:
        return self.clock() >= self.at


@dataclass(slots=True)
class Decisions:
    bindings: list[Binding] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    resizes: list[Resize] = field(default_factory=list)
    pending: dict[str, PendingReason] = field(default_factory=dict)
    rejections: dict[str, str] = field(default_factory=dict)  # job id -> why it can never run
    # Pending jobs the pass did not reach before its deadline (each has a "priority" reason
    # saying so); empty when it decided every one.
    not_reached: list[str] = field(default_factory=list)
    # Pending jobs a quota row held for an aged job of their tenant keeps waiting: job id -> that
    # job's id (PolicyPass.quota_held_for_another); the start estimates play them behind it.
    held_for: dict[str, str] = field(default_factory=dict)

    @property
    def undecided(self) -> int:
        return len(self.not_reached)

    @property
    def cut_short(self) -> bool:
        return bool(self.not_reached)


class Scheduler(Protocol):
    """The incremental engine a driver talks to.

    The live system builds one from a :class:`Snapshot` each pass; the simulator keeps one across
    simulated time and reports each change to it. ``decide`` applies its own bindings, resizes and
    preemption marks to the internal state (a preempted job keeps its GPUs until ``release``).
    """

    def submit(self, job: JobRequest) -> None: ...

    def cancel(self, job_id: str) -> None: ...

    def release(self, job_id: str, now: float) -> None:
        """The job's processes have exited (finished, failed, preempted): free its GPUs."""

    def requeue(self, job: JobRequest) -> None:
        """Put a released job back in the queue (preempted, or a retry)."""

    def release_leaving(self, job_id: str, now: float) -> None:
        """The replicas a shrink removed from the job have exited: free their GPUs."""

    def checkpoint(self, job_id: str, at: float) -> None: ...

    def decide(self, now: float) -> Decisions: ...
