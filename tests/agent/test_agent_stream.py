"""The agent's websocket, agent side: the RFC 6455 client (``agent/stream.py``) against a small
scripted websocket server on a real socket, and the agent's loop (``agent/node.py``) against a
fake server that streams.

What the agent relies on: a refused handshake tells "no stream here" (use the long-poll) from
"server down"; pings are answered; fragmented messages arrive whole; answers reach the request
that asked, also when wakes come in between; a connection that ends fails what waits on it at
once (so the exit report goes by HTTP), and the agent reconnects and heartbeats.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from agent.client import Rejected, ServerError
from agent.stream import CLOSE, PING, PONG, TEXT, Stream, accept_for, frame, unmask

fakes = importlib.import_module("tests.agent.fakes")
push = importlib.import_module("tests.agent.test_agent_push")


def test_the_handshake_answer_is_computed_as_rfc_6455_says():
    assert accept_for("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 70000])
def test_a_frame_is_masked_and_its_length_encoded_for_every_size(size):
    payload = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    data = frame(TEXT, payload, mask=b"\x01\x02\x03\x04")
    assert data[0] == 0x80 | TEXT and data[1] & 0x80  # final, masked
    length = data[1] & 0x7F
    offset = 2
    if length == 126:
        (length,) = struct.unpack("!H", data[2:4])
        offset = 4
    elif length == 127:
        (length,) = struct.unpack("!Q", data[2:10])
        offset = 10
    assert length == size and data[offset : offset + 4] == b"\x01\x02\x03\x04"
    assert unmask(data[offset + 4 :], b"\x01\x02\x03\x04") == payload


# --- a scripted server --------------------------------------------------------------------------


def _server_frame(opcode: int, payload: bytes, final: bool = True) -> bytes:
    """An unmasked frame, as a server sends."""
    n = len(payload)
    first = (0x80 if final else 0) | opcode
    head = struct.pack("!BB", first, n) if n < 126 else struct.pack("!BBH", first, 126, n)
    return head + payload


def _read_client_frame(conn: socket.socket) -> tuple[int, bytes]:
    def exact(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise ConnectionError
            data += chunk
        return data

    first, second = exact(2)
    assert second & 0x80, "a client's frames must be masked"
    length = second & 0x7F
    if length == 126:
        (length,) = struct.unpack("!H", exact(2))
    elif length == 127:
        (length,) = struct.unpack("!Q", exact(8))
    mask = exact(4)
    return first & 0x0F, unmask(exact(length), mask)


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
            accept = accept_for(seen["sec-websocket-key"])
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
        _read_client_frame(conn)  # wait for the close

    with scripted(script) as (base, seen):
        stream = _open(base)
        assert stream.receive() == {"wake": True, "start": [], "heartbeat": True}
        stream.close()
    assert seen["request"] == "GET /api/v1/agent/stream HTTP/1.1"
    assert seen["authorization"] == "Node secret-cred" and seen["upgrade"].lower() == "websocket"


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
    with push.agent_running_against(server) as node:
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
    with push.agent_running_against(server):
        server.wake(start=[fakes.binding(job_id=23, command=["true"], gpus=[0])])
        server.exit_of(23)
    kinds = [kind for kind, _ in server.calls]
    assert kinds.count("open_stream") == 1 and "wait" in kinds
    assert "stream-exits" not in kinds
