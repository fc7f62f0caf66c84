"""The test run's exit guard (tests/conftest.py, "The end of the run"): a run that leaves a thread
behind still ends, with pytest's own exit status, naming the thread; turned off, it waits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LEAVES_A_THREAD = """
import threading, time
from concurrent.futures import ThreadPoolExecutor

def test_leaves_a_thread():
    threading.Thread(target=time.sleep, args=(3600,), name="stuck-for-an-hour").start()

def test_leaves_an_executor_thread_made_by_a_daemon():
    # as a live-server request thread running an async view does: the worker is a daemon
    # (made by one), yet the interpreter joins it at exit
    def request_thread():
        ThreadPoolExecutor(1, thread_name_prefix="stuck-executor").submit(time.sleep, 3600)
    made = threading.Thread(target=request_thread, daemon=True)
    made.start()
    made.join()

def test_fails():
    assert False
"""


def argv_env(tmp_path: Path, guard: str) -> tuple[list[str], dict[str, str]]:
    (tmp_path / "test_leaves.py").write_text(LEAVES_A_THREAD)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "TESSERA_TEST_EXIT_GRACE_S": "0.5",
        "TESSERA_TEST_EXIT_GUARD": guard,
    }
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull]
    argv += ["--rootdir", str(tmp_path), "-p", "tests.conftest", str(tmp_path / "test_leaves.py")]
    return argv, env


def test_a_run_that_leaves_a_thread_ends_with_its_status_and_names_the_thread(tmp_path):
    argv, env = argv_env(tmp_path, "1")
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1  # a test failed: pytest's status, not the guard's
    assert "1 failed, 2 passed" in done.stdout
    assert "stuck-for-an-hour" in done.stderr and "stuck-executor" in done.stderr


def test_without_the_guard_the_interpreter_waits_for_the_thread(tmp_path):
    """The canary: what the guard is there for (were it gone, the guard could go too)."""
    argv, env = argv_env(tmp_path, "0")
    out, err = subprocess.PIPE, subprocess.DEVNULL
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=err, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # until pytest's summary: the run itself is over
            if "1 failed, 2 passed" in line:
                break
        else:
            raise AssertionError("the run ended without its summary")
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(5)  # still waiting for the thread
    finally:
        proc.kill()
        proc.wait()
