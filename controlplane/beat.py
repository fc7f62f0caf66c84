"""Celery beat's scheduler: the stock persistent one, logging a broker outage once.

Celery's own ``Scheduler.apply_entry`` logs every send that fails with the full stack and
traceback, at every tick of every entry: with Redis (the broker) stopped for 15 s and the safety
pass every second, beat wrote 2,000 lines, and an operator reading its log could not see when
the outage began or ended. Here the first failure is logged in one line, the sends that fail
after it are counted, not logged, and the first send that goes through again says how long it
was and how many scheduled tasks were not queued meanwhile (docs/operations.md, "What happens
when something fails"). Nothing is lost by it: the entries are periodic and the next tick sends
them again.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery.beat import PersistentScheduler, ScheduleEntry

from controlplane.errors import first_line

log = logging.getLogger("tessera.beat")


class OutageScheduler(PersistentScheduler):
    """``PersistentScheduler`` whose failed sends are logged once per outage."""

    failing_since: float | None = None
    missed = 0

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        logging.getLogger("celery.beat").info("Scheduler: Sending due task %s (%s)", entry.name, entry.task)
        try:
            self.apply_async(entry, producer=producer, advance=False)
        except Exception as exc:  # the broker is away: the entry's next tick sends it again
            self.missed += 1
            if self.failing_since is None:
                self.failing_since = time.monotonic()
                log.error(
                    "cannot queue scheduled tasks (%s); retrying at each tick, "
                    "logged again once they are queued",
                    first_line(exc),
                )
            return
        if self.failing_since is not None:
            log.warning(
                "queueing scheduled tasks again after %.0f s; %d sends failed meanwhile",
                time.monotonic() - self.failing_since,
                self.missed,
            )
            self.failing_since, self.missed = None, 0
