"""The ``tessera`` command: submit, wait, follow, inspect and stop jobs on a Tessera cluster.

Every command takes ``-o json|yaml|table``; every failure is one line on stderr and a documented
exit code (``tessera --help``), never a traceback.
"""

from __future__ import annotations

import getpass
import math
import os
import socket
import sys
import time
from typing import Any

import click
import yaml

from tessera_cli import __version__, config, idempotency, jobfile, outcome, output, watch, webhooks
from tessera_cli.client import RETRIES, TIMEOUT_S, Client, DeadlinePassed
from tessera_cli.context import SECONDS, Context, job_ids, output_option, pass_ctx
from tessera_cli.errors import CliError
from tessera_cli.waiting import WaitTimeout, follow_logs, wait_for_end

_ARGV: list[str] = []  # this run's arguments (``split_words`` needs to see where ``--`` was)

EXIT_CODES_HELP = "\b\nExit codes:\n" + outcome.table_text()

JOB_COLUMNS: list[output.Column] = [
    ("id", lambda j: j.get("id")),
    ("name", lambda j: j.get("name")),
    ("owner", lambda j: j.get("owner")),
    ("kind", lambda j: j.get("kind")),
    ("state", lambda j: j.get("state")),
    ("gpus", lambda j: j.get("gpus")),
    ("reason", lambda j: j.get("pending_code") or _end_reason(j)),
    ("submitted", lambda j: (j.get("submitted_at") or "")[:19]),
]


def _end_reason(job: dict[str, Any]) -> str | None:
    if job.get("state") in ("succeeded", "failed") and job.get("exit_code") is not None:
        return f"exit {job['exit_code']}"
    return None


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=EXIT_CODES_HELP,
)
@click.option(
    "--url", envvar="TESSERA_URL", help="The server, e.g. https://tessera.example.org (TESSERA_URL)."
)
@click.option(
    "--retries",
    envvar="TESSERA_RETRIES",
    type=click.IntRange(0, 20),
    default=RETRIES,
    show_default=True,
    help="Retries of a request after a transient fault, with backoff (TESSERA_RETRIES).",
)
@click.option(
    "--timeout",
    envvar="TESSERA_TIMEOUT",
    type=click.FloatRange(min=1, max=3600),
    default=TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for each answer before it counts as a transient fault (TESSERA_TIMEOUT).",
)
@click.version_option(__version__, prog_name="tessera")
@click.pass_context
def cli(ctx: click.Context, url: str | None, retries: int, timeout: float) -> None:
    """Submit, wait for, follow and stop jobs on a Tessera GPU cluster.

    The server and token come from TESSERA_URL and TESSERA_TOKEN, or from the file
    `tessera login` writes.
    """
    ctx.obj = Context(url, _ARGV, retries, timeout)


# --- submit ---------------------------------------------------------------------------------


