"""A CI step, as a shell runs it, against a whole live stack: the job's exit code is the step's.

Real processes (``tests/support.py``'s launcher): daphne and a Celery worker that runs the passes
(the session's, shared with tests/integration/test_end_to_end.py), and a node agent of each test's
with simulated GPUs that runs the jobs' commands for real. The step is a bash
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
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduling.models import Job
from tests.support import wait_until

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
def stack(shared_servers, require_postgres, redis_url, transactional_db, world) -> Iterator[dict[str, Any]]:
    """The session's shared web server and worker (tests/conftest.py), and an agent of this test's."""
    from scheduling.models import Node
    from scheduling.services import redis_flags
    from scheduling.services.agents import do_create_join_token
    from scheduling.services.triggers import QUEUED_FLAG

    _, join_token = do_create_join_token("cli")
    procs = shared_servers.procs
    since = procs.marks()
    try:
        shared_servers.start_agent(
            "cli-a100", "8xA100,nvlink=4,rack=r1", join_token, "--poll-interval", "0.2"
        )
        wait_until(
            "the agent to register",
            lambda: Node.objects.filter(name="cli-a100", devices__isnull=False).exists(),
            procs,
            time.monotonic() + DEADLINE_S,
        )
        redis_flags.client().delete(redis_flags.key(QUEUED_FLAG))  # (see test_end_to_end.py)
        yield {"base": shared_servers.base, "procs": procs, "work": shared_servers.work, "since": since}
    finally:
        shared_servers.stop_agents()


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
    procs, since = stack["procs"], stack["since"]
    assert "Traceback" not in procs.output("web", since) + procs.output("worker", since)


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


# --- the tenant's event stream: `tessera watch` -------------------------------------------------


def watch(stack, world, *args: str, who: str = "alice", url: str | None = None) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "CI_", "GITLAB_", "GITHUB_"))}
    env.update(TESSERA_URL=url or stack["base"], TESSERA_TOKEN=world.tokens[who], HOME=str(stack["work"]))
    return subprocess.run([TESSERA, "watch", *args], env=env, capture_output=True, text=True, timeout=60)


def test_watch_prints_the_tenants_events_resumes_and_survives_a_cutting_proxy(stack, world):
    assert step(stack, world, "tessera submit --wait -- true").returncode == 0
    job = Job.objects.get()
    first = watch(stack, world, "-o", "json", "--count", "4")
    assert first.returncode == 0, first.stderr
    seen = [json.loads(line) for line in first.stdout.splitlines()]
    assert [e["type"] for e in seen] == ["submitted", "scheduled", "started", "succeeded"]
    assert {e["job"] for e in seen} == {job.pk}
    assert f"resume with: tessera watch --since {seen[3]['id']}" in first.stderr  # stdout: JSON only

    resumed = watch(stack, world, "-o", "json", "--since", str(seen[1]["id"]), "--count", "1")
    assert [json.loads(line)["type"] for line in resumed.stdout.splitlines()] == ["started"]
    table = watch(stack, world, "--since", str(seen[2]["id"]), "--count", "1")
    assert table.stdout.splitlines()[0].split() == ["ID", "AT", "JOB", "NAME", "TYPE", "REASON"]
    assert f"resume with: tessera watch --since {seen[3]['id']}" in table.stderr
    quiet = watch(stack, world, "-o", "json", "--timeout", "2", who="bob")  # alice's jobs are not his
    assert quiet.returncode == 0 and quiet.stdout == "", quiet.stdout
    bad = watch(stack, world, "--since", "yesterday")
    assert bad.returncode == 200 and "--since" in bad.stderr

    proxy = CuttingProxy(int(stack["base"].rsplit(":", 1)[1]), cut_after=700)  # a message or two a connection
    try:
        cut = watch(stack, world, "-o", "json", "--count", "4", url=f"http://127.0.0.1:{proxy.port}")
    finally:
        proxy.close()
    assert cut.returncode == 0, cut.stderr
    assert [json.loads(line) for line in cut.stdout.splitlines()] == seen  # nothing lost or twice
    assert proxy.cuts >= 2, proxy.cuts
    for result in (first, resumed, table, quiet, bad, cut):
        assert "Traceback" not in result.stderr, result.stderr
