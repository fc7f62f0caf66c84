"""Lease fencing in the agent: jobs die at the lease's deadline, not at the loop's next turn.

The lease runs out a lease period after the send of the last heartbeat that succeeded; the server
requeues a lost node's jobs only after its own count (from the receipt) plus a margin
(tests/scheduling/test_health.py), so the agent must kill them at its deadline whatever its main
loop is waiting for. Real processes; the control plane is the recording fake of fakes.py.
"""

from __future__ import annotations

import threading
import time

import pytest

from agent.client import ServerError
from agent.identity import resolve_run_as
from agent.inventory import simulated_inventory
from agent.node import Agent
from agent.process import job_path
from agent.spec import parse_spec
from tests.agent import fakes
from tests.agent.agent_process import alive

LEASE_S = 0.8
POLL_S = 30.0  # far longer than the lease: a kill at the next periodic turn would come too late


class Partition:
    """Wraps a fake server's heartbeat: answers with a short lease while ``up``, fails otherwise."""

    def __init__(self, server: fakes.FakeServer, up: int = 1) -> None:
        self.server, self.answer = server, server.heartbeat
        self.left = up  # heartbeats that get through before the partition
        self.lock = threading.Lock()
        server.heartbeat = self

    def __call__(self, running, utilisation=None, checkpoints=None):
        with self.lock:
            if self.left <= 0:
                raise ServerError("connection refused")
            self.left -= 1
        return {**self.answer(running, utilisation, checkpoints), "lease_seconds": LEASE_S}


def make_agent(server, state_dir, poll_interval: float = POLL_S) -> Agent:
    run_as = resolve_run_as("nobody")
    return Agent(
        server,
        simulated_inventory("fence", parse_spec("4xT4")),
        state_dir,
        run_as,
        job_path(state_dir, run_as),
        poll_interval=poll_interval,
    )


def deadline_of(node: Agent) -> float:
    """The lease's deadline as docs/agent.md states it: the last good heartbeat's send + the lease."""
    return node.last_ok + node.lease_seconds


