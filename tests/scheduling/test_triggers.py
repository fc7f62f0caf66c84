"""Pass triggers on the real broker: a burst of requests queues one pass task, not one each."""

from __future__ import annotations

import json

import pytest
import redis
from django.conf import settings as django_settings

from controlplane.env import redis_db_url
from scheduling.services import passes, redis_flags, triggers
from scheduling.tasks import scheduling_pass
from tests.scheduling import helpers

pytestmark = pytest.mark.redis("pass triggers go through the Celery broker and flags in Redis")


@pytest.fixture
def celery_mode(redis_url, settings, monkeypatch):
    if not django_settings.CELERY_BROKER_URL:
        pytest.fail("REDIS_URL must be set when the settings load for the Celery broker test")
    monkeypatch.setitem(settings.TESSERA, "EMBEDDED_PASSES", False)
    broker = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
    broker.delete("celery")
    flags = [redis_flags.key(triggers.QUEUED_FLAG), redis_flags.key(triggers.AGAIN_FLAG)]
    redis_flags.client().delete(*flags)
    yield broker
    broker.delete("celery")
    redis_flags.client().delete(*flags)


@pytest.fixture
def a_pending_job(world):
    return helpers.submit(world.alice, world.vision, gpus=1)  # no node: it stays pending


def test_a_burst_of_requests_queues_a_single_pass(celery_mode, a_pending_job):
    for _ in range(200):  # well within the "queued" flag's 5 s, even on a loaded machine
        triggers.request_pass()
    assert celery_mode.llen("celery") == 1


def test_the_task_a_request_queues_is_the_scheduling_pass(celery_mode, a_pending_job):
    # Queued by name (the trigger imports no task): the name is the one the worker runs.
    triggers.request_pass()
    message = json.loads(celery_mode.lpop("celery"))
    assert message["headers"]["task"] == scheduling_pass.name


def test_a_request_after_the_pass_started_queues_another(celery_mode, a_pending_job):
    triggers.request_pass()
    scheduling_pass.run()  # the worker's side: takes the "queued" flag, then runs the pass
    triggers.request_pass()
    assert celery_mode.llen("celery") == 2


def requesting_in_rounds(monkeypatch, asking_rounds: int) -> list[int]:
    """Make each pass round up to ``asking_rounds`` see a request arrive while it runs."""
    rounds: list[int] = []
    real = passes._one_pass

    def one_pass(now, **kwargs):
        rounds.append(len(rounds) + 1)
        if len(rounds) <= asking_rounds:
            triggers.request_pass()  # a submit commits while the pass runs
        return real(now, **kwargs)

    monkeypatch.setattr(passes, "_one_pass", one_pass)
    return rounds


def test_a_request_during_a_pass_runs_it_once_more_at_once_not_as_another_task(
    celery_mode, a_pending_job, monkeypatch
):
    triggers.request_pass()  # queues the task the worker now runs
    celery_mode.delete("celery")
    rounds = requesting_in_rounds(monkeypatch, asking_rounds=1)
    scheduling_pass.run()
    assert rounds == [1, 2]
    assert celery_mode.llen("celery") == 0
    triggers.request_pass()  # no pass runs now: a task again
    assert celery_mode.llen("celery") == 1


def test_a_pass_asked_again_in_every_round_hands_the_rest_to_a_new_task(
    celery_mode, a_pending_job, monkeypatch
):
    triggers.request_pass()
    celery_mode.delete("celery")
    rounds = requesting_in_rounds(monkeypatch, asking_rounds=3)
    scheduling_pass.run()
    assert rounds == [1, 2, 3]  # max_rounds: the worker's other tasks get their turn
    assert celery_mode.llen("celery") == 1


def test_a_request_with_no_job_pending_queues_no_pass(celery_mode, world):
    # An exit, a node joining, a quota change: capacity for no one. A pass would decide nothing.
    job = helpers.submit(world.alice, world.vision, gpus=1)
    job.state = "cancelled"
    job.save(update_fields=["state"])
    triggers.request_pass()
    assert celery_mode.llen("celery") == 0


def test_a_request_whose_database_check_fails_still_queues_a_pass(celery_mode, db, monkeypatch):
    # It runs after its change's commit: failing there would fail a request that succeeded.
    from django.db import OperationalError

    def down():
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(triggers.ANY_PENDING, "rows", down)
    triggers.request_pass()
    assert celery_mode.llen("celery") == 1


def test_flags_live_in_their_own_redis_database(redis_url):
    assert redis_flags.client().connection_pool.connection_kwargs["db"] == 2
    assert redis_db_url(redis_url, 2).endswith("/2")
