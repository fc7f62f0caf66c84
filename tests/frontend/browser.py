"""Real-browser test helpers: Debian's Chromium driven by Playwright against a real ASGI server
(daphne, in a subprocess) with websockets and the embedded pass loop, over its own SQLite file
(the embedded default), so it shares nothing with pytest's test database and needs no service.

The fixtures ``server`` and ``agent`` are registered by ``conftest.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support import free_port, need_service, stop_process

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
ARTIFACTS = ROOT / "test-artifacts"


def server_env(db_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PROMETHEUS_URL", "PYTEST_VERSION")}
    env.update(
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        DATABASE_URL=f"sqlite://{db_path}",
        TESSERA_PASS_LOOP="1",  # the embedded default: passes run in the web process
        TESSERA_PASS_INTERVAL_S="0.5",
        TESSERA_HEARTBEAT_TIMEOUT_S="3600",  # the seeded nodes have no agent heartbeating
        TESSERA_LEASE_S="3600",
        PYTHONPATH=str(ROOT),
    )
    return env


@pytest.fixture
def server(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """daphne on a free port over a fresh, migrated and seeded SQLite file."""
    with running_server(tmp_path) as server:
        yield server


@contextmanager
def running_server(tmp_path: Path, **more_env: str) -> Iterator[dict[str, Any]]:
    """:func:`server`, with ``more_env`` in the server's environment."""
    env = {**server_env(tmp_path / "tessera.sqlite3"), **more_env}
    python = sys.executable

    def run(*args: str) -> str:
        done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    # One interpreter for both steps: start-up is a good part of the cost on a busy machine.
    seed = (
        "import django, json; django.setup(); from django.core.management import call_command; "
        "call_command('migrate', interactive=False, verbosity=0); "
        "from tests.frontend.helpers import seed_browser_world; print(json.dumps(seed_browser_world()))"
    )
    users = json.loads(run(python, "-c", seed).splitlines()[-1])
    port = free_port()
    log = open(tmp_path / "daphne.log", "wb")  # noqa: SIM115 - closed after the process ends
    proc = subprocess.Popen(
        [python, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "controlplane.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(url + "/login/", timeout=5).status_code == 200:
                    break
            except requests.RequestException:  # not listening yet, or still importing
                pass
            assert proc.poll() is None, (tmp_path / "daphne.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "daphne did not answer within 30 s"
            time.sleep(0.1)
        yield {"url": url, "users": users, "log": tmp_path / "daphne.log", "env": env}
    finally:
        stop_process(proc, timeout=10)
        log.close()


@pytest.fixture
def agent(server: dict[str, Any], tmp_path: Path) -> Iterator[str]:
    """A real node agent (4 simulated L40S in rack r3) registered with the server; its name."""
    with running_agent(server, tmp_path) as name:
        yield name


@contextmanager
def running_agent(server: dict[str, Any], tmp_path: Path, *more_args: str) -> Iterator[str]:
    """:func:`agent`, with ``more_args`` on its command line."""
    name = "gpu-live"
    token_file = tmp_path / "join-token"
    token_file.write_text(server["users"]["join_token"])
    # Jobs run as an unprivileged user when the agent is root: it must reach the state directory.
    state_dir = Path(tempfile.mkdtemp(prefix="tessera-agent-"))
    state_dir.chmod(0o711)
    log = open(tmp_path / "agent.log", "wb")  # noqa: SIM115 - closed after the process ends
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent",
            "--server",
            server["url"],
            "--join-token-file",
            str(token_file),
            "--simulate",
            "4xL40S,nvlink=2,rack=r3",
            "--name",
            name,
            "--metrics-port",
            "0",
            "--metrics-addr",
            "127.0.0.1",
            "--state-dir",
            str(state_dir / "state"),
            "--poll-interval",
            "0.2",
            "--shutdown-grace",
            "1",
            *more_args,
        ],
        cwd=ROOT,
        env=server["env"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        admin = {"Authorization": f"Token {server['users']['admin']['token']}"}
        node_url = f"{server['url']}/api/v1/nodes/{name}/"
        deadline = time.monotonic() + 30
        while requests.get(node_url, headers=admin, timeout=5).status_code != 200:
            assert proc.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the agent did not register within 30 s"
            time.sleep(0.2)
        yield name
    finally:
        stop_process(proc, timeout=15)
        log.close()
        shutil.rmtree(state_dir, ignore_errors=True)


def submit(server: dict[str, Any], who: str, **body: Any) -> int:
    body = {"kind": "training", "command": ["sleep", "600"], **body}
    response = requests.post(
        server["url"] + "/api/v1/jobs/",
        json=body,
        headers={"Authorization": f"Token {server['users'][who]['token']}"},
        timeout=10,
    )
    assert response.status_code == 201, response.text
    return response.json()["id"]


def submit_sign_in(page: Any, server: dict[str, Any], who: str) -> None:
    """Fill in and send the sign-in form ``page`` shows, as ``who``."""
    page.fill("#id_username", who)
    page.fill("#id_password", server["users"][who]["password"])
    page.click("button[type=submit]")


def sign_in(browser: Any, server: dict[str, Any], who: str) -> Any:
    # bypass_csp: the tests' own probes (wait_for_function with a string) are evaluated as script
    # text, which the site's policy forbids; the pages' own scripts keep to it
    # (tests/frontend/test_csp_browser.py checks that, without this).
    page = browser.new_page(viewport={"width": 1400, "height": 900}, bypass_csp=True)
    page.goto(server["url"] + "/")
    assert "/login/" in page.url  # the dashboard needs a session
    submit_sign_in(page, server, who)
    page.wait_for_url(server["url"] + "/")
    page.wait_for_selector("#live.live-on", timeout=10_000)
    page.wait_for_selector(".cell[data-node]", timeout=10_000)
    return page


def wait_quiet(page: Any, quiet_ms: int = 1500, timeout_s: float = 15) -> None:
    """Until no delta has arrived for ``quiet_ms`` (the pass loop has settled)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if page.evaluate(f"Date.now() - window.TESSERA.lastDeltaAt > {quiet_ms}"):
            return
        time.sleep(0.2)
    pytest.fail("the dashboard kept receiving deltas")


def need_chromium() -> None:
    if not Path(CHROMIUM).exists() or shutil.which("chromium") is None:
        need_service("Chromium (apt-get install chromium)")
