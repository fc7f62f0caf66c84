"""``GET /api/v1/jobs/{id}/?wait=S``: the long-poll a CI step waits on instead of polling.

Changes are made by the real services in another thread while the request waits, and committed
(``transactional_db``), so the wake travels as in production: after commit, through
``services.job_bus`` — in-process without Redis, through Redis pub/sub with it.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import AsyncClient

from scheduling.models import Job
from scheduling.services.jobs import do_cancel_job
from tests.api.helpers import submit


def url(job: Job) -> str:
    return f"/api/v1/jobs/{job.pk}/"


def auth(world, who: str) -> dict[str, str]:
    return {"Authorization": f"Token {world.tokens[who]}"}


async def _get(job: Job, headers: dict[str, str], **params):
    started = time.monotonic()
    response = await AsyncClient().get(url(job), params, headers=headers)
    return response, time.monotonic() - started


def _cancel_while_waiting(job: Job, headers: dict[str, str], after_s: float = 0.3):
    async def go():
        waiting = asyncio.ensure_future(_get(job, headers, wait=10))
        await asyncio.sleep(after_s)
        assert not waiting.done(), "the wait answered before anything changed"
        await sync_to_async(do_cancel_job)(job.pk)
        return await waiting

    return async_to_sync(go)()


@pytest.fixture
def pending_job(transactional_db, world):
    return submit(world.alice, world.vision, name="waited-for")


def test_a_wait_answers_when_the_job_changes_state_not_at_its_timeout(world, pending_job):
    response, took = _cancel_while_waiting(pending_job, auth(world, "alice"))
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "cancelled"
    assert 0.3 <= took < 3, took


def test_carol_waits_on_her_teammates_job(world, pending_job):
    response, _ = _cancel_while_waiting(pending_job, auth(world, "carol"))
    assert response.json()["state"] == "cancelled"


@pytest.mark.redis("the wake travels by Redis pub/sub, as between processes")
def test_a_wait_is_woken_through_redis_where_there_is_redis(world, pending_job, redis_url, settings):
    settings.REDIS_URL = redis_url
    response, took = _cancel_while_waiting(pending_job, auth(world, "alice"))
    assert response.json()["state"] == "cancelled" and took < 3


def test_a_wait_with_no_change_answers_the_job_as_it_is_after_the_timeout(world, pending_job):
    response, took = async_to_sync(_get)(pending_job, auth(world, "alice"), wait=0.4)
    assert response.status_code == 200 and response.json()["state"] == "pending"
    assert 0.4 <= took < 2.5, took


def test_a_finished_job_answers_at_once(world, pending_job):
    do_cancel_job(pending_job.pk)
    response, took = async_to_sync(_get)(pending_job, auth(world, "alice"), wait=30)
    assert response.json()["state"] == "cancelled" and took < 2


def test_bob_cannot_wait_on_alices_job(world, pending_job):
    response, took = async_to_sync(_get)(pending_job, auth(world, "bob"), wait=30)
    assert response.status_code == 404 and took < 2


def test_a_wait_without_a_token_is_refused(world, pending_job):
    response, _ = async_to_sync(_get)(pending_job, {}, wait=30)
    assert response.status_code == 401


@pytest.mark.parametrize("value", ["", "soon", "-1", "56", "nan", "inf", "1e400", "10\x00", ["1", "50"]])
def test_a_wait_that_is_not_0_to_55_seconds_is_a_400_naming_wait(world, pending_job, value):
    response, _ = async_to_sync(_get)(pending_job, auth(world, "alice"), wait=value)
    assert response.status_code == 400
    assert list(response.json()) == ["wait"]


def test_a_plain_read_is_unchanged(world, pending_job):
    response = world.client("alice").get(url(pending_job))
    assert response.status_code == 200 and response.json()["id"] == pending_job.pk
    assert world.client("bob").get(url(pending_job)).status_code == 404
    assert world.client("alice").post(url(pending_job), {}, format="json").status_code == 405
