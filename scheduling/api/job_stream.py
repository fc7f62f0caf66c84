"""Server-Sent Events: a job's events and output as they happen, and a tenant's jobs' events.

``GET /api/v1/jobs/{id}/stream/?replica=K`` sends the job's events (``event: job-event``) and
its output (``event: log``, at most 64 KiB a message) from the start or from a ``Last-Event-ID``,
then ``event: end`` once the job has ended and everything was sent, and closes. Every message's
``id`` is the whole position after it, ``<last event id>.<log offset>``, so a client that
reconnects with the id of the last message it got (browsers' ``EventSource`` do it by
themselves) gets exactly what follows it: nothing lost, nothing twice. A job's events are
written under its row lock, so their ids commit in order, and its output is read by byte offset.

``GET /api/v1/jobs/stream/`` sends the events of every job the caller may see
(``event: job-event``, with the job's id and name), ``id`` the event's. Ids of different jobs'
events may commit out of order (two transactions), so the stream sends events in id order and
stops at a missing id until it has been missing for ``SETTLE_S`` seconds (a transaction still
running, or one rolled back, which never fills it): an event is lost only if its transaction
takes longer than that between writing it and committing.

Both are async views: a stream holds neither a request thread nor a database connection between
reads. They read when ``services.job_bus`` says their job (or tenant) changed, and at least every
``KEEPALIVE_S`` (sending a comment line, which keeps proxies from closing an idle stream).
Access is the job read's (``retrieve``: 401, another tenant's job 404) or the list's, and it is
checked again while the stream is open, at least every ``RECHECK_S`` seconds of the stream
(it wakes for it): a stream whose token was revoked, whose user was deactivated, whose
session ended, or whose caller no longer sees the job (or the same tenants) ends there, and
reconnecting answers 401 or 404.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib import auth
from django.db import connection
from django.http import HttpRequest, HttpResponseBase, JsonResponse, StreamingHttpResponse
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.response import Response

from scheduling.api.job_serializers import JobEventSerializer
from scheduling.api.jobs import JobViewSet
from scheduling.api.logs import read_log
from scheduling.api.permissions import is_operator
from scheduling.api.user_auth import TokenAuthentication
from scheduling.choices import TERMINAL_STATES
from scheduling.models import Job, JobEvent, Tenant
from scheduling.services import job_bus

KEEPALIVE_S = 15.0
RECHECK_S = 15.0  # the caller's access, read again (the token cache keeps it 5 s: user_auth.py)
SETTLE_S = 5.0
LOG_PAGE_BYTES = 64 * 1024
EVENTS_PER_READ = 500
_JOB_CURSOR = re.compile(r"^([0-9]{1,18})\.([0-9]{1,18})$")
_EVENT_CURSOR = re.compile(r"^[0-9]{1,18}$")

# The stream's own parameters pass the plain read's check of its query (query_params.py).
_retrieve = JobViewSet.as_view(
    {"get": "retrieve"}, query_params_taken={"retrieve": ("replica", "last_event_id")}
)
_list = JobViewSet.as_view({"get": "list"})


def _give_back_connection() -> None:
    if not connection.in_atomic_block:
        connection.close()


def _authorized(view, request: HttpRequest, **kwargs: Any) -> tuple[Response, Any]:
    """The plain read's answer (its 401/404/429 are the stream's) and the caller."""
    request.META["HTTP_ACCEPT"] = "application/json"  # that read's answer, not the stream's type
    try:
        response = view(request, **kwargs)
        response.render()
        context = getattr(response, "renderer_context", None) or {}
        user = getattr(context.get("request"), "user", None)
        return response, user
    finally:
        _give_back_connection()


def _caller_now(request: HttpRequest) -> Any | None:
    """Who ``request`` authenticates as now (None: nobody any more): its token read again (revoked,
    or its user deactivated: None), else its session, if it still exists."""
    try:
        if request.META.get("HTTP_AUTHORIZATION"):
            found = TokenAuthentication().authenticate(request)  # type: ignore[arg-type]
            return found[0] if found else None
        session = getattr(request, "session", None)
        if session is None or not session.session_key or not session.exists(session.session_key):
            return None
        user = auth.get_user(request)
        return user if user.is_authenticated and user.is_active else None
    except AuthenticationFailed:
        return None
    finally:
        _give_back_connection()


class Recheck:
    """Whether a stream's caller may still read it, asked at most every ``RECHECK_S`` seconds:
    ``allowed(user)`` (sync, with the database) says whether the user, as now, still may."""

    def __init__(self, request: HttpRequest, allowed: Callable[[Any], bool]) -> None:
        self.request, self.allowed = request, allowed
        self.at = time.monotonic()

    def _still(self) -> bool:
        user = _caller_now(self.request)
        try:
            return user is not None and self.allowed(user)
        finally:
            _give_back_connection()

    async def still(self) -> bool:
        if time.monotonic() - self.at < RECHECK_S:
            return True
        self.at = time.monotonic()
        return await sync_to_async(self._still)()


def message(event: str, data: Any, id_: str | None = None) -> bytes:
    lines = [f"id: {id_}"] if id_ is not None else []
    lines += [f"event: {event}", "data: " + json.dumps(data, separators=(",", ":"), ensure_ascii=False)]
    return ("\n".join(lines) + "\n\n").encode()


def stream_response(body: AsyncIterator[bytes]) -> StreamingHttpResponse:
    response = StreamingHttpResponse(body, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # a proxy in front must not buffer the stream
    return response


def _last_event_id(request: HttpRequest) -> str | None:
    return request.headers.get("Last-Event-ID") or request.GET.get("last_event_id") or None


def _bad(field_name: str, reason: str) -> JsonResponse:
    return JsonResponse({field_name: [reason]}, status=400)


async def _wait(changed: asyncio.Event, seconds: float) -> bool:
    """Whether ``changed`` was set within ``seconds`` (then cleared)."""
    try:
        await asyncio.wait_for(changed.wait(), seconds)
    except TimeoutError:
        return False
    changed.clear()
    return True


# --- one job --------------------------------------------------------------------------------


@dataclass
class JobCursor:
    event: int = 0
    offset: int = 0

    def __str__(self) -> str:
        return f"{self.event}.{self.offset}"


@dataclass
class JobBatch:
    messages: list[bytes] = field(default_factory=list)
    ended: dict[str, Any] | None = None


def _job_batch(job_id: int, replica: int, cursor: JobCursor) -> JobBatch:
    """What follows ``cursor`` (advanced in place). The job's state is read first: when it is
    final, its last event and output were committed before, so this read sees them all."""
    try:
        job = Job.objects.get(pk=job_id)
        batch = JobBatch()
        events = list(
            JobEvent.objects.filter(job_id=job_id, id__gt=cursor.event).order_by("id")[:EVENTS_PER_READ]
        )
        for event in events:
            cursor.event = event.id
            data = {"id": event.id, **JobEventSerializer(event).data}
            batch.messages.append(message("job-event", data, str(cursor)))
        page = read_log(job, replica, cursor.offset, limit=LOG_PAGE_BYTES)
        if page.next_offset != cursor.offset or page.data:
            cursor.offset = page.next_offset
            data = {"replica": replica, **page.as_dict()}
            batch.messages.append(message("log", data, str(cursor)))
        if job.state in TERMINAL_STATES and len(events) < EVENTS_PER_READ and page.eof:
            batch.ended = {"id": job.pk, "state": job.state, "exit_code": job.exit_code}
        return batch
    finally:
        _give_back_connection()


async def _job_messages(
    job_id: int, replica: int, cursor: JobCursor, access: Recheck
) -> AsyncIterator[bytes]:
    read = sync_to_async(_job_batch)
    async with job_bus.watching(job_bus.job_key(job_id)) as changed:
        while True:
            if not await access.still():
                return  # the caller may no longer read it: reconnecting says why (401, 404)
            batch = await read(job_id, replica, cursor)
            for chunk in batch.messages:
                yield chunk
            if batch.ended is not None:
                yield message("end", batch.ended, str(cursor))
                return
            if batch.messages:
                continue  # there may be more right behind (a long log): read on at once
            if not await _wait(changed, min(KEEPALIVE_S, RECHECK_S)):
                yield b": keepalive\n\n"


async def job_stream(request: HttpRequest, pk: str) -> HttpResponseBase:
    first, _ = await sync_to_async(_authorized)(_retrieve, request, pk=pk)
    if first.status_code != 200 or request.method != "GET":
        return first  # 401, 404, 429; a method but GET: 405 (after authentication, as DRF does)
    job = first.data
    cursor = JobCursor()
    last = _last_event_id(request)
    if last is not None:
        found = _JOB_CURSOR.match(last)
        if found is None:
            return _bad("Last-Event-ID", "must be the id of a message of this stream (<event>.<offset>)")
        cursor = JobCursor(int(found.group(1)), int(found.group(2)))
    raw = request.GET.get("replica", "0")
    if not raw.isdigit() or int(raw) >= job["replicas"]:
        return _bad("replica", f"must be an integer below the job's {job['replicas']} replica(s)")
    job_id = job["id"]
    access = Recheck(request, lambda user: Job.objects.visible_to(user).filter(pk=job_id).exists())
    return stream_response(_job_messages(job_id, int(raw), cursor, access))


# --- a tenant's jobs --------------------------------------------------------------------------


@dataclass
class EventCursor:
    """The last event id sent, and since when each missing id above it has been missing."""

    event: int = 0
    missing_since: dict[int, float] = field(default_factory=dict)


def _tenant_batch(tenant_ids: list[int] | None, cursor: EventCursor) -> list[bytes]:
    """Events after the cursor in id order, up to the first id missing for less than SETTLE_S.
    ``tenant_ids``: the tenants whose jobs' events are sent (None: all, an operator's)."""
    try:
        rows = list(
            JobEvent.objects.filter(id__gt=cursor.event)
            .order_by("id")
            .values_list("id", "job__tenant_id")[:EVENTS_PER_READ]
        )
        now = time.monotonic()
        sendable: list[int] = []
        expected = cursor.event + 1
        for event_id, tenant_id in rows:
            if event_id != expected and not _settled(cursor, range(expected, event_id), now):
                break
            expected = event_id + 1
            cursor.event = event_id
            if tenant_ids is None or tenant_id in tenant_ids:
                sendable.append(event_id)
        cursor.missing_since = {k: v for k, v in cursor.missing_since.items() if k > cursor.event}
        events = JobEvent.objects.filter(id__in=sendable).select_related("job").order_by("id")
        return [
            message(
                "job-event",
                {"id": e.id, "job": e.job_id, "name": e.job.name, **JobEventSerializer(e).data},
                str(e.id),
            )
            for e in events
        ]
    finally:
        _give_back_connection()


def _settled(cursor: EventCursor, gap: range, now: float) -> bool:
    """Whether every id of ``gap`` has been missing for ``SETTLE_S`` (noting when each was first)."""
    if len(gap) > 1000:  # a hole this wide is a restored or pruned table, not a transaction
        return True
    firsts = [cursor.missing_since.setdefault(i, now) for i in gap]
    return now - max(firsts) >= SETTLE_S


def _scope(user) -> tuple[list[int] | None, str]:
    """The tenants whose jobs ``user`` sees (None: all) and the key that wakes their stream."""
    try:
        tenants = list(Tenant.objects.visible_to(user).values_list("pk", flat=True))
        if is_operator(user):
            return None, job_bus.ALL_KEY
        return tenants, job_bus.tenant_key(tenants[0]) if tenants else job_bus.ALL_KEY
    finally:
        _give_back_connection()


async def _tenant_messages(
    tenant_ids: list[int] | None, key: str, cursor: EventCursor, access: Recheck
) -> AsyncIterator[bytes]:
    read = sync_to_async(_tenant_batch)
    async with job_bus.watching(key) as changed:
        while True:
            if not await access.still():
                return  # the caller may no longer read these: reconnecting says why (401)
            chunks = await read(tenant_ids, cursor)
            for chunk in chunks:
                yield chunk
            waiting_on_gap = bool(cursor.missing_since)
            if (
                not await _wait(changed, 1.0 if waiting_on_gap else min(KEEPALIVE_S, RECHECK_S))
                and not waiting_on_gap
            ):
                yield b": keepalive\n\n"


async def jobs_stream(request: HttpRequest) -> HttpResponseBase:
    first, user = await sync_to_async(_authorized)(_list, request)
    if first.status_code != 200 or request.method != "GET":
        return first
    cursor = EventCursor()
    last = _last_event_id(request)
    if last is not None:
        if not _EVENT_CURSOR.match(last):
            return _bad("Last-Event-ID", "must be the id of a message of this stream")
        cursor.event = int(last)
    tenant_ids, key = await sync_to_async(_scope)(user)
    access = Recheck(request, lambda now: _scope(now) == (tenant_ids, key))  # the same tenants
    return stream_response(_tenant_messages(tenant_ids, key, cursor, access))
