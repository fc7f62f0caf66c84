"""The agent's loop: idempotent starts, stale attempts, stop orders, lease fencing, shutdown.

Real processes; the control plane is the recording fake of tests/agent/fakes.py.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from agent.client import ServerError
from agent.identity import resolve_run_as
from agent.inventory import simulated_inventory
from agent.metrics import PROFILE_ENV, GpuCollector
from agent.node import Agent
from agent.process import checkpoint_dir, job_path
from agent.spec import parse_spec
from tests.agent import fakes
from tests.agent.agent_process import alive


@pytest.fixture
def agent():
    with fakes.job_user_state_dir() as state_dir:
        run_as = resolve_run_as("nobody")
        server = fakes.FakeServer()
        node = Agent(
            server,
            simulated_inventory("loop", parse_spec("4xT4")),
            state_dir,
            run_as,
            job_path(state_dir, run_as),
            poll_interval=0.05,
        )
        yield node, server
        node.shutdown(0.5)


def test_a_binding_is_started_once_even_when_delivered_again(agent):
    node, server = agent
    sleeper = fakes.binding(job_id=1, command=["sleep", "30"])
    node.apply({"start": [sleeper]})
    node.apply({"start": [dict(sleeper)]})
    assert [r["job_id"] for r in node.running_reports()] == [1]
    assert len([c for c in server.calls if c[0] == "started"]) <= 1
    assert fakes.wait_for(lambda: [c for c in server.calls if c[0] == "started"], 5)


def test_a_binding_of_an_older_attempt_than_one_run_here_is_ignored(agent):
    node, server = agent
    node.apply({"start": [fakes.binding(job_id=2, attempt=1, command=["true"])]})
    server.exit_of(2)
    node.apply({"start": [fakes.binding(job_id=2, attempt=0, command=["true"])]})
    assert [r for r in node.running_reports() if r["job_id"] == 2 and r["attempt"] == 0] == []


def test_a_stop_order_reaches_only_its_process(agent):
    node, server = agent
    node.apply(
        {
            "start": [
                fakes.binding(job_id=3, command=["sleep", "30"]),
                fakes.binding(job_id=4, command=["sleep", "30"], gpus=[2, 3]),
            ]
        }
    )
    node.apply(
        {"stop": [{"job_id": 3, "attempt": 0, "replica": 0, "reason": "cancelled", "grace_left_seconds": 1}]}
    )
    assert server.exit_of(3, timeout=10)["reason"] == "stopped"
    assert node.jobs[(4, 0, 0)].proc.poll() is None and node.jobs[(4, 0, 0)].stop_reason is None
    assert node.jobs[(3, 0, 0)].done.wait(5)
    node._reap()  # the loop's housekeeping: a reported exit leaves the heartbeat's list
    assert [r["job_id"] for r in node.running_reports()] == [4]


def test_the_heartbeat_reports_running_processes_and_applies_the_answer(agent):
    node, server = agent
    server.orders.append(fakes.binding(job_id=5, command=["sleep", "30"]))
    stop = threading.Event()
    loop = threading.Thread(target=node.run, args=(stop,), daemon=True)
    loop.start()
    try:
        assert fakes.wait_for(
            lambda: any(
                c[0] == "heartbeat" and any(r["job_id"] == 5 and r["pid"] > 0 for r in c[1]["running"])
                for c in list(server.calls)
            ),
            10,
        )
    finally:
        stop.set()
        loop.join(5)


def test_the_heartbeat_carries_utilisation_only_while_the_server_asks_for_it(agent):
    node, server = agent
    collector = GpuCollector(node.inventory, node.gpu_uses)
    node.utilisation = collector.report
    server.orders.append(
        fakes.binding(job_id=7, command=["sleep", "30"], env={PROFILE_ENV: "busy"}, gpus=[1])
    )
    stop = threading.Event()
    loop = threading.Thread(target=node.run, args=(stop,), daemon=True)
    loop.start()

    def reported() -> list[dict]:
        return [
            c[1]["utilisation"] for c in list(server.calls) if c[0] == "heartbeat" and c[1]["utilisation"]
        ]

    try:
        assert fakes.wait_for(lambda: node.running_reports(), 10)
        time.sleep(0.3)  # several heartbeats, none asked to report
        assert reported() == []
        server.report_utilisation = True
        assert fakes.wait_for(reported, 10)
        (gpu,) = reported()[-1]  # only the GPU the job holds
        assert gpu["gpu"] == 1 and gpu["job_ids"] == [7] and gpu["util"] >= 80 and 0 < gpu["sm_active"] <= 1
    finally:
        stop.set()
        loop.join(5)


def test_jobs_are_killed_when_the_lease_cannot_be_renewed(agent):
    node, server = agent
    node.apply({"start": [fakes.binding(job_id=6, command=["sleep", "30"], grace_seconds=30)]})
    pid = fakes.wait_for(lambda: node.jobs[(6, 0, 0)].pid, 5)

    def unreachable(running, utilisation=None, checkpoints=None):
        raise ServerError("connection refused")

    server.heartbeat = unreachable
    node.lease_seconds = 0.5
    node.last_ok = time.monotonic()
    stop = threading.Event()
    loop = threading.Thread(target=node.run, args=(stop,), daemon=True)
    loop.start()
    try:
        assert fakes.wait_for(lambda: not alive(pid), 5), "the job outlived the lease"
        assert server.exit_of(6, timeout=5)["reason"] == "lost"
    finally:
        stop.set()
        loop.join(5)


def test_shutdown_stops_jobs_without_reporting_their_exits(agent):
    node, server = agent
    node.apply({"start": [fakes.binding(job_id=7, command=["sleep", "30"])]})
    pid = fakes.wait_for(lambda: node.jobs[(7, 0, 0)].pid, 5)
    began = time.monotonic()
    node.shutdown(2.0)
    assert not alive(pid) and time.monotonic() - began < 4
    time.sleep(0.3)
    assert server.exits == []
    assert os.path.isdir(node.state_dir)


class SlowExits(fakes.FakeServer):
    """Exit reports wait until released (a busy server)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def report_exits(self, reports):
        self.release.wait(10)
        return super().report_exits(reports)


