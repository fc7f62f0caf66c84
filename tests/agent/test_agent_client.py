"""The agent's HTTP client: kept-alive connections, reused and replaced; errors by kind."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.client import AgentClient, Rejected, ServerError


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Recording

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self._answer(None)

    def do_POST(self) -> None:
        self._answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

    def _answer(self, body) -> None:
        self.server.seen.append(
            (self.command, self.path, self.headers["Authorization"], body, self.client_address[1])
        )
        status = self.server.status
        data = json.dumps({"echo": body, "detail": "no"}).encode() if status != 502 else b"<html>"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if self.server.close_after:
            self.close_connection = True  # closes without saying so: the client finds it closed


class Recording(ThreadingHTTPServer):
    daemon_threads = True
    status = 200
    close_after = False

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.seen: list[tuple] = []


@pytest.fixture
def server() -> Iterator[Recording]:
    server = Recording()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def client_of(server: Recording) -> AgentClient:
    client = AgentClient(f"http://127.0.0.1:{server.server_port}/")
    client.credential = "cred"
    return client


def test_calls_share_one_kept_alive_connection_and_carry_the_credential(server):
    client = client_of(server)
    client.heartbeat([])
    client.started(7, 1, 0, 123, 5.5)
    client.wait(3)
    assert [(m, p, a) for m, p, a, _, _ in server.seen] == [
        ("POST", "/api/v1/agent/heartbeat", "Node cred"),
        ("POST", "/api/v1/agent/jobs/7/started", "Node cred"),
        ("GET", "/api/v1/agent/wait?timeout=3", "Node cred"),
    ]
    assert server.seen[1][3] == {"attempt": 1, "replica": 0, "pid": 123, "started_at": 5.5}
    assert len({port for *_, port in server.seen}) == 1  # one TCP connection for all three


def test_a_connection_the_server_closed_while_idle_is_replaced(server):
    server.close_after = True
    client = client_of(server)
    for _ in range(3):
        assert client.heartbeat([])["echo"] == {"running": []}
    assert len({port for *_, port in server.seen}) == 3


@pytest.mark.parametrize(
    ("status", "error"), [(404, Rejected), (409, Rejected), (500, ServerError), (502, ServerError)]
)
def test_refusals_and_server_errors_raise_their_kind(server, status, error):
    server.status = status
    with pytest.raises(error) as raised:
        client_of(server).heartbeat([])
    if error is Rejected:
        assert raised.value.status == status and raised.value.body["detail"] == "no"


def test_an_unreachable_server_or_a_bad_url_is_a_server_error():
    with pytest.raises(ServerError, match="heartbeat: ConnectionRefusedError"):
        client = AgentClient("http://127.0.0.1:9")
        client.credential = "c"
        client.heartbeat([])
    with pytest.raises(ServerError, match="not an http"):
        client = AgentClient("ftp://example")
        client.credential = "c"
        client.heartbeat([])
