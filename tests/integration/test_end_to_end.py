"""End to end, through every real part: alice's 2-GPU job from HTTP to a GPU process and back.

Real PostgreSQL (the test database pytest-django made), real Redis, and three real processes: the
web server (daphne) and a Celery worker the session shares (``shared_servers``, tests/conftest.py),
and a node agent with 8 simulated A100s this test starts and always stops. The scheduling pass
runs only in the worker, queued by the submit's on-commit trigger (``scheduling/services/
triggers.py``): no beat, no in-process loop, and the test never calls a pass itself.

Isolation from other test runs on the same Redis: the web and the worker use a broker database of
their own (``TESSERA_REDIS_BROKER_DB``), so no other worker takes this test's pass and this worker
takes no one else's. The processes are launched by ``tests/support.py``, as the chaos test and the
end-to-end benchmark launch theirs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.support import (
    wait_until,
)

DEADLINE_S = 50  # everything below must happen within this; a hang fails, it does not block CI
COMMAND = ["python", "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"]

pytestmark = [
    pytest.mark.services,
    pytest.mark.slow,
    pytest.mark.timeout(90),
    pytest.mark.postgresql("web, Celery worker and agent are separate processes sharing one database"),
    pytest.mark.redis("the Celery broker and the channel layer between the processes"),
]


@pytest.fixture
def stack(shared_servers, require_postgres, redis_url, transactional_db, world) -> Iterator[dict[str, Any]]:
    """The session's daphne and Celery worker (tests/conftest.py) and this test's simulated agent."""
    from scheduling.services.agents import do_create_join_token

    _, join_token = do_create_join_token("e2e")
    since = shared_servers.procs.marks()
    deadline = time.monotonic() + DEADLINE_S
    try:
        key = shared_servers.start_agent(
            "e2e-a100", "8xA100,nvlink=4,rack=r1", join_token, "--poll-interval", "0.2"
        )
        yield {
            "base": shared_servers.base,
            "procs": shared_servers.procs,
            "deadline": deadline,
            "redis_url": redis_url,
            "since": since,
            "agent": key,
        }
    finally:
        shared_servers.stop_agents()


def test_alices_two_gpu_job_runs_on_a_real_agent_and_succeeds(stack, world):
    from scheduling.models import Node
    from scheduling.services.triggers import QUEUED_FLAG

    procs, deadline, base = stack["procs"], stack["deadline"], stack["base"]
    wait_until(
        "the agent to register",
        lambda: Node.objects.filter(name="e2e-a100", devices__isnull=False).exists(),
        procs,
        deadline,
    )
    # A "pass already queued" flag left by an earlier run on this test database would swallow this
    # submit's trigger for its TTL; clearing it only ever causes one more (harmless) pass.
    from scheduling.services import redis_flags

    redis_flags.client().delete(redis_flags.key(QUEUED_FLAG))

    alice = requests.Session()
    alice.headers["Authorization"] = f"Token {world.tokens['alice']}"
    body = {"name": "e2e-cuda-devices", "kind": "batch", "command": COMMAND, "gpus": 2}
    answer = alice.post(base + "/api/v1/jobs/", json=body, timeout=10)
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]

    def finished() -> dict | None:
        job = alice.get(f"{base}/api/v1/jobs/{job_id}/", timeout=10).json()
        return job if job["state"] in ("succeeded", "failed", "cancelled") else None

    job = wait_until(f"job {job_id} to finish", finished, procs, deadline)
    assert job["state"] == "succeeded", f"{job}\n{procs.report()}"
    assert job["exit_code"] == 0 and job["attempts"] == 0

    events = alice.get(f"{base}/api/v1/jobs/{job_id}/events/", timeout=10).json()
    events = events["results"] if isinstance(events, dict) else events
    assert [e["type"] for e in events] == ["submitted", "scheduled", "started", "succeeded"]
    (placement,) = next(e for e in events if e["type"] == "scheduled")["allocations"]
    assert placement["node"] == "e2e-a100" and len(placement["gpus"]) == 2 and placement["replica"] == 0

    logs = alice.get(f"{base}/api/v1/jobs/{job_id}/logs/", timeout=10).json()
    assert logs["data"].strip() == ",".join(str(g) for g in placement["gpus"]), logs
    assert logs["truncated"] is False

    # daphne's requests skip Twisted's form parsing (controlplane/daphne_requests.py): a form or
    # a multipart body still reaches the API whole, which refuses it cleanly, as it always did
    for body in ({"data": {"name": "x"}}, {"files": {"spec": ("job.json", b'{"name": "x"}')}}):
        refused = alice.post(base + "/api/v1/jobs/", timeout=10, **body)
        assert refused.status_code == 400, refused.text
        assert refused.json() == {"detail": "Content-Type must be application/json."}

    # The pass that bound it ran in the worker, as a Celery task (nothing else runs passes here).
    since = stack["since"]
    assert "scheduling.tasks.scheduling_pass" in procs.output("worker", since)
    logs = procs.output("web", since) + procs.output("worker", since) + procs.output(stack["agent"])
    assert "Traceback" not in logs
