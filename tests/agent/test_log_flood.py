"""A job that floods its log harms only itself, through a real agent (``python -m agent``).

bob's job writes 64 MiB of output as fast as it can, beside alice's job, which prints a numbered
line every 20 ms. With the server reachable, the server keeps the job's log up to its cap and
marks the cut; with the server unreachable (the agent's connection to it cut by a proxy), the
agent holds at most ``--job-log-buffer-mb`` of it (4 MiB here) and marks what it dropped, with
how many bytes. Either way the agent's memory stays bounded (its resident set, from ``/proc``),
alice's output arrives whole and her job succeeds.
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from subprocess import Popen

import pytest

from scheduling.choices import TERMINAL_STATES, JobState
from scheduling.models import Job
from tests.agent import agent_process as processes
from tests.agent import fakes
from tests.agent import helpers as h

pytestmark = pytest.mark.slow

FLOOD = 64 << 20
HELD = 4 << 20  # the agent's --job-log-buffer-mb here (32 by default: 8 s more to send here)

FLOODER = r"""
import os, sys, time
while not os.path.exists("go"):
    time.sleep(0.02)
line, out = b"f" * 1023 + b"\n", sys.stdout.buffer
for _ in range(int(sys.argv[1]) // 1024):
    out.write(line)
out.flush()
open("flooded", "w").close()
while not os.path.exists("done"):
    time.sleep(0.02)
"""

NEIGHBOUR = r"""
import os, time
n = 0
while not os.path.exists("done"):
    print(f"line {n}", flush=True)
    n += 1
    time.sleep(0.02)
print(f"end {n}", flush=True)
"""


class Proxy:
    """A TCP proxy to the control plane that can be cut: while it is, every connection through
    it (the open ones included) is reset at once."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.listening = socket.create_server(("127.0.0.1", 0))
        self.port = self.listening.getsockname()[1]
        self.cut = False
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listening.accept()
            except OSError:
                return
            if self.cut:
                self._reset(client)
                continue
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                self._reset(client)
                continue
            with self._lock:
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    @staticmethod
    def _reset(sock: socket.socket) -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()

    def set_cut(self, cut: bool) -> None:
        self.cut = cut
        if cut:
            with self._lock:
                dead, self._open = self._open, []
            for sock in dead:
                with contextlib.suppress(OSError):
                    self._reset(sock)

    def close(self) -> None:
        self.listening.close()
        self.set_cut(True)


def memory_kib(pid: int) -> dict[str, int]:
    """The process's resident set now (``VmRSS``) and at its peak (``VmHWM``), in KiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {k: int(fields[k].split()[0]) for k in ("VmRSS", "VmHWM")}


def reset_peak(pid: int) -> None:
    """Start ``VmHWM`` afresh from the resident set now (Linux's ``clear_refs``, 5)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def workdir(state_dir: Path, job: Job) -> Path:
    (path,) = state_dir.glob(f"jobs/{job.pk}-*")
    return path


def assert_whole(output: bytes) -> None:
    """alice's output: every numbered line, in order, then the count."""
    lines = output.decode().splitlines()
    assert lines[-1] == f"end {len(lines) - 1}", lines[-3:]
    assert lines[:-1] == [f"line {n}" for n in range(len(lines) - 1)]


@contextlib.contextmanager
def node_with_two_jobs(server: str, state_dir: Path, world) -> Iterator[tuple[Popen[str], Job, Job]]:
    """A real agent (through ``server``) running alice's job and bob's flooder, both started."""
    token_file = state_dir / "join-token"
    token_file.write_text(h.new_join_token())
    limits = ["--job-log-buffer-mb", str(HELD >> 20)]
    agent = processes.start_agent(server, state_dir, "--join-token-file", str(token_file), *limits)
    try:
        processes.registered(state_dir)
        neighbour = h.submit(world.alice, world.vision, command=["python", "-c", NEIGHBOUR], gpus=1)
        flooder = h.submit(world.bob, world.nlp, command=["python", "-c", FLOODER, str(FLOOD)], gpus=1)
        h.bind(neighbour, "cli-node", [0])
        h.bind(flooder, "cli-node", [1])
        started = (neighbour, flooder)
        assert fakes.wait_for(lambda: all(h.state_of(j) == JobState.RUNNING for j in started), 30)
        assert fakes.wait_for(lambda: b"line 1\n" in h.output_bytes(neighbour), 15)
        yield agent, neighbour, flooder
    finally:
        processes.stop_agent(agent)


def finish(state_dir: Path, *jobs: Job) -> None:
    for job in jobs:
        (workdir(state_dir, job) / "done").touch()
    for job in jobs:
        assert fakes.wait_for(lambda j=job: h.state_of(j) in TERMINAL_STATES, 60), h.output_bytes(job)[-300:]


def test_a_flood_with_the_server_reachable_is_cut_at_the_cap_and_marked_and_the_neighbour_is_whole(
    live_server, world, state_dir, settings
):
    settings.TESSERA = {**settings.TESSERA, "LOG_CAP_BYTES": 1 << 20}
    with node_with_two_jobs(live_server.url, state_dir, world) as (agent, neighbour, flooder):
        before = memory_kib(agent.pid)["VmRSS"]
        reset_peak(agent.pid)
        (workdir(state_dir, flooder) / "go").touch()
        assert fakes.wait_for(lambda: (workdir(state_dir, flooder) / "flooded").exists(), 60)
        grew = memory_kib(agent.pid)["VmHWM"] - before
        finish(state_dir, flooder, neighbour)
    print(f"agent resident set: {before} KiB, grew by at most {grew} KiB under a {FLOOD >> 20} MiB flood")
    assert grew < 16 << 10  # KiB: the agent ships as it reads, then drops past the cap
    assert h.state_of(flooder) == JobState.SUCCEEDED and h.state_of(neighbour) == JobState.SUCCEEDED
    flooded = h.output_bytes(flooder)
    cut = b"[tessera] output past the job's log cap of 1048576 bytes dropped\n"
    assert flooded.endswith(cut), flooded[-300:]
    kept = flooded[: -len(cut)]
    assert len(kept) == 1 << 20 and set(kept) == set(b"f\n")  # the job's output up to the cap
    assert Job.objects.get(pk=flooder.pk).log_truncated
    assert_whole(h.output_bytes(neighbour))


def test_a_flood_while_the_server_is_unreachable_is_held_up_to_the_bound_and_the_rest_marked(
    live_server, world, state_dir, settings
):
    settings.TESSERA = {**settings.TESSERA, "LOG_CAP_BYTES": 2 * HELD}  # past what the agent holds
    url = live_server.url.rsplit(":", 1)
    proxy = Proxy((url[0].split("//")[1], int(url[1])))
    try:
        through = f"http://127.0.0.1:{proxy.port}"
        with node_with_two_jobs(through, state_dir, world) as (agent, neighbour, flooder):
            before = memory_kib(agent.pid)["VmRSS"]
            reset_peak(agent.pid)
            proxy.set_cut(True)
            (workdir(state_dir, flooder) / "go").touch()
            assert fakes.wait_for(lambda: (workdir(state_dir, flooder) / "flooded").exists(), 60)
            grew = memory_kib(agent.pid)["VmHWM"] - before
            proxy.set_cut(False)
            finish(state_dir, flooder, neighbour)
    finally:
        proxy.close()
    print(f"agent resident set: {before} KiB, grew by at most {grew} KiB under a {FLOOD >> 20} MiB flood")
    assert grew < (HELD >> 10) + (16 << 10)  # KiB: what it holds, and little more
    assert h.state_of(flooder) == JobState.SUCCEEDED and h.state_of(neighbour) == JobState.SUCCEEDED
    flooded = h.output_bytes(flooder)
    said = re.search(rb"\[tessera-agent\] (\d+) bytes of output dropped: [^\n]*\n", flooded)
    assert said is not None, flooded[-300:]
    kept, dropped = flooded[: said.start()] + flooded[said.end() :], int(said.group(1))
    assert set(kept) == set(b"f\n")
    # all of it, kept or said to be dropped (+1: the note's own newline after a line cut short)
    assert len(kept) + dropped in (FLOOD, FLOOD + 1)
    assert len(kept) <= HELD + 1
    assert_whole(h.output_bytes(neighbour))
