"""The packing benchmark and the baselines on a small hand-made cluster."""

from __future__ import annotations

import json

import pytest

from scheduling.engine.registry import POLICIES, make_scheduler
from scheduling.engine.types import JobRequest
from scheduling.sim.pack import PACK_POLICIES, Pod, run_pack, workload
from tests.engine.engine_cases import node

NODES = """node,rack,gpus,model,gpu_memory_gib,nvlink_domain,cpus,memory_gib,price_per_gpu_hour
a0,r0,8,G2,32,8,96,384,2
a1,r0,8,G2,32,8,96,384,2
t0,r1,2,T4,16,1,64,256,1
t1,r1,2,T4,16,1,64,256,1
"""


def _jobs(path):
    rows = [
        "job,tenant,kind,submit_s,duration_s,gpus,replicas,model,priority,preemptible,"
        "time_limit_s,cpus,memory_gib"
    ]
    shapes = [(1, 8), (0.5, 4), (2, 8), (0, 4), (0.25, 2), (4, 16), (1, 8), (0.5, 4)]
    for i in range(16):
        g, c = shapes[i % len(shapes)]
        rows.append(f"p{i:03d},t,batch,0,,{g},1,,0,true,,{c},8")
    path.write_text("\n".join(rows) + "\n")


@pytest.mark.parametrize("policy", PACK_POLICIES)
def test_every_pack_policy_writes_a_summary_and_a_plot(tmp_path, policy):
    (tmp_path / "nodes.csv").write_text(NODES)
    _jobs(tmp_path / "jobs.csv")
    out = tmp_path / policy
    summary = run_pack(tmp_path / "nodes.csv", tmp_path / "jobs.csv", policy, out, [42, 43])
    data = json.loads((out / "summary.json").read_text())
    assert data == json.loads(json.dumps(summary))
    for key in (
        "gpu_allocation_rate_at_100",
        "gpu_allocation_rate_at_130",
        "fragmentation_rate_at_90",
        "per_seed",
        "policy",
    ):
        assert key in data
    assert len(data["per_seed"]) == 2
    assert (out / "allocation.png").stat().st_size > 1000
    for seed in data["per_seed"]:
        assert 0 <= seed["final_allocation_rate"] <= 1


def test_the_tune_up_stops_before_passing_130_percent():
    pods = [Pod(f"p{i}", 1000, 0, 1000, 1, ()) for i in range(5)]
    order = workload(pods, 10_000, seed=1)
    assert sum(p.demand for p in order) <= 13_000
    assert sum(p.demand for p in order) + 1000 > 13_000


def test_fcfs_node_gives_each_replica_a_whole_node_and_lists_only_what_it_asked():
    s = make_scheduler("fcfs-node", [node("a"), node("b")])
    s.submit(JobRequest("one", "t", "batch", 1))
    s.submit(JobRequest("two", "t", "batch", 1, submitted_at=1))
    s.submit(JobRequest("three", "t", "batch", 1, submitted_at=2))
    d = s.decide(0.0)
    assert [(b.job_id, b.placements[0].node, b.placements[0].gpus) for b in d.bindings] == [
        ("one", "a", (0,)),
        ("two", "b", (0,)),
    ]
    assert d.pending["three"].code == "capacity"


def test_first_come_first_served_blocks_behind_the_head():
    s = make_scheduler("fcfs-device", [node("a", gpus=4, nvlink=4)])
    s.submit(JobRequest("small", "t", "batch", 2))
    s.submit(JobRequest("big", "t", "batch", 4, submitted_at=1))
    s.submit(JobRequest("tiny", "t", "batch", 1, submitted_at=2))
    d = s.decide(0.0)
    assert [b.job_id for b in d.bindings] == ["small"]
    assert d.pending["tiny"].code == "priority"


def test_best_fit_and_fgd_share_a_gpu_between_fractions():
    for name in ("best-fit", "fgd", "tessera"):
        s = make_scheduler(name, [node("a", gpus=2, nvlink=1)])
        s.submit(JobRequest("x", "t", "batch", 0.5))
        s.decide(0.0)
        s.submit(JobRequest("y", "t", "batch", 0.5, submitted_at=1))
        d = s.decide(1.0)
        assert d.bindings[0].placements[0].share == 0.5
        assert d.bindings[0].placements[0].gpus == s.state.allocs["x"][0].gpus, name


def test_the_registry_knows_every_policy():
    assert POLICIES == (
        "tessera",
        "fcfs-node",
        "fcfs-device",
        "random",
        "best-fit",
        "fgd",
        "greedy",
        "greedy-quota",
    )
    with pytest.raises(ValueError):
        make_scheduler("nope", [node("a")])
