"""Invariants 1, 2, 3, 5 and 6 (docs/architecture.md) over random clusters and workloads, every policy."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine.registry import POLICIES, make_scheduler
from tests.engine.engine_cases import clusters, jobs, quota_sets
from tests.engine.engine_world import World, run

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(nodes=clusters(), workload=jobs(), quotas=quota_sets(), seed=st.integers(0, 3))
def test_tessera_keeps_the_invariants_through_binds_preemptions_and_releases(nodes, workload, quotas, seed):
    sched = make_scheduler("tessera", nodes, quotas, seed=seed)
    run(sched, World(nodes, quotas, workload), workload, seed=seed)


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "tessera"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=clusters(), workload=jobs(), quotas=quota_sets())
def test_every_baseline_keeps_the_invariants(policy, nodes, workload, quotas):
    sched = make_scheduler(policy, nodes, quotas, seed=1)
    rules = [] if policy == "greedy" else quotas  # the reference that ignores quotas, by definition
    run(sched, World(nodes, rules, workload), workload)


@SETTINGS
@given(nodes=clusters(), workload=jobs(), quotas=quota_sets())
def test_every_pending_job_has_a_reason_with_a_stable_code(nodes, workload, quotas):
    from scheduling.engine.types import PENDING_CODES

    sched = make_scheduler("tessera", nodes, quotas)
    for j in workload:
        sched.submit(j)
    d = sched.decide(0.0)
    decided = {b.job_id for b in d.bindings} | set(d.pending) | set(d.rejections)
    assert decided == {j.id for j in workload}
    assert all(r.code in PENDING_CODES and r.message for r in d.pending.values())
