"""A CI step, as a shell runs it, against a whole live stack: the job's exit code is the step's.

Real processes (``tests/support.py``'s launcher): daphne, a Celery worker that runs the passes,
and a node agent with simulated GPUs that runs the jobs' commands for real. The step is a bash
line calling the installed ``tessera`` command with GitLab CI's variables set, as a runner would.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduling.models import Job
from tests.support import (
    Processes,
    agent_argv,
    agent_env,
    database_url_of,
    free_port,
    stack_env,
    wait_until,
    web_answers,
    web_argv,
    worker_argv,
)

TESSERA = shutil.which("tessera", path=str(Path(sys.executable).parent)) or "tessera"
DEADLINE_S = 60

pytestmark = [
    pytest.mark.services,
    pytest.mark.slow,
    pytest.mark.timeout(150),
    pytest.mark.postgresql("web, Celery worker and agent are separate processes sharing one database"),
    pytest.mark.redis("the Celery broker, and the job changes the waiting command is woken by"),
]

GITLAB = {"GITLAB_CI": "true", "CI_PROJECT_ID": "7", "CI_PIPELINE_ID": "1234", "CI_JOB_NAME": "train"}


@pytest.fixture
def stack(require_postgres, redis_url, transactional_db, world, settings) -> Iterator[dict[str, Any]]:
    from scheduling.models import Node
    from scheduling.services import redis_flags
    from scheduling.services.agents import do_create_join_token
    from scheduling.services.triggers import QUEUED_FLAG

    _, join_token = do_create_join_token("cli")
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="tessera-cli-", dir="/tmp"))
    work.chmod(0o711)  # the job user must reach the agent's job directories below it
    env = stack_env(
        database_url_of(settings),
        redis_url,
        TESSERA_REDIS_BROKER_DB=str(8 + os.getpid() % 8),
        TESSERA_WEBHOOK_ALLOWLIST="127.0.0.1",  # the test's receiver
    )
    procs = Processes(work)
    try:
        procs.start("worker", worker_argv("cli"), env)
        procs.start("web", web_argv(port=port), env)
        deadline = time.monotonic() + DEADLINE_S
        wait_until("the Celery worker", lambda: " ready." in procs.output("worker"), procs, deadline)
        base = f"http://127.0.0.1:{port}"
        wait_until("the web server", lambda: web_answers(base), procs, deadline)
        procs.start(
            "agent",
            agent_argv(base, "cli-a100", "8xA100,nvlink=4,rack=r1", work / "agent", "--poll-interval", "0.2"),
            agent_env(env, join_token),
        )
        wait_until(
            "the agent to register",
            lambda: Node.objects.filter(name="cli-a100", devices__isnull=False).exists(),
            procs,
            deadline,
        )
        redis_flags.client().delete(redis_flags.key(QUEUED_FLAG))  # (see test_end_to_end.py)
        yield {"base": base, "procs": procs, "work": work}
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)


def step(stack, world, script: str, ci: dict[str, str] | None = None, **popen) -> Any:
    """Run ``script`` in bash as a CI runner would: the CI's variables, the token in the env."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "CI_", "GITLAB_", "GITHUB_"))}
    env.update(
        TESSERA_URL=stack["base"],
        TESSERA_TOKEN=world.tokens["alice"],
        HOME=str(stack["work"]),
        PATH=f"{Path(TESSERA).parent}:{os.environ['PATH']}",
        **(ci or {}),
    )
    argv = ["bash", "-c", script]
    if popen.pop("background", False):
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90)


