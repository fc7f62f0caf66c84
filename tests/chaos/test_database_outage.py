"""The database unreachable for a while, under a real web process (daphne with its connection
pool, as deployed), reached through a TCP proxy this test cuts and restores.

While it is cut, users and scrapers get clean answers: the API a 503 with a JSON error and a
``Retry-After`` (not Django's HTML "Server Error (500)" page), within a few seconds (not after the
pool's 20 s wait, which tied up every web thread and every agent's heartbeat); ``/metrics`` its
process metrics within the deployed scrape timeout (``deploy/prometheus.yml``: 5 s), as
docs/metrics.md promises, with ``tessera_cluster_metrics_available 0``: the cluster gauges are
gone, and without it every alert on them went quiet with nothing saying why. Once it is back,
the API answers again within seconds: the pool's reconnection backoff (doubling up to 5
minutes) no longer leaves the web answering errors long after the database returned.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import requests

from tests.support import Processes, database_url_of, free_port, stack_env, wait_until, web_answers, web_argv

pytestmark = [
    pytest.mark.services,
    pytest.mark.timeout(120),
    pytest.mark.postgresql("the web process's connection pool against a database that goes away"),
]

SCRAPE_TIMEOUT_S = 5.0  # deploy/prometheus.yml: a 5 s scrape interval bounds the scrape timeout


class CuttableProxy:
    """127.0.0.1:<port> → the database; ``cut()`` drops every connection and refuses new ones
    (as a database that went away does), ``restore()`` accepts again."""

    def __init__(self, target: tuple[str, int]):
        self.target, self.cut_off = target, threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="db-proxy").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if self.cut_off.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.cut_off.set()
        with self.lock:
            for s in self.open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            self.open.clear()

    def restore(self) -> None:
        self.cut_off.clear()

    def close(self) -> None:
        self.cut()
        self.server.close()


@pytest.fixture
def web_via_proxy(require_postgres, transactional_db, world, settings) -> Iterator[tuple[str, CuttableProxy]]:
    url = urlsplit(database_url_of(settings))
    proxy = CuttableProxy((url.hostname or "127.0.0.1", url.port or 5432))
    auth = url.netloc.rsplit("@", 1)[0]
    proxied = urlunsplit(url._replace(netloc=f"{auth}@127.0.0.1:{proxy.port}"))
    work = Path(tempfile.mkdtemp(prefix="tessera-dbout-", dir="/tmp"))
    procs = Processes(work)
    # No Redis: passes in the web process (its loop off), nothing else this test needs.
    env = stack_env(proxied, "", TESSERA_EMBEDDED_PASSES="1", TESSERA_WEB_THREADS="4")
    env.pop("REDIS_URL")
    port = free_port()
    try:
        procs.start("web", web_argv(port=port), env)
        base = f"http://127.0.0.1:{port}"
        wait_until("the web server", lambda: web_answers(base), procs, time.monotonic() + 60)
        yield base, proxy
    finally:
        procs.stop_all()
        proxy.close()
        shutil.rmtree(work, ignore_errors=True)


def test_api_answers_503_json_while_the_database_is_away_and_recovers_when_it_is_back(web_via_proxy, world):
    base, proxy = web_via_proxy
    alice = requests.Session()
    alice.headers["Authorization"] = f"Token {world.tokens['alice']}"
    body = {"name": "db-away", "kind": "batch", "command": ["true"], "gpus": 1}
    assert alice.get(base + "/api/v1/jobs/", timeout=10).status_code == 200
    assert "\ntessera_cluster_metrics_available 1.0\n" in requests.get(base + "/metrics", timeout=10).text

    proxy.cut()
    for method, path, kwargs in (("GET", "/api/v1/jobs/", {}), ("POST", "/api/v1/jobs/", {"json": body})):
        began = time.monotonic()
        answer = alice.request(method, base + path, timeout=30, **kwargs)
        took = time.monotonic() - began
        assert answer.status_code == 503, (method, answer.status_code, answer.text[:300])
        assert answer.headers["Content-Type"].startswith("application/json"), answer.headers
        assert "database" in answer.json()["detail"].lower()
        assert int(answer.headers["Retry-After"]) > 0
        assert took < SCRAPE_TIMEOUT_S, f"{method} {path} took {took:.1f} s"

    began = time.monotonic()
    scrape = requests.get(base + "/metrics", timeout=30)
    assert time.monotonic() - began < SCRAPE_TIMEOUT_S, "the scrape outlasts Prometheus's timeout"
    assert scrape.status_code == 200 and "process_cpu_seconds_total" in scrape.text
    # the cluster gauges are gone, and the scrape says why (deploy/alerts.yml alerts on it)
    assert "tessera_jobs{" not in scrape.text
    assert "\ntessera_cluster_metrics_available 0.0\n" in scrape.text

    time.sleep(12)  # an outage long enough for the pool's reconnection backoff to grow
    proxy.restore()
    began = time.monotonic()
    deadline = began + 30
    while time.monotonic() < deadline:
        answer = alice.get(base + "/api/v1/jobs/", timeout=30)
        if answer.status_code == 200:
            break
        time.sleep(0.2)
    assert answer.status_code == 200, answer.text[:300]
    assert time.monotonic() - began < 5.0, f"back only {time.monotonic() - began:.1f} s after the database"
    created = alice.post(base + "/api/v1/jobs/", json=body, timeout=10)
    assert created.status_code == 201, created.text
