"""The real agent process against a live control plane: secrets, registration, a job, Ctrl-C.

The scheduling pass is not involved here (jobs are bound by hand); the end-to-end test in
tests/integration runs everything together.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import pytest

from scheduling.choices import JobState, NodeState
from scheduling.models import Job, Node
from tests.agent import agent_process as processes
from tests.agent import fakes
from tests.agent import helpers as h

start_agent, stop_agent, registered = processes.start_agent, processes.stop_agent, processes.registered


def descendants(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


@pytest.mark.slow
def test_the_agent_keeps_its_join_token_out_of_ps_and_its_credential_private(live_server, world, state_dir):
    token = h.new_join_token()
    agent = start_agent(live_server.url, state_dir, "--join-token", token)
    try:
        node = registered(state_dir)
        cmdline = Path(f"/proc/{agent.pid}/cmdline").read_bytes()
        assert token.encode() not in cmdline and b"--simulate" in cmdline
        assert token.encode() not in Path(f"/proc/{agent.pid}/environ").read_bytes()
        credential = state_dir / "credential"
        assert credential.stat().st_mode & 0o777 == 0o600 and credential.stat().st_uid == os.geteuid()
        assert credential.read_text().encode() not in cmdline
        assert (node.rack, node.nvlink_domain, node.devices.count()) == ("r9", 2, 4)
        with urllib.request.urlopen(node.metrics_url, timeout=5) as answer:
            assert "DCGM_FI_DEV_GPU_UTIL" in answer.read().decode()
    finally:
        output = stop_agent(agent)
    assert agent.returncode == 0, output
    assert "visible in ps" in output and token not in output


@pytest.mark.slow
def test_the_agent_runs_a_bound_job_and_ctrl_c_stops_its_jobs(live_server, world, state_dir):
    token_file = state_dir / "join-token"
    token_file.write_text(h.new_join_token())
    # The default --util-speed: the profile's first busy sample lasts a minute of job time.
    agent = start_agent(live_server.url, state_dir, "--join-token-file", str(token_file))
    try:
        node = registered(state_dir)
        done = h.bind(
            h.submit(world.alice, world.vision, command=["sh", "-c", "echo $CUDA_VISIBLE_DEVICES"]),
            "cli-node",
            [2, 3],
        )
        assert fakes.wait_for(lambda: Job.objects.get(pk=done.pk).state == JobState.SUCCEEDED, 20)
        assert b"".join(bytes(c.data) for c in Job.objects.get(pk=done.pk).log_chunks.all()) == b"2,3\n"

        long = h.bind(h.submit(world.alice, world.vision, command=["sleep", "300"]), "cli-node", [0, 1])
        assert fakes.wait_for(lambda: Job.objects.get(pk=long.pk).state == JobState.RUNNING, 20)
        with urllib.request.urlopen(node.metrics_url, timeout=5) as answer:
            text = answer.read().decode()
        busy = [
            line
            for line in text.splitlines()
            if line.startswith("DCGM_FI_DEV_GPU_UTIL{") and f'job="{long.pk}"' in line
        ]
        assert len(busy) == 2 and all(float(line.rsplit(" ", 1)[1]) > 0 for line in busy)
        children = descendants(agent.pid)
        assert children, "the job's process is not a child of the agent"
    finally:
        output = stop_agent(agent)
    assert agent.returncode == 0, output
    assert fakes.wait_for(lambda: not any(os.path.exists(f"/proc/{c}") for c in children), 5)
    # The agent did not report the stopped job: its fate is left to its lease.
    assert Job.objects.get(pk=long.pk).state == JobState.RUNNING
    assert Node.objects.get(name="cli-node").state == NodeState.READY


@pytest.mark.slow
def test_an_agent_with_a_refused_join_token_exits_2_saying_so(live_server, db, state_dir):
    agent = start_agent(live_server.url, state_dir, env={"TESSERA_JOIN_TOKEN": "not-a-real-token"})
    output = agent.communicate(timeout=60)[0]
    assert agent.returncode == 2
    assert "refused to register 'cli-node'" in output
    assert "Invalid, expired, revoked or used-up join token" in output
    assert "not-a-real-token" not in output


@pytest.mark.parametrize("server", ["notaurl", "ftp://gpu-ctl:21", "http://", "127.0.0.1:8000"])
def test_an_agent_given_a_server_that_is_no_http_url_exits_2_at_once_naming_it(server, state_dir):
    # It used to take it as a server "not answering yet" and retry for --register-timeout
    # (120 s), then say it "could not reach the server": a typo looked like an outage.
    agent = start_agent(server, state_dir, env={"TESSERA_JOIN_TOKEN": "unused"})
    try:
        output = agent.communicate(timeout=30)[0]
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(10)
    assert agent.returncode == 2, output
    assert f"--server {server!r}" in output and "not answering" not in output
