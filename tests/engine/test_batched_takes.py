"""A snapshot's running jobs laid on a fresh cluster state in one batch (one leave and join of its
group per node, ``ClusterState.batched``) leave the state exactly as laying them one by one does:
what every node has free, the groups and their nodes, the histograms and sums placement reads, and
who holds what — so the pass decides the same."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings

from scheduling.engine.config import EngineConfig
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.state import ClusterState
from scheduling.engine.types import RunningJob, Snapshot
from tests.engine.engine_cases import clusters, jobs, quota_sets


def observed(state: ClusterState) -> dict:
    """Everything of ``state`` placement reads, its groups named by their keys (a group's id
    depends on the order nodes joined, which nothing decides by)."""
    assert state._batch is None
    racks = {
        (rack, state.group_by_gid[gid].key): tuple(ranks)
        for rack, groups in state.rack_groups.items()
        for gid, ranks in groups.items()
    }
    return {
        "nodes": [(n.free[:], n.cpu, n.mem, n.group.key if n.group else None) for n in state.nodes],
        "groups": {key: (g.cls, tuple(g.ranks)) for key, g in state.groups.items()},
        "by_class": {cls: sorted(groups) for cls, groups in state.by_class.items()},
        "racks": racks,
        "whole_hist": state.whole_hist,
        "share_hist": state.share_hist,
        "rack_free": {k: v for k, v in state.rack_free.items() if v},
        "total_free": state.total_free,
        "allocs": state.allocs,
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=clusters(), workload=jobs(count=20), quotas=quota_sets())
def test_running_jobs_laid_in_one_batch_leave_the_state_as_one_by_one(nodes, workload, quotas):
    first = TesseraScheduler(nodes, quotas, EngineConfig())
    for job in workload:
        first.submit(job)
    d = first.decide(0.0)
    by_id = {j.id: j for j in workload}
    running = tuple(RunningJob(by_id[b.job_id], b.placements, started_at=0.0) for b in d.bindings)
    snapshot = Snapshot(10.0, tuple(nodes), running, (), tuple(quotas))

    batched = TesseraScheduler.from_snapshot(snapshot, EngineConfig())
    one_by_one = TesseraScheduler(nodes, quotas, EngineConfig())
    for run in running:
        one_by_one.adopt(run.job, run.placements, run.started_at)

    assert observed(batched.state) == observed(one_by_one.state)
    assert math.isclose(batched.state.total_f, one_by_one.state.total_f, rel_tol=1e-9, abs_tol=1e-9)
    assert batched.quotas.usage == one_by_one.quotas.usage
