"""Fixtures for the ``tessera`` command's tests that need no real server: a server with a canned
answer, and the command run as a process of its own; both from this checkout's ``clients/cli``."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "cli"

# This checkout's client, first, in the tests and in the commands they start: the environment's
# `tessera-cli` may be installed (editable) from another checkout of the repository.
sys.path.insert(0, str(CLIENT))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(CLIENT), os.environ.get("PYTHONPATH")) if p)


@dataclass
class Canned:
    """What the canned server answers every request with (tests change it as they go)."""

    status: int = 200
    body: bytes = b"{}"
    content_type: str = "application/json"
    redirect_writes_to: str | None = None  # a POST or DELETE answered 301 to this path


@pytest.fixture
def canned_server() -> Iterator[tuple[str, Canned]]:
    """A server at the URL it yields answering every request with the :class:`Canned` it yields."""
    canned = Canned()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if canned.redirect_writes_to is not None and self.command != "GET":
                self.send_response(301)
                self.send_header("Location", canned.redirect_writes_to)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(canned.status)
            self.send_header("Content-Type", canned.content_type)
            self.send_header("Content-Length", str(len(canned.body)))
            self.end_headers()
            self.wfile.write(canned.body)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", canned
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def hanging_server() -> Iterator[str]:
    """A server (its URL) that takes a submit (201, a pending job) and then never answers a read:
    it accepts each GET and keeps the connection, silent, until the test ends."""
    done = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b'{"id": 7, "name": "hung", "state": "pending"}'
            self.send_response(201)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            done.wait(60)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        done.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def run_tessera(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_tessera(url, *args, stdin="", env={})``: the command against ``url``, with a token, no
    retries, no CI variables, a config file of the test's own and ``env``'s variables."""

    def run(
        url: str, *args: str, stdin: str = "", env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        environment = {
            k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "GITHUB_", "CI_"))
        }
        environment.update(
            TESSERA_URL=url,
            TESSERA_TOKEN="tsr_test",
            TESSERA_RETRIES="0",
            TESSERA_CONFIG=str(tmp_path / "config.json"),
        )
        environment.update(env or {})  # may replace the ones above (another TESSERA_TOKEN)
        code = "import sys; from tessera_cli.main import main; sys.exit(main(sys.argv[1:]))"
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            env=environment,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )

    return run
