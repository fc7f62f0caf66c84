"""What every command shares: the server's client, made once, and the ``-o`` option."""

from __future__ import annotations

import math
from typing import Any

import click

from tessera_cli import config, outcome, output
from tessera_cli.client import TIMEOUT_S, Client
from tessera_cli.errors import CliError


def output_option(command):
    return click.option(
        "-o",
        "--output",
        "fmt",
        type=click.Choice(output.FORMATS),
        default="table",
        show_default=True,
        help="How to print the answer.",
    )(command)


class Seconds(click.ParamType):
    """A positive, finite number of seconds (``nan`` and ``inf`` are floats, but no duration)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0:
            self.fail(f"{value!r}: expected a positive, finite number of seconds", param, ctx)
        return seconds


SECONDS = Seconds()


def job_ids(ids: tuple[str, ...], what: str = "job") -> list[int]:
    out = []
    for raw in ids:
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:  # "²".isdigit(), int("²") fails
            raise CliError(f"{raw!r} is not a {what} id (a positive integer)", outcome.BAD_INPUT)
        out.append(int(raw))
    return out


class Context:
    def __init__(self, url: str | None, argv: list[str], retries: int, timeout: float = TIMEOUT_S) -> None:
        self.url = url
        self.argv = argv
        self.retries = retries
        self.timeout = timeout
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            settings = config.load(self.url)
            self._client = Client(settings.url, settings.token, retries=self.retries, timeout=self.timeout)
        return self._client


pass_ctx = click.make_pass_decorator(Context)
