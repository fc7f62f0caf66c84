"""The Celery app: the scheduling pass, the periodic safety pass and the adjustment pass, when
Redis is configured."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_init, worker_ready
from django.conf import settings

from controlplane.env import env_float
from controlplane.gc_tuning import tune_for_server

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# One line per broker outage in beat's log, not a traceback per tick (controlplane/beat.py).
app.conf.beat_scheduler = "controlplane.beat:OutageScheduler"
app.conf.beat_schedule = {
    "scheduling-safety-pass": {
        "task": "scheduling.tasks.scheduling_pass",
        "schedule": env_float("TESSERA_PASS_INTERVAL_S", 5.0, minimum=0.1),  # as settings.py
    },
    "adjustment-pass": {
        "task": "monitoring.tasks.adjustment_pass",
        "schedule": env_float("TESSERA_ADJUST_INTERVAL_S", 30.0, minimum=0.5),
    },
    "node-health-sweep": {
        "task": "scheduling.tasks.node_health_sweep",
        "schedule": 10.0,
    },
    "webhook-deliveries": {  # retries falling due (new deliveries are queued at once)
        "task": "scheduling.tasks.deliver_webhooks",
        "schedule": 10.0,
    },
}


@worker_init.connect
def _quiet_broker_outages(**_: object) -> None:
    if settings.TESSERA["CELERY_OUTAGE_LOG"]:
        from controlplane import celery_outage  # the worker's only: Celery's worker modules

        celery_outage.install(app)  # before the consumer is built: its bootstep is added


@worker_ready.connect
def _tune_gc(**_: object) -> None:
    if settings.TESSERA["GC_TUNING"]:
        tune_for_server()  # the worker has loaded Django and its tasks: see controlplane/gc_tuning.py
