"""Node health: a node whose heartbeats stop becomes ``not-ready``; once its leases have expired,
and a safety margin after that, its jobs are requeued (fencing: a job never runs in two places).

The agent kills its jobs at its lease's deadline, which it counts from the *send* of its last
heartbeat that succeeded, so it comes before ``last_heartbeat + LEASE_S`` here. The margin
(``TESSERA["FENCE_MARGIN_S"]``, default 5 s) covers what that order alone does not: the kill takes
a moment (a loaded agent wakes late; a process dies after its SIGKILL is delivered), the agent's
monotonic clock and the server's wall clock run at slightly different rates, and the web process
that stamped ``last_heartbeat`` and the worker that sweeps read two wall clocks.

What a lost node's job becomes, once the lease has expired (docs/operations.md):

- bound but never started (``scheduled``): back to the queue at once (``requeued``, reason
  ``node-lost``); nothing ran, so nothing is counted against it;
- running (or stopping because its node was lost): the attempt is lost, but not through the
  job's fault, so it uses no retry: back to the queue at once (``requeued``, ``node-lost``),
  from its last checkpoint, as Slurm requeues such jobs. A job that takes nodes down (an
  out-of-memory kernel panic) must not take down node after node: after
  ``TESSERA["MAX_NODE_LOSSES"]`` (default 3) such requeues the next loss fails it (``failed``,
  ``node-lost``);
- stopping after one of its replicas failed (``exit N``): it fails or retries as that failure
  would have;
- stopping for a reason of its own (cancelled, preempted, time limit): it ends as that stop
  would have ended it (``do_record_exit``): cancelled, requeued after preemption, failed.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from scheduling.choices import HOLDING_STATES, JobState, NodeState
from scheduling.models import Job, Node
from scheduling.services import live
from scheduling.services.jobs import (
    Settlement,
    active_allocations_of,
    failed_code,
    locked_jobs,
    requeue_unstarted,
)
from scheduling.services.resizes import leave_alone, leaves_alone

OWN_STOPS = ("cancelled", "preempt", "time-limit", "disk-limit")
log = logging.getLogger("tessera.health")

# How much further the wall clock may move than the monotonic clock between two sweeps before it
# counts as a step: NTP's slewing moves it by half a millisecond a second at most.
CLOCK_STEP_S = 5.0
monotonic = time.monotonic  # the sweep's monotonic clock (a test may give a fake one)


class WallClockSteps:
    """Forward steps of this process's wall clock, seen from one sweep to the next.

    ``last_heartbeat`` is stamped with the wall clock. Stepped forward past the lease and the
    margin (NTP correcting a drifted clock, a virtual machine resumed), every node whose agent had
    not heartbeated since looked lost at the next sweep and its running jobs were requeued, though
    each agent was alive and heartbeating every few seconds. So for a lease and a heartbeat
    timeout after a step, the sweep takes the step off its ``now``: an agent that heartbeated just
    before the step is judged by the time that really passed; one stamped after it, by the new
    clock, at worst a step later than it would be; past that window, nothing is taken off.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.forget()

    def forget(self) -> None:
        self._last: tuple[float, float] | None = None
        self._step_s = 0.0
        self._until = -math.inf

    def correction(self, wall: float, mono: float, window_s: float) -> float:
        """Seconds to take off ``wall`` (epoch seconds) at monotonic time ``mono``."""
        with self._lock:
            if self._last is not None:
                jump = (wall - self._last[0]) - (mono - self._last[1])
                if jump > CLOCK_STEP_S:
                    self._step_s += jump
                    self._until = mono + window_s
                    log.warning(
                        "the wall clock stepped %.0f s forward since the last node sweep: nodes are "
                        "judged by the time that really passed for the next %.0f s",
                        jump,
                        window_s,
                    )
            self._last = (wall, mono)
            if mono >= self._until:
                self._step_s = 0.0
            return self._step_s


clock_steps = WallClockSteps()  # per process: each sweeping process watches its own clock


def sweep_nodes(now: datetime | None = None) -> list[str]:
    """Mark silent nodes not-ready; requeue the jobs of nodes whose leases expired (plus the
    fencing margin: see the module's docstring). Without ``now``, the wall clock's forward steps
    are taken off it for a while (:class:`WallClockSteps`)."""
    timeout = timedelta(seconds=settings.TESSERA["HEARTBEAT_TIMEOUT_S"])
    fence_after = timedelta(seconds=settings.TESSERA["LEASE_S"] + settings.TESSERA["FENCE_MARGIN_S"])
    if now is None:
        now = timezone.now()
        window_s = (timeout + fence_after).total_seconds()
        now -= timedelta(seconds=clock_steps.correction(now.timestamp(), monotonic(), window_s))
    lost = list(
        Node.objects.filter(state=NodeState.READY, last_heartbeat__lt=now - timeout).values_list(
            "name", flat=True
        )
    )
    if lost:
        # Versions bumped: a pass whose snapshot still saw them ready drops its bindings there.
        Node.objects.filter(name__in=lost).update(state=NodeState.NOT_READY, version=F("version") + 1)
        live.publish_nodes(name__in=lost)
    fenced = Node.objects.exclude(state=NodeState.READY).filter(last_heartbeat__lt=now - fence_after)
    for node in fenced:
        job_ids = set(
            Job.objects.filter(
                state__in=list(HOLDING_STATES),
                allocations__node=node,
                allocations__released_at__isnull=True,
            ).values_list("pk", flat=True)
        )
        for job_id in sorted(job_ids):
            with transaction.atomic():
                job = locked_jobs().get(pk=job_id)
                if job.state in HOLDING_STATES and not _resize_only(job, node.pk, now):
                    requeue_lost(job, now)
    return lost


def _resize_only(job: Job, node_id: int, now: datetime) -> bool:
    """Were the job's replicas on the fenced node only ones a shrink removed, or ones a grow
    added that had not started? Then they are released alone and the job goes on elsewhere
    (a resize whose agent is gone falls back, the job is not lost)."""
    held = list(active_allocations_of(job))
    here: dict[int, list] = {}
    for a in held:
        if a.node_id == node_id:
            here.setdefault(a.replica, []).append(a)
    if not here or not all(leaves_alone(these, held, "lost", None) for these in here.values()):
        return False
    leave_alone(job, [a for these in here.values() for a in these], held, now, lost=True)
    return True


def requeue_lost(job: Job, now: datetime) -> None:
    """``job`` (locked) lost its node and the lease expired: free its GPUs and settle it."""
    if job.state == JobState.SCHEDULED:
        requeue_unstarted(job, now)
        return
    active = list(active_allocations_of(job))
    settlement = Settlement()
    if job.state == JobState.TERMINATING and job.stop_reason.startswith(OWN_STOPS):
        settlement.exit(job, None, now, active)
    else:
        settlement.exit(job, failed_code(job.stop_reason), now, active, lost=True)
    settlement.write()
