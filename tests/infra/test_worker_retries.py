"""The Celery worker outlives a Redis outage of any length.

Celery's consumer retries its broker ``broker_connection_max_retries`` times (default 100, 2 to
30 s apart: about 46 minutes), then ends the worker with "Unrecoverable error" (seen with the
limit set to 2 and Redis away: the worker ended 6 s later). A worker ended so ran no pass once
Redis came back unless something restarted it. An outage of 46 minutes cannot be waited for in a
test; the setting the consumer reads is checked, on the app the worker runs.
"""

from __future__ import annotations


def test_the_worker_retries_its_broker_for_as_long_as_redis_is_away():
    from controlplane.celery import app

    assert app.conf.broker_connection_max_retries is None
    assert app.conf.broker_connection_retry and app.conf.broker_connection_retry_on_startup
