"""Per-user request limits: 429 with Retry-After above them, nothing lost, other users unaffected."""

from __future__ import annotations

import pytest

from scheduling.api import throttling
from scheduling.models import Job
from tests.agent.helpers import heartbeat, new_join_token, register
from tests.support import free_port

BODY = {"name": "t", "kind": "batch", "command": ["true"], "gpus": 1}


def submit(world, who: str):
    return world.client(who).post("/api/v1/jobs/", BODY, format="json")


def test_a_user_over_the_submit_limit_gets_429_with_retry_after_and_no_job(world, settings):
    settings.TESSERA_RATE_LIMITS = {"submit": (3, 60), "api": None}
    assert [submit(world, "alice").status_code for _ in range(3)] == [201, 201, 201]
    refused = submit(world, "alice")
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert "throttled" in refused.json()["detail"].lower()
    assert Job.objects.filter(tenant__name="vision").count() == 3  # the refused one was not kept
    # Only submissions count against "submit": alice can still read, and bob is not limited by her.
    assert world.client("alice").get("/api/v1/jobs/").status_code == 200
    assert submit(world, "bob").status_code == 201


def test_every_user_request_counts_against_the_api_limit(world, settings):
    settings.TESSERA_RATE_LIMITS = {"submit": None, "api": (4, 60)}
    alice = world.client("alice")
    codes = [alice.get("/api/v1/jobs/").status_code for _ in range(4)]
    codes.append(submit(world, "alice").status_code)
    assert codes == [200, 200, 200, 200, 429]
    assert world.client("carol").get("/api/v1/jobs/").status_code == 200  # per user, not per tenant


def test_limits_off_let_everything_through(world, settings):
    settings.TESSERA_RATE_LIMITS = {"submit": None, "api": None}
    assert {submit(world, "alice").status_code for _ in range(20)} == {201}


def test_agents_are_never_limited(db, settings):
    settings.TESSERA_RATE_LIMITS = {"submit": (1, 60), "api": (1, 60)}
    node, _ = register(new_join_token())
    for _ in range(5):
        heartbeat(node)  # asserts 200 each time


@pytest.mark.redis("the counts are shared between web processes only in Redis")
def test_with_redis_the_count_is_shared_by_every_web_process(world, settings, redis_url):
    settings.REDIS_URL = redis_url
    settings.TESSERA_RATE_LIMITS = {"submit": (2, 60), "api": None}
    throttling.forget_counts()
    assert [submit(world, "alice").status_code for _ in range(2)] == [201, 201]
    throttling.local_counters.clear()  # another process's memory: the count lives in Redis
    assert submit(world, "alice").status_code == 429
    throttling.forget_counts()
    assert submit(world, "alice").status_code == 201


@pytest.mark.parametrize(
    ("value", "expected"), [("1200/m", (1200, 60)), ("5/s", (5, 1)), ("100/h", (100, 3600)), ("off", None)]
)
def test_rates_are_read_from_the_environment(monkeypatch, value, expected):
    from controlplane.env import env_rate

    monkeypatch.setenv("TESSERA_TEST_RATE", value)
    assert env_rate("TESSERA_TEST_RATE", "1/s") == expected


@pytest.mark.parametrize("value", ["fast", "0/m", "10/day", "-1/s", "10"])
def test_a_bad_rate_names_the_variable(monkeypatch, value):
    from controlplane.env import ImproperlyConfiguredEnv, env_rate

    monkeypatch.setenv("TESSERA_TEST_RATE", value)
    with pytest.raises(ImproperlyConfiguredEnv, match="TESSERA_TEST_RATE"):
        env_rate("TESSERA_TEST_RATE", "1/s")


def test_requests_while_redis_is_away_are_answered_and_the_outage_logged_once(
    world, settings, monkeypatch, caplog
):
    """Uncounted, not refused; and one line in the web's log for the outage, not one per request
    (a cluster's users made it most of the log)."""
    import logging

    import redis

    from scheduling.services import redis_flags, redis_outage

    redis_outage.forget()  # no outage left over from another test
    caplog.clear()
    away = redis.Redis(host="127.0.0.1", port=free_port(), socket_timeout=1)
    settings.REDIS_URL = "redis://127.0.0.1:6379/0"
    settings.TESSERA_RATE_LIMITS = {"submit": (1, 60), "api": (1, 60)}
    monkeypatch.setattr(redis_flags, "client", lambda: away)
    with caplog.at_level(logging.DEBUG, logger="tessera.redis"):
        codes = [world.client("alice").get("/api/v1/jobs/").status_code for _ in range(5)]
    assert codes == [200] * 5
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and "rate limit not counted" in said[0], said
    assert len([r for r in caplog.records if r.name == "tessera.redis"]) == 5  # the rest at debug
    redis_outage.forget()
