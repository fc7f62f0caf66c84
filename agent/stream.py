"""The agent's websocket to the server (``/api/v1/agent/stream``, see docs/agent.md, "Push").

One connection carries what would otherwise be an HTTP request each: the server's wakes (pushed)
and the agent's exit reports (answered on the same socket, matched by ``id``). The websocket
protocol is the ``websockets`` library's threaded client: the handshake, framing and masking,
fragmented messages, UTF-8 checks, pings answered and the closing handshake. The agent pings too,
every ``idle_s / 2``: a connection whose pong has not come back ``idle_s / 2`` later counts as dead
(the server pings on its own as well). Errors are the client's: :class:`~agent.errors.Rejected`
for a refused handshake (a server without the endpoint, a bad credential),
:class:`~agent.errors.ServerError` for anything else (the server down or gone away), after which
the agent reconnects or falls back to the long-poll.

The stream connects directly, as the agent's HTTP calls do (``agent/client.py``): proxy
variables in the environment are not used for either.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.sync.client import ClientConnection, connect

from agent.errors import Rejected, ServerBusy, ServerError

MAX_MESSAGE = 64 * 1024 * 1024  # a wake with thousands of bindings is far below this
# The server's close code for "try again later" (1013's meaning, in the range an application may
# send): its Redis is away (scheduling/api/agent_stream.py).
TRY_AGAIN_LATER = 4013
CLOSE_TIMEOUT_S = 2.0  # how long closing waits for the server's half of the closing handshake
USER_AGENT = "tessera-agent"


def stream_uri(base: str) -> str:
    """The websocket URI of ``<base>stream`` (``base``: the agent API's http(s) URL, ending in
    ``/``); user info in the URL is dropped (the credential travels in ``Authorization``)."""
    url = urlsplit(base + "stream")
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ServerError(f"stream: {base!r} is not an http(s) URL")
    scheme = "wss" if url.scheme == "https" else "ws"
    return urlunsplit((scheme, url.netloc.rsplit("@", 1)[-1], url.path, url.query, ""))


class Stream:
    """An open websocket: :meth:`receive` in one thread (the agent's listener), :meth:`request`
    and :meth:`close` from any."""

    def __init__(self, connection: ClientConnection, closing: contextlib.ExitStack):
        self._ws = connection
        self._closing = closing  # closes the connection (the library's context manager's exit)
        self._ids = itertools.count(1)
        self._pending: dict[int, _Answer] = {}
        self._pending_lock = threading.Lock()
        self.closed = False

    @classmethod
    def open(cls, base: str, auth: str, timeout: float, idle_s: float) -> Stream:
        """Connect to ``<base>stream`` with the ``Authorization`` value ``auth`` within
        ``timeout``; a connection then counts as dead after ``idle_s`` without a sign of life."""
        uri = stream_uri(base)
        closing = contextlib.ExitStack()
        try:
            connecting = connect(
                uri,
                legacy=False,  # the library's current form: a context manager
                additional_headers={"Authorization": auth},
                user_agent_header=USER_AGENT,
                compression=None,  # the messages are small JSON: deflating costs more than it saves
                proxy=None,
                open_timeout=timeout,
                ping_interval=idle_s / 2,
                ping_timeout=idle_s / 2,
                close_timeout=CLOSE_TIMEOUT_S,
                max_size=MAX_MESSAGE,
            )
            connection = closing.enter_context(connecting)
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status >= 500:
                raise ServerError(f"stream: HTTP {status}") from None
            raise Rejected(status, "the stream's handshake was refused") from None
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise ServerError(f"stream: {exc.__class__.__name__}: {exc}") from None
        return cls(connection, closing)

    def receive(self) -> dict[str, Any]:
        """The next JSON object the server sent; an answer to a :meth:`request` is handed to it and
        not returned. Raises ServerError when the connection ends (and fails what waits on it)."""
        while True:
            try:
                body = json.loads(self._ws.recv())
            except ConnectionClosed as exc:
                why = _closed(exc)
                self.close(why)
                if exc.rcvd is not None and exc.rcvd.code == TRY_AGAIN_LATER:
                    raise ServerBusy(why) from None
                raise ServerError(why) from None
            except (OSError, ValueError, WebSocketException) as exc:
                why = f"stream: {exc.__class__.__name__}: {exc}"
                self.close(why)
                raise ServerError(why) from None
            if not isinstance(body, dict):
                continue
            if "id" in body and "wake" not in body:
                with self._pending_lock:
                    answer = self._pending.pop(body["id"], None) if isinstance(body["id"], int) else None
                if answer is not None:
                    answer.set(body, None)
                continue
            return body

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
            self._ws.send(json.dumps({**body, "id": request_id}))
        except (ConnectionClosed, OSError, WebSocketException) as exc:
            why = _closed(exc) if isinstance(exc, ConnectionClosed) else f"stream: send failed: {exc}"
            self.close(why)
            raise ServerError(why) from None
        if not answer.done.wait(timeout):
            with self._pending_lock:
                self._pending.pop(request_id, None)
            raise ServerError(f"stream: no answer within {timeout:g}s")
        if answer.error is not None:
            raise ServerError(answer.error)
        assert answer.body is not None
        return answer.body

    def close(self, why: str = "stream: closed") -> None:
        """Close the connection (the closing handshake, briefly); what waits for an answer fails."""
        with self._pending_lock:
            if self.closed:
                return
            self.closed = True
            pending, self._pending = self._pending, {}
        for answer in pending.values():
            answer.set(None, why)
        self._closing.close()


def _closed(exc: ConnectionClosed) -> str:
    if exc.rcvd is not None:
        return f"stream: closed by the server ({exc.rcvd.code})"
    return f"stream: the connection ended ({exc})"


class _Answer:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.body: dict[str, Any] | None = None
        self.error: str | None = None

    def set(self, body: dict[str, Any] | None, error: str | None) -> None:
        self.body, self.error = body, error
        self.done.set()