def test_a_process_that_ended_unreported_is_not_listed_running_while_its_exit_report_is_on_its_way():
    server = SlowExits()
    with fakes.job_user_state_dir() as state_dir:
        run_as = resolve_run_as("nobody")
        node = Agent(
            server,
            simulated_inventory("loop", parse_spec("4xT4")),
            state_dir,
            run_as,
            job_path(state_dir, run_as),
        )
        try:
            node.apply(
                {
                    "start": [
                        fakes.binding(job_id=8, command=["true"]),
                        fakes.binding(job_id=9, command=["sleep", "30"], gpus=[2]),
                        fakes.binding(job_id=10, command=["sleep", "0.3"], gpus=[3]),
                    ]
                }
            )
            quick, reported = node.jobs[(8, 0, 0)], node.jobs[(10, 0, 0)]
            assert fakes.wait_for(lambda: quick.proc.returncode is not None, 5)
            assert fakes.wait_for(lambda: reported.proc.returncode is not None, 5)
            assert not quick.done.is_set() and not reported.done.is_set()  # exit reports wait
            # Job 10's start was reported: it stays listed until its exit report is answered.
            assert sorted(r["job_id"] for r in node.running_reports()) == [9, 10]
            server.release.set()
            assert server.exit_of(8)["started_at"] is not None  # the exit report carries its start
        finally:
            server.release.set()
            node.shutdown(0.5)


def test_periodic_heartbeats_are_spread_around_the_poll_interval_not_in_lockstep():
    from agent.node import HEARTBEAT_JITTER, heartbeat_gap

    gaps = [heartbeat_gap(5.0) for _ in range(2000)]
    assert all(5.0 * (1 - HEARTBEAT_JITTER) <= g <= 5.0 * (1 + HEARTBEAT_JITTER) for g in gaps)
    assert max(gaps) - min(gaps) > 0.5  # agents started together drift apart
    assert abs(sum(gaps) / len(gaps) - 5.0) < 0.05  # the mean (the lease's arithmetic) holds


def test_a_binding_on_gpus_a_stale_process_still_uses_starts_only_once_it_has_exited(agent):
    """The server freed job 20's GPUs (it settled it: say a cancel met its start on the way) and
    bound job 21 there. The agent holds 21 back, asks for a heartbeat, whose answer stops 20
    ("not bound"), and starts 21 once 20 has exited: the GPUs never run both."""
    node, server = agent
    node.apply({"start": [fakes.binding(job_id=20, command=["sleep", "30"], gpus=[0, 1])]})
    old = fakes.wait_for(lambda: node.jobs[(20, 0, 0)].pid, 5)
    record = server.heartbeat

    # as the server answers: 21 is to start here, 20 is not bound
    def heartbeat(running, utilisation=None, checkpoints=None):
        record(running)
        stale = [
            {"job_id": 20, "attempt": 0, "replica": 0, "reason": "not bound", "grace_left_seconds": 0}
            for r in running
            if r["job_id"] == 20
        ]
        started = any(r["job_id"] == 21 for r in running)
        start = [] if started else [fakes.binding(job_id=21, command=["sleep", "30"], gpus=[1, 2])]
        return {"node": "fake", "lease_seconds": 60, "start": start, "stop": stale}

    server.heartbeat = heartbeat
    stop = threading.Event()
    loop = threading.Thread(target=node.run, args=(stop,), daemon=True)
    node.apply({"start": [fakes.binding(job_id=21, command=["sleep", "30"], gpus=[1, 2])]})
    assert (21, 0, 0) not in node.jobs and (21, 0, 0) in node._held
    loop.start()
    try:
        new = fakes.wait_for(lambda: (21, 0, 0) in node.jobs and node.jobs[(21, 0, 0)].pid, 10)
        assert new and not alive(old)
        assert server.exit_of(20, timeout=5) is not None
    finally:
        stop.set()
        loop.join(5)


