"""Node health: a node whose heartbeats stop becomes ``not-ready``; once its leases have expired
its jobs are requeued (fencing: a job never runs in two places)."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from scheduling.choices import HOLDING_STATES, EventType, JobState, NodeState
from scheduling.models import Job, Node
from scheduling.services.jobs import do_transition, release_allocations, request_pass_on_commit


def sweep_nodes(now=None) -> list[str]:
    """Mark silent nodes not-ready; requeue the jobs of nodes whose leases expired."""
    now = now or timezone.now()
    timeout = timedelta(seconds=settings.TESSERA["HEARTBEAT_TIMEOUT_S"])
    lease = timedelta(seconds=settings.TESSERA["LEASE_S"])
    lost = list(
        Node.objects.filter(state=NodeState.READY, last_heartbeat__lt=now - timeout)
        .values_list("name", flat=True)
    )
    if lost:
        Node.objects.filter(name__in=lost).update(state=NodeState.NOT_READY)
    fenced = Node.objects.exclude(state=NodeState.READY).filter(last_heartbeat__lt=now - lease)
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
                job = Job.objects.select_for_update().select_related("tenant").get(pk=job_id)
                if job.state not in HOLDING_STATES:
                    continue
                release_allocations(job, now)
                if job.state == JobState.TERMINATING and job.stop_reason == "cancelled":
                    do_transition(job, JobState.CANCELLED, EventType.CANCELLED, "node-lost",
                                  finished_at=now)
                elif job.attempts < job.max_retries or job.state == JobState.SCHEDULED:
                    do_transition(job, JobState.PENDING, EventType.REQUEUED, "node-lost",
                                  attempts=job.attempts + 1, stop_reason="")
                else:
                    do_transition(job, JobState.FAILED, EventType.FAILED, "node-lost",
                                  finished_at=now)
                request_pass_on_commit()
    return lost
