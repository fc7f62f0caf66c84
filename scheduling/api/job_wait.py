"""``GET /api/v1/jobs/{id}/?wait=S``: the job, once its state changes or ``S`` seconds pass.

A CI step that waits for its job's end asks again after each answer, one request per state
change (or per ``S`` ≤ 55 seconds), instead of polling. The view is ``async``: a waiting request
parks an asyncio task on the web process's event loop, not one of its request threads, and holds
no database connection while it waits. It is woken by ``services.job_bus`` (a message per commit
that changed the job), and reads the database again before answering, so a lost message only
costs the timeout.

Without ``wait`` (and for any method but GET) it is the plain ``retrieve`` of
``JobViewSet``, which authenticates, scopes to the caller's tenant (another tenant's job is a
404, before any waiting) and renders as every other read does.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from asgiref.sync import sync_to_async
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework.response import Response

from scheduling.api.jobs import JobViewSet
from scheduling.choices import TERMINAL_STATES
from scheduling.models import Job
from scheduling.services import job_bus

log = logging.getLogger("tessera.api")

MAX_WAIT_S = 55.0  # below common proxies' 60 s idle limit

_retrieve = JobViewSet.as_view({"get": "retrieve"})


def _give_back_connection() -> None:
    # A waiting request must not hold a pooled connection for its whole wait.
    if not connection.in_atomic_block:
        connection.close()


def _read(request: HttpRequest, pk: str) -> Response:
    try:
        response = _retrieve(request, pk=pk)
        response.render()
        return response
    finally:
        _give_back_connection()


def _state(job_id: int) -> str | None:
    try:
        return Job.objects.filter(pk=job_id).values_list("state", flat=True).first()
    finally:
        _give_back_connection()


def wait_seconds(raw: str) -> float | None:
    """``wait``'s value in seconds, or None if it is not a number from 0 to ``MAX_WAIT_S``."""
    try:
        value = float(raw)
    except ValueError:
        return None
    if not math.isfinite(value) or not 0 <= value <= MAX_WAIT_S:
        return None
    return value


async def job_detail(request: HttpRequest, pk: str) -> HttpResponse:
    read = sync_to_async(_read)
    if request.method != "GET" or "wait" not in request.GET:
        return await read(request, pk)
    given = request.GET.getlist("wait")
    seconds = wait_seconds(given[0]) if len(given) == 1 else None  # twice: which one was meant?
    first = await read(request, pk)
    if first.status_code != 200:
        return first  # 401, 404 (another tenant's job), 429: as the plain read answers
    if len(given) > 1:
        return JsonResponse({"wait": ["give it at most once"]}, status=400)
    if seconds is None:
        return JsonResponse({"wait": [f"A number of seconds from 0 to {MAX_WAIT_S:g}."]}, status=400)
    job = first.data
    if seconds == 0 or job["state"] in TERMINAL_STATES:
        return first
    if await _changed(job["id"], job["state"], time.monotonic() + seconds):
        return await read(request, pk)
    return first


# Documented, authenticated and scoped as ``retrieve`` is (drf-spectacular reads these).
job_detail.cls = _retrieve.cls  # type: ignore[attr-defined]
job_detail.initkwargs = _retrieve.initkwargs  # type: ignore[attr-defined]
job_detail.actions = _retrieve.actions  # type: ignore[attr-defined]
job_detail.csrf_exempt = True  # type: ignore[attr-defined]  # DRF checks CSRF for sessions itself


async def _changed(job_id: int, state: str, deadline: float) -> bool:
    """Whether the job's state left ``state`` before ``deadline`` (monotonic). False at once if
    the change bus cannot be listened to (Redis down): the caller answers the job as it is."""
    try:
        return await _watch(job_id, state, deadline)
    except TimeoutError:  # the subscription was not confirmed in time
        log.warning("job %s: no change bus; answering without waiting", job_id)
        return False


async def _watch(job_id: int, state: str, deadline: float) -> bool:
    async with job_bus.watching(job_bus.job_key(job_id)) as changed:
        while True:
            # Read after registering: a change committed before the registration is seen here.
            if await sync_to_async(_state)(job_id) != state:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(changed.wait(), left)
            except TimeoutError:
                return False
            changed.clear()
