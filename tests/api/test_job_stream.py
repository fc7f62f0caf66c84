"""``GET /jobs/{id}/stream/`` and ``GET /jobs/stream/``: Server-Sent Events that resume from
``Last-Event-ID`` with nothing lost and nothing repeated.

Read through Django's async test client, which hands the view's async iterator over as it is
produced: a stream read in two halves (the connection dropped after any message, then made again
with that message's id) must equal the stream read at once.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import AsyncClient

from scheduling.models import JobEvent
from scheduling.services.jobs import do_cancel_job
from tests.api.helpers import add_log, bind, finish, run, submit


def auth(world, who: str) -> dict[str, str]:
    return {"Authorization": f"Token {world.tokens[who]}", "Accept": "text/event-stream"}


def parse(raw: bytes) -> list[dict]:
    """The messages of an SSE body (comments skipped): [{"id", "event", "data"}]."""
    out = []
    for block in raw.decode().split("\n\n"):
        fields = {}
        for line in block.splitlines():
            if line.startswith(":"):
                continue
            name, _, value = line.partition(": ")
            fields[name] = json.loads(value) if name == "data" else value
        if fields:
            out.append(fields)
    return out


async def _read(url: str, headers: dict[str, str], stop_after: int | None = None, timeout: float = 10):
    """The first ``stop_after`` messages (all, until the stream closes, when None)."""
    response = await AsyncClient().get(url, headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "text/event-stream"
    raw = b""
    iterator = aiter(response.streaming_content)
    try:
        while stop_after is None or len(parse(raw)) < stop_after:
            try:
                raw += await asyncio.wait_for(anext(iterator), timeout)
            except StopAsyncIteration:
                break
    finally:
        await iterator.aclose()  # the client goes away: the server's generator is closed
    return parse(raw)


def read(url, headers, stop_after=None):
    return async_to_sync(_read)(url, headers, stop_after)


@pytest.fixture
def ended_job(transactional_db, world, cluster):
    """alice's job: submitted, bound, started, three pieces of output, failed with exit 3."""
    job = submit(world.alice, world.vision, name="streamed")
    bind(job, cluster["n01"], [0])
    run(job)
    for piece in (b"one\n", "twö\n".encode(), b"three\n"):
        add_log(job, piece)
    finish(job, 3)
    return job


def test_the_stream_gives_a_jobs_events_and_output_then_its_end(world, ended_job):
    messages = read(f"/api/v1/jobs/{ended_job.pk}/stream/", auth(world, "alice"))
    kinds = [m["event"] for m in messages]
    assert [m["data"]["type"] for m in messages if m["event"] == "job-event"] == [
        "submitted",
        "scheduled",
        "started",
        "failed",
    ]
    assert "".join(m["data"]["data"] for m in messages if m["event"] == "log") == "one\ntwö\nthree\n"
    assert kinds[-1] == "end" and messages[-1]["data"] == {
        "id": ended_job.pk,
        "state": "failed",
        "exit_code": 3,
    }


def test_a_stream_resumed_after_any_message_loses_and_repeats_nothing(world, ended_job, settings):
    from scheduling.api import job_stream

    url = f"/api/v1/jobs/{ended_job.pk}/stream/"
    job_stream.LOG_PAGE_BYTES = 4  # several log messages, so the cut falls inside the output too
    try:
        whole = read(url, auth(world, "alice"))
        for cut in range(1, len(whole)):
            first = read(url, auth(world, "alice"), stop_after=cut)
            rest = read(url, {**auth(world, "alice"), "Last-Event-ID": first[-1]["id"]})
            assert first + rest == whole, cut
    finally:
        job_stream.LOG_PAGE_BYTES = 64 * 1024


def test_a_stream_sends_what_happens_while_it_is_open(world, transactional_db, cluster):
    job = submit(world.alice, world.vision, name="live")

    async def go():
        reading = asyncio.ensure_future(_read(f"/api/v1/jobs/{job.pk}/stream/", auth(world, "alice")))
        await asyncio.sleep(0.3)
        assert not reading.done()
        started = time.monotonic()
        await sync_to_async(do_cancel_job)(job.pk)
        messages = await reading
        return messages, time.monotonic() - started

    messages, took = async_to_sync(go)()
    assert [m["data"].get("type") for m in messages[:-1]] == ["submitted", "cancelled"]
    assert messages[-1]["event"] == "end" and took < 3


