"""The dashboard in a real browser: Debian's headless Chromium, driven by Playwright, against a
real ASGI server (daphne, in a subprocess) with websockets and the embedded pass loop.

alice signs in and sees the cluster; bob's jobs show to her only as "in use". When she submits a
job, the pass binds it to the GPUs of a real agent's node and the agent starts it: her GPU cells
and her running list change on the open page — pushed over the websocket, with no reload. The
page's model after those deltas equals a fresh snapshot. bob, on his own page, sees her GPUs only
as "in use". A screenshot goes to ``test-artifacts/dashboard.png``.

The server runs on its own SQLite file (the embedded default), so it shares nothing with pytest's
test database and needs no other service.
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
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support import free_port, need_service, stop_process

pytestmark = [pytest.mark.browser, pytest.mark.slow]

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
    env = server_env(tmp_path / "tessera.sqlite3")
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
        ],
        cwd=ROOT,
        env=server["env"],
        stdout=log,
        stderr=subprocess.STDOUT,
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


def sign_in(browser: Any, server: dict[str, Any], who: str) -> Any:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(server["url"] + "/")
    assert "/login/" in page.url  # the dashboard needs a session
    page.fill("#id_username", who)
    page.fill("#id_password", server["users"][who]["password"])
    page.click("button[type=submit]")
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


def test_alice_sees_her_job_take_its_gpus_live_without_a_reload(server: dict[str, Any], agent: str) -> None:
    if not Path(CHROMIUM).exists() or shutil.which("chromium") is None:
        need_service("Chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    # bob is already using the cluster; one job of his cannot fit anywhere.
    bob_job = submit(server, "bob", name="bob-pretraining", gpus=8, accelerators=["H100"])
    submit(server, "bob", name="bob-notebook", gpus=0.5, kind="inference", accelerators=["T4"])
    submit(server, "bob", name="bob-too-big", gpus=64)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            alice = sign_in(browser, server, "alice")
            alice.wait_for_function("document.querySelectorAll('.cell.in-use').length >= 8", timeout=15_000)
            # Nothing of bob's jobs but "in use": no ids, names or tenant on alice's page.
            html = alice.content()
            assert "bob-pretraining" not in html and "nlp" not in html and f"job {bob_job}" not in html
            alice.evaluate("window.__noReloadMarker = 'still here'")
            loaded_at = alice.evaluate("window.TESSERA.loadedAt")
            snapshots = alice.evaluate("window.TESSERA.snapshots")

            # The job runs for real on the agent's node: bound by the pass, started by the agent.
            job_id = submit(server, "alice", name="alice-resnet", gpus=4, accelerators=["L40S"])
            mine = f".cell.mine[data-jobs~='{job_id}']"
            alice.wait_for_function(f'document.querySelectorAll("{mine}").length === 4', timeout=15_000)
            cells = alice.eval_on_selector_all(
                mine, "cells => cells.map(c => [c.dataset.node, c.dataset.state, c.title])"
            )
            assert {node for node, _, _ in cells} == {agent}
            for _, state, title in cells:
                assert state == "allocated" and f"job {job_id} alice-resnet" in title
            running = f"#running li[data-job-id='{job_id}'][data-state='running']"
            alice.wait_for_selector(running, timeout=15_000)

            # Pushed, not reloaded: the page's own state survived, and no second snapshot was needed.
            assert alice.evaluate("window.__noReloadMarker") == "still here"
            assert alice.evaluate("window.TESSERA.loadedAt") == loaded_at
            assert alice.evaluate("window.TESSERA.snapshots") == snapshots
            assert alice.evaluate("window.TESSERA.deltas") > 0

            # Snapshot plus deltas equals a fresh snapshot (docs/websockets.md), in the page's own code.
            wait_quiet(alice)
            current = alice.evaluate("window.TESSERA.currentNormalized()")
            fresh = alice.evaluate("window.TESSERA.fetchNormalized()")
            assert current == fresh

            ARTIFACTS.mkdir(exist_ok=True)
            alice.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

            # bob sees alice's GPUs only as "in use", without her job's id or name.
            bob = sign_in(browser, server, "bob")
            bob.wait_for_function("document.querySelectorAll('.cell.in-use').length >= 4", timeout=10_000)
            titles = bob.eval_on_selector_all(
                f".cell[data-node='{agent}']", "cells => cells.map(c => c.className + ' ' + c.title)"
            )
            assert sum("in-use" in t for t in titles) == 4
            assert "alice-resnet" not in bob.content() and f"job {job_id}" not in bob.content()
            bob.screenshot(path=str(ARTIFACTS / "dashboard-bob.png"), full_page=True)
        finally:
            browser.close()