def _env_pairs(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--env {item!r}: expected KEY=VALUE", outcome.BAD_INPUT)
        out[key] = value
    return out


def _number(text: str, option: str) -> int | float:
    try:
        value = float(text)
    except ValueError:
        raise CliError(f"{option} {text!r}: expected a number", outcome.BAD_INPUT) from None
    if not math.isfinite(value):  # JSON has no NaN or infinity
        raise CliError(f"{option} {text!r}: expected a finite number", outcome.BAD_INPUT)
    return int(value) if value.is_integer() else value


def split_words(words: tuple[str, ...], argv: list[str]) -> tuple[str | None, tuple[str, ...]]:
    """JOB_FILE and the command from the positional words: what follows ``--`` is the command
    (click hands both over as one list, so the raw arguments tell where ``--`` was)."""
    after = len(argv) - argv.index("--") - 1 if "--" in argv else 0
    before, command = words[: len(words) - after], words[len(words) - after :]
    if len(before) > 1:
        raise CliError(
            f"one job file at most (got {' '.join(before)}); put the command after --", outcome.BAD_INPUT
        )
    return (before[0] if before else None), tuple(command)


def build_body(job_file: str | None, command: tuple[str, ...], options: dict[str, Any]) -> dict[str, Any]:
    """The job body: the file's, then the options given on the line (they win), then the command."""
    body: dict[str, Any] = jobfile.read(job_file)[0] if job_file else {}
    if options["name"] is not None:
        body["name"] = options["name"]
    if options["kind"] is not None:
        body["kind"] = options["kind"]
    if options["gpus"] is not None:
        body["gpus"] = _number(options["gpus"], "--gpus")
    for key in ("replicas", "priority", "time_limit_seconds", "max_retries"):
        if options[key] is not None:
            body[key] = options[key]
    if options["accelerator"]:
        body["accelerators"] = list(options["accelerator"])
    if options["env"]:
        body["env"] = {**(body.get("env") or {}), **_env_pairs(options["env"])}
    if options["tenant"] is not None:
        body["tenant"] = options["tenant"]
    if command:
        body["command"] = list(command)
    if not body.get("command"):
        raise CliError("no command: give a job file with `command`, or `-- CMD ARGS...`", outcome.BAD_INPUT)
    if "name" not in body:
        body["name"] = os.path.basename(str(body["command"][0]))[:128] or "job"
    body.setdefault("kind", "batch")
    return body


@cli.command(epilog=EXIT_CODES_HELP)
@click.argument("words", nargs=-1, type=click.UNPROCESSED)
@click.option("--name", help="The job's name (default: the file's, else the command's).")
@click.option(
    "--kind", type=click.Choice(["batch", "training", "finetune", "inference"]), help="Default: batch."
)
@click.option("--gpus", help="GPUs in all (a fraction below 1 asks for a share of one GPU).")
@click.option("--replicas", type=int, help="Replicas of a gang (each gets gpus / replicas).")
@click.option(
    "--accelerator", "-a", multiple=True, help="An acceptable GPU model (repeat, in preference order)."
)
@click.option("--priority", type=int)
@click.option("--time-limit", "time_limit_seconds", type=int, help="Seconds; the job is stopped there.")
@click.option("--max-retries", type=int)
@click.option("--env", "-e", multiple=True, help="KEY=VALUE for the job's environment (repeat).")
@click.option("--tenant", help="Operators only: the tenant to submit for.")
@click.option("--wait", "wait", is_flag=True, help="Wait for the job's end and exit with its exit code.")
@click.option("--wait-timeout", type=SECONDS, help="With --wait: give up after this many seconds (exit 204).")
@click.option("--follow", "-f", is_flag=True, help="Stream the job's output while waiting (implies --wait).")
@click.option(
    "--dry-run", is_flag=True, help="Ask the server whether and where it would start; submit nothing."
)
@click.option(
    "--idempotency-key",
    help="Makes a repeated submit return the first job. Default in CI: derived from the run, "
    "its attempt and the step (GitHub Actions, GitLab CI, Jenkins) and the job's body.",
)
@output_option
@pass_ctx
def submit(ctx: Context, words, fmt, wait, wait_timeout, follow, dry_run, idempotency_key, **options):
    """Submit a job from JOB_FILE (YAML or JSON; - for stdin) and/or options and `-- CMD ARGS...`.

    \b
      tessera submit job.yaml --wait
      tessera submit --gpus 2 --name train -- python train.py --epochs 3
    """
    job_file, command = split_words(words, ctx.argv)
    body = build_body(job_file, command, options)
    wait = wait or follow
    if wait_timeout is not None and not wait:
        raise CliError("--wait-timeout takes a positive number of seconds, with --wait", outcome.BAD_INPUT)
    client = ctx.client
    if dry_run:
        _, answer = client.post("jobs/", body, params={"dry_run": "true"})
        output.emit(answer, fmt)
        return
    key = idempotency_key or idempotency.derive(os.environ, jobfile.body_digest(body))
    headers = {"Idempotency-Key": key} if key else None
    try:
        status, job = client.post("jobs/", body, headers=headers)
    except CliError as exc:
        if _refused_by_quota(exc):
            exc.code = outcome.UNSCHEDULABLE
        _emit_failure(None, exc, fmt, "refused" if exc.code == outcome.UNSCHEDULABLE else "error")
        raise
    if not wait:
        output.emit(job, fmt, JOB_COLUMNS, [job])
        return
    if fmt == "table":
        verb = "submitted" if status == 201 else "already submitted (same idempotency key)"
        click.echo(f"job {job['id']} {verb}; waiting for its end", err=True)
    try:
        code = _wait_and_report(client, job, wait_timeout, follow, fmt)
    except CliError as exc:
        _emit_failure(job, exc, fmt, "error")
        raise
    raise SystemExit(code)


def _emit_failure(job: dict[str, Any] | None, exc: CliError, fmt: str, name: str) -> None:
    """For ``-o json|yaml``: the outcome of a submit that failed (``job`` null if none was made),
    so that what a script keeps of it is always the outcome, never an empty file."""
    if fmt != "table":
        error = exc.body if isinstance(exc.body, dict) else exc.message
        output.emit({"job": job, "outcome": name, "error": error, "cli_exit_code": exc.code}, fmt)


def _refused_by_quota(exc: CliError) -> bool:
    """A 400 naming only ``accelerators`` with a quota's words: no quota of the tenant can ever
    admit the job (any other 400 is bad input)."""
    body = exc.body
    if exc.code != outcome.BAD_INPUT or not isinstance(body, dict) or set(body) != {"accelerators"}:
        return False
    return any("quota" in str(reason) for reason in body["accelerators"])


def _wait_and_report(
    client: Client, submitted: dict[str, Any], timeout: float | None, follow: bool, fmt: str
) -> int:
    job_id = submitted["id"]
    last = submitted  # the job as last read: what a wait-timeout reports if the server hangs

    def changed(job: dict[str, Any]) -> None:
        nonlocal last
        last = job
        if fmt == "table":
            click.echo(f"job {job_id}: {job['state']}", err=True)

    deadline = None if timeout is None else time.monotonic() + timeout
    client.deadline = deadline  # a server that hangs cannot hold the command past it
    try:
        if follow:  # ends at the log's eof, which comes with the job's end
            follow_logs(client, job_id, deadline=deadline)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        job = wait_for_end(client, job_id, left, on_change=changed)
    except (WaitTimeout, DeadlinePassed) as timed_out:
        known = timed_out.job if isinstance(timed_out, WaitTimeout) else last
        result = {"job": known, "outcome": "wait-timeout", "cli_exit_code": outcome.WAIT_TIMEOUT}
        if fmt != "table":
            output.emit(result, fmt)
        else:
            why = "" if isinstance(timed_out, WaitTimeout) else f" (last read; {timed_out.message})"
            click.echo(f"job {job_id} is still {known['state']}{why} after --wait-timeout", err=True)
        return outcome.WAIT_TIMEOUT
    finally:
        client.deadline = None
    ended = outcome.outcome_of(job, _events(client, job_id))
    if fmt == "table":
        code = f", exit code {ended.exit_code}" if ended.exit_code is not None else ""
        click.echo(f"job {job_id} {ended.name}{code}", err=True)
    else:
        output.emit({"job": job, **ended.as_dict()}, fmt)
    return ended.code


# --- reading ----------------------------------------------------------------------------------


@cli.command("ls")
@click.option("--state", help="Only jobs in this state.")
@click.option("--kind", help="Only jobs of this kind.")
@click.option("--name", help="Only jobs with exactly this name.")
@click.option("--owner", help="Only jobs this user submitted.")
@click.option("--tenant", help="Operators: only this tenant's jobs.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=50, show_default=True)
@output_option
@pass_ctx
def list_jobs(ctx: Context, limit, fmt, **filters):
    """Your tenant's jobs, newest first."""
    params = {k: v for k, v in filters.items() if v is not None}
    jobs = list(ctx.client.pages("jobs/", params, limit=limit))
    output.emit(jobs, fmt, JOB_COLUMNS)


@cli.command()
@click.argument("job_id")
@output_option
@pass_ctx
def status(ctx: Context, job_id, fmt):
    """One job: its state, where it runs, its exit code."""
    (jid,) = job_ids((job_id,))
    job = ctx.client.get(f"jobs/{jid}/")
    output.emit(job, fmt)


WHY_FIELDS = (
    "state",
    "pending_code",
    "pending_reason",
    "estimated_start",
    "estimated_start_earliest",
    "estimated_start_latest",
    "estimate_basis",
    "queue_position",
    "jobs_ahead",
)


@cli.command()
@click.argument("job_id")
@output_option
@pass_ctx
def why(ctx: Context, job_id, fmt):
    """Why a job waits: its pending code, the sentence, and when it may start."""
    (jid,) = job_ids((job_id,))
    job = ctx.client.get(f"jobs/{jid}/")
    answer = {"id": job["id"], **{k: job[k] for k in WHY_FIELDS if k in job}}
    if fmt == "table" and job["state"] != "pending":
        click.echo(f"job {jid} is {job['state']}, not waiting")
        return
    output.emit(answer, fmt)


@cli.command()
@click.argument("job_id")
@click.option("--follow", "-f", is_flag=True, help="Keep printing output as it comes, until the job ends.")
@click.option("--replica", type=click.IntRange(0), default=0, show_default=True)
@click.option(
    "--raw",
    is_flag=True,
    help="Print the output's control characters as the job wrote them (colours, and whatever "
    "else it sends your terminal), not written out as \\xNN.",
)
@output_option
@pass_ctx
def logs(ctx: Context, job_id, follow, replica, raw, fmt):
    """A job's output (one replica's): as it is (table), or with where it ended (json, yaml)."""
    (jid,) = job_ids((job_id,))
    shown = (lambda text: text) if raw else output.visible
    if follow:
        # -o json: one object a line (JSON Lines), as `watch` prints; -o yaml: one document each
        on_log = None if fmt == "table" else (lambda message: _emit_piece(message, fmt))
        follow_logs(ctx.client, jid, replica, write=_write if raw else None, on_log=on_log)
        return
    offset, pieces, page = 0, [], {}
    while True:
        page = ctx.client.get(f"jobs/{jid}/logs/", params={"offset": offset, "replica": replica})
        pieces.append(page.get("data", ""))
        if fmt == "table":
            sys.stdout.write(shown(pieces.pop()))
        if page.get("next_offset", offset) == offset:
            break
        offset = page["next_offset"]
    if fmt == "table":
        sys.stdout.flush()
        return
    answer = {
        "data": "".join(pieces),
        "next_offset": offset,
        "eof": page.get("eof"),
        "truncated": page.get("truncated"),
    }
    output.emit(answer, fmt)


def _emit_piece(message: dict[str, Any], fmt: str) -> None:
    """A piece of output that ``logs -f`` got, for a script: ``data``, ``offset``,
    ``next_offset``, ``eof``, ``truncated``."""
    piece = {k: message.get(k) for k in ("data", "offset", "next_offset", "eof", "truncated")}
    if fmt == "json":
        click.echo(output.as_json(piece))
    else:
        click.echo("---\n" + yaml.safe_dump(piece, sort_keys=False, allow_unicode=True).rstrip())
    sys.stdout.flush()


def _write(text: str) -> None:
    """A job's output as it is (``logs -f --raw``)."""
    sys.stdout.write(text)
    sys.stdout.flush()


EVENT_COLUMNS: list[output.Column] = [
    ("at", lambda e: (e.get("at") or "")[:23]),
    ("type", lambda e: e.get("type")),
    ("reason", lambda e: e.get("reason")),
    (
        "allocations",
        lambda e: (
            " ".join(f"{a['node']}:{','.join(map(str, a['gpus']))}" for a in e.get("allocations") or [])
            or None
        ),
    ),
]


@cli.command()
@click.argument("job_id")
@output_option
@pass_ctx
def events(ctx: Context, job_id, fmt):
    """A job's history, in order."""
    (jid,) = job_ids((job_id,))
    output.emit(_events(ctx.client, jid), fmt, EVENT_COLUMNS)


def _events(client: Client, job_id: int) -> list[dict[str, Any]]:
    """A job's events: a plain list (an older server: a page of them)."""
    return list(client.pages(f"jobs/{job_id}/events/", {}))


# --- changing ----------------------------------------------------------------------------------


def _act(ctx: Context, action: str, ids: tuple[str, ...], fmt: str) -> None:
    """POST ``action`` to each job; every job is tried, the first failure's code is the exit."""
    results, first_error = [], None
    for jid in job_ids(ids):
        try:
            _, job = ctx.client.post(f"jobs/{jid}/{action}/")
            results.append(job)
        except CliError as exc:
            if exc.code in (outcome.AUTH, outcome.UNREACHABLE):
                raise
            click.echo(f"tessera: job {jid}: {exc.message}", err=True)
            first_error = first_error or exc.code
    output.emit(results, fmt, JOB_COLUMNS)
    if first_error:
        raise SystemExit(first_error)


@cli.command()
@click.argument("ids", nargs=-1, required=True)
@output_option
@pass_ctx
def cancel(ctx: Context, ids, fmt):
    """Cancel jobs (cancelling a cancelled job is not an error)."""
    _act(ctx, "cancel", ids, fmt)


@cli.command()
@click.argument("ids", nargs=-1, required=True)
@output_option
@pass_ctx
def hold(ctx: Context, ids, fmt):
    """Keep waiting jobs from starting until released."""
    _act(ctx, "hold", ids, fmt)


@cli.command()
@click.argument("ids", nargs=-1, required=True)
@output_option
@pass_ctx
def release(ctx: Context, ids, fmt):
    """Let held jobs start again."""
    _act(ctx, "release", ids, fmt)


# --- the cluster ----------------------------------------------------------------------------------

QUOTA_COLUMNS: list[output.Column] = [
    ("tenant", lambda q: q.get("tenant")),
    ("model", lambda q: q.get("model")),
    ("guaranteed", lambda q: q.get("guaranteed")),
    ("limit", lambda q: q.get("limit")),
    ("weight", lambda q: q.get("weight")),
]


@cli.command()
@output_option
@pass_ctx
def quota(ctx: Context, fmt):
    """Your tenant's quotas per GPU model (operators: every tenant's)."""
    rows = list(ctx.client.pages("quotas/"))
    output.emit(rows, fmt, QUOTA_COLUMNS)


def _gpu_summary(node: dict[str, Any]) -> str:
    devices = node.get("devices") or []
    free = sum(1 for d in devices if d.get("state") == "free")
    models = sorted({str(d.get("model")) for d in devices})
    return f"{free}/{len(devices)} free {'/'.join(models)}" if devices else "-"


NODE_COLUMNS: list[output.Column] = [
    ("name", lambda n: n.get("name")),
    ("state", lambda n: n.get("state")),
    ("rack", lambda n: n.get("rack")),
    ("gpus", _gpu_summary),
]


@cli.command()
@click.option("--state", help="Only nodes in this state (ready, not-ready, cordoned, draining).")
@click.option("--rack", help="Only nodes in this rack.")
@click.option("--model", help="Only nodes with a GPU of this model.")
@output_option
@pass_ctx
def nodes(ctx: Context, fmt, **filters):
    """The cluster's nodes and their GPUs."""
    rows = list(ctx.client.pages("nodes/", {k: v for k, v in filters.items() if v is not None}))
    output.emit(rows, fmt, NODE_COLUMNS)


# --- login -------------------------------------------------------------------------------------


@cli.command()
@click.option("--url", "login_url", help="The server (default: TESSERA_URL, or the saved one).")
@click.option("--token-stdin", is_flag=True, help="Read the API token from standard input.")
@click.option("--keep-token", is_flag=True, help="Save the token given, instead of making one of its own.")
@pass_ctx
def login(ctx: Context, login_url, token_stdin, keep_token):
    """Log in with an API token; save the server and a token in a file only you can read (0600).

    The token given is checked first. Unless --keep-token, `login` then makes a named token of
    its own (`tessera-cli@HOST <time>`, revocable on its own in the portal or with the tokens
    API) and saves that one. The token is read from standard input or asked for, never taken on
    the command line, where other users could see it in the process list.
    """
    url = login_url or ctx.url or config.read_file().get("url")
    # No terminal (a CI job, a script): nothing to ask on, and getpass would read standard input
    # with a warning, then fail on its end as if interrupted.
    asking = not url or not token_stdin
    if asking and not sys.stdin.isatty():
        missing = "--url (or TESSERA_URL)" if not url else "--token-stdin, with the token on standard input"
        raise CliError(f"no terminal to ask on: give {missing}", outcome.BAD_INPUT)
    if not url:
        url = click.prompt("Server URL")
    url = config.normal_url(url)
    token = sys.stdin.readline().strip() if token_stdin else getpass.getpass("API token: ").strip()
    if not token:
        raise CliError("no token given", outcome.AUTH)
    config.check_token(token, "the token given")
    client = Client(url, token, retries=ctx.retries, timeout=ctx.timeout)
    client.get("jobs/", params={"limit": 1})  # 401 here: the token is refused
    made = None if keep_token else _own_token(client)
    path = config.write_file(url, made["token"] if made else token)
    what = f"a token of its own, {made['name']!r} (prefix {made['prefix']})" if made else "the token given"
    click.echo(f"logged in to {url}; saved {what} in {path}")


def _own_token(client: Client) -> dict[str, Any] | None:
    """A new named token of the caller's (None where the server has no tokens API)."""
    name = f"tessera-cli@{socket.gethostname()}"[:44] + time.strftime(" %Y-%m-%d %H:%M:%S")
    try:
        _, made = client.post("tokens/", {"name": name})
    except CliError as exc:
        if exc.message.endswith("(HTTP 404)"):
            return None  # a server with one token per user
        raise
    return made


cli.add_command(webhooks.webhooks)
cli.add_command(watch.watch)


def _asked_format(argv: list[str]) -> str | None:
    """For a ``submit`` whose options could not be read: the ``-o json|yaml`` it asked for, if
    any (read from the words before ``--``), so that its outcome is still printed."""
    words = argv[: argv.index("--")] if "--" in argv else argv
    if "submit" not in words:
        return None
    fmt = None
    for i, word in enumerate(words):
        for prefix in ("--output=", "-o"):
            if word.startswith(prefix) and len(word) > len(prefix):
                fmt = word[len(prefix) :].removeprefix("=")
        if word in ("-o", "--output") and i + 1 < len(words):
            fmt = words[i + 1]
    return fmt if fmt in ("json", "yaml") else None


def main(argv: list[str] | None = None) -> int:
    """Run the command; every failure becomes a message and an exit code, never a traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _ARGV[:] = argv
    try:
        code = cli.main(args=argv, prog_name="tessera", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except CliError as exc:
        click.echo(f"tessera: {exc.message}", err=True)
        return exc.code
    except click.exceptions.Abort:
        click.echo("tessera: interrupted", err=True)
        return 130
    except click.ClickException as exc:  # a bad option or argument: one line, as every failure
        message = " ".join(exc.format_message().split())
        where = getattr(exc, "ctx", None)
        hint = f" (see `{where.command_path} --help`)" if where is not None else ""
        click.echo(f"tessera: {message}{hint}", err=True)
        fmt = _asked_format(argv)
        if fmt is not None:  # a submit's outcome, as for any other failure of it
            _emit_failure(None, CliError(message, outcome.BAD_INPUT), fmt, "error")
        return outcome.BAD_INPUT
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:
        click.echo("tessera: interrupted", err=True)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - a bug of ours: one line, never a traceback
        if os.environ.get("TESSERA_DEBUG"):
            raise
        click.echo(f"tessera: internal error: {type(exc).__name__}: {exc}", err=True)
        return outcome.BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
