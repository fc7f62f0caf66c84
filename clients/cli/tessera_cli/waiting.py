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

from tessera_cli import outcome
from tessera_cli.client import Client, StreamBroken, read_events
from tessera_cli.errors import CliError
from tessera_cli.outcome import TERMINAL
from tessera_cli.output import visible

LONG_POLL_S = 50  # below the server's bound (55 s) and common proxies' 60 s idle limit
MIN_ROUND_S = 1.0  # an answer quicker than this with nothing changed: pause before the next
STREAM_IDLE_S = 40.0  # no byte for this long (the server sends one every 15 s): reconnect
# A wait without --wait-timeout rides out a server it cannot reach for this long (a rollout, a
# restart); with one, until it passes. The client's own retries give up after about 15 s, and a
# CI step waiting on a long job then failed (exit 202) while the job ran on.
OUTAGE_S = 600.0
OUTAGE_PAUSE_S = 5.0


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
        job = _read_riding_out(
            client,
            job_id,
            job,
            deadline,
            clock,
            sleep,
            params={"wait": seconds},
            timeout=seconds + client.timeout,
        )
        if job["state"] != state:
            state = job["state"]
            if on_change is not None:
                on_change(job)
        elif clock() - began < MIN_ROUND_S and job["state"] not in TERMINAL:
            sleep(MIN_ROUND_S)
    return job


def _read_riding_out(
    client: Client,
    job_id: int,
    job: dict[str, Any],
    deadline: float | None,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    **kwargs: Any,
) -> dict[str, Any]:
    """Job ``job_id`` read (``client.get`` with ``kwargs``), and read again while the server
    cannot be reached (exit code 202 once the client's own retries are spent): until
    ``deadline`` (then :class:`WaitTimeout` with ``job``, as last read) or, without one, for
    :data:`OUTAGE_S`; said once on stderr."""
    since: float | None = None
    while True:
        try:
            return client.get(f"jobs/{job_id}/", **kwargs)
        except CliError as exc:
            if exc.code != outcome.UNREACHABLE:
                raise
            now = clock()
            if since is None:
                since = now
                print(f"tessera: {exc.message}; still waiting for the job", file=sys.stderr, flush=True)
            if deadline is not None and now >= deadline:
                raise WaitTimeout(job) from None
            if deadline is None and now - since >= OUTAGE_S:
                raise
            sleep(OUTAGE_PAUSE_S if deadline is None else max(0.0, min(OUTAGE_PAUSE_S, deadline - now)))


def follow_logs(
    client: Client,
    job_id: int,
    replica: int = 0,
    write: Callable[[str], None] | None = None,
    deadline: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    on_log: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Write the job's output as it comes, until the job has ended and all of it was written.

    Read from the job's event stream (``GET /jobs/ID/stream/``, Server-Sent Events). A dropped
    connection is made again from the last message's id, so nothing is written twice or lost;
    :class:`WaitTimeout` once ``deadline`` (monotonic) passes. ``on_log``, if given, gets each
    output message whole (``replica``, ``offset``, ``next_offset``, ``data``, ``eof``,
    ``truncated``) instead of ``write`` its text."""
    write = write or _stdout
    last: str | None = None
    failures = 0
    while True:
        try:
            for message in read_events(
                client, f"jobs/{job_id}/stream/", last, {"replica": replica}, _read_timeout(deadline)
            ):
                failures = 0
                last = message.id or last
                if message.event == "log" and on_log is not None:
                    on_log(message.data)
                elif message.event == "log":
                    write(message.data.get("data", ""))
                elif message.event == "end":
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    break
        except StreamBroken:
            failures += 1
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(client.get(f"jobs/{job_id}/"))
        if failures > client.retries:
            raise CliError(f"the stream of job {job_id} kept breaking", outcome.UNREACHABLE)
        if failures:
            sleep(min(0.5 * 2 ** (failures - 1), 8.0))


def _read_timeout(deadline: float | None) -> float:
    """Longer than the server's keepalive (15 s), or until the deadline."""
    if deadline is None:
        return STREAM_IDLE_S
    return max(1.0, min(STREAM_IDLE_S, deadline - time.monotonic()))


def _stdout(text: str) -> None:
    """A job's output, to the terminal: its control characters written out (output.visible)."""
    sys.stdout.write(visible(text))
    sys.stdout.flush()
