"""The adjustment pass as a Celery task (beat runs it every ``TESSERA_ADJUST_INTERVAL_S``)."""

from __future__ import annotations

from celery import shared_task

from monitoring.adjust import adjust_once

ADJUST_TASK = "monitoring.tasks.adjustment_pass"


@shared_task(name=ADJUST_TASK, ignore_result=True, soft_time_limit=120, time_limit=150)
def adjustment_pass() -> None:
    adjust_once()
