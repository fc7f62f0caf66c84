"""Celery tasks: thin, safe to run twice (the pass holds an advisory lock)."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="scheduling.tasks.scheduling_pass", ignore_result=True)
def scheduling_pass() -> None:
    from scheduling.services.passes import run_pass
    from scheduling.services.redis_flags import take_flag
    from scheduling.services.triggers import QUEUED_FLAG

    # Clear "queued" first: a request arriving from now on queues one more task, which either
    # runs after this pass or, finding the lock taken, makes this pass loop once more.
    take_flag(QUEUED_FLAG)
    run_pass()


@shared_task(name="scheduling.tasks.node_health_sweep", ignore_result=True)
def node_health_sweep() -> None:
    from scheduling.services.health import sweep_nodes

    sweep_nodes()
