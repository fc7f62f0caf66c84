"""What wakes the scheduling pass: one code path, two triggers.

With Redis configured, a request queues the Celery task ``scheduling.tasks.scheduling_pass`` (beat
adds a periodic safety pass). In the embedded default, a thread in the web process runs the same
:func:`scheduling.services.passes.run_pass` when woken, and every ``PASS_INTERVAL_S`` anyway.
"""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import DatabaseError

from scheduling.choices import JobState
from scheduling.models import Job
from scheduling.services.snapshot import PreparedRead

log = logging.getLogger("tessera.triggers")

QUEUED_FLAG = "pass-queued"  # a pass task is queued or running
AGAIN_FLAG = "pass-again"  # asked for since the running pass began: it runs once more
# How long a "pass queued" flag lives if the task that should clear it never runs (lost with a
# Redis hiccup or a killed worker): triggers are swallowed for at most this long.
QUEUED_TTL_S = 5
_ANY_PENDING = PreparedRead(
    lambda: Job.objects.filter(state=JobState.PENDING).order_by().values_list("id")[:1]
)
_wake = threading.Event()
_loop_started = threading.Event()


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
    from scheduling.services.redis_flags import set_flags

    if set_flags(AGAIN_FLAG, QUEUED_FLAG, once_ttl_s=QUEUED_TTL_S):
        queue_pass()


def _job_pending() -> bool:
    """Is a job pending? If the database cannot say, yes: the request must not fail (it runs after
    its change's commit) and a pass too many costs little."""
    try:
        return bool(_ANY_PENDING.rows())
    except DatabaseError:
        log.warning("could not check for pending jobs", exc_info=True)
        return True


def queue_pass() -> None:
    """Queue a pass task (the embedded default: wake its loop)."""
    if settings.TESSERA["EMBEDDED_PASSES"]:
        _wake.set()
        return
    try:
        from scheduling.tasks import scheduling_pass

        scheduling_pass.delay()
    except Exception:  # the broker is down: beat's safety pass will catch up
        log.warning("could not queue a scheduling pass", exc_info=True)


def start_embedded_loop() -> None:
    """Start the in-process pass loop once (the embedded default's web process)."""
    if _loop_started.is_set():
        return
    _loop_started.set()
    thread = threading.Thread(target=_loop, name="tessera-scheduler", daemon=True)
    thread.start()


def _loop() -> None:
    from django.db import close_old_connections

    from scheduling.services.health import sweep_nodes
    from scheduling.services.passes import run_pass

    interval = settings.TESSERA["PASS_INTERVAL_S"]
    while True:
        _wake.wait(timeout=interval)
        _wake.clear()
        close_old_connections()
        try:
            sweep_nodes()
            run_pass()
        except Exception:
            log.exception("scheduling pass failed")
        finally:
            close_old_connections()
