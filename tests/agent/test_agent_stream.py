"""The agent's websocket, agent side: the client (``agent/stream.py``, on the ``websockets``
library) against a small scripted websocket server on a real socket, and the agent's loop
(``agent/node.py``) against a fake server that streams.

What the agent relies on: a refused handshake tells "no stream here" (use the long-poll) from
"server down"; pings are answered; fragmented and large messages arrive whole; answers reach the
request that asked, also when wakes come in between; a connection that ends, or that goes silent,
fails what waits on it at once (so the exit report goes by HTTP), and the agent reconnects and
heartbeats. The scripted server speaks RFC 6455 by hand so that it can misbehave on purpose.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from agent.client import Rejected, ServerError
from agent.errors import ServerBusy
from agent.stream import Stream, stream_uri
from tests.agent import fakes

CONTINUATION, TEXT, CLOSE, PING, PONG = 0x0, 0x1, 0x8, 0x9, 0xA


def _accept_for(key: str) -> str:
    """The ``Sec-WebSocket-Accept`` a server answers to ``key`` (RFC 6455, 4.2.2)."""
    return base64.b64encode(
        hashlib.sha1(key.encode() + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()
    ).decode()


def _unmask(payload: bytes, mask: bytes) -> bytes:
    return bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def test_the_stream_uri_is_the_api_url_as_a_websocket_without_user_info():
    assert stream_uri("http://10.0.0.1:8000/api/v1/agent/") == "ws://10.0.0.1:8000/api/v1/agent/stream"
    assert stream_uri("https://u:p@cp.example/api/v1/agent/") == "wss://cp.example/api/v1/agent/stream"
    with pytest.raises(ServerError):
        stream_uri("ftp://cp.example/api/v1/agent/")


# --- a scripted server --------------------------------------------------------------------------


def _server_frame(opcode: int, payload: bytes, final: bool = True) -> bytes:
    """An unmasked frame, as a server sends."""
    n = len(payload)
    first = (0x80 if final else 0) | opcode
    if n < 126:
        head = struct.pack("!BB", first, n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", first, 126, n)
    else:
        head = struct.pack("!BBQ", first, 127, n)
    return head + payload


def _read_client_frame(conn: socket.socket, skip: tuple[int, ...] = (PING,)) -> tuple[int, bytes]:
    """The client's next frame (its own keepalive pings skipped): (opcode, unmasked payload)."""

    def exact(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise ConnectionError
            data += chunk
        return data

    while True:
        first, second = exact(2)
        assert second & 0x80, "a client's frames must be masked"
        length = second & 0x7F
        if length == 126:
            (length,) = struct.unpack("!H", exact(2))
        elif length == 127:
            (length,) = struct.unpack("!Q", exact(8))
        mask = exact(4)
        opcode, payload = first & 0x0F, _unmask(exact(length), mask)
        if opcode not in skip:
            return opcode, payload


@contextmanager
def scripted(script: Callable[[socket.socket, dict[str, str]], None], status: str = "101 Switching"):
    """A server on 127.0.0.1 that answers one handshake with ``status``, then runs ``script``."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    seen: dict[str, str] = {}

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(4096)
            lines = head.decode("latin1").split("\r\n")
            seen["request"] = lines[0]
            for line in lines[1:]:
                if ":" in line:
                    name, value = line.split(":", 1)
                    seen[name.strip().lower()] = value.strip()
            if not status.startswith("101"):
                conn.sendall(f"HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n".encode())
                return
            accept = _accept_for(seen["sec-websocket-key"])
            conn.sendall(
                f"HTTP/1.1 {status}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Accept: {accept}\r\n\r\n".encode()
            )
            with contextlib.suppress(OSError):  # the client went away: the script's end
                script(conn, seen)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/api/v1/agent/", seen
    finally:
        thread.join(5)
        listener.close()


def _open(base: str, idle_s: float = 5.0) -> Stream:
    return Stream.open(base, "Node secret-cred", timeout=5.0, idle_s=idle_s)


def test_the_handshake_carries_the_credential_and_a_wake_arrives():
    def script(conn: socket.socket, seen: dict[str, str]) -> None:
        conn.sendall(_server_frame(TEXT, json.dumps({"wake": True, "start": [], "heartbeat": True}).encode()))
        closes.append(_read_client_frame(conn))
        conn.sendall(_server_frame(CLOSE, struct.pack("!H", 1000)))  # the server's half

    closes: list[tuple[int, bytes]] = []
    with scripted(script) as (base, seen):
        stream = _open(base)
        assert stream.receive() == {"wake": True, "start": [], "heartbeat": True}
        stream.close()
    assert seen["request"] == "GET /api/v1/agent/stream HTTP/1.1"
    assert seen["authorization"] == "Node secret-cred" and seen["upgrade"].lower() == "websocket"
    assert closes == [(CLOSE, struct.pack("!H", 1000))]  # a closing handshake, "normal closure"


@pytest.mark.parametrize(
    "status, error",
    [("404 Not Found", Rejected), ("403 Forbidden", Rejected), ("500 Internal Server Error", ServerError)],
)
def test_a_refused_handshake_is_a_refusal_and_a_failing_server_a_server_error(status, error):
    with scripted(lambda conn, seen: None, status=status) as (base, _), pytest.raises(error):
        _open(base)


def test_nobody_listening_is_a_server_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ServerError):
        _open(f"http://127.0.0.1:{port}/api/v1/agent/")


def test_pings_are_answered_and_a_fragmented_message_arrives_whole():
    pongs: list[bytes] = []

    def script(conn: socket.socket, seen: dict[str, str]) -> None:
        conn.sendall(_server_frame(PING, b"are you there"))
        opcode, payload = _read_client_frame(conn)
        if opcode == PONG:
            pongs.append(payload)
        text = json.dumps({"wake": True, "start": [{"job_id": 1}], "heartbeat": False}).encode()
        conn.sendall(_server_frame(TEXT, text[:10], final=False) + _server_frame(0x0, text[10:]))
        _read_client_frame(conn)

    with scripted(script) as (base, _):
        stream = _open(base)
        assert stream.receive() == {"wake": True, "start": [{"job_id": 1}], "heartbeat": False}
        stream.close()
    assert pongs == [b"are you there"]


def test_a_message_larger_than_64_kib_arrives_whole():
    wake = {"wake": True, "start": [{"job_id": i, "command": ["x" * 40]} for i in range(2000)]}
    text = json.dumps(wake).encode()
    assert len(text) > 1 << 16

    def script(conn: socket.socket, seen: dict[str, str]) -> None:
        conn.sendall(_server_frame(TEXT, text))
        _read_client_frame(conn)

    with scripted(script) as (base, _):
        stream = _open(base)
        assert stream.receive() == wake
        stream.close()


def test_a_text_message_that_is_not_utf_8_ends_the_connection_as_a_server_error():
    def script(conn: socket.socket, seen: dict[str, str]) -> None:
        conn.sendall(_server_frame(TEXT, b'{"wake": "\xff\xfe"}'))
        closes.append(_read_client_frame(conn))

    closes: list[tuple[int, bytes]] = []
    with scripted(script) as (base, _):
        stream = _open(base)
        with pytest.raises(ServerError):
            stream.receive()
    assert closes and closes[0][0] == CLOSE and closes[0][1][:2] == struct.pack("!H", 1007)  # invalid data


def test_answers_reach_the_request_that_asked_while_wakes_arrive_in_between():
    def script(conn: socket.socket, seen: dict[str, str]) -> None:
        _, payload = _read_client_frame(conn)
        request = json.loads(payload)
        conn.sendall(_server_frame(TEXT, b'{"wake": true, "start": [], "heartbeat": true}'))
        results = [{"status": 200, "n": len(request["exits"])}]
        answer = {"id": request["id"], "status": 200, "results": results}
        conn.sendall(_server_frame(TEXT, json.dumps(answer).encode()))
        _read_client_frame(conn)

    with scripted(script) as (base, _):
        stream = _open(base)
        wakes: list[dict] = []
        reader = threading.Thread(target=lambda: _collect(stream, wakes), daemon=True)
        reader.start()
        answer = stream.request({"exits": [{"job_id": 3}, {"job_id": 4}]}, timeout=5)
        assert answer["status"] == 200 and answer["results"] == [{"status": 200, "n": 2}]
        assert fakes.wait_for(lambda: wakes, 5) == [{"wake": True, "start": [], "heartbeat": True}]
        stream.close()
        reader.join(5)


def _collect(stream: Stream, into: list[dict]) -> None:
    try:
        while True:
            into.append(stream.receive())
    except ServerError:
        pass


def test_a_connection_that_ends_fails_the_waiting_request_at_once_not_at_its_timeout():
    def script(conn: socket.socket, seen: dict[str, str]) -> None:
        _read_client_frame(conn)  # the request: never answered
        conn.sendall(_server_frame(CLOSE, struct.pack("!H", 1001)))

    with scripted(script) as (base, _):
        stream = _open(base)
        reader = threading.Thread(target=lambda: _collect(stream, []), daemon=True)
        reader.start()
        with pytest.raises(ServerError, match="1001"):  # the server's close, not the 30 s timeout
            stream.request({"exits": [{"job_id": 3}]}, timeout=30)
        reader.join(5)


def test_a_silent_connection_counts_as_dead_after_idle_s():
    """The server reads nothing and answers nothing, not even the agent's pings."""
    release = threading.Event()

    def script(conn: socket.socket, seen: dict[str, str]) -> None:
        release.wait(5)

    with scripted(script) as (base, _):
        stream = _open(base, idle_s=0.3)
        with pytest.raises(ServerError):
            stream.receive()
        release.set()


# --- the agent's loop ---------------------------------------------------------------------------


@pytest.fixture
def streaming_agent() -> Iterator[tuple[object, fakes.StreamingServer]]:
    server = fakes.StreamingServer()
    with fakes.agent_running_against(server) as node:
        yield node, server


def test_bindings_pushed_on_the_stream_start_at_once_and_exits_go_back_on_it(streaming_agent):
    node, server = streaming_agent
    server.wake(start=[fakes.binding(job_id=21, command=["true"], gpus=[0])])
    exit_ = server.exit_of(21)
    assert exit_["exit_code"] == 0 and exit_.get("started_at") is not None
    kinds = [kind for kind, _ in server.calls]
    assert "stream-exits" in kinds and "exits" not in kinds and "exited" in kinds
    assert "wait" not in kinds  # no long-poll while the stream is open


def test_a_dropped_stream_is_reopened_and_the_agent_heartbeats_for_what_it_missed(streaming_agent):
    node, server = streaming_agent
    assert fakes.wait_for(lambda: [k for k, _ in server.calls if k == "open_stream"], 5)
    heartbeats = len([k for k, _ in server.calls if k == "heartbeat"])
    server.orders.append(fakes.binding(job_id=22, command=["sleep", "30"], gpus=[1]))  # published meanwhile
    server.drop_stream()
    assert fakes.wait_for(lambda: len([k for k, _ in server.calls if k == "open_stream"]) == 2, 5)
    assert fakes.wait_for(lambda: [r["job_id"] for r in node.running_reports()] == [22], 5)
    assert len([k for k, _ in server.calls if k == "heartbeat"]) > heartbeats


def test_against_a_server_without_the_stream_the_agent_uses_the_long_poll():
    server = fakes.FakeServer()
    with fakes.agent_running_against(server):
        server.wake(start=[fakes.binding(job_id=23, command=["true"], gpus=[0])])
        server.exit_of(23)
    kinds = [kind for kind, _ in server.calls]
    assert kinds.count("open_stream") == 1 and "wait" in kinds
    assert "stream-exits" not in kinds


def test_a_close_with_try_again_later_is_a_busy_server():
    def script(conn: socket.socket, seen: dict[str, str]) -> None:
        conn.sendall(_server_frame(CLOSE, struct.pack("!H", 4013)))

    with scripted(script) as (base, _):
        stream = _open(base)
        with pytest.raises(ServerBusy, match="4013"):
            stream.receive()


def test_streams_told_to_try_again_later_are_reopened_with_a_growing_pause_not_at_once():
    """A server whose Redis is away opens each stream and closes it with 4013 at once. Taken as
    a session that went well, each reset the agent's count of failures: it reopened the stream
    and heartbeated in a tight loop, every agent at once, for the whole outage."""
    import time

    server = fakes.BusyStreamingServer()
    with fakes.agent_running_against(server):
        time.sleep(2.0)
        opened = len([k for k, _ in server.calls if k == "open_stream"])
        heartbeats = len([k for k, _ in server.calls if k == "heartbeat"])
    # pauses of 0, 0.5, 1, 1.5 s...: a handful in 2 s, not hundreds
    assert 2 <= opened <= 6 and heartbeats <= opened + 2, (opened, heartbeats)
