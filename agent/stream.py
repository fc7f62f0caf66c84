"""The agent's websocket to the server (``/api/v1/agent/stream``, see docs/agent.md, "Push").

One connection carries what would otherwise be an HTTP request each: the server's wakes (pushed)
and the agent's exit reports (answered on the same socket, matched by ``id``). A small RFC 6455
client on the standard library, as the rest of the agent: text frames of JSON, masked as a
client's must be; pings answered; a connection that sends nothing (not even the server's pings)
for ``idle_s`` counts as dead. Errors are the client's: :class:`~agent.client.Rejected` for a
refused handshake (a server without the endpoint, a bad credential), :class:`~agent.client.ServerError`
for anything else (the server down or gone away), after which the agent reconnects or falls back.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import socket
import ssl
import struct
import threading
from typing import Any
from urllib.parse import urlsplit

from agent.client import Rejected, ServerError

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_MESSAGE = 64 * 1024 * 1024  # a wake with thousands of bindings is far below this
MAX_HEAD = 16 * 1024
TEXT, BINARY, CONTINUATION, CLOSE, PING, PONG = 0x1, 0x2, 0x0, 0x8, 0x9, 0xA


def accept_for(key: str) -> str:
    """The ``Sec-WebSocket-Accept`` a server must answer to ``key``."""
    return base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()


def frame(opcode: int, payload: bytes, mask: bytes | None = None) -> bytes:
    """One final frame; masked (as a client's must be) with ``mask`` (4 random bytes by default)."""
    mask = os.urandom(4) if mask is None else mask
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    return head + mask + unmask(payload, mask)


def unmask(payload: bytes, mask: bytes) -> bytes:
    """XOR ``payload`` with the repeated 4-byte ``mask`` (one big-integer XOR, not a byte loop)."""
    n = len(payload)
    if n == 0:
        return payload
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")


class Stream:
    """An open websocket: :meth:`receive` in one thread (the agent's listener), :meth:`request`
    and sends from any."""

    def __init__(self, sock: socket.socket, leftover: bytes):
        self.sock = sock
        self._buffer = bytearray(leftover)
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, _Answer] = {}
        self._pending_lock = threading.Lock()
        self.closed = False

    @classmethod
    def open(cls, base: str, auth: str, timeout: float, idle_s: float) -> Stream:
        """Connect to ``<base>stream`` (``base``: the agent API's URL, ending in ``/``) with the
        ``Authorization`` value ``auth``. Reads then time out after ``idle_s``."""
        url = urlsplit(base + "stream")
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ServerError(f"stream: {base!r} is not an http(s) URL")
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            sock = socket.create_connection((url.hostname, port), timeout=timeout)
            if url.scheme == "https":
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=url.hostname)
            key = base64.b64encode(os.urandom(16)).decode()
            host = url.netloc.rsplit("@", 1)[-1]
            sock.sendall(
                (
                    f"GET {url.path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                    f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                    f"Authorization: {auth}\r\n\r\n"
                ).encode("latin1")
            )
            head, leftover = _read_head(sock)
        except (OSError, ssl.SSLError) as exc:
            raise ServerError(f"stream: {exc.__class__.__name__}: {exc}") from None
        status, headers = _parse_head(head)
        if status != 101:
            sock.close()
            if status >= 500:
                raise ServerError(f"stream: HTTP {status}")
            raise Rejected(status, "the stream's handshake was refused")
        if headers.get("sec-websocket-accept") != accept_for(key):
            sock.close()
            raise ServerError("stream: the server's handshake answer is not a websocket's")
        sock.settimeout(idle_s)
        return cls(sock, leftover)

    # --- receiving (one thread) ----------------------------------------------------------------

    def receive(self) -> dict[str, Any]:
        """The next JSON object the server sent; an answer to a :meth:`request` is handed to it and
        not returned. Raises ServerError when the connection ends (and fails what waits on it)."""
        while True:
            try:
                message = self._message()
                body = json.loads(message)
            except ServerError as exc:
                self.close(str(exc))
                raise
            except (OSError, ValueError) as exc:
                self.close(f"{exc.__class__.__name__}: {exc}")
                raise ServerError(f"stream: {exc.__class__.__name__}: {exc}") from None
            if not isinstance(body, dict):
                continue
            if "id" in body and "wake" not in body:
                with self._pending_lock:
                    answer = self._pending.pop(body["id"], None) if isinstance(body["id"], int) else None
                if answer is not None:
                    answer.set(body, None)
                continue
            return body

    def _message(self) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            first, second = self._read(2)
            opcode, length = first & 0x0F, second & 0x7F
            if length == 126:
                (length,) = struct.unpack("!H", self._read(2))
            elif length == 127:
                (length,) = struct.unpack("!Q", self._read(8))
            mask = self._read(4) if second & 0x80 else None
            if size + length > MAX_MESSAGE:
                raise ServerError(f"stream: a message over {MAX_MESSAGE} bytes")
            payload = self._read(length)
            if mask is not None:
                payload = unmask(payload, mask)
            if opcode == PING:
                self._send_frame(PONG, payload)
            elif opcode == CLOSE:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                raise ServerError(f"stream: closed by the server ({code})")
            elif opcode in (TEXT, BINARY, CONTINUATION):
                parts.append(payload)
                size += length
                if first & 0x80:
                    return b"".join(parts)
            # PONG, and opcodes we do not know: nothing to do

    def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self.sock.recv(max(65536, n - len(self._buffer)))
            if not chunk:
                raise ServerError("stream: the server closed the connection")
            self._buffer += chunk
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    # --- sending (any thread) ------------------------------------------------------------------

    def request(self, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send ``body`` with a fresh ``id``; its answer (what :meth:`receive` reads for it).
        ServerError if the connection ends or no answer comes within ``timeout``."""
        request_id = next(self._ids)
        answer = _Answer()
        with self._pending_lock:
            if self.closed:
                raise ServerError("stream: closed")
            self._pending[request_id] = answer
        try:
            self._send_frame(TEXT, json.dumps({**body, "id": request_id}).encode())
        except ServerError:
            self.close("send failed")
            raise
        if not answer.done.wait(timeout):
            with self._pending_lock:
                self._pending.pop(request_id, None)
            raise ServerError(f"stream: no answer within {timeout:g}s")
        if answer.error is not None:
            raise ServerError(f"stream: {answer.error}")
        assert answer.body is not None
        return answer.body

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        try:
            with self._send_lock:
                self.sock.sendall(frame(opcode, payload))
        except OSError as exc:
            raise ServerError(f"stream: {exc.__class__.__name__}: {exc}") from None

    def close(self, why: str = "closed") -> None:
        """Close the connection (a close frame first, if it can); what waits for an answer fails."""
        with self._pending_lock:
            if self.closed:
                return
            self.closed = True
            pending, self._pending = self._pending, {}
        for answer in pending.values():
            answer.set(None, why)
        try:
            with self._send_lock:
                self.sock.sendall(frame(CLOSE, struct.pack("!H", 1000)))
        except OSError:
            pass
        self.sock.close()


class _Answer:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.body: dict[str, Any] | None = None
        self.error: str | None = None

    def set(self, body: dict[str, Any] | None, error: str | None) -> None:
        self.body, self.error = body, error
        self.done.set()


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD:
            raise OSError("the handshake's answer is too long")
        chunk = sock.recv(4096)
        if not chunk:
            raise OSError("the server closed the connection during the handshake")
        data += chunk
    head, _, leftover = data.partition(b"\r\n\r\n")
    return head, leftover


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin1").split("\r\n")
    parts = lines[0].split(" ", 2)
    try:
        status = int(parts[1])
    except (IndexError, ValueError):
        raise ServerError(f"stream: not an HTTP answer: {lines[0][:80]!r}") from None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers
