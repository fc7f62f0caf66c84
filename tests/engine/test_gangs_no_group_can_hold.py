"""A gang no rack (or no model's nodes) could ever hold together waits for capacity, and holds no
first-come-first-served queue behind it: nothing the cluster frees will ever start it."""

from __future__ import annotations

import pytest

from scheduling.engine.registry import POLICIES, make_scheduler
from scheduling.engine.types import JobRequest
from tests.engine.engine_cases import node

# two racks of two 8-GPU H100 nodes: 16 GPUs a rack, 32 in all
RACKS = [node(f"n{r}{i}", "H100", 8, 8, rack=f"r{r}") for r in range(2) for i in range(2)]
# 16 H100 and 16 A100: 32 GPUs, but a gang's replicas share one model
MODELS = [
    node("h0", "H100", 8, 8),
    node("h1", "H100", 8, 8),
    node("a0", "A100", 8, 8),
    node("a1", "A100", 8, 8),
]


def _decide(policy: str, nodes, gang: JobRequest):
    scheduler = make_scheduler(policy, nodes, seed=1)
    scheduler.submit(gang)
    for i in range(3):
        scheduler.submit(JobRequest(id=f"s{i}", tenant="t", kind="batch", gpus=1, submitted_at=1.0 + i))
    return scheduler.decide(10.0)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_rack_gang_larger_than_every_rack_waits_for_capacity_and_holds_no_queue(policy):
    gang = JobRequest(id="gang", tenant="t", kind="training", gpus=32, replicas=4, topology="rack")
    d = _decide(policy, RACKS, gang)
    assert d.pending["gang"].code == "capacity"
    assert "rack" in d.pending["gang"].message
    assert {b.job_id for b in d.bindings} == {"s0", "s1", "s2"}


@pytest.mark.parametrize("policy", POLICIES)
def test_a_gang_larger_than_any_one_model_waits_for_capacity_and_holds_no_queue(policy):
    gang = JobRequest(id="gang", tenant="t", kind="training", gpus=32, replicas=4)
    d = _decide(policy, MODELS, gang)
    assert d.pending["gang"].code == "capacity"
    assert {b.job_id for b in d.bindings} == {"s0", "s1", "s2"}


@pytest.mark.parametrize("policy", POLICIES)
def test_a_rack_gang_one_rack_can_hold_is_not_called_over_capacity(policy):
    gang = JobRequest(id="gang", tenant="t", kind="training", gpus=16, replicas=2, topology="rack")
    scheduler = make_scheduler(policy, RACKS, seed=1)
    scheduler.submit(gang)
    d = scheduler.decide(10.0)
    assert [b.job_id for b in d.bindings] == ["gang"]
