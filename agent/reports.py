"""Exit reports sent in batches: one request for every replica that ended at about the same time.

Each job's supervisor thread calls :meth:`ExitReporter.exited` as it would call the client's, and
blocks until its own answer: the reporter thread takes every report queued within a few
milliseconds of the first and sends them as one ``POST /api/v1/agent/exits``, or as one message on
the agent's websocket while it has one open (the same body, the same answers; if the socket fails,
by HTTP). A pass that binds eight short jobs to a node thus costs one exit request, not eight.
Errors stay per report: a refused one raises :class:`~agent.client.Rejected` in its own thread
only; a failed request raises :class:`~agent.client.ServerError` in each, and each retries as
before.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from agent.client import TIMEOUT_S, Rejected, ServerError, exit_body

WINDOW_S = 0.005  # how long the first report waits for others to join it
MAX_BATCH = 256


@dataclass
class _Pending:
    body: dict[str, Any]
    done: threading.Event = field(default_factory=threading.Event)
    result: dict[str, Any] | None = None
    error: Exception | None = None


class ExitReporter:
    """Wraps the agent's client: ``exited`` is batched, every other call goes straight through."""

    def __init__(self, client: Any, window_s: float = WINDOW_S):
        self.client = client
        self.window_s = window_s
        self._queue: list[_Pending] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self.batched = True  # False once the server is found to have no ``exits`` endpoint
        self.stream: Any = None  # the agent's open websocket (agent/stream.py), when it has one

    def __getattr__(self, name: str) -> Any:  # started, logs, heartbeat, ...: the client's own
        return getattr(self.client, name)

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
        item = _Pending({"job_id": job_id, **exit_body(attempt, replica, exit_code, reason, started_at, pid)})
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="agent-exits", daemon=True)
                self._thread.start()
            self._queue.append(item)
            self._cond.notify()
        item.done.wait()
        if item.error is not None:
            raise item.error
        assert item.result is not None
        return item.result

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
            time.sleep(self.window_s)  # let the reports of the same moment join
            with self._cond:
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            self._send(batch)

    def _send(self, batch: list[_Pending]) -> None:
        if not self.batched:
            self._send_one_by_one(batch)
            return
        stream = self.stream
        if stream is not None and self._send_on_stream(stream, batch):
            return
        try:
            results = self.client.report_exits([item.body for item in batch])
            if len(results) != len(batch):
                raise ServerError(f"exits: {len(results)} results for {len(batch)} reports")
        except Rejected as exc:
            if exc.status not in (404, 405):
                self._fail(batch, exc)
                return
            self.batched = False  # a server from before ``exits``: one report per request
            self._send_one_by_one(batch)
            return
        except Exception as exc:  # noqa: BLE001 - never leave a caller waiting: each retries
            if not isinstance(exc, ServerError):
                exc = ServerError(f"exits: {exc.__class__.__name__}: {exc}")
            self._fail(batch, exc)
            return
        self._deliver(batch, results)

    def _send_on_stream(self, stream: Any, batch: list[_Pending]) -> bool:
        """Send the batch on the agent's websocket; False (nothing delivered) if the stream failed:
        the batch then goes by HTTP (a repeated exit report is recorded once)."""
        try:
            answer = stream.request({"exits": [item.body for item in batch]}, TIMEOUT_S)
        except Exception:  # noqa: BLE001 - whatever failed, the batch still goes (by HTTP)
            return False
        status = int(answer.get("status", 500))
        results = answer.get("results")
        if status == 200 and isinstance(results, list) and len(results) == len(batch):
            self._deliver(batch, results)
        elif 400 <= status < 500:
            self._fail(batch, Rejected(status, answer))
        else:
            return False
        return True

    @staticmethod
    def _deliver(batch: list[_Pending], results: list[dict[str, Any]]) -> None:
        for item, result in zip(batch, results, strict=True):
            status = int(result.get("status", 200))
            if status >= 400:
                item.error = Rejected(status, result)
            else:
                item.result = result
            item.done.set()

    def _send_one_by_one(self, batch: list[_Pending]) -> None:
        for item in batch:
            body = dict(item.body)
            try:
                item.result = self.client.exited(body.pop("job_id"), **body)
            except (ServerError, Rejected) as exc:
                item.error = exc
            except Exception as exc:  # noqa: BLE001 - never leave a caller waiting: it retries
                item.error = ServerError(f"exited: {exc.__class__.__name__}: {exc}")
            item.done.set()

    @staticmethod
    def _fail(batch: list[_Pending], exc: Exception) -> None:
        for item in batch:
            item.error = exc
            item.done.set()
