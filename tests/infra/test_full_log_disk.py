"""The worker and beat start, as docker-compose.yml runs them, when their log disk is full.

Celery prints a banner to stdout as the worker or beat starts; when that write failed (the disk
holding the logs full: ``OSError: [Errno 28]``), Celery ended the process with status 1, so a
worker or beat restarted then never came up and no pass ran. The deployment runs them with
``--quiet`` (docs/operations.md, "What happens when something fails"). ``/dev/full`` stands for
the full disk: every write to it fails with ENOSPC.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.infra.helpers import COMPOSE, ROOT
from tests.support import free_port

# What each logs once its start is past the banner (to stderr, which is a file here).
STARTED = {"worker": ("Redis unreachable", "Connected to"), "beat": ("beat: Starting",)}


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("service", ["worker", "beat"])
def test_the_worker_and_beat_start_with_their_stdout_on_a_full_disk(service, tmp_path: Path):
    command = yaml.safe_load(COMPOSE.read_text())["services"][service]["command"]
    assert command[0] == "celery"
    argv = [sys.executable, "-m", "celery", *command[1:]]
    if "-s" in argv:  # beat's schedule file: the test's own
        argv[argv.index("-s") + 1] = str(tmp_path / "celerybeat-schedule")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "DJANGO_", "PYTEST_"))}
    # A broker nobody listens on: nothing is taken from or sent to anyone's Redis.
    env.update(REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", DJANGO_SETTINGS_MODULE="controlplane.settings")
    env["DATABASE_URL"] = f"sqlite:///{tmp_path}/db.sqlite3"
    with open("/dev/full", "w") as full, open(tmp_path / "stderr", "w+") as err:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=full, stderr=err, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                if any(marker in (tmp_path / "stderr").read_text() for marker in STARTED[service]):
                    break
                time.sleep(0.2)
            log = (tmp_path / "stderr").read_text()
            assert proc.poll() is None, f"{service} ended with status {proc.returncode}:\n{log[-2000:]}"
            assert any(marker in log for marker in STARTED[service]), log[-2000:]
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
