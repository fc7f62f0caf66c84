"""The embedded default's pass loop: a thread of the web process that runs the scheduling pass
when one is asked for (``scheduling.services.triggers``) and every ``PASS_INTERVAL_S`` anyway,
as the Celery worker and beat do when Redis is configured (``scheduling/tasks.py``)."""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import close_old_connections

from scheduling.services import webhooks
from scheduling.services.health import sweep_nodes
from scheduling.services.passes import run_pass
from scheduling.services.triggers import wait_for_wake

log = logging.getLogger("tessera.triggers")

WEBHOOK_INTERVAL_S = 5.0  # retries falling due are sent at least this often
_started = threading.Event()


def start_embedded_loop() -> None:
    """Start the in-process pass loop once (the embedded default's web process)."""
    if _started.is_set():
        return
    _started.set()
    thread = threading.Thread(target=_loop, name="tessera-scheduler", daemon=True)
    thread.start()
    # Webhooks in a thread of their own: a slow or dead receiver never holds up a pass.
    threading.Thread(target=_webhook_loop, name="tessera-webhooks", daemon=True).start()


def _loop() -> None:
    interval = settings.TESSERA["PASS_INTERVAL_S"]
    while True:
        wait_for_wake(interval)
        close_old_connections()
        try:
            sweep_nodes()
            run_pass()
        except Exception:
            log.exception("scheduling pass failed")
        finally:
            close_old_connections()


def _webhook_loop() -> None:
    while True:
        webhooks.wait_for_wake(WEBHOOK_INTERVAL_S)
        close_old_connections()
        try:
            webhooks.deliver_due()
        except Exception:
            log.exception("webhook deliveries failed")
        finally:
            close_old_connections()
