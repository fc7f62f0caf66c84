"""A CPU-only job (``gpus`` 0) that names accelerator models runs only on nodes of those models."""

from __future__ import annotations

import pytest

from scheduling.engine.registry import POLICIES, make_scheduler
from scheduling.engine.types import JobRequest
from tests.engine.engine_cases import node


@pytest.mark.parametrize("policy", POLICIES)
def test_a_cpu_only_job_with_a_model_list_lands_only_on_that_model(policy):
    nodes = [node("t4-0", "T4", 4, 1), node("a100-0", "A100", 8, 4), node("h100-0", "H100", 8, 8)]
    scheduler = make_scheduler(policy, nodes, seed=3)
    for i in range(6):
        scheduler.submit(
            JobRequest(
                id=f"c{i}",
                tenant="t",
                kind="batch",
                gpus=0,
                cpus=8,
                accelerators=("A100",),
                submitted_at=float(i),
            )
        )
    decisions = scheduler.decide(10.0)
    placed = {p.node for b in decisions.bindings for p in b.placements}
    assert placed == {"a100-0"}
    # fcfs-node gives each replica a whole node (classic HPC); the others share the node's CPUs.
    assert len(decisions.bindings) == (1 if policy == "fcfs-node" else 6)
