"""The spawn chain's Landlock step (agent/landlock.py): where it stands, and what it scopes.

A process behind the step cannot connect to an abstract unix socket made outside it, nor signal a
process outside it; its own processes reach each other as before. Jobs attacking each other this
way through a real agent: tests/agent/test_hostile_jobs.py; replicas of one attempt:
tests/agent/test_isolation.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from agent import sandbox
from agent.identity import RunAs
from tests.agent import fakes

needs_scopes = pytest.mark.skipif(
    sandbox.scope_unavailable() is not None, reason=f"no Landlock scopes: {sandbox.scope_unavailable()}"
)


@pytest.mark.skipif(sandbox.setpriv() is None, reason="no setpriv with --pdeathsig on this machine")
def test_the_landlock_step_runs_as_root_right_before_the_user_switch_and_only_when_scoped():
    job = RunAs("job", 200001, 200001)
    scoped = sandbox.Sandbox(False, max_tasks=64, scoped=True).prefix(job, [])
    at = scoped.index(sandbox.setpriv())
    step = [sys.executable, "-I", "-S", str(sandbox.LANDLOCK_STEP)]
    assert scoped[at - len(step) : at] == step
    assert scoped[0].endswith("prlimit") and scoped.index("--") == at - len(step) - 1  # prlimit's end
    assert "--reuid" in scoped[at:]  # the user switch comes after: the step runs as root
    plain = sandbox.Sandbox(False, max_tasks=64).prefix(job, [])
    assert str(sandbox.LANDLOCK_STEP) not in plain and plain == scoped[: at - len(step)] + scoped[at:]


BEHIND_THE_STEP = (
    fakes.ATTEMPT
    + r"""
import json, os, signal, socket, subprocess, sys
outside, parent = "\0" + sys.argv[1], int(sys.argv[2])

def connect(name, kind=socket.SOCK_STREAM):
    with socket.socket(socket.AF_UNIX, kind) as s:
        s.connect(name)

def send(name):
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(b"x", name)

mine = socket.socket(socket.AF_UNIX)
mine.bind("\0" + sys.argv[1] + "-mine")
mine.listen()
own = "import socket, sys; socket.socket(socket.AF_UNIX).connect('\\0' + sys.argv[1])"
child = [sys.executable, "-c", own, sys.argv[1] + "-mine"]
print(json.dumps({
    "connect to an abstract socket made outside": attempt(lambda: connect(outside)),
    "send to an abstract datagram socket made outside": attempt(lambda: send(outside + "-dgram")),
    "signal a process outside": attempt(lambda: os.kill(parent, signal.SIGUSR1)),
    "its child connects to its own": subprocess.run(child).returncode,
}))
"""
)


@needs_scopes
def test_behind_the_step_no_abstract_socket_or_signal_reaches_outside_but_its_own_sockets_do():
    name = f"tessera-test-landlock-{os.getpid()}"
    with socket.socket(socket.AF_UNIX) as outside, socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as dgram:
        outside.bind("\0" + name)
        outside.listen()
        dgram.bind("\0" + name + "-dgram")
        dgram.setblocking(False)
        received: list[int] = []
        old = signal.signal(signal.SIGUSR1, lambda *_: received.append(1))
        try:
            script = [sys.executable, "-c", BEHIND_THE_STEP, name, str(os.getpid())]
            # the same process without the step reaches out: the test could fail
            without = subprocess.run(script, capture_output=True, text=True, check=True)
            assert json.loads(without.stdout)["connect to an abstract socket made outside"] == "succeeded"
            assert dgram.recv(8) == b"x" and received == [1]
            behind = subprocess.run([*sandbox.landlock_step(), *script], capture_output=True, text=True)
        finally:
            signal.signal(signal.SIGUSR1, old)
        assert behind.returncode == 0, behind.stderr
        assert json.loads(behind.stdout) == {
            "connect to an abstract socket made outside": "PermissionError",
            "send to an abstract datagram socket made outside": "PermissionError",
            "signal a process outside": "PermissionError",
            "its child connects to its own": 0,
        }
        assert received == [1]
        with pytest.raises(BlockingIOError):
            dgram.recv(8)


def test_without_landlock_scopes_the_agent_says_so_at_its_start_and_jobs_are_not_scoped(monkeypatch, caplog):
    monkeypatch.setattr(sandbox, "scope_unavailable", lambda: "Landlock ABI 4 has no scopes")
    with caplog.at_level("INFO", logger="tessera.agent"):
        box = sandbox.detect()
    assert not box.scoped
    assert "abstract unix socket" in caplog.text and "Landlock ABI 4 has no scopes" in caplog.text


@needs_scopes
@pytest.mark.skipif(sandbox.namespaces_unavailable() is not None, reason="no mount namespaces here")
def test_behind_the_whole_chain_the_job_gets_its_own_locale_and_no_other():
    """The chain's util-linux steps run without a locale; the Landlock step (Python) gets one,
    so that Python does not set ``LC_CTYPE`` for the job: the job's locale is its own."""
    box = sandbox.Sandbox(True, max_tasks=64, scoped=True)
    assert "LANG" not in box.env  # unshare and every mount: no locale to load
    job = RunAs("tessera-test", 270003, 270003)
    env_fd = fakes.env_stdin({"PATH": sandbox.SAFE_PATH, "LANG": "C", "MINE": "yes"}, job)
    try:
        done = subprocess.run(
            [*box.prefix(job, []), "env"], stdin=env_fd, env=box.env, cwd="/", capture_output=True, text=True
        )
    finally:
        os.close(env_fd)
    assert done.returncode == 0, done.stderr
    seen = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert (seen["LANG"], seen["MINE"]) == ("C", "yes")
    assert not [name for name in seen if name.startswith("LC_")]
