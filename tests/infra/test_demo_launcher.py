"""``make demo``'s launcher, for real: web + 12 agent processes, a job through, Ctrl-C, nothing left.

Runs ``scripts/demo.py`` on its own port, database and state directories, so that it neither
needs nor disturbs a demo the developer may be running.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
SLEEPER = "import time; time.sleep(120)"


def start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else fields[19]


def process_tree(root: int) -> dict[int, str]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry.name))
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        started = start_time(pid)
        if started is not None and pid not in tree:
            tree[pid] = started
            todo.extend(children.get(pid, []))
    return tree


def listening_ports(pids) -> set[int]:
    """TCP ports in LISTEN held by any of ``pids`` (from /proc: no ss/netstat needed)."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def port_listens(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def api(base: str, token: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def run_job(base: str, token: str, command: list[str]) -> dict:
    job = api(base, token, "/api/v1/jobs/", {"name": "probe", "kind": "batch", "command": command, "gpus": 1})
    deadline = time.monotonic() + 30
    while job["state"] not in ("succeeded", "failed", "cancelled") and time.monotonic() < deadline:
        time.sleep(0.3)
        job = api(base, token, f"/api/v1/jobs/{job['id']}/")
    return job


def test_demo_serves_runs_a_job_and_ctrl_c_leaves_no_process_or_port(tmp_path):
    port = free_port()
    creds = tmp_path / "credentials.json"
    demo = subprocess.Popen(
        [
            sys.executable,
            "scripts/demo.py",
            "--port",
            str(port),
            "--db",
            str(tmp_path / "demo.sqlite3"),
            "--log-dir",
            str(tmp_path / "logs"),
            "--state-dir",
            str(tmp_path / "agents"),
            "--credentials-file",
            str(creds),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    output: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while not any("Press Ctrl-C" in line for line in output):
            line = demo.stdout.readline()
            assert line or demo.poll() is None, "demo exited early:\n" + "".join(output)
            output.append(line)
            assert time.monotonic() < deadline, "demo not ready in 60 s:\n" + "".join(output)
        text = "".join(output)
        assert f"http://127.0.0.1:{port}/api/v1/" in text and "12 simulated agents" in text
        users = {u["username"]: u for u in json.loads(creds.read_text())["users"]}
        assert {"admin", "alice", "carol", "bob"} <= set(users)
        for u in users.values():
            assert u["password"] in text and u["token"] in text

        # The README's example: alice's job reaches `succeeded` on one of the agents.
        base, token = f"http://127.0.0.1:{port}", users["alice"]["token"]
        job = api(
            base,
            token,
            "/api/v1/jobs/",
            {"name": "hello", "kind": "batch", "command": ["python", "-c", "print(42)"], "gpus": 1},
        )
        deadline = time.monotonic() + 30
        while job["state"] not in ("succeeded", "failed", "cancelled") and time.monotonic() < deadline:
            time.sleep(0.3)
            job = api(base, token, f"/api/v1/jobs/{job['id']}/")
        assert job["state"] == "succeeded", job
        assert "42" in api(base, token, f"/api/v1/jobs/{job['id']}/logs/")["data"]

        # What the demo wrote is its user's alone, and no log holds a password or a token.
        written = [tmp_path / "demo.sqlite3", creds, *sorted((tmp_path / "logs").iterdir())]
        assert {p.name: oct(p.stat().st_mode & 0o777) for p in written} == {p.name: "0o600" for p in written}
        assert oct((tmp_path / "logs").stat().st_mode & 0o777) == "0o700"
        logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").iterdir())
        for u in users.values():
            assert u["password"] not in logs and u["token"] not in logs
        # A job (as root, the agents run it as an unprivileged user) reads none of it.
        probe = (
            "import sys\nfor p in sys.argv[1:]:\n"
            "    try: open(p).read(1); print('READ', p)\n    except OSError: pass"
        )
        reader = run_job(base, token, ["python", "-c", probe, *map(str, written)])
        assert reader["state"] == "succeeded", reader
        read = api(base, token, f"/api/v1/jobs/{reader['id']}/logs/")["data"]
        if os.geteuid() == 0:
            assert "READ" not in read, read

        # A job still running at Ctrl-C must not outlive the demo either.
        sleeper = api(
            base,
            token,
            "/api/v1/jobs/",
            {"name": "sleeper", "kind": "batch", "gpus": 1, "command": ["python", "-c", SLEEPER]},
        )
        deadline = time.monotonic() + 30
        while sleeper["state"] != "running" and time.monotonic() < deadline:
            time.sleep(0.3)
            sleeper = api(base, token, f"/api/v1/jobs/{sleeper['id']}/")
        assert sleeper["state"] == "running", sleeper

        tree = process_tree(demo.pid)
        assert any(SLEEPER in cmdline(pid) for pid in tree), "the job's process is not in the tree"
        ports = listening_ports(tree)
        assert len(tree) >= 14  # the launcher, web, 12 agents
        assert port in ports and len(ports) >= 13  # web, and each agent's /metrics
    finally:
        demo.send_signal(signal.SIGINT)  # what Ctrl-C delivers
        try:
            rc = demo.wait(timeout=40)
        finally:
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGKILL)
    assert rc == 0, demo.stdout.read()
    left = [pid for pid, started in tree.items() if start_time(pid) == started]
    assert left == [], f"processes left behind: {left}"
    assert [p for p in ports if port_listens(p)] == []


def test_demo_refuses_a_busy_port_with_a_clear_message_and_starts_nothing(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                "scripts/demo.py",
                "--port",
                str(port),
                "--db",
                str(tmp_path / "d.sqlite3"),
                "--log-dir",
                str(tmp_path / "logs"),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    assert result.returncode != 0
    assert f"port {port}" in result.stderr and "PORT=" in result.stderr
    assert not (tmp_path / "d.sqlite3").exists()
