"""docker-compose.yml's commands really run the stack, on PostgreSQL and Redis, without Docker.

There is no container engine on these machines, so this test takes each service's command and
environment from ``docker-compose config`` and runs it as a local process, with only the
addresses rewritten (``web:8000`` → a free local port, ``postgres``/``redis`` → the services the
tests use, a database of its own). Then alice's job goes through web → Celery worker → agent, as
it would in the containers.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from tests.infra.helpers import COMPOSE, ROOT, SECRETS, agent_services, tool
from tests.support import free_port, need_service

pytestmark = [pytest.mark.slow, pytest.mark.services, pytest.mark.timeout(180)]
BIN = str(Path(sys.executable).parent)


@pytest.fixture
def database() -> Iterator[str]:
    """A database of its own on the tests' PostgreSQL server, dropped afterwards."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        need_service("PostgreSQL (set DATABASE_URL), needed as compose runs it: one for web, worker, agent")
    import psycopg

    parsed = urlparse(url)
    name = f"tessera_compose_{os.getpid()}"
    admin = parsed._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield parsed._replace(path=f"/{name}").geturl()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


CREDENTIALS = "/app/var/demo-credentials.json"


def local(argv: list[str], port: int, credentials: Path | None = None) -> list[str]:
    """A service's command with the compose network's addresses (and the container's credentials
    file) made local."""
    swaps = {"http://web:8000": f"http://127.0.0.1:{port}", "-p 8000": f"-p {port}", "0.0.0.0": "127.0.0.1"}
    if credentials is not None:
        swaps[CREDENTIALS] = str(credentials)
    out = []
    for arg in argv:
        for old, new in swaps.items():
            arg = arg.replace(old, new)
        out.append(arg)
    return out


def get(url: str, token: str | None = None, body: dict | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Token {token}"
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body else None, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_compose_services_commands_run_a_job_through_web_worker_and_agent(database, tmp_path):
    redis_url = os.environ.get("REDIS_URL", "")
    if not redis_url:
        need_service("Redis (set REDIS_URL), needed as compose runs it: the broker and the channel layer")
    config = yaml.safe_load(
        subprocess.run(
            [tool("docker-compose"), "-f", str(COMPOSE), "config"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
            env={**os.environ, **SECRETS},
        ).stdout
    )
    services = config["services"]
    port = free_port()
    path = f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    overrides = {
        "DATABASE_URL": database,
        # Databases of their own on the tests' Redis server: broker 11, channel layer 12.
        "REDIS_URL": urlparse(redis_url)._replace(path="/11").geturl(),
        "TESSERA_REDIS_LAYER_DB": "12",
        "PROMETHEUS_URL": "http://127.0.0.1:9",
        "TESSERA_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "PATH": path,
        "HOME": os.environ.get("HOME", "/root"),
    }
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = tmp_path / "logs"
    logs.mkdir()
    # As root the agents run jobs as "nobody", who must reach their job directories.
    state = Path(tempfile.mkdtemp(prefix="tessera-compose-"))
    state.chmod(0o711)

    def start(name: str, argv: list[str], env: dict[str, str]) -> None:
        with open(logs / f"{name}.log", "wb") as out:
            procs[name] = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    try:
        for name in ("web", "worker", "beat"):
            argv = local([str(a) for a in services[name]["command"]], port, tmp_path / "credentials.json")
            if name == "beat":
                argv[argv.index("-s") + 1] = str(tmp_path / "celerybeat-schedule")
            start(name, argv, {**services[name]["environment"], **overrides})
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            assert procs["web"].poll() is None, (logs / "web.log").read_text()
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, (logs / "web.log").read_text()
            time.sleep(0.3)
        web_log = (logs / "web.log").read_text()
        credentials = tmp_path / "credentials.json"
        assert credentials.stat().st_mode & 0o777 == 0o600
        users = {u["username"]: u for u in json.loads(credentials.read_text())["users"]}
        alice_token = users["alice"]["token"]
        for secret in [services["web"]["environment"]["TESSERA_JOIN_TOKEN"], alice_token]:
            assert secret not in web_log
        assert all(u["password"] not in web_log for u in users.values())

        for name, svc in agent_services(config).items():
            argv = local([str(a) for a in svc["command"]], port)
            argv[argv.index("--metrics-port") + 1] = "0"
            argv[0] = sys.executable
            argv += ["--metrics-addr", "127.0.0.1", "--state-dir", str(state / name)]
            # Exactly the agent's compose environment: the join token and nothing of the server's.
            start(name, argv, {**svc["environment"], "PATH": path, "HOME": overrides["HOME"]})

        # Production mode (TESSERA_DEBUG=0) still serves the admin's static files.
        assert get(f"{base}/static/admin/css/base.css")[0] == 200
        status, body = get(
            f"{base}/api/v1/jobs/",
            alice_token,
            {"name": "hello", "kind": "batch", "command": ["python", "-c", "print(42)"], "gpus": 2},
        )
        assert status == 201, body
        job = json.loads(body)
        deadline = time.monotonic() + 60
        while job["state"] != "succeeded" and time.monotonic() < deadline:
            assert job["state"] not in ("failed", "cancelled"), job
            time.sleep(0.5)
            job = json.loads(get(f"{base}/api/v1/jobs/{job['id']}/", alice_token)[1])
        assert job["state"] == "succeeded", (job, (logs / "worker.log").read_text()[-3000:])
        logs_body = json.loads(get(f"{base}/api/v1/jobs/{job['id']}/logs/", alice_token)[1])
        assert "42" in logs_body["data"]
        assert "scheduling.tasks.scheduling_pass" in (logs / "worker.log").read_text()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
