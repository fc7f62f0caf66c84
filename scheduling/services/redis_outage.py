"""One line per Redis outage in a process's log, and one when it ends.

Redis carries what may be lost (pass triggers, live updates, rate-limit counts, the agents'
pushed wakes: docs/operations.md, "What happens when something fails"), so every place that
reaches it carries on without it. Each used to log its own failure, often with a traceback, at
every request, pass, reconnection or socket: stopped for 15 s under one agent and a few
requests, Redis cost the web's log 800 lines, and with a cluster's agents and users an outage
of minutes buries when it began and ended. Those places call :func:`failed` instead: the first
failure since Redis last answered is logged in one line (what failed, and why), the others at
debug level; and :func:`answered` where they reach it, which logs the end of an outage once,
with how long it was and how much failed meanwhile. Per process: each of them says it once.
"""

from __future__ import annotations

import logging
import threading
import time

from controlplane.errors import first_line

log = logging.getLogger("tessera.redis")

_lock = threading.Lock()
_down_since: float | None = None
_failures = 0


def failed(what: str, exc: BaseException | None = None) -> None:
    """``what`` could not be done because Redis did not answer (``exc``: how it failed)."""
    global _down_since, _failures
    why = first_line(exc) if exc is not None else "no answer"
    with _lock:
        first = _down_since is None
        if first:
            _down_since, _failures = time.monotonic(), 0
        _failures += 1
    if first:
        log.warning("Redis unreachable: %s (%s); not logged again until it answers", what, why)
    else:
        log.debug("Redis unreachable: %s (%s)", what, why)


def answered() -> None:
    """Redis answered: the end of an outage, if there was one (logged once)."""
    global _down_since, _failures
    if _down_since is None:  # the common case: no lock, nothing to say
        return
    with _lock:
        if _down_since is None:
            return
        lasted, failures = time.monotonic() - _down_since, _failures
        _down_since, _failures = None, 0
    log.warning("Redis answers again after %.0f s; %d operations failed meanwhile", lasted, failures)
