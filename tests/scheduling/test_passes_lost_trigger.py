"""No pass request is lost when several worker processes run pass tasks (Celery's prefork pool).

Each test runs one worker's pass in this thread and, at one critical point of it, a submit
commits (its request sets "again", and queues a task if it sets "queued") and another worker —
another thread with its own database connection and its own process-local flag — runs the
task it queued (or a safety pass). Then every task left in the broker is run, as workers
would. Whatever the point, the job submitted there must end up bound, and the trigger flags
must be left so that the next request queues a task again. No sleeps: the points are hooks.
"""

from __future__ import annotations

import threading

import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection

from scheduling.choices import JobState
from scheduling.services import passes, redis_flags, triggers
from tests.scheduling import helpers

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.redis("two workers' passes meet through the Celery broker and flags in Redis"),
]


class ProcessFlag(threading.local):
    """``triggers._again`` as each worker process has its own: one per thread here."""

    def __init__(self) -> None:
        self.flag = False

    def set(self) -> None:
        self.flag = True

    def clear(self) -> None:
        self.flag = False

    def is_set(self) -> bool:
        return self.flag


@pytest.fixture
def broker(redis_url, settings, monkeypatch):
    if not django_settings.CELERY_BROKER_URL:
        pytest.fail("REDIS_URL must be set when the settings load for the Celery broker test")
    monkeypatch.setitem(settings.TESSERA, "EMBEDDED_PASSES", False)
    monkeypatch.setattr(triggers, "_again", ProcessFlag())
    broker = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
    flags = [redis_flags.key(triggers.QUEUED_FLAG), redis_flags.key(triggers.AGAIN_FLAG)]
    broker.delete("celery")
    redis_flags.client().delete(*flags)
    yield broker
    broker.delete("celery")
    redis_flags.client().delete(*flags)


def in_another_worker(fn):
    """Run ``fn`` to its end in another thread (another connection, another process's flag)."""
    out: dict = {}

    def target() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:  # re-raised in the test's thread
            out["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    if "error" in out:
        raise out["error"]
    return out.get("result")


def run_queued_tasks(broker) -> int:
    """The workers run every pass task queued (and those these queue), one after another."""
    ran = 0
    while broker.lpop("celery") is not None:
        ran += 1
        assert ran < 20
        in_another_worker(passes.run_pass)
    return ran


def meanwhile(world, broker, submitted: list):
    """What happens at the critical point: a submit commits, and another worker runs the task
    it queued — or, if it queued none, a safety pass, so two passes always meet there."""

    def happen() -> None:
        if submitted:
            return  # once
        submitted.append(helpers.submit(world.bob, world.nlp, gpus=1))
        broker.lpop("celery")  # the other worker takes the task, if the submit queued one
        in_another_worker(passes.run_pass)

    return happen


def hook(monkeypatch, point: str, happen) -> None:
    if point == "during the pass":
        real_pass = passes._one_pass

        def one_pass(now, **kwargs):
            result = real_pass(now, **kwargs)
            happen()  # this worker holds the pass lock
            return result

        monkeypatch.setattr(passes, "_one_pass", one_pass)
        return
    real_check = triggers.asked_again

    def asked_again():
        if point == "before the final check":
            happen()
            return real_check()
        again = real_check()
        if not again:
            happen()  # "queued" was just cleared
        return again

    monkeypatch.setattr(triggers, "asked_again", asked_again)


@pytest.mark.parametrize("point", ["during the pass", "before the final check", "after the final check"])
def test_a_job_submitted_at_any_point_of_another_workers_pass_is_bound(world, broker, monkeypatch, point):
    helpers.make_node("a100-01")
    first = helpers.submit(world.alice, world.vision, gpus=1)  # queues the task this worker runs
    assert broker.lpop("celery") is not None
    submitted: list = []
    hook(monkeypatch, point, meanwhile(world, broker, submitted))

    passes.run_pass()
    monkeypatch.undo()  # the rest runs unhooked, as workers would
    run_queued_tasks(broker)

    (second,) = submitted
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.state == JobState.SCHEDULED
    assert second.state == JobState.SCHEDULED, "the submit's request was lost"
    # Nothing is left stuck: the next submit's request queues a task at once.
    helpers.submit(world.bob, world.nlp, gpus=1)
    assert broker.llen("celery") == 1


def test_a_pass_that_finds_the_lock_taken_looks_again_after_asking(world, broker, monkeypatch):
    # A safety pass (which no request flagged) finds the lock taken, and the holder makes its
    # final check before the flag is set: the loser's second try finds the lock free.
    helpers.make_node("a100-01")
    job = helpers.submit(world.alice, world.vision, gpus=1)
    broker.delete("celery")
    redis_flags.client().delete(redis_flags.key(triggers.AGAIN_FLAG))
    tries = []
    real_try = passes.try_lock

    def try_lock():
        tries.append(1)
        if len(tries) == 1:
            return False  # the holder had the lock: it has given it back since, not asked again
        return real_try()

    monkeypatch.setattr(passes, "try_lock", try_lock)
    result = passes.run_pass()
    assert result is not None and result.bound == [str(job.pk)]
