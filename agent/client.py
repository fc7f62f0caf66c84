"""The agent's side of the HTTP protocol (``/api/v1/agent/``; see docs/agent.md).

Secrets travel only in the ``Authorization`` header. A call borrows a kept-alive connection
(``http.client``) from a small pool and gives it back: a connection is never used by two threads
at once, and every job's thread reuses one instead of opening its own. Every call has a timeout.
(``requests`` cost several times the CPU per call: docs/benchmarks/e2e.md.)
"""

from __future__ import annotations

import base64
import http.client
import json
import queue
import select
from typing import Any
from urllib.parse import urlencode, urlsplit

# The errors are the stream's too (agent/errors.py); imported from here by the agent's modules.
from agent.errors import Rejected as Rejected
from agent.errors import ServerError as ServerError
from agent.stream import Stream

TIMEOUT_S = 10.0


def exit_body(
    attempt: int, replica: int, exit_code: int | None, reason: str, started_at: float | None, pid: int
) -> dict[str, Any]:
    """An exit report's body (one ``exited`` request, or one entry of an ``exits`` batch)."""
    body: dict[str, Any] = {"attempt": attempt, "replica": replica, "exit_code": exit_code, "reason": reason}
    if started_at is not None:
        body.update(started_at=started_at, pid=pid)
    return body


