"""Small helpers the test folders share: free ports, missing services, stopping processes."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

REQUIRE_SERVICES = os.environ.get("TESSERA_REQUIRE_SERVICES", "") in ("1", "true", "yes")


def need_service(what: str) -> None:
    """Skip (or, under TESSERA_REQUIRE_SERVICES=1 as CI runs, fail) because ``what`` is missing."""
    if REQUIRE_SERVICES:
        pytest.fail(f"{what} is required (TESSERA_REQUIRE_SERVICES=1) but not available")
    pytest.skip(f"{what} not available")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds; always reaped."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