def test_a_ci_step_exits_with_its_jobs_exit_code_and_a_retry_submits_nothing_new(stack, world):
    failing = "tessera submit --wait -- python -c 'import sys; print(\"loss 0.1\"); sys.exit(3)'"
    first = step(stack, world, failing, GITLAB)
    assert first.returncode == 3, f"{first.stderr}\n{stack['procs'].report()}"
    assert "failed, exit code 3" in first.stderr
    retried = step(stack, world, failing, {**GITLAB, "CI_JOB_ID": "another"})  # GitLab's retry
    assert retried.returncode == 3, retried.stderr
    assert "already submitted" in retried.stderr
    assert Job.objects.count() == 1

    ok = step(
        stack, world, "tessera submit --follow -- python -c 'print(\"done\")' && echo step-passed", GITLAB
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == "done\nstep-passed\n"
    procs = stack["procs"]
    assert "Traceback" not in procs.output("web") + procs.output("worker")


def test_a_step_whose_job_is_cancelled_exits_210_and_one_stopped_at_its_limit_211(stack, world):
    waiting = step(stack, world, "tessera submit --wait -o json --name long -- sleep 60", background=True)
    wait_until(
        "the job to run",
        lambda: Job.objects.filter(name="long", state="running").first(),
        stack["procs"],
        time.monotonic() + DEADLINE_S,
    )
    job = Job.objects.get(name="long")
    assert step(stack, world, f"tessera cancel {job.pk}").returncode == 0
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 210, err
    assert json.loads(out)["outcome"] == "cancelled"

    limited = step(stack, world, "tessera submit --wait --time-limit 1 -- sleep 60")
    assert limited.returncode == 211, f"{limited.stderr}\n{stack['procs'].report()}"


class CuttingProxy:
    """A TCP proxy in front of the web server that cuts every connection ``cut_after`` bytes into
    the answer to a stream request (as a proxy or a flaky network would drop a long stream)."""

    def __init__(self, upstream_port: int, cut_after: int) -> None:
        self.upstream_port, self.cut_after = upstream_port, cut_after
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cuts = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                server = socket.create_connection(("127.0.0.1", self.upstream_port))
                state = {"streaming": False, "sent": 0}
                threading.Thread(target=self._up, args=(client, server, state), daemon=True).start()
                threading.Thread(target=self._down, args=(server, client, state), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, state: dict) -> None:
        with contextlib.suppress(OSError):
            while chunk := client.recv(65536):
                if b"/stream/" in chunk:
                    state["streaming"], state["sent"] = True, 0
                server.sendall(chunk)
        _close(client, server)

    def _down(self, server: socket.socket, client: socket.socket, state: dict) -> None:
        with contextlib.suppress(OSError):
            while chunk := server.recv(256):
                client.sendall(chunk)
                if state["streaming"]:
                    state["sent"] += len(chunk)
                    if state["sent"] >= self.cut_after:
                        self.cuts += 1
                        break
        _close(client, server)

    def close(self) -> None:
        self.listener.close()


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


def test_follow_survives_a_dropped_stream_with_nothing_lost_or_twice(stack, world):
    port = int(stack["base"].rsplit(":", 1)[1])
    proxy = CuttingProxy(port, cut_after=900)
    try:
        script = (
            f"TESSERA_URL=http://127.0.0.1:{proxy.port} tessera submit --follow -- "
            "python -c 'import time\nfor i in range(6): print(i, flush=True); time.sleep(0.4)'"
        )
        result = step(stack, world, script)
    finally:
        proxy.close()
    assert result.returncode == 0, f"{result.stderr}\n{stack['procs'].report()}"
    assert result.stdout == "0\n1\n2\n3\n4\n5\n"
    assert proxy.cuts >= 2, proxy.cuts


def test_a_webhook_receiver_gets_the_signed_end_of_a_pipelines_job(stack, world):
    import hashlib
    import hmac
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import requests

    got: list[tuple[dict, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            got.append((dict(self.headers), self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        made = requests.post(
            stack["base"] + "/api/v1/webhooks/",
            json={"url": f"http://127.0.0.1:{server.server_address[1]}/ci", "events": ["succeeded"]},
            headers={"Authorization": f"Token {world.tokens['alice']}"},
            timeout=10,
        )
        assert made.status_code == 201, made.text
        assert step(stack, world, "tessera submit --wait -- true").returncode == 0
        wait_until("the delivery", lambda: got, stack["procs"], time.monotonic() + 30)
    finally:
        server.shutdown()
    ((headers, body),) = got
    t, v1 = (part.split("=", 1)[1] for part in headers["Tessera-Signature"].split(","))
    secret = made.json()["secret"].encode()
    assert hmac.compare_digest(v1, hmac.new(secret, t.encode() + b"." + body, hashlib.sha256).hexdigest())
    assert json.loads(body)["job"]["state"] == "succeeded"
