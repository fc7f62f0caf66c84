"""A worker SIGKILLed in the middle of applying a pass leaves nothing behind.

A real process (a stand-in for the Celery worker, on its own PostgreSQL connection) takes the
pass's advisory lock, locks the job and writes half of a binding (its allocations and state),
then is SIGKILLed before it commits. PostgreSQL rolls the transaction back and drops the lock with
the connection: the next pass binds the job, once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from scheduling.choices import JobState
from scheduling.models import Allocation, Job
from scheduling.services import passes
from tests.scheduling import helpers
from tests.support import database_url_of

pytestmark = [
    pytest.mark.services,
    pytest.mark.timeout(60),
    pytest.mark.postgresql(
        "a pass killed in another process: row locks and the advisory lock die with its session"
    ),
]

HALF_A_PASS = """
import sys, time, psycopg
conn = psycopg.connect(sys.argv[1])
cur = conn.cursor()
cur.execute("SELECT pg_try_advisory_lock(%s)", [int(sys.argv[2])])
assert cur.fetchone()[0]
cur.execute("SELECT id FROM scheduling_job WHERE id = %s FOR UPDATE", [int(sys.argv[3])])
cur.execute(
    "INSERT INTO scheduling_allocation (job_id, node_id, device_id, replica, share_milli, attempt,"
    " created_at) SELECT %s, node_id, id, 0, 1000, 0, now() FROM scheduling_device"
    " WHERE index < 2 ORDER BY index", [int(sys.argv[3])])
cur.execute("UPDATE scheduling_job SET state = 'scheduled' WHERE id = %s", [int(sys.argv[3])])
print("half-way", flush=True)
time.sleep(60)
"""


def test_a_pass_killed_half_way_leaves_nothing_and_the_next_pass_binds_the_job_once(
    require_postgres, transactional_db, world, settings
):
    helpers.make_node("a100-01")
    job = helpers.submit(world.alice, world.vision, gpus=2)
    dsn = database_url_of(settings).replace("postgres://", "postgresql://", 1)
    worker = subprocess.Popen(
        [sys.executable, "-c", HALF_A_PASS, dsn, str(passes.PASS_LOCK_KEY), str(job.pk)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert worker.stdout.readline().strip() == "half-way"
        assert passes.run_pass() is None  # the lock is held: this pass only asks for another
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)
        deadline = time.monotonic() + 20
        while (result := passes.run_pass()) is None and time.monotonic() < deadline:
            time.sleep(0.1)  # until PostgreSQL has noticed the dead connection
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)
    assert result is not None and result.bound == [str(job.pk)]
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED
    assert Allocation.objects.filter(job=job).count() == 2  # the half-written binding is gone
    assert job.events.filter(type="scheduled").count() == 1
    assert passes.run_pass().bound == []  # and it is not bound again
    assert Job.objects.get(pk=job.pk).allocations.filter(released_at__isnull=True).count() == 2
