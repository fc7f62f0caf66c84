"""Fixtures for the monitoring tests: a real Prometheus server, and tools the tests need.

A missing tool skips its test, or fails it under ``TESSERA_REQUIRE_SERVICES=1`` (CI), through
``tests.support.need_service``.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support import free_port, need_service

PROMETHEUS = "/usr/bin/prometheus"


# The control plane's /metrics runs its aggregate queries at scrape time, in the test's own live
# server: on a loaded machine one scrape may take over a second, so it gets longer than the agents.
SLOW_TARGETS = {"tessera": "3s"}


def scrape_config(targets: dict[str, str]) -> str:
    """A Prometheus config scraping each ``name: host:port[/path]`` every second (the control
    plane's /metrics every 3 s, each scrape allowed as long)."""
    lines = ["global:", "  scrape_interval: 1s", "  evaluation_interval: 1s", "scrape_configs:"]
    for name, target in targets.items():
        address, _, path = target.partition("/")
        every = SLOW_TARGETS.get(name, "1s")
        lines += [
            f"  - job_name: {name}",
            f"    scrape_interval: {every}",
            f"    scrape_timeout: {every}",
            f"    metrics_path: /{path or 'metrics'}",
            "    static_configs:",
            f"      - targets: ['{address}']",
        ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[dict[str, str]], str]]:
    """Start a real Prometheus scraping the given targets; returns its URL. Stopped afterwards,
    or by the test calling ``prometheus.stop()``."""
    binary = PROMETHEUS if Path(PROMETHEUS).exists() else shutil.which("prometheus")
    if binary is None:
        need_service("Prometheus (apt-get install prometheus)")
    started: list[subprocess.Popen[bytes]] = []

    def start(targets: dict[str, str], more_jobs: str = "") -> str:
        """``more_jobs``: scrape jobs of its own, YAML appended under ``scrape_configs``."""
        config = tmp_path / "prometheus.yml"
        config.write_text(scrape_config(targets) + more_jobs)
        port = free_port()
        log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - the process holds it
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        started.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                if requests.get(url + "/-/ready", timeout=1).status_code == 200:
                    return url
            except requests.RequestException:
                pass
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "Prometheus was not ready within 20 s"
            time.sleep(0.1)

    def stop() -> None:
        for proc in started:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    start.stop = stop  # type: ignore[attr-defined]  # a test may stop it mid-way (an outage)
    yield start
    stop()


@pytest.fixture(autouse=True)
def fast_password_hashing(settings: Any) -> None:
    """The test world hashes four passwords per test; the production hasher is slow on purpose."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
