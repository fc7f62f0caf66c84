"""The embedded default's adjustment loop: a thread of the web process running the adjustment
pass every ``ADJUST_INTERVAL_S``, as Celery beat does when Redis is configured."""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import close_old_connections

from monitoring.adjust import adjust_once

log = logging.getLogger("tessera.adjust")

_started = threading.Event()


def start_adjust_loop() -> None:
    """Start the in-process adjustment loop once."""
    if _started.is_set():
        return
    _started.set()
    threading.Thread(target=_loop, name="tessera-adjust", daemon=True).start()


def _loop() -> None:
    interval = settings.TESSERA["ADJUST_INTERVAL_S"]
    while True:
        time.sleep(interval)
        close_old_connections()
        try:
            adjust_once()
        except Exception:
            log.exception("adjustment pass failed")
        finally:
            close_old_connections()
