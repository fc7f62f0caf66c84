"""End to end, through every real part: alice's 2-GPU job from HTTP to a GPU process and back.

Real PostgreSQL (the test database pytest-django made), real Redis, and three real processes this
test starts and always stops: the web server (daphne), a Celery worker, and a node agent with 8
simulated A100s. The scheduling pass runs only in the worker, queued by the submit's on-commit
trigger (``scheduling/services/triggers.py``): no beat, no in-process loop, and the test never
calls a pass itself.

Isolation from other test runs on the same Redis: the web and the worker use a broker database of
their own (``TESSERA_REDIS_BROKER_DB``), so no other worker takes this test's pass and this worker
takes no one else's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests

from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 50  # everything below must happen within this; a hang fails, it does not block CI
COMMAND = ["python", "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"]

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(90)]


def database_url_of(settings) -> str:
    db = settings.DATABASES["default"]
    auth = quote(db["USER"] or "postgres")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"])
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


class Processes:
    """Child processes in their own sessions, each logging to a file; all stopped at the end."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.children: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.children[name] = proc
        return proc

    def output(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def check_alive(self) -> None:
        for name, proc in self.children.items():
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with {proc.returncode}:\n{self.output(name)[-3000:]}")

    def stop_all(self) -> None:
        """SIGINT the agent first (it stops its jobs), then SIGTERM the rest; SIGKILL stragglers."""
        order = sorted(self.children, key=lambda n: n != "agent")
        for name in order:
            proc = self.children[name]
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT if name == "agent" else signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.children.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
        for proc in self.children.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # the whole group: whatever a child left behind
            proc.wait(5)

    def report(self) -> str:
        return "\n".join(f"--- {name} ---\n{self.output(name)[-2500:]}" for name in self.children)


def wait_until(what: str, check: Callable[[], Any], procs: Processes, deadline: float) -> Any:
    while time.monotonic() < deadline:
        procs.check_alive()
        value = check()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}\n{procs.report()}")


@pytest.fixture
def stack(require_postgres, redis_url, transactional_db, world, settings) -> Iterator[dict[str, Any]]:
    """daphne + Celery worker + a simulated agent on the test database; torn down after the test."""
    from scheduling.services.agents import do_create_join_token

    _, join_token = do_create_join_token("e2e")
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="tessera-e2e-", dir="/tmp"))
    work.chmod(0o711)  # the job user must reach the agent's job directories below it
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "PYTEST_"))}
    env = {
        **base_env,
        "DATABASE_URL": database_url_of(settings),
        "REDIS_URL": redis_url,
        "TESSERA_REDIS_BROKER_DB": str(8 + os.getpid() % 8),
        "TESSERA_EMBEDDED_PASSES": "0",
        "TESSERA_PASS_LOOP": "0",
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
    }
    procs = Processes(work)
    try:
        procs.start("worker", [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "-P", "solo",
                               "--without-mingle", "--without-gossip", "--without-heartbeat",
                               "-n", f"e2e-{os.getpid()}@%h", "-l", "INFO"], env)
        procs.start("web", [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                            "controlplane.asgi:application"], env)
        deadline = time.monotonic() + DEADLINE_S
        wait_until("the Celery worker", lambda: " ready." in procs.output("worker"), procs, deadline)
        base = f"http://127.0.0.1:{port}"
        wait_until("the web server", lambda: _answers(base), procs, deadline)
        agent_env = {k: v for k, v in env.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        agent_env["TESSERA_JOIN_TOKEN"] = join_token  # never on the command line
        procs.start("agent", [sys.executable, "-m", "agent", "--server", base, "--simulate",
                              "8xA100,nvlink=4,rack=r1", "--name", "e2e-a100", "--metrics-port", "0",
                              "--metrics-addr", "127.0.0.1", "--state-dir", str(work / "agent"),
                              "--poll-interval", "0.2"], agent_env)
        yield {"base": base, "procs": procs, "deadline": deadline, "redis_url": redis_url}
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)


def _answers(base: str) -> bool:
    try:
        return requests.get(base + "/api/v1/jobs/", timeout=2).status_code == 401
    except requests.RequestException:
        return False


def test_alices_two_gpu_job_runs_on_a_real_agent_and_succeeds(stack, world):
    from scheduling.models import Node
    from scheduling.services.triggers import QUEUED_FLAG

    procs, deadline, base = stack["procs"], stack["deadline"], stack["base"]
    wait_until("the agent to register", lambda: Node.objects.filter(name="e2e-a100", devices__isnull=False)
               .exists(), procs, deadline)
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

    # The pass that bound it ran in the worker, as a Celery task (nothing else runs passes here).
    assert "scheduling.tasks.scheduling_pass" in procs.output("worker")
    assert "Traceback" not in procs.output("web") + procs.output("worker") + procs.output("agent")
