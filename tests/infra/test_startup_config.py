"""A misconfigured environment at start-up: every process (manage.py, daphne, the Celery worker)
stops with a message naming the variable and its value, exit status 1, and no traceback — the
README's promise ("a bad value stops the process with a message naming the variable")."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

BAD = [
    ("TESSERA_LEASE_S", "-1"),  # an env_float below its minimum
    ("TESSERA_LEASE_S", "inf"),  # a lease that never ends is no lease
    ("TESSERA_PASS_INTERVAL_S", "abc"),  # also read by the Celery app for beat's schedule
    ("TESSERA_ADJUST_INTERVAL_S", "5s"),
    ("TESSERA_IDLE_WARN_S", "900,abc"),  # a list of numbers
    ("TESSERA_IDLE_BOUNDS_THRESHOLD", "0.01,high"),
    ("TESSERA_IDLE_BOUNDS_THRESHOLD", "0.5"),  # one number: every read of the bounds was a 500
    ("TESSERA_IDLE_BOUNDS_EXEMPT_S", "7200,300"),  # low above high: every override refused
    ("REDIS_URL", "redis://127.0.0.1:notaport/0"),
    ("TESSERA_ENGINE_PREEMPT", "off"),  # a misspelt knob (preemption) must not be ignored
    ("TESSERA_LOG_LEVEL", "verbose"),  # reached logging's dictConfig raw: a page of traceback
]

PROCESSES = {
    "manage.py": [sys.executable, "manage.py", "check"],
    "daphne": [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", "0", "controlplane.asgi:application"],
    "celery": [str(BIN / "celery"), "-A", "controlplane", "worker", "--pool", "solo"],
}


def start(argv: list[str], name: str, value: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "PYTEST_"))}
    env.update(DJANGO_SETTINGS_MODULE="controlplane.settings", **{name: value})
    if "celery" in argv[0]:
        env.setdefault("REDIS_URL", "redis://127.0.0.1:1/0")  # never reached: it stops first
    return subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL
    )


@pytest.mark.parametrize(("name", "value"), BAD, ids=[f"{n}={v}" for n, v in BAD])
def test_manage_py_stops_naming_the_variable_without_a_traceback(name, value):
    done = start(PROCESSES["manage.py"], name, value)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert name in done.stderr and repr(value) in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("process", ["daphne", "celery"])
def test_servers_stop_naming_the_variable_without_a_traceback(process):
    done = start(PROCESSES[process], "TESSERA_PASS_INTERVAL_S", "abc")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "TESSERA_PASS_INTERVAL_S='abc'" in done.stderr, done.stderr


def test_a_log_level_in_lower_case_is_taken_as_its_name():
    done = start([*PROCESSES["manage.py"], "--fail-level", "ERROR"], "TESSERA_LOG_LEVEL", "debug")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("command", [["create_join_token"], ["export_trace", "{tmp}/trace"]])
def test_an_operator_command_without_its_database_says_so_without_a_traceback(command, tmp_path):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    port = closed.getsockname()[1]
    argv = [sys.executable, "manage.py", *(a.format(tmp=tmp_path) for a in command)]
    try:
        done = start(argv, "DATABASE_URL", f"postgres://postgres@127.0.0.1:{port}/tessera")
    finally:
        closed.close()
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert f"the database at 127.0.0.1:{port}/tessera cannot be reached" in done.stderr, done.stderr


def test_a_request_that_cannot_reach_the_database_is_one_503_and_one_log_line(world, monkeypatch, caplog):
    """While PostgreSQL is away every request fails alike: each answers 503 (handler500) and
    is logged by django.request in one line that says why, not a page of traceback each."""
    from django.db import OperationalError
    from rest_framework.test import APIClient

    from scheduling.api.jobs import JobViewSet

    def away(*args, **kwargs):
        raise OperationalError('connection failed: connection to server at "127.0.0.1", port 5432 refused')

    monkeypatch.setattr(JobViewSet, "list", away)
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Token {world.tokens['alice']}")
    with caplog.at_level(logging.ERROR, logger="django.request"):
        answer = client.get("/api/v1/jobs/")
    assert answer.status_code == 503 and "detail" in answer.json()
    logged = [r for r in caplog.records if r.name == "django.request"]
    assert len(logged) == 1 and logged[0].exc_info is None, logged
    assert "/api/v1/jobs/" in logged[0].getMessage()
    assert "the database is unreachable: connection failed" in logged[0].getMessage()
