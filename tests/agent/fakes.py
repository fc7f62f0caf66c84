"""A stand-in for the control plane at the HTTP edge, recording what the agent reports."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agent import sandbox
from agent.client import Rejected, ServerError
from agent.errors import ServerBusy
from agent.identity import RunAs, resolve_run_as
from agent.inventory import simulated_inventory
from agent.node import Agent
from agent.process import job_path
from agent.spec import parse_spec

# A job that forks until its uid's process limit stops it (the isolation tests bound it at 30 or
# 40): prints how many children it made and the error that stopped it, or "no limit" at 200.
FORK_BOMB = r"""
import os, time
children = 0
try:
    while children < 200:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        children += 1
except OSError as exc:
    print(children, type(exc).__name__, flush=True)
else:
    print(children, "no limit", flush=True)
"""


class FakeServer:
    """Implements :class:`agent.client.AgentClient`'s calls; thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.chunks: dict[tuple[int, int], list[tuple[int, bytes]]] = {}
        self.exits: list[dict[str, Any]] = []
        self.orders: list[dict[str, Any]] = []
        self.refuse_started = False
        self.unreachable_checkpoints = 0  # the next this many checkpoint reports fail (no answer)
        self.report_utilisation = False  # what the heartbeat answers ask of the agent
        self.ended: dict[int, float] = {}  # jobs that ended (epoch seconds): the rest may resume
        self.woken = threading.Event()
        self.pushed: list[dict[str, Any]] | None = None

    def _record(self, what: str, **body: Any) -> None:
        with self.lock:
            self.calls.append((what, body))

    def wait(self, timeout_s: float) -> dict[str, Any]:
        """The long-poll: answers at once when :meth:`wake` was called, else after the timeout."""
        woken = self.woken.wait(timeout_s)
        self.woken.clear()
        self._record("wait", woken=woken)
        if not woken:
            return {"wake": False}
        with self.lock:
            pushed, self.pushed = self.pushed, None
        if pushed is None:
            return {"wake": True}  # as an older server answers: heartbeat to get the orders
        return {"wake": True, "start": pushed, "heartbeat": False}

    def wake(self, start: list[dict[str, Any]] | None = None) -> None:
        """Wake the agent; ``start``: bindings carried by the wake (as a pass's wake does)."""
        with self.lock:
            self.pushed = start
        self.woken.set()

    def open_stream(self, idle_s: float) -> Any:
        """As a server from before the stream: the handshake is refused (the long-poll is used)."""
        self._record("open_stream")
        raise Rejected(404, "no stream here")

    def heartbeat(
        self,
        running: list[dict[str, int]],
        utilisation: list[dict[str, Any]] | None = None,
        checkpoints: list[int] | None = None,
    ) -> dict[str, Any]:
        self._record("heartbeat", running=running, utilisation=utilisation, checkpoints=checkpoints)
        with self.lock:
            orders, self.orders = self.orders, []
        start = [o for o in orders if "command" in o]
        stop = [o for o in orders if "command" not in o]
        answer = {
            "node": "fake",
            "lease_seconds": 60,
            "report_utilisation": self.report_utilisation,
            "start": start,
            "stop": stop,
        }
        if checkpoints:  # every job asked about is this node's and can still resume, unless ended
            answer["checkpoints"] = [{"job_id": j, "ended_at": self.ended.get(j)} for j in checkpoints]
        return answer

    def started(
        self, job_id: int, attempt: int, replica: int, pid: int, started_at: float | None = None
    ) -> dict[str, Any]:
        self._record(
            "started", job_id=job_id, attempt=attempt, replica=replica, pid=pid, started_at=started_at
        )
        if self.refuse_started:
            raise Rejected(409, {"detail": "not bound"})
        return {"state": "running"}

    def logs(self, job_id: int, attempt: int, replica: int, offset: int, data: bytes) -> dict[str, Any]:
        self._record("logs", job_id=job_id, offset=offset, size=len(data))
        with self.lock:
            self.chunks.setdefault((job_id, replica), []).append((offset, data))
        return {"stored": len(data), "next_offset": offset + len(data), "truncated": False}

    def checkpointed(self, job_id: int, attempt: int, replica: int, at: float, line: str) -> dict[str, Any]:
        with self.lock:
            unreachable = self.unreachable_checkpoints > 0
            self.unreachable_checkpoints -= unreachable
        if unreachable:
            self._record("checkpoint-unanswered", job_id=job_id, line=line)
            raise ServerError("checkpointed: ConnectionRefusedError")
        self._record("checkpointed", job_id=job_id, attempt=attempt, replica=replica, at=at, line=line)
        return {"state": "running"}

    def checkpoints(self, job_id: int) -> list[str]:
        """The lines reported for ``job_id``, in order."""
        with self.lock:
            return [
                body["line"]
                for what, body in self.calls
                if what == "checkpointed" and body["job_id"] == job_id
            ]

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
        self._record("exited", job_id=job_id, exit_code=exit_code, reason=reason, started_at=started_at)
        with self.lock:
            self.exits.append(
                {
                    "job_id": job_id,
                    "attempt": attempt,
                    "replica": replica,
                    "exit_code": exit_code,
                    "reason": reason,
                    **({"started_at": started_at} if started_at is not None else {}),
                }
            )
        return {"state": "succeeded" if exit_code == 0 else "failed", "recorded": True}

    def report_exits(self, reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The batched exit reports: each recorded as an ``exited`` call, the batch as ``exits``."""
        self._record("exits", count=len(reports))
        return [{"status": 200, **self.exited(**report)} for report in reports]

    def output(self, job_id: int, replica: int = 0) -> bytes:
        with self.lock:
            return b"".join(data for _, data in sorted(self.chunks.get((job_id, replica), [])))

    def exit_of(self, job_id: int, timeout: float = 20.0) -> dict[str, Any]:
        found = wait_for(lambda: next((e for e in self.exits if e["job_id"] == job_id), None), timeout)
        assert found is not None, f"job {job_id} did not exit within {timeout}s: {self.calls}"
        return found


class StreamingServer(FakeServer):
    """A server with the stream: wakes come on it, exit reports go on it (``stream-exits``), and
    :meth:`drop_stream` ends it as a restarted web process would."""

    def __init__(self) -> None:
        super().__init__()
        self.streams: list[FakeStream] = []

    def open_stream(self, idle_s: float) -> FakeStream:
        self._record("open_stream")
        stream = FakeStream(self)
        with self.lock:
            self.streams.append(stream)
        return stream

    def wake(self, start: list[dict[str, Any]] | None = None) -> None:
        message = {"wake": True, "start": start or [], "heartbeat": start is None}
        wait_for(lambda: self.streams and not self.streams[-1].closed, 5)
        self.streams[-1].inbox.put(message)

    def drop_stream(self) -> None:
        self.streams[-1].inbox.put(None)


class BusyStreamingServer(StreamingServer):
    """A server whose Redis is away: each stream it opens is closed at once with 4013, "try
    again later" (``scheduling/api/agent_stream.py``)."""

    def open_stream(self, idle_s: float) -> FakeStream:
        stream = super().open_stream(idle_s)
        stream.busy = True
        return stream


class FakeStream:
    def __init__(self, server: StreamingServer) -> None:
        import queue

        self.server = server
        self.inbox: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self.closed = False
        self.busy = False

    def receive(self) -> dict[str, Any]:
        if self.busy:
            self.closed = True
            raise ServerBusy("stream: closed by the server (4013)")
        message = self.inbox.get()
        if message is None:
            self.closed = True
            raise ServerError("stream: closed by the server")
        return message

    def request(self, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.server._record("stream-exits", count=len(body["exits"]))
        return {"status": 200, "results": [{"status": 200, **self.server.exited(**r)} for r in body["exits"]]}

    def close(self, why: str = "closed") -> None:
        self.closed = True


# For job scripts (``ATTEMPT + script``): what a job's attempt at something it must not do
# ended with ("succeeded", or the OSError's name).
ATTEMPT = r"""
def attempt(action):
    try:
        action()
    except OSError as exc:
        return type(exc).__name__
    return "succeeded"
"""


def env_stdin(env: dict[str, str], run_as: RunAs) -> int:
    """The spawn chain's standard input as the agent hands it over to ``run_as``'s chain: the job's
    environment and the line that runs its command, whole (the write end closed); the caller
    closes it."""
    script = sandbox.env_script(env)
    read_end, write_end = sandbox.env_pipe(len(script))
    sandbox.send_env(read_end, write_end, script, run_as)
    os.close(write_end)
    return read_end


def wait_for(check: Callable[[], Any], timeout: float = 20.0, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    return check()


def binding(job_id: int = 1, command: list[str] | None = None, **overrides: Any) -> dict[str, Any]:
    b = {
        "job_id": job_id,
        "attempt": 0,
        "replica": 0,
        "replicas": 1,
        "name": "t",
        "command": command or ["true"],
        "env": {},
        "gpus": [0, 1],
        "share": 1.0,
        "grace_seconds": 5,
        "time_limit_seconds": None,
        "checkpoint_seconds": None,
        "log_offset": 0,
    }
    b.update(overrides)
    return b


@contextmanager
def job_user_state_dir() -> Iterator[Path]:
    """A state dir the job user can reach (pytest's tmp_path is private to root)."""
    from agent.leftovers import tidy
    from agent.state import prepare_state_dir, remove_tree

    path = Path(tempfile.mkdtemp(prefix="tessera-agent-test-", dir="/tmp"))
    try:
        yield prepare_state_dir(path)
    finally:
        tidy(path)  # its session records' directory under /run, once empty
        remove_tree(path)  # however deep a job's tree in it (the agent's own way)


@contextmanager
def agent_running_against(server: FakeServer):
    """A real agent loop (2 simulated T4s, 30 s periodic poll) against ``server``, once it has
    sent its first heartbeat; stopped and reaped afterwards."""
    with job_user_state_dir() as state_dir:
        run_as = resolve_run_as("nobody")
        node = Agent(
            server,
            simulated_inventory("push", parse_spec("2xT4")),
            state_dir,
            run_as,
            job_path(state_dir, run_as),
            poll_interval=30,
        )
        stop = threading.Event()
        loop = threading.Thread(target=node.run, args=(stop,), daemon=True)
        loop.start()
        try:
            assert wait_for(lambda: [c for c in server.calls if c[0] == "heartbeat"], 5)
            yield node
        finally:
            stop.set()
            node.poke()
            loop.join(5)
            node.shutdown(0.5)
        assert not loop.is_alive()
