"""The Celery app: the scheduling pass and the periodic safety pass, when Redis is configured."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

app.conf.beat_schedule = {
    "scheduling-safety-pass": {
        "task": "scheduling.tasks.scheduling_pass",
        "schedule": float(os.environ.get("TESSERA_PASS_INTERVAL_S", "5") or 5),
    },
    "node-health-sweep": {
        "task": "scheduling.tasks.node_health_sweep",
        "schedule": 10.0,
    },
}
