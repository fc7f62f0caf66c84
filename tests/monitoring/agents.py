"""A real agent process for the monitoring tests (simulated GPUs replaying utilisation profiles,
its DCGM-style metrics on a port of its own), and the polling they share."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support import free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]
NODE = "prom-node-1"
FIRST_SAMPLE_S = 30  # the first scraped sample appears after ~6 s even at a 1 s interval


def poll(what: str, fetch: Any, timeout_s: float = FIRST_SAMPLE_S, every_s: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = fetch()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: nothing within {timeout_s:.0f} s")
        time.sleep(every_s)


@contextmanager
def running_agent(server: str, tmp_path: Path, gpus: int = 2) -> Iterator[dict[str, Any]]:
    """A real agent process (``gpus`` simulated A100s) registered with ``server``; one profile
    minute per second (``--util-speed 60``)."""
    from scheduling.services.agents import do_create_join_token

    _, token = do_create_join_token("prometheus-test")
    token_file = tmp_path / "join-token"
    token_file.write_text(token)
    # Jobs run as an unprivileged user when the agent is root, who must reach the state directory
    # (pytest's tmp_path is private to root).
    state_dir = Path(tempfile.mkdtemp(prefix="tessera-agent-"))
    state_dir.chmod(0o711)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "TESSERA_JOIN_TOKEN"}
    env["PYTHONPATH"] = str(ROOT)
    argv = [sys.executable, "-m", "agent", "--server", server, "--join-token-file", str(token_file)]
    argv += ["--simulate", f"{gpus}xA100,rack=r1", "--name", NODE, "--metrics-port", str(port)]
    argv += ["--metrics-addr", "127.0.0.1", "--state-dir", str(state_dir / "state")]
    argv += ["--poll-interval", "0.2", "--util-speed", "60"]
    log = open(tmp_path / "agent.log", "wb")  # noqa: SIM115 - the process holds it
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        from scheduling.models import Device

        def registered() -> bool:
            assert proc.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
            return Device.objects.filter(node__name=NODE).count() == gpus

        poll("agent registration", registered, timeout_s=30)
        yield {"metrics": f"127.0.0.1:{port}", "log": tmp_path / "agent.log"}
    finally:
        stop_process(proc, timeout=15)
        log.close()
        subprocess.run(["rm", "-rf", str(state_dir)], check=False)
