"""What asks for a scheduling pass, and the again/queued flags that make sure one runs.

With Redis configured, a request queues the Celery task named :data:`PASS_TASK` (beat adds a
periodic safety pass); in the embedded default it wakes the web process's pass loop
(``scheduling/loop.py``), which also runs every ``PASS_INTERVAL_S`` anyway.

The bottom of the services' layers: the task is queued by name, so nothing here imports the
tasks, the loop or the pass that act on a request (the pass calls :func:`take_again`,
:func:`asked_again` and :func:`queue_pass`; the loop waits in :func:`wait_for_wake`).

The flag protocol (why no request is lost: ``scheduling.services.passes.run_pass``):

- ``again`` — a pass was asked for since the running one began, so one more runs. Set by every
  request; taken by the lock holder as it starts a round; checked by it after its unlock. Kept
  in this process (an event) and, with Redis, for every process (a flag).
- ``queued`` — a pass task is queued or running, so a request queues no other. Set by a
  request only if unset (it then queues the task); cleared by the pass, atomically, only while
  ``again`` is not set.
"""

from __future__ import annotations

import logging
import threading

from celery import current_app
from django.conf import settings
from django.db import DatabaseError, transaction

from scheduling.choices import JobState
from scheduling.models import Job
from scheduling.services import redis_flags, redis_outage
from scheduling.services.snapshot import PreparedRead

log = logging.getLogger("tessera.triggers")

PASS_TASK = "scheduling.tasks.scheduling_pass"  # the Celery task a request queues, by name
QUEUED_FLAG = "pass-queued"  # a pass task is queued or running
AGAIN_FLAG = "pass-again"  # asked for since the running pass began: it runs once more
# How long a "pass queued" flag lives if the task that should clear it never runs (lost with a
# Redis hiccup or a killed worker): triggers are swallowed for at most this long.
QUEUED_TTL_S = 5
# Is a job pending? (one id, or none): a read a caller may also send with its own.
ANY_PENDING = PreparedRead(
    lambda: Job.objects.filter(state=JobState.PENDING).order_by().values_list("id")[:1]
)
_wake = threading.Event()  # the embedded loop's: a pass is asked for
_again = threading.Event()  # this process's "again" (the Redis flag is every process's)


def request_pass(pending: bool = False) -> None:
    """Ask for a pass soon, if a job is pending (``pending``: the caller knows one is).

    Coalesced: the request marks "again", so a pass running now runs once more (at once, in the
    same task: no broker round trip between passes back to back), and queues a task only if
    none is queued or running (a burst of 1,000 submits causes a handful of passes, not 1,000).

    Only if a job is pending: every change that can let a job start (submit, exit, cancel, node
    join or loss, quota change) asks after its commit, and a pass with no pending job decides
    nothing, so a job's exit with an empty queue costs no pass (and no task). A job that becomes
    pending asks for a pass itself, after its own commit, so none is missed.
    """
    if settings.TESSERA["EMBEDDED_PASSES"]:
        _wake.set()
        return
    if not pending and not _job_pending():
        return
    if redis_flags.set_flags(AGAIN_FLAG, QUEUED_FLAG, once_ttl_s=QUEUED_TTL_S):
        queue_pass()


def request_pass_on_commit(pending: bool | None = None) -> None:
    """:func:`request_pass` once the current transaction commits (what it changed is visible).

    ``pending``: whether a job is pending, when the caller knows without another read (it read
    :data:`ANY_PENDING` in its transaction, or made a job pending): no read after the commit. A
    job that became pending since that read asks for a pass itself, after its own commit; one
    bound since costs a pass that decides nothing."""
    if pending is None:
        transaction.on_commit(request_pass)
    elif pending or settings.TESSERA["EMBEDDED_PASSES"]:
        transaction.on_commit(_request_pending_pass)


def _request_pending_pass() -> None:
    request_pass(pending=True)


def _job_pending() -> bool:
    """Is a job pending? If the database cannot say, yes: the request must not fail (it runs after
    its change's commit) and a pass too many costs little."""
    try:
        return bool(ANY_PENDING.rows())
    except DatabaseError:
        log.warning("could not check for pending jobs", exc_info=True)
        return True


def queue_pass() -> None:
    """Queue a pass task (the embedded default: wake its loop)."""
    if settings.TESSERA["EMBEDDED_PASSES"]:
        _wake.set()
        return
    try:
        current_app.send_task(PASS_TASK)
    except Exception as exc:  # the broker is down: beat's safety pass will catch up
        redis_outage.failed("could not queue a scheduling pass", exc)
    else:
        redis_outage.answered()


def wait_for_wake(timeout: float) -> None:
    """The embedded loop's wait: until a pass is asked for, or ``timeout`` seconds."""
    _wake.wait(timeout=timeout)
    _wake.clear()


def set_again() -> None:
    """Mark "again": the pass holding the lock runs once more (a pass that found it taken)."""
    _again.set()
    if settings.REDIS_URL:
        redis_flags.set_flag(AGAIN_FLAG)


def take_again() -> bool:
    """Take "again" as a round starts (that round covers every request made before it)."""
    flagged = _again.is_set()
    _again.clear()
    if settings.REDIS_URL:
        flagged = redis_flags.take_flag(AGAIN_FLAG) or flagged
    return flagged


def asked_again() -> bool:
    """Was a pass asked for since this round began? If not, the "queued" flag is cleared in the
    same step, so the next request queues a task (a request in between finds "again" set)."""
    if _again.is_set():
        return True
    if settings.REDIS_URL:
        return redis_flags.clear_unless(QUEUED_FLAG, AGAIN_FLAG)
    return False
