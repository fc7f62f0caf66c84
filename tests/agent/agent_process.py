"""The real agent as a process (``python -m agent``) against a live control plane, for tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from scheduling.models import Node
from tests.agent import fakes

ROOT = Path(__file__).resolve().parents[2]


def start_agent(server: str, state_dir: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "agent",
        "--server",
        server,
        "--simulate",
        "4xA100,nvlink=2,rack=r9",
        "--name",
        "cli-node",
        "--metrics-port",
        "0",
        "--metrics-addr",
        "127.0.0.1",
        "--state-dir",
        str(state_dir),
        "--poll-interval",
        "0.2",
        "--shutdown-grace",
        "2",
        # No long-poll against the test's threaded WSGI server: a request parked there for
        # seconds would outlive the test (push is tested against daphne: tests/integration).
        "--wait-timeout",
        "0",
        *(["--single-tenant"] if os.geteuid() != 0 else []),  # a uid per job needs root
        *extra,
    ]
    clean = {k: v for k, v in os.environ.items() if k != "TESSERA_JOIN_TOKEN"}
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        env={**clean, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def stop_agent(agent: subprocess.Popen) -> str:
    if agent.poll() is None:
        agent.send_signal(signal.SIGINT)
        try:
            agent.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait(5)
    return agent.stdout.read() if agent.stdout else ""


def registered(state_dir: Path, name: str = "cli-node", timeout: float = 30) -> Node:
    """The node, once the agent has registered it and stored its credential."""
    ours = Node.objects.filter(name=name, credential_hash__isnull=False)
    node = fakes.wait_for(ours.first, timeout)
    assert node is not None, "the agent did not register"
    assert fakes.wait_for(lambda: (state_dir / "credential").exists(), 10)
    return node


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for whoever inherited it): a process whose first
    thread exited while its others run reads as a zombie, and is alive."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0] not in ("Z", "X") or int(fields[17]) > 1
