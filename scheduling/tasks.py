"""Celery tasks: thin, safe to run twice (the pass holds an advisory lock)."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="scheduling.tasks.scheduling_pass", ignore_result=True)
def scheduling_pass() -> None:
    from scheduling.services.passes import run_pass

    run_pass()


@shared_task(name="scheduling.tasks.node_health_sweep", ignore_result=True)
def node_health_sweep() -> None:
    from scheduling.services.health import sweep_nodes

    sweep_nodes()
