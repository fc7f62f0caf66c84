"""The rendezvous port an agent gives a job that the server left to it (a job on this node alone
without a whole GPU): never one another running job here has; the same for one attempt's replicas."""

from __future__ import annotations

import json

from tests.agent import fakes

NAMES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK")
MEET = f"import os, json, time; print(json.dumps({{k: os.environ.get(k) for k in {NAMES}}})); time.sleep(3)"


def _binding(job_id: int, replica: int, replicas: int, gpus: list[int], share: float) -> dict:
    meet = {
        "master_addr": "127.0.0.1",
        "master_port": None,
        "world_size": replicas,
        "rank": replica,
        "local_rank": replica,
    }
    return fakes.binding(
        job_id,
        ["python", "-c", MEET],
        replica=replica,
        replicas=replicas,
        gpus=gpus,
        share=share,
        rendezvous=meet,
    )


def test_jobs_sharing_a_gpu_get_ports_of_their_own_and_a_jobs_replicas_share_one():
    server = fakes.FakeServer()
    with fakes.agent_running_against(server) as agent:
        agent.apply(
            {
                "start": [
                    _binding(1, 0, 2, [], 1.0),
                    _binding(1, 1, 2, [], 1.0),
                    _binding(2, 0, 1, [0], 0.5),
                    _binding(3, 0, 1, [0], 0.5),
                ],
                "stop": [],
            }
        )
        seen = {}
        for job_id, replica in ((1, 0), (1, 1), (2, 0), (3, 0)):
            out = fakes.wait_for(lambda j=job_id, r=replica: server.output(j, r), timeout=10)
            seen[(job_id, replica)] = json.loads(out.decode().splitlines()[0])
    ports = {key: env["MASTER_PORT"] for key, env in seen.items()}
    assert ports[(1, 0)] == ports[(1, 1)]
    assert len({ports[(1, 0)], ports[(2, 0)], ports[(3, 0)]}) == 3
    assert all(29400 <= int(p) < 29500 for p in ports.values())
    assert seen[(1, 1)] == {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": ports[(1, 0)],
        "WORLD_SIZE": "2",
        "RANK": "1",
        "LOCAL_RANK": "1",
    }


def test_the_world_told_to_a_running_replica_keeps_the_port_its_agent_chose():
    server = fakes.FakeServer()
    with fakes.agent_running_against(server) as agent:
        agent.apply({"start": [_binding(1, 0, 1, [0], 0.5)], "stop": []})
        out = fakes.wait_for(lambda: server.output(1, 0), timeout=10)
        port = int(json.loads(out.decode().splitlines()[0])["MASTER_PORT"])
        # Every heartbeat tells each running replica its job's world: the server's has no port
        # where it left the choice to the agent.
        meet = _binding(1, 0, 1, [0], 0.5)["rendezvous"]
        agent.apply({"worlds": [{"job_id": 1, "attempt": 0, "replica": 0, **meet}]})
        (process,) = agent.jobs.values()
        world = json.loads((process.workdir / "world.json").read_text())
    assert world == {
        "master_addr": "127.0.0.1",
        "master_port": port,
        "world_size": 1,
        "rank": 0,
        "local_rank": 0,
    }
