"""The agent's side of the HTTP protocol (``/api/v1/agent/``; see docs/agent.md).

Secrets travel only in the ``Authorization`` header. A call borrows a ``requests`` session from
a small pool and gives it back (sessions are not guaranteed thread-safe, so one is never used by
two threads at once; pooled, their keep-alive connections serve every job's thread instead of
one new connection per job); every call has a timeout.
"""

from __future__ import annotations

import base64
import contextlib
import queue
from collections.abc import Iterator
from typing import Any

import requests

TIMEOUT_S = 10.0


class ServerError(Exception):
    """The server could not be reached or answered 5xx: try again later."""


class Rejected(Exception):
    """The server refused the request (4xx): retrying the same request will not help."""

    def __init__(self, status: int, body: Any):
        super().__init__(f"HTTP {status}: {body}")
        self.status, self.body = status, body


class AgentClient:
    def __init__(self, server: str, timeout: float = TIMEOUT_S):
        self.base = server.rstrip("/") + "/api/v1/agent/"
        self.timeout = timeout
        self.credential: str | None = None
        self._idle: queue.SimpleQueue[requests.Session] = queue.SimpleQueue()

    @contextlib.contextmanager
    def _session(self) -> Iterator[requests.Session]:
        try:
            session = self._idle.get_nowait()
        except queue.Empty:
            session = requests.Session()
            session.trust_env = False  # no proxies from the environment for the control plane
        try:
            yield session
        finally:
            self._idle.put(session)

    def _post(self, path: str, body: dict[str, Any], auth: str) -> Any:
        try:
            with self._session() as session:
                response = session.post(
                    self.base + path, json=body, headers={"Authorization": auth}, timeout=self.timeout
                )
        except requests.RequestException as exc:
            raise ServerError(f"{path}: {exc.__class__.__name__}: {exc}") from None
        if response.status_code >= 500:
            raise ServerError(f"{path}: HTTP {response.status_code}")
        try:
            data = response.json()
        except ValueError:
            data = response.text[:500]
        if response.status_code >= 400:
            raise Rejected(response.status_code, data)
        return data

    def _node_auth(self) -> str:
        if not self.credential:
            raise RuntimeError("not registered")
        return f"Node {self.credential}"

    def register(self, body: dict[str, Any], join_token: str | None) -> dict[str, Any]:
        """Register with the join token, or (none given) re-register with the stored credential."""
        auth = f"Join {join_token}" if join_token else self._node_auth()
        data = self._post("register", body, auth)
        self.credential = data["credential"]
        return data

    def wait(self, timeout_s: float) -> dict[str, Any]:
        """The long-poll: ``{"wake": true, "start": [...], "heartbeat": bool}`` when the server has
        news for this node, ``{"wake": false}`` at the timeout.

        Raises :class:`Rejected` with 404 against a server without the push endpoint.
        """
        try:
            with self._session() as session:
                response = session.get(
                    self.base + "wait", params={"timeout": f"{timeout_s:g}"},
                    headers={"Authorization": self._node_auth()}, timeout=timeout_s + self.timeout,
                )
        except requests.RequestException as exc:
            raise ServerError(f"wait: {exc.__class__.__name__}: {exc}") from None
        if response.status_code >= 500:
            raise ServerError(f"wait: HTTP {response.status_code}")
        if response.status_code >= 400:
            raise Rejected(response.status_code, response.text[:500])
        try:
            answer = response.json()
        except ValueError:
            return {"wake": False}
        return answer if isinstance(answer, dict) else {"wake": False}

    def heartbeat(self, running: list[dict[str, int]]) -> dict[str, Any]:
        return self._post("heartbeat", {"running": running}, self._node_auth())

    def started(
        self, job_id: int, attempt: int, replica: int, pid: int, started_at: float | None = None
    ) -> dict[str, Any]:
        """``started_at``: when the process started, seconds since the epoch (the agent's clock)."""
        body: dict[str, Any] = {"attempt": attempt, "replica": replica, "pid": pid}
        if started_at is not None:
            body["started_at"] = started_at
        return self._post(f"jobs/{job_id}/started", body, self._node_auth())

    def logs(self, job_id: int, attempt: int, replica: int, offset: int, data: bytes) -> dict[str, Any]:
        body = {
            "attempt": attempt,
            "replica": replica,
            "offset": offset,
            "data": base64.b64encode(data).decode("ascii"),
        }
        return self._post(f"jobs/{job_id}/logs", body, self._node_auth())

    def exited(
        self, job_id: int, attempt: int, replica: int, exit_code: int | None, reason: str = "",
        started_at: float | None = None, pid: int = 0,
    ) -> dict[str, Any]:
        """``started_at``/``pid``: set when no ``started`` report was sent (a process that ended
        at once): the exit report then records its start too."""
        body: dict[str, Any] = {"attempt": attempt, "replica": replica, "exit_code": exit_code,
                                "reason": reason}
        if started_at is not None:
            body.update(started_at=started_at, pid=pid)
        return self._post(f"jobs/{job_id}/exited", body, self._node_auth())

    def report_exits(self, reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Several replicas' exit reports in one request (the ``exited`` bodies, each with its
        ``job_id``); one result per report, in order: ``{"status": 200, "state", "recorded"}``, or
        ``{"status": 404|409, "detail"}`` for a report refused on its own."""
        return self._post("exits", {"exits": reports}, self._node_auth())["results"]