def death_time(pid: int, timeout: float) -> float | None:
    """When (``time.monotonic()``) ``pid`` was first seen dead, looking every 5 ms."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return time.monotonic()
        time.sleep(0.005)
    return None


@pytest.mark.parametrize("push", [fakes.FakeServer, fakes.StreamingServer], ids=["long-poll", "stream"])
def test_jobs_are_killed_at_the_lease_deadline_while_the_loop_waits_a_long_poll_interval(state_dir, push):
    server = push()
    partition = Partition(server)
    server.orders.append(fakes.binding(job_id=1, command=["sleep", "60"], grace_seconds=30))
    node = make_agent(server, state_dir)
    stop = threading.Event()
    loop = threading.Thread(target=node.run, args=(stop,), daemon=True)
    loop.start()
    try:
        pid = fakes.wait_for(lambda: (p := node.jobs.get((1, 0, 0))) is not None and p.pid, 5)
        assert pid, "the job did not start"
        assert partition.left == 0  # the heartbeat that carried the binding set the lease
        deadline = deadline_of(node)  # no heartbeat succeeds from now on: it stays
        died = death_time(pid, 5)
        assert died is not None, "the job outlived its lease by seconds: killed at the next poll?"
        late = died - deadline
        print(f"killed {late * 1000:.0f} ms after the lease's deadline")
        assert -0.01 < late < 1.0  # not before the deadline; at it, give or take scheduling
        assert server.exit_of(1, timeout=5)["reason"] == "lost"
    finally:
        stop.set()
        node.poke()
        if isinstance(server, fakes.StreamingServer) and server.streams:
            server.drop_stream()
        loop.join(5)
        node.shutdown(0.5)


def test_a_heartbeat_that_succeeds_after_the_deadline_does_not_bring_killed_jobs_back(state_dir):
    server = fakes.FakeServer()
    partition = Partition(server)
    killed = fakes.binding(job_id=2, command=["sleep", "60"], grace_seconds=30)
    server.orders.append(killed)
    node = make_agent(server, state_dir, poll_interval=0.3)
    stop = threading.Event()
    loop = threading.Thread(target=node.run, args=(stop,), daemon=True)
    loop.start()
    try:
        pid = fakes.wait_for(lambda: (p := node.jobs.get((2, 0, 0))) is not None and p.pid, 5)
        assert death_time(pid, 5) is not None
        assert server.exit_of(2, timeout=5)["reason"] == "lost"
        # The server comes back, and (not having settled the exit yet) delivers the binding again,
        # with a new one: the killed job stays dead; the new one runs under the renewed lease.
        with server.lock:
            server.orders += [killed, fakes.binding(job_id=3, command=["sleep", "60"], gpus=[2])]
        with partition.lock:
            partition.left = 1
        fresh = fakes.wait_for(lambda: (p := node.jobs.get((3, 0, 0))) is not None and p.pid, 5)
        assert fresh, "a job bound after the lease was renewed did not start"
        # Job 2's process is dead (above); the loop forgets it once its exit report is answered
        # (the turn that started job 3 may reap it just after): it never runs again.
        assert fakes.wait_for(lambda: not any(r["job_id"] == 2 for r in node.running_reports()), 5)
        assert (2, 0, 0) not in node.jobs or node.jobs[(2, 0, 0)].pid == pid
        assert [e["job_id"] for e in server.exits] == [2]
        # The partition again: the new job dies at the new deadline, as the first did.
        deadline = deadline_of(node)
        died = death_time(fresh, 5)
        assert died is not None and -0.01 < died - deadline < 1.0
    finally:
        stop.set()
        node.poke()
        loop.join(5)
        node.shutdown(0.5)


def test_a_heartbeat_that_lands_while_the_agent_fences_leaves_later_jobs_under_the_new_lease(state_dir):
    server = fakes.FakeServer()
    node = make_agent(server, state_dir)
    try:
        node.apply({"start": [fakes.binding(job_id=4, command=["sleep", "60"])]})
        first = node.jobs[(4, 0, 0)]
        node.lease_seconds, node.last_ok = LEASE_S, time.monotonic() - 2 * LEASE_S

        def stop_while_a_heartbeat_lands(reason, grace_s):
            type(first).stop(first, reason, grace_s)
            node._heartbeat(time.monotonic(), 0)  # the heartbeat thread, at this very moment

        first.stop = stop_while_a_heartbeat_lands
        node._fence_if_expired()
        assert first.stop_reason == "lease expired"
        node.apply({"start": [fakes.binding(job_id=5, command=["sleep", "60"], gpus=[2])]})
        second = node.jobs[(5, 0, 0)]
        node.lease_seconds, node.last_ok = LEASE_S, time.monotonic() - LEASE_S  # its lease ran out
        node._fence_if_expired()
        assert second.stop_reason == "lease expired", "fencing stayed off after the renewal"
        assert death_time(second.pid, 5) is not None
    finally:
        node.shutdown(0.5)


def test_no_binding_is_started_while_the_lease_has_run_out(state_dir):
    server = fakes.FakeServer()
    node = make_agent(server, state_dir)
    try:
        node.lease_seconds, node.last_ok = LEASE_S, time.monotonic() - 2 * LEASE_S
        binding = fakes.binding(job_id=6, command=["sleep", "60"])
        node.apply({"start": [binding]})  # a wake pushed it: the server may be requeueing it
        assert node.jobs == {} and node.ever_started == set()
        node.last_ok = time.monotonic()  # a heartbeat got through and delivers it again
        node.apply({"start": [binding]})
        assert list(node.jobs) == [(6, 0, 0)]
    finally:
        node.shutdown(0.5)


def test_the_main_loop_wait_ends_at_the_lease_deadline():
    node = Agent.__new__(Agent)  # only the arithmetic of the wait
    node.poll_interval, node.lease_seconds = POLL_S, 10.0
    node.last_ok = time.monotonic() - 9.5
    assert 0.4 < node._wait_s() <= 0.5
    node.last_ok = time.monotonic()
    assert 9.9 < node._wait_s() <= 10.0
    node.last_ok = time.monotonic() - 11  # run out: nothing due until a heartbeat wakes the loop
    assert node._wait_s() == POLL_S
