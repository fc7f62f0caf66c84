"""Waiting for a job's end, and following its output, without polling the server in a loop.

The job is read with ``GET /api/v1/jobs/ID/?wait=S``: the server answers when the job's state
changes or ``S`` seconds pass, so a waiting CLI costs one request per state change (or per
``S`` seconds), not one a second. A server that answers at once (an older one, without the
long-poll) is read again only after a pause, so the CLI never spins.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from tessera_cli.client import Client
from tessera_cli.outcome import TERMINAL

LONG_POLL_S = 50  # below the server's bound (55 s) and common proxies' 60 s idle limit
MIN_ROUND_S = 1.0  # an answer quicker than this with nothing changed: pause before the next
LOG_IDLE_S = 1.0


class WaitTimeout(Exception):
    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__("wait timed out")
        self.job = job


def wait_for_end(
    client: Client,
    job_id: int,
    timeout: float | None,
    on_change: Callable[[dict[str, Any]], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """The job once it is in a terminal state; :class:`WaitTimeout` after ``timeout`` seconds."""
    deadline = None if timeout is None else clock() + timeout
    job = client.get(f"jobs/{job_id}/")
    state = job["state"]
    while job["state"] not in TERMINAL:
        left = LONG_POLL_S if deadline is None else min(LONG_POLL_S, deadline - clock())
        if left <= 0:
            raise WaitTimeout(job)
        began = clock()
        seconds = max(1, int(left))
        job = client.get(f"jobs/{job_id}/", params={"wait": seconds}, timeout=seconds + 30)
        if job["state"] != state:
            state = job["state"]
            if on_change is not None:
                on_change(job)
        elif clock() - began < MIN_ROUND_S and job["state"] not in TERMINAL:
            sleep(MIN_ROUND_S)
    return job


def follow_logs(
    client: Client,
    job_id: int,
    replica: int = 0,
    offset: int = 0,
    write: Callable[[str], None] | None = None,
    deadline: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Write the job's output from ``offset`` as it comes, until its end (the log's ``eof``).
    Returns the offset reached; :class:`WaitTimeout` once ``deadline`` (monotonic) passes."""
    write = write or _stdout
    while True:
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(client.get(f"jobs/{job_id}/"))
        page = client.get(f"jobs/{job_id}/logs/", params={"offset": offset, "replica": replica})
        if page.get("data"):
            write(page["data"])
        advanced = page.get("next_offset", offset) != offset
        offset = page.get("next_offset", offset)
        if page.get("eof"):
            return offset
        if not advanced:
            sleep(LOG_IDLE_S)


def _stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
