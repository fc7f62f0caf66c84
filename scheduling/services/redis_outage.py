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
import math
import threading
import time

from controlplane.errors import first_line

log = logging.getLogger("tessera.redis")

# A failure within this long of an outage's end is a blip, not a new outage: right after a
# restart, each pooled connection that the old server closed fails once, then reconnects; logged,
# each was an "unreachable" line and an "answers again after 0 s" line.
BLIP_S = 1.0
clock = time.monotonic  # the helper's clock (a test may give a fake one)

_lock = threading.Lock()
_down_since: float | None = None
_failures = 0
_logged = False  # whether this outage's start was logged (so is its end)
_ended_at = -math.inf  # when the last outage ended


def failed(what: str, exc: BaseException | None = None) -> None:
    """``what`` could not be done because Redis did not answer (``exc``: how it failed)."""
    global _down_since, _failures, _logged
    why = first_line(exc) if exc is not None else "no answer"
    now = clock()
    with _lock:
        first = _down_since is None
        if first:
            _down_since, _failures, _logged = now, 0, now - _ended_at >= BLIP_S
        _failures += 1
        say = first and _logged
    if say:
        log.warning("Redis unreachable: %s (%s); not logged again until it answers", what, why)
    else:
        log.debug("Redis unreachable: %s (%s)", what, why)


def down() -> bool:
    """Whether this process is in an outage: something failed and nothing has answered since."""
    return _down_since is not None


def answered() -> None:
    """Redis answered: the end of an outage, if there was one (logged once)."""
    global _down_since, _failures, _ended_at
    if _down_since is None:  # the common case: no lock, nothing to say
        return
    with _lock:
        if _down_since is None:
            return
        now = clock()
        lasted, failures, say = now - _down_since, _failures, _logged
        _down_since, _failures, _ended_at = None, 0, now
    if say:
        log.warning("Redis answers again after %.0f s; %d operations failed meanwhile", lasted, failures)


def forget() -> None:
    """Forget any outage in progress or just ended (tests start from a quiet Redis)."""
    global _down_since, _failures, _ended_at
    with _lock:
        _down_since, _failures, _ended_at = None, 0, -math.inf