def test_bob_cannot_stream_alices_job_and_bad_ids_are_400s(world, ended_job):
    assert (
        async_to_sync(AsyncClient().get)(
            f"/api/v1/jobs/{ended_job.pk}/stream/", headers=auth(world, "bob")
        ).status_code
        == 404
    )
    assert async_to_sync(AsyncClient().get)(f"/api/v1/jobs/{ended_job.pk}/stream/").status_code == 401
    for header, value in (("Last-Event-ID", "7"), ("Last-Event-ID", "x.y"), ("Last-Event-ID", "1.-2")):
        response = async_to_sync(AsyncClient().get)(
            f"/api/v1/jobs/{ended_job.pk}/stream/", headers={**auth(world, "alice"), header: value}
        )
        assert response.status_code == 400 and list(response.json()) == ["Last-Event-ID"]
    response = async_to_sync(AsyncClient().get)(
        f"/api/v1/jobs/{ended_job.pk}/stream/", {"replica": "1"}, headers=auth(world, "alice")
    )
    assert response.status_code == 400 and list(response.json()) == ["replica"]


def test_the_tenant_stream_sends_only_the_tenants_events_and_resumes_exactly(world, ended_job):
    bobs = submit(world.bob, world.nlp, name="bobs")
    do_cancel_job(bobs.pk)
    vision_events = list(JobEvent.objects.filter(job=ended_job).order_by("id").values_list("id", flat=True))

    async def first_part():
        return await _read("/api/v1/jobs/stream/", auth(world, "carol"), stop_after=2)

    first = async_to_sync(first_part)()
    assert [m["data"]["job"] for m in first] == [ended_job.pk] * 2
    assert all(m["data"]["name"] == "streamed" for m in first)

    async def rest_part():
        return await _read(
            "/api/v1/jobs/stream/",
            {**auth(world, "carol"), "Last-Event-ID": first[-1]["id"]},
            stop_after=len(vision_events) - 2,
        )

    rest = async_to_sync(rest_part)()
    assert [int(m["id"]) for m in first + rest] == vision_events

    async def bobs_part():
        return await _read("/api/v1/jobs/stream/", auth(world, "bob"), stop_after=2)

    assert {m["data"]["job"] for m in async_to_sync(bobs_part)()} == {bobs.pk}


def _ends_after(url: str, headers: dict[str, str], change) -> tuple[list[dict], float]:
    """What ``url``'s stream sent and how long it stayed open after ``change`` (sync) was made."""

    async def go():
        reading = asyncio.ensure_future(_read(url, headers))
        await asyncio.sleep(0.3)
        assert not reading.done()
        await sync_to_async(change)()
        started = time.monotonic()
        messages = await asyncio.wait_for(reading, 10)
        return messages, time.monotonic() - started

    return async_to_sync(go)()


@pytest.mark.parametrize("path", ["/api/v1/jobs/{id}/stream/", "/api/v1/jobs/stream/"])
def test_a_stream_ends_once_its_token_is_revoked(world, transactional_db, monkeypatch, path):
    from scheduling.api import job_stream
    from scheduling.models import ApiToken
    from scheduling.services.tokens import do_revoke_api_token

    monkeypatch.setattr(job_stream, "RECHECK_S", 0.5)
    job = submit(world.alice, world.vision, name="live")  # pending: its stream stays open
    revoke = lambda: do_revoke_api_token(ApiToken.objects.get(user=world.alice))  # noqa: E731
    messages, took = _ends_after(path.format(id=job.pk), auth(world, "alice"), revoke)
    assert took < 3 and all(m["event"] == "job-event" for m in messages)
    assert (
        async_to_sync(AsyncClient().get)(path.format(id=job.pk), headers=auth(world, "alice")).status_code
        == 401
    )


def test_a_tenant_stream_ends_once_its_user_leaves_the_tenant(world, transactional_db, monkeypatch):
    from scheduling.api import job_stream
    from scheduling.models import Membership

    monkeypatch.setattr(job_stream, "RECHECK_S", 0.5)
    job = submit(world.alice, world.vision, name="live")

    def moved():
        membership = Membership.objects.get(user=world.carol)
        membership.tenant = world.nlp  # as the admin does it (saved: the token cache forgets)
        membership.save()

    messages, took = _ends_after("/api/v1/jobs/stream/", auth(world, "carol"), moved)
    assert took < 3 and {m["data"]["job"] for m in messages} <= {job.pk}


def test_the_streams_own_query_parameters_pass_and_an_unknown_one_is_a_400(world, ended_job):
    """The stream is authorised by the plain read of the job, which refuses a query parameter it
    does not read: the stream's own (`replica`, `last_event_id`) must still pass."""
    url = f"/api/v1/jobs/{ended_job.pk}/stream/?replica=0&last_event_id=1.0"
    messages = read(url, auth(world, "alice"))
    assert messages[-1]["event"] == "end"
    response = async_to_sync(AsyncClient().get)(
        f"/api/v1/jobs/{ended_job.pk}/stream/", {"replca": "0"}, headers=auth(world, "alice")
    )
    assert response.status_code == 400 and list(response.json()) == ["replca"]
