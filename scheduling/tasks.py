"""Celery tasks: thin, safe to run twice (the pass holds an advisory lock).

The live updates a pass makes leave through the outlet's own thread and event loop
(``scheduling.services.live``), so the task runs the pass right here, on the worker's thread.
"""

from __future__ import annotations

from celery import shared_task


def _drop_dead_connections() -> None:
    """A connection the database dropped (a restart) is closed: the next query reconnects."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and not conn.is_usable():
            conn.close()


@shared_task(bind=True, name="scheduling.tasks.scheduling_pass", ignore_result=True)
def scheduling_pass(self) -> None:
    from scheduling.services.passes import run_pass

    # The pass clears "queued" when it ends with no request left (services/triggers.py).
    if not self.request.called_directly:  # a test or a shell runs on the caller's connection
        _drop_dead_connections()
    run_pass()


@shared_task(bind=True, name="scheduling.tasks.node_health_sweep", ignore_result=True)
def node_health_sweep(self) -> None:
    from scheduling.services.health import sweep_nodes

    if not self.request.called_directly:
        _drop_dead_connections()
    sweep_nodes()