def test_fractional_shares_of_one_gpu_start_side_by_side(agent):
    node, _ = agent
    node.apply({"start": [fakes.binding(job_id=22, command=["sleep", "30"], gpus=[3], share=0.5)]})
    node.apply({"start": [fakes.binding(job_id=23, command=["sleep", "30"], gpus=[3], share=0.5)]})
    assert {(22, 0, 0), (23, 0, 0)} <= set(node.jobs) and not node._held


def test_a_held_binding_the_server_no_longer_lists_is_dropped(agent):
    node, server = agent
    node.apply({"start": [fakes.binding(job_id=24, command=["sleep", "30"], gpus=[0])]})
    fakes.wait_for(lambda: node.jobs[(24, 0, 0)].pid, 5)
    node.apply({"start": [fakes.binding(job_id=25, command=["sleep", "30"], gpus=[0])]})
    assert (25, 0, 0) in node._held
    before = node._held[(25, 0, 0)][0]
    node._drop_unordered(before - 1, {"start": []})  # an answer to a heartbeat sent before: kept
    assert (25, 0, 0) in node._held
    node._drop_unordered(before + 1, {"start": []})  # one sent after it: 25 is not bound here
    assert (25, 0, 0) not in node._held and (25, 0, 0) not in node.jobs


def test_a_held_binding_is_dropped_when_the_lease_runs_out(agent):
    """Held for its GPUs when the control plane became unreachable: no retry loop (and no
    warning 20 times a second) for the outage; the heartbeat that gets through brings it again."""
    node, _ = agent
    node.apply({"start": [fakes.binding(job_id=26, command=["sleep", "30"], gpus=[0])]})
    fakes.wait_for(lambda: node.jobs[(26, 0, 0)].pid, 5)
    node.apply({"start": [fakes.binding(job_id=27, command=["sleep", "30"], gpus=[0])]})
    assert (27, 0, 0) in node._held
    node.last_ok = time.monotonic() - node.lease_seconds - 1  # the lease has run out
    node._fence_if_expired()
    assert not node._held and node._wait_s() == node.poll_interval


def test_the_agent_removes_checkpoints_past_their_retention_only_once_their_jobs_cannot_resume(agent):
    """``--checkpoint-retention-hours``, applied by the running agent: a checkpoint directory
    unused for longer is asked about in a heartbeat, and goes only once the server says its job
    ended more than the retention ago; one whose job can still resume (requeued, pending) stays
    and its time restarts, one whose job ended lately stays until the retention has passed since
    then; and the checkpoint of a job running here is not even asked about."""
    node, server = agent
    node.checkpoint_retention_s = 3600.0
    node.apply({"start": [fakes.binding(job_id=41, command=["sleep", "30"])]})
    assert fakes.wait_for(lambda: [c for c in server.calls if c[0] == "started"], 5)
    ended, resumable, lately, running = (checkpoint_dir(node.state_dir, j) for j in (40, 43, 44, 41))
    old = time.time() - 2 * 3600
    for directory in (ended, resumable, lately, running):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.utime(directory, (old, old))
    server.ended = {40: time.time() - 1.5 * 3600, 44: time.time() - 600}

    node._reap()  # the loop's housekeeping: what is past its retention is asked about
    node._heartbeat(time.monotonic(), 0)
    node._sweep_answered()  # and the answer applied by the main loop
    (asked,) = [c[1]["checkpoints"] for c in server.calls if c[0] == "heartbeat"]
    assert asked == [40, 43, 44]
    assert not ended.exists()
    assert resumable.is_dir() and time.time() - resumable.stat().st_mtime < 60  # a retention more
    assert lately.is_dir() and abs(lately.stat().st_mtime - server.ended[44]) < 1  # until 1 h after
    assert running.is_dir()
