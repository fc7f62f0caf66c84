"""The Celery worker says a broker outage once, in one line, as every other process does.

Celery's consumer logs each reconnection attempt as an error of its own ("consumer: Cannot connect
to redis://…", two lines and a blank one, every 2 to 30 s for as long as Redis is away), and at
the loss itself a notice, a pending-deprecation warning of eight lines and, with
gossip on (the default), "Error on restarting Gossip" with four chained tracebacks (75 lines):
Celery closes the gossip step's channel after it has dropped the connection (celery 5.7,
``kombu.common.ignore_errors`` on ``None``). An operator could not see when the outage began or
ended.

:class:`BrokerOutageFilter`, on Celery's consumer and bootsteps loggers, hands those records to
``scheduling.services.redis_outage`` instead (one line at the first, the rest at debug level);
:class:`BrokerAnswers`, a consumer bootstep, says when the broker answers again. Other records
pass untouched. A workaround inside a framework (docs/internals.md): it recognises Celery's
records by their logger and message, which Celery does not promise to keep; canary
``tests/infra/test_internals.py``; off switch ``TESSERA_CELERY_OUTAGE_LOG=0``.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps
from celery.worker.consumer import consumer as celery_consumer

from scheduling.services import redis_outage

CONSUMER_LOGGER = "celery.worker.consumer.consumer"
BOOTSTEPS_LOGGER = "celery.bootsteps"
# Python's warnings, which the worker logs (``logging.captureWarnings``): at the first loss of
# each worker, Celery warns that Celery 6 will cancel the tasks running then
# (``worker_cancel_long_running_tasks_on_connection_loss``). Ours are safe to run twice either way.
WARNINGS_LOGGER = "py.warnings"
CANCEL_NOTICE = "worker_cancel_long_running_tasks_on_connection_loss"
WHAT = "the worker's broker connection"
# The consumer's messages (celery-types has no stubs for them).
CONNECTION_RETRY: str = celery_consumer.CONNECTION_RETRY  # type: ignore[attr-defined]
CONNECTION_ERROR: str = celery_consumer.CONNECTION_ERROR  # type: ignore[attr-defined]


def _exception_in(args: Any) -> BaseException | None:
    for arg in args if isinstance(args, tuple) else ():
        if isinstance(arg, BaseException):
            return arg
    return None


class BrokerOutageFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == CONSUMER_LOGGER:
            lost = record.msg == "%s (%r)" and CONNECTION_RETRY in (record.args or ())
            if lost or record.msg == CONNECTION_ERROR:
                redis_outage.failed(WHAT, _exception_in(record.args))
                return False
        elif record.name == WARNINGS_LOGGER:
            return CANCEL_NOTICE not in record.getMessage()
        elif record.name == BOOTSTEPS_LOGGER and redis_outage.down():
            # A step that failed to restart or stop while the connection is gone: part of it.
            redis_outage.failed(WHAT, _exception_in(record.args))
            return False
        return True


class BrokerAnswers(bootsteps.StartStopStep):
    """Started at each (re)connection of the consumer, once the broker answered."""

    requires = ("celery.worker.consumer.connection:Connection",)

    def start(self, parent: Any) -> None:
        redis_outage.answered()


def install(app: Any) -> None:
    """Quiet ``app``'s worker's broker outages (its consumer's bootstep and the filters)."""
    outage_filter = BrokerOutageFilter()
    for name in (CONSUMER_LOGGER, BOOTSTEPS_LOGGER, WARNINGS_LOGGER):
        logging.getLogger(name).addFilter(outage_filter)
    app.steps["consumer"].add(BrokerAnswers)
