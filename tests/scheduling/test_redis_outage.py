"""``scheduling.services.redis_outage``: a process says a Redis outage once, and its end once."""

from __future__ import annotations

import logging

import redis

from scheduling.services import redis_outage


def test_an_outage_is_logged_once_in_one_line_and_its_end_once_with_what_failed(caplog, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(redis_outage, "clock", lambda: now[0])
    redis_outage.forget()  # no outage left over from another test
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tessera.redis"):
        redis_outage.answered()  # Redis answering, no outage: nothing to say
        for _ in range(3):
            redis_outage.failed("live sequence not taken", redis.ConnectionError("Error 111\nmore"))
        now[0] += 17
        redis_outage.answered()
        redis_outage.answered()
        now[0] += 60
        redis_outage.failed("rate limit not counted", redis.TimeoutError("Timeout reading from socket"))
    said = [(r.getMessage(), r.exc_info) for r in caplog.records]
    assert said == [
        ("Redis unreachable: live sequence not taken (Error 111); not logged again until it answers", None),
        ("Redis answers again after 17 s; 3 operations failed meanwhile", None),
        (
            "Redis unreachable: rate limit not counted (Timeout reading from socket); "
            "not logged again until it answers",
            None,
        ),
    ]
    redis_outage.forget()


def test_a_stale_connection_failing_right_after_an_outage_ends_is_not_a_new_outage(caplog, monkeypatch):
    """Right after Redis restarts, each pooled connection the old server closed fails once: a web
    process said "unreachable" and "answers again after 0 s" three times in 50 ms."""
    now = [100.0]
    monkeypatch.setattr(redis_outage, "clock", lambda: now[0])
    redis_outage.forget()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tessera.redis"):
        redis_outage.failed("a live update not delivered", redis.ConnectionError("Error 111"))
        now[0] += 17
        redis_outage.answered()
        for _ in range(3):
            now[0] += 0.01
            redis_outage.failed("an agent's stream closed (4013)", redis.ConnectionError("Connection closed"))
            redis_outage.answered()
    assert [r.getMessage().split(" (")[0].split(";")[0] for r in caplog.records] == [
        "Redis unreachable: a live update not delivered",
        "Redis answers again after 17 s",
    ]
    redis_outage.forget()