class AgentClient:
    def __init__(self, server: str, timeout: float = TIMEOUT_S):
        self.base = server.rstrip("/") + "/api/v1/agent/"
        self.timeout = timeout
        self.credential: str | None = None
        self._url = urlsplit(self.base)
        self._idle: queue.SimpleQueue[http.client.HTTPConnection] = queue.SimpleQueue()

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """(connection, reused): an idle kept-alive one the server has not closed meanwhile, or a
        new one."""
        while True:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                break
            poller = select.poll()
            if conn.sock is not None:
                poller.register(conn.sock, select.POLLIN)
                if not poller.poll(0):  # readable while idle: the server closed it
                    return conn, True
            conn.close()
        if self._url.scheme not in ("http", "https") or not self._url.hostname:
            raise http.client.InvalidURL(f"{self.base!r} is not an http(s) URL")
        kind = http.client.HTTPSConnection if self._url.scheme == "https" else http.client.HTTPConnection
        return kind(self._url.hostname, self._url.port), False

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None, auth: str, timeout: float
    ) -> tuple[int, bytes]:
        """(status, body); ServerError when the server could not be reached or answered 5xx.

        A kept-alive connection the server closed just as it was reused is retried once on a new
        one (every call of the protocol is idempotent)."""
        name = path.split("?")[0]
        headers = {"Authorization": auth}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        while True:
            conn: http.client.HTTPConnection | None = None
            reused = False
            try:
                conn, reused = self._connection()
                conn.timeout = timeout
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                conn.request(method, self._url.path + path, body=data, headers=headers)
                response = conn.getresponse()
                content = response.read()
                break
            except (OSError, http.client.HTTPException) as exc:
                if conn is not None:
                    conn.close()
                if reused and isinstance(exc, ConnectionError):  # RemoteDisconnected is one
                    continue
                raise ServerError(f"{name}: {exc.__class__.__name__}: {exc}") from None
        if response.will_close:
            conn.close()
        else:
            self._idle.put(conn)
        if response.status >= 500:
            raise ServerError(f"{name}: HTTP {response.status}")
        return response.status, content

    def _post(self, path: str, body: dict[str, Any], auth: str) -> dict[str, Any]:
        """The server's answer, a JSON object (every agent endpoint's); :class:`Rejected` for a
        4xx, :class:`ServerError` for an answer that is not an object."""
        status, content = self._request("POST", path, body, auth, self.timeout)
        try:
            data = json.loads(content)
        except ValueError:
            data = content[:500].decode(errors="replace")
        if status >= 400:
            raise Rejected(status, data)
        if not isinstance(data, dict):
            raise ServerError(f"{path}: HTTP {status} answered {str(data)[:200]!r}, not a JSON object")
        return data

    def node_auth(self) -> str:
        if not self.credential:
            raise RuntimeError("not registered")
        return f"Node {self.credential}"

    def register(self, body: dict[str, Any], join_token: str | None) -> dict[str, Any]:
        """Re-register with the stored credential when there is one (a restarted agent: only its own
        credential re-registers an active node); with the join token when there is none, or when
        the server no longer knows it (401: the node was removed, or the database is new)."""
        if self.credential:
            try:
                data = self._post("register", body, self.node_auth())
            except Rejected as exc:
                if exc.status != 401 or not join_token:
                    raise
                data = self._post("register", body, f"Join {join_token}")
        else:
            data = self._post("register", body, f"Join {join_token}" if join_token else self.node_auth())
        self.credential = data["credential"]
        return data

    def wait(self, timeout_s: float) -> dict[str, Any]:
        """The long-poll: ``{"wake": true, "start": [...], "heartbeat": bool}`` when the server has
        news for this node, ``{"wake": false}`` at the timeout.

        Raises :class:`Rejected` with 404 against a server without the push endpoint.
        """
        status, content = self._request(
            "GET",
            "wait?" + urlencode({"timeout": f"{timeout_s:g}"}),
            None,
            self.node_auth(),
            timeout_s + self.timeout,
        )
        if status >= 400:
            raise Rejected(status, content[:500].decode(errors="replace"))
        try:
            answer = json.loads(content)
        except ValueError:
            return {"wake": False}
        return answer if isinstance(answer, dict) else {"wake": False}

    def open_stream(self, idle_s: float) -> Stream:
        """The websocket for wakes and exit reports (agent/stream.py); :class:`Rejected` from a
        server that refuses it, :class:`ServerError` when it cannot be reached."""
        return Stream.open(self.base, self.node_auth(), self.timeout, idle_s)

    def heartbeat(
        self,
        running: list[dict[str, int]],
        utilisation: list[dict[str, Any]] | None = None,
        checkpoints: list[int] | None = None,
    ) -> dict[str, Any]:
        """``checkpoints``: jobs whose checkpoints this node holds past their retention; the
        answer's ``checkpoints`` says which of them can still resume, and when the others ended."""
        body: dict[str, Any] = {"running": running}
        if utilisation:
            body["utilisation"] = utilisation
        if checkpoints:
            body["checkpoints"] = checkpoints
        return self._post("heartbeat", body, self.node_auth())

    def started(
        self, job_id: int, attempt: int, replica: int, pid: int, started_at: float | None = None
    ) -> dict[str, Any]:
        """``started_at``: when the process started, seconds since the epoch (the agent's clock)."""
        body: dict[str, Any] = {"attempt": attempt, "replica": replica, "pid": pid}
        if started_at is not None:
            body["started_at"] = started_at
        return self._post(f"jobs/{job_id}/started", body, self.node_auth())

    def logs(self, job_id: int, attempt: int, replica: int, offset: int, data: bytes) -> dict[str, Any]:
        body = {
            "attempt": attempt,
            "replica": replica,
            "offset": offset,
            "data": base64.b64encode(data).decode("ascii"),
        }
        return self._post(f"jobs/{job_id}/logs", body, self.node_auth())

    def checkpointed(self, job_id: int, attempt: int, replica: int, at: float, line: str) -> dict[str, Any]:
        """The job wrote its checkpoint marker (``at``: when the agent saw it, epoch seconds)."""
        body = {"attempt": attempt, "replica": replica, "at": at, "line": line}
        return self._post(f"jobs/{job_id}/checkpointed", body, self.node_auth())

    def exited(
        self,
        job_id: int,
        attempt: int,
        replica: int,
        exit_code: int | None,
        reason: str = "",
        started_at: float | None = None,
        pid: int = 0,
    ) -> dict[str, Any]:
        """``started_at``/``pid``: set when no ``started`` report was sent (a process that ended
        at once): the exit report then records its start too."""
        body = exit_body(attempt, replica, exit_code, reason, started_at, pid)
        return self._post(f"jobs/{job_id}/exited", body, self.node_auth())

    def report_exits(self, reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Several replicas' exit reports in one request (the ``exited`` bodies, each with its
        ``job_id``); one result per report, in order: ``{"status": 200, "state", "recorded"}``, or
        ``{"status": 404|409, "detail"}`` for a report refused on its own."""
        results = self._post("exits", {"exits": reports}, self.node_auth()).get("results")
        if not isinstance(results, list):
            raise ServerError(f"exits: the answer has no list of results: {results!r}"[:300])
        return results
