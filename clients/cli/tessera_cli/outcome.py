"""Exit codes, and the outcome of a job that ended, as a pipeline step passes them on.

A job that ran to an end gives its own exit code (0 when it succeeded). Where there is no exit
code of the job's own to give, ``tessera`` exits with a reserved code, chosen above the range
that processes use for signals (128 + signal number), so that a step can tell them apart:

=====  ==========================================================================================
code   meaning
=====  ==========================================================================================
200    bad input: a malformed job file, an unknown option or field, a value the server refused
201    authentication failed: no token, or the server refused it (401, 403)
202    the server could not be reached, or kept failing (after retries with backoff), or answered
       with something other than the API's JSON (a sign-in page in front, a wrong URL)
203    the server refused the request for the object's state: not found (404), conflict (409, 422)
204    ``--wait-timeout`` passed before the job ended (the job goes on)
210    the job was cancelled
211    the job was stopped at its time limit
212    the job was refused at submit as one its tenant's quotas can never admit
213    the job's node was lost, beyond what its retries cover
214    the job failed without an exit code of its own (killed, or its process never started)
215    the job was stopped for filling more disk than its node allows (``disk-limit``)
=====  ==========================================================================================

``-o json`` gives the same outcome in words, for scripts that must not guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BAD_INPUT = 200
AUTH = 201
UNREACHABLE = 202
REFUSED_STATE = 203
WAIT_TIMEOUT = 204
CANCELLED = 210
TIME_LIMIT = 211
UNSCHEDULABLE = 212
NODE_LOST = 213
NO_EXIT_CODE = 214
DISK_LIMIT = 215

TABLE = [
    (0, "the job succeeded (and any other command did what it was asked)"),
    (1, "…255 except the reserved codes: the job's own exit code (a gang: the first failing replica's)"),
    (BAD_INPUT, "bad input: malformed job file, unknown option or field, a value the server refused"),
    (AUTH, "authentication failed (no token, or the server refused it)"),
    (
        UNREACHABLE,
        "the server could not be reached or kept failing, after retries, or answered other than JSON",
    ),
    (REFUSED_STATE, "not found, or refused for the object's state (404, 409, 422)"),
    (WAIT_TIMEOUT, "--wait-timeout passed before the job ended (the job goes on)"),
    (CANCELLED, "the job was cancelled"),
    (TIME_LIMIT, "the job was stopped at its time limit"),
    (UNSCHEDULABLE, "the job was refused at submit: no quota of its tenant can ever admit it"),
    (NODE_LOST, "the job's node was lost beyond its retries"),
    (NO_EXIT_CODE, "the job failed without an exit code of its own"),
    (DISK_LIMIT, "the job was stopped for filling more disk than its node allows"),
]

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


def table_text() -> str:
    """The table above as ``--help`` prints it (click keeps lines after a ``\\b`` line as they are)."""
    return "\n".join(f"  {code:>3}  {meaning}" for code, meaning in TABLE)


@dataclass(frozen=True)
class Outcome:
    """How a waited-for job ended: ``name`` in words (``-o json``), ``code`` to exit with."""

    name: str
    code: int
    exit_code: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"outcome": self.name, "exit_code": self.exit_code, "cli_exit_code": self.code}


def outcome_of(job: dict[str, Any], events: list[dict[str, Any]]) -> Outcome:
    """The outcome of ``job`` (in a terminal state) with its ``events``.

    The failure's cause is the reason of the job's last ``failed`` event: ``time-limit``,
    ``disk-limit``, ``node-lost`` (its node was lost with no retry left), ``lost`` (its process vanished), or
    ``exit N``. The job's
    ``exit_code`` is the code its agent reported: for a gang, that of the first replica to fail,
    since the first failure stops the others.
    """
    state = job.get("state")
    code = job.get("exit_code")
    if state == "succeeded":
        return Outcome("succeeded", 0, code)
    if state == "cancelled":
        return Outcome("cancelled", CANCELLED, code)
    reason = next((e.get("reason") or "" for e in reversed(events) if e.get("type") == "failed"), "")
    if reason == "time-limit":
        return Outcome("time-limit", TIME_LIMIT, code)
    if reason == "disk-limit":
        return Outcome("disk-limit", DISK_LIMIT, code)
    if reason == "node-lost":
        return Outcome("node-lost", NODE_LOST, code)
    if isinstance(code, int) and 0 < code <= 255:
        return Outcome("failed", code, code)
    if isinstance(code, int) and code < 0:  # killed by a signal (-N): as a shell reports it
        return Outcome("failed", min(128 - code, 255), code)
    return Outcome("failed", NO_EXIT_CODE, code)
