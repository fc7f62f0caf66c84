"""Nodes alike but for their CPUs or memory: a job only the larger ones can hold is not rejected."""

from __future__ import annotations

import pytest

from scheduling.engine.registry import POLICIES, make_scheduler
from scheduling.engine.types import JobRequest
from tests.engine.engine_cases import node


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("big_first", [True, False])
def test_a_job_only_the_larger_node_of_a_model_can_hold_starts_there(policy, big_first):
    # openb's P100 nodes: two GPUs each, some with 16 CPUs and 120 GiB, some with 64 and 256
    small = node("p100-small", "P100", 2, 1, cpus=16, memory_gib=120)
    big = node("p100-big", "P100", 2, 1, cpus=64, memory_gib=256)
    nodes = [big, small] if big_first else [small, big]
    scheduler = make_scheduler(policy, nodes, seed=1)
    for i, (cpus, mem) in enumerate([(18.7, 63.0), (8.0, 200.0)]):
        scheduler.submit(
            JobRequest(
                id=f"j{i}",
                tenant="t",
                kind="inference",
                gpus=1,
                cpus=cpus,
                memory_gib=mem,
                accelerators=("P100",),
                preemptible=False,
                submitted_at=float(i),
            )
        )
    decisions = scheduler.decide(10.0)
    assert decisions.rejections == {}
    placed = {b.job_id: {p.node for p in b.placements} for b in decisions.bindings}
    assert placed.get("j0") == {"p100-big"}


@pytest.mark.parametrize("policy", POLICIES)
def test_a_job_no_node_of_its_model_can_hold_is_still_rejected(policy):
    nodes = [
        node("p100-small", "P100", 2, 1, cpus=16, memory_gib=120),
        node("p100-big", "P100", 2, 1, cpus=64),
    ]
    scheduler = make_scheduler(policy, nodes, seed=1)
    scheduler.submit(JobRequest(id="j0", tenant="t", kind="batch", gpus=1, cpus=65, submitted_at=0.0))
    decisions = scheduler.decide(10.0)
    assert "j0" in decisions.rejections
