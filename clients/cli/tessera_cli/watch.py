"""``tessera watch``: the events of your tenant's jobs as they happen (``GET /jobs/stream/``).

The stream is Server-Sent Events; a dropped connection is made again from the last event's id
(``Last-Event-ID``), so no event is printed twice or lost. ``--since ID`` resumes where an
earlier watch stopped (it prints the id to resume from when it ends).
"""

from __future__ import annotations

import time
from typing import Any

import click
import yaml

from tessera_cli import outcome, output
from tessera_cli.client import StreamBroken, read_events
from tessera_cli.context import SECONDS, Context, output_option, pass_ctx
from tessera_cli.errors import CliError

IDLE_S = 40.0  # no byte for this long (the server sends a keepalive every 15 s): reconnect

EVENT_COLUMNS: list[output.Column] = [
    ("id", lambda e: e.get("id")),
    ("at", lambda e: (e.get("at") or "")[:23]),
    ("job", lambda e: e.get("job")),
    ("name", lambda e: e.get("name")),
    ("type", lambda e: e.get("type")),
    ("reason", lambda e: e.get("reason") or None),
]


@click.command(epilog="With -o json, one JSON object a line (JSON Lines); with -o yaml, one document each.")
@click.option("--since", "since", help="Only events after this event id (where an earlier watch stopped).")
@click.option("--job", "job_filter", type=click.IntRange(1), help="Only this job's events.")
@click.option("--count", "-n", type=click.IntRange(1), help="Stop after this many events.")
@click.option("--timeout", type=SECONDS, help="Stop after this many seconds.")
@output_option
@pass_ctx
def watch(ctx: Context, since, job_filter, count, timeout, fmt):
    """Print the events of your tenant's jobs (operators: every job's) from the first one, or
    from --since, as they happen, until interrupted, --count or --timeout."""
    if since is not None and (not (since.isascii() and since.isdigit()) or len(since) > 18):
        raise CliError(f"--since {since!r}: expected an event id (a positive integer)", outcome.BAD_INPUT)
    client = ctx.client
    if job_filter is not None:  # a job the caller cannot see is a 404 (203), not a wait for nothing
        client.get(f"jobs/{job_filter}/")
    deadline = None if timeout is None else time.monotonic() + timeout
    last, printed, failures = since, 0, 0
    first_row = True
    try:
        while deadline is None or time.monotonic() < deadline:
            idle = IDLE_S if deadline is None else max(0.5, min(IDLE_S, deadline - time.monotonic()))
            try:
                for message in read_events(client, "jobs/stream/", last, {}, idle):
                    failures = 0
                    if message.event != "job-event":
                        if deadline is not None and time.monotonic() >= deadline:
                            return
                        continue
                    last = message.id or last
                    if job_filter is not None and message.data.get("job") != job_filter:
                        continue
                    _print(message.data, fmt, first_row)
                    first_row, printed = False, printed + 1
                    if (count is not None and printed >= count) or (
                        deadline is not None and time.monotonic() >= deadline
                    ):
                        return
            except StreamBroken:
                failures += 1
                if failures > client.retries:
                    raise CliError("the tenant's event stream kept breaking", outcome.UNREACHABLE) from None
                time.sleep(min(0.5 * 2 ** (failures - 1), 8.0))
    finally:
        if last is not None:  # on stderr: -o json's standard output stays one object a line
            click.echo(f"resume with: tessera watch --since {last}", err=True)


def _print(event: dict[str, Any], fmt: str, header: bool) -> None:
    if fmt == "json":
        click.echo(output.as_json(event))
    elif fmt == "yaml":
        click.echo("---\n" + yaml.safe_dump(event, sort_keys=False, allow_unicode=True).rstrip())
    else:
        lines = output.table([event], EVENT_COLUMNS).splitlines()
        click.echo("\n".join(lines if header else lines[1:]))
