"""``scheduling.services.redis_outage``: a process says a Redis outage once, and its end once."""

from __future__ import annotations

import logging

import redis

from scheduling.services import redis_outage


def test_an_outage_is_logged_once_in_one_line_and_its_end_once_with_what_failed(caplog):
    redis_outage.answered()  # no outage left over from another test
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tessera.redis"):
        redis_outage.answered()  # Redis answering, no outage: nothing to say
        for _ in range(3):
            redis_outage.failed("live sequence not taken", redis.ConnectionError("Error 111\nmore"))
        redis_outage.answered()
        redis_outage.answered()
        redis_outage.failed("rate limit not counted", redis.TimeoutError("Timeout reading from socket"))
    said = [(r.getMessage(), r.exc_info) for r in caplog.records]
    assert said == [
        ("Redis unreachable: live sequence not taken (Error 111); not logged again until it answers", None),
        ("Redis answers again after 0 s; 3 operations failed meanwhile", None),
        (
            "Redis unreachable: rate limit not counted (Timeout reading from socket); "
            "not logged again until it answers",
            None,
        ),
    ]
    redis_outage.answered()
