"""Where a job ran, attempt by attempt (the API's ``placements``; the portal's job page).

A job's allocation rows are kept after they are released, each with its ``attempt``; its events
say how each attempt ended. Both are read with the job (prefetched for a list), so a page of jobs
costs two queries more, whatever its size. Read-only: nothing here writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Prefetch, QuerySet

from scheduling.choices import EventType
from scheduling.models import Allocation, Job, JobEvent
from scheduling.services.jobs import allocations_payload

# The events that end an attempt: the job let go of its GPUs then.
ENDING_EVENTS = (
    EventType.PREEMPTED,
    EventType.REQUEUED,
    EventType.RETRYING,
    EventType.SUCCEEDED,
    EventType.FAILED,
    EventType.CANCELLED,
)


def with_history(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """``jobs`` with every allocation (``all_allocations``) and ending event (``ending_events``)
    prefetched, for :func:`placements_payload`."""
    return jobs.prefetch_related(
        Prefetch(
            "allocations",
            queryset=Allocation.objects.select_related("node", "device").order_by(
                "attempt", "created_at", "id"
            ),
            to_attr="all_allocations",
        ),
        Prefetch(
            "events",
            queryset=JobEvent.objects.filter(type__in=[str(t) for t in ENDING_EVENTS]).order_by("at", "id"),
            to_attr="ending_events",
        ),
    )


def placements_payload(job: Job) -> list[dict[str, Any]]:
    """``[{"attempt", "allocations", "started_at", "ended_at", "outcome", "reason"}]``, oldest
    first. ``started_at``: when the attempt was bound; ``ended_at``: when its GPUs were freed
    (null while it holds them); ``outcome``: the event that ended it (``preempted``, ``failed``,
    …), or the job's state while the attempt lasts."""
    allocs = getattr(job, "all_allocations", None)
    if allocs is None:
        allocs = list(
            job.allocations.select_related("node", "device").order_by("attempt", "created_at", "id")
        )
    events = getattr(job, "ending_events", None)
    if events is None:
        events = list(job.events.filter(type__in=[str(t) for t in ENDING_EVENTS]).order_by("at", "id"))
    by_attempt: dict[int, list[Allocation]] = {}
    for a in allocs:
        by_attempt.setdefault(a.attempt, []).append(a)
    out = []
    for attempt, rows in sorted(by_attempt.items()):
        started = min(a.created_at for a in rows)
        released = [a.released_at for a in rows]
        ended = max(released) if all(r is not None for r in released) else None  # type: ignore[type-var]
        outcome, reason = str(job.state), None
        if ended is not None:
            event = _ending_event(events, ended)
            if event is not None:
                outcome, reason = event.type, event.reason or None
        out.append(
            {
                "attempt": attempt,
                "allocations": allocations_payload(rows),
                "started_at": started,
                "ended_at": ended,
                "outcome": outcome,
                "reason": reason,
            }
        )
    return out


def _ending_event(events: Iterable[JobEvent], ended) -> JobEvent | None:
    """The event that freed the GPUs at ``ended``: written with the same time, or the first after."""
    later = [e for e in events if e.at >= ended]
    same = [e for e in later if e.at == ended]
    return (same or later)[0] if later else None
