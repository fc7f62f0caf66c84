"""Celery tasks: thin, safe to run twice (the pass holds an advisory lock).

The live updates a pass makes leave through the outlet's own thread and event loop
(``scheduling.services.live``), so the task runs the pass right here, on the worker's thread.
"""

from __future__ import annotations

import logging

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import connection, connections

from scheduling.services.health import sweep_nodes
from scheduling.services.passes import run_pass
from scheduling.services.triggers import PASS_TASK
from scheduling.services.webhooks import DELIVER_TASK, deliver_due

log = logging.getLogger("tessera.pass")

# A safety net far above the pass's own time budget (PASS_BUDGET_S, which a pass honours by
# itself): a task runs up to 3 rounds of a pass, each over budget only by its snapshot and its
# applying. The soft limit raises SoftTimeLimitExceeded in the pass (handled below); the hard
# limit kills the worker process (prefork pool only), and PostgreSQL then rolls back its open
# transaction and drops its advisory lock with its connection.
PASS_SOFT_TIME_LIMIT_S = max(60.0, 20 * settings.TESSERA["PASS_BUDGET_S"])
PASS_TIME_LIMIT_S = PASS_SOFT_TIME_LIMIT_S + 30


def _drop_dead_connections() -> None:
    """A connection the database dropped (a restart) is closed: the next query reconnects."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and not conn.is_usable():
            conn.close()


@shared_task(
    bind=True,
    name=PASS_TASK,  # the name the trigger queues it by
    ignore_result=True,
    soft_time_limit=PASS_SOFT_TIME_LIMIT_S,
    time_limit=PASS_TIME_LIMIT_S,
)
def scheduling_pass(self) -> None:
    # The pass clears "queued" when it ends with no request left (services/triggers.py).
    if not self.request.called_directly:  # a test or a shell runs on the caller's connection
        _drop_dead_connections()
    try:
        run_pass()
    except SoftTimeLimitExceeded:
        # Wherever it broke in: the chunk being applied was one transaction (rolled back on
        # the way out, or by the server now), and closing the connection drops the pass lock
        # even if releasing it failed. Beat's safety pass decides the rest.
        log.error("scheduling pass stopped by its soft time limit (%.0f s)", PASS_SOFT_TIME_LIMIT_S)
        connection.close()


@shared_task(bind=True, name="scheduling.tasks.node_health_sweep", ignore_result=True)
def node_health_sweep(self) -> None:
    if not self.request.called_directly:
        _drop_dead_connections()
    sweep_nodes()


@shared_task(bind=True, name=DELIVER_TASK, ignore_result=True)
def deliver_webhooks(self) -> None:
    """Send the webhook deliveries due (queued after the commit that made them; beat retries)."""
    if not self.request.called_directly:
        _drop_dead_connections()
    deliver_due()
