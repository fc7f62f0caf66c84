"""Exclusive GPU shares (``EngineConfig.exclusive_gpu_shares``): fractions of different tenants
never share a GPU (shares have no memory isolation), through binds, preemptions, resizes and
releases; off, fractions share as before."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine.config import EngineConfig
from scheduling.engine.registry import make_scheduler
from scheduling.engine.types import Decisions, JobRequest, NodeSpec
from tests.engine.engine_cases import clusters, jobs, node
from tests.engine.engine_world import World, run

ON = EngineConfig(exclusive_gpu_shares=True)


def frac(i: int, tenant: str, gpus: float = 0.5, **kw) -> JobRequest:
    return JobRequest(id=f"f{i}", tenant=tenant, kind="batch", gpus=gpus, submitted_at=float(i), **kw)


def gpus_of(d: Decisions) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {b.job_id: (b.placements[0].node, b.placements[0].gpus) for b in d.bindings}


def test_off_fractions_of_two_tenants_share_a_gpu_on_they_do_not():
    nodes = [node("n1", gpus=2)]
    for config, shared in ((EngineConfig(), True), (ON, False)):
        s = make_scheduler("tessera", nodes, config=config)
        s.submit(frac(1, "alice", 0.25))
        s.submit(frac(2, "bob", 0.25))
        s.submit(frac(3, "alice", 0.25))
        got = gpus_of(s.decide(0.0))
        assert (got["f1"] == got["f2"]) is shared
        assert got["f3"] == got["f1"]  # its own tenant's share is fine either way


def test_a_fraction_waits_with_a_capacity_reason_naming_the_rule():
    s = make_scheduler("tessera", [node("n1", gpus=2)], config=ON)
    s.submit(frac(1, "alice", 0.25))
    s.submit(frac(2, "bob", 0.25, time_limit_s=3600.0))
    s.decide(0.0)
    s.submit(frac(3, "carol", 0.25))
    s.submit(frac(4, "dave", 0.25))
    d = s.decide(1.0)
    # The first blocked job is reserved the GPU bob's share frees (not one it may not share).
    assert d.pending["f3"].code == "reserved" and d.pending["f3"].estimated_start == 3600.0
    reason = d.pending["f4"]
    assert reason.code == "capacity"
    assert "exclusive_gpu_shares" in reason.message and "dave" in reason.message
    s.submit(frac(5, "alice", 0.25, time_limit_s=600.0))  # alice's own GPU still has room
    assert "f5" in gpus_of(s.decide(2.0))


def test_a_priority_fraction_preempts_the_other_tenants_share_it_needs():
    s = make_scheduler("tessera", [node("n1", gpus=1)], config=ON)
    s.submit(frac(1, "bob", 0.25))
    s.decide(0.0)
    s.submit(JobRequest(id="f2", tenant="alice", kind="inference", gpus=0.25, priority=5, submitted_at=500.0))
    d = s.decide(600.0)  # bob's job has run past the minimum run time
    assert [p.job_id for p in d.preemptions] == ["f1"]
    s.release("f1", 601.0)
    assert "f2" in gpus_of(s.decide(602.0))


@st.composite
def fraction_heavy(draw) -> list[JobRequest]:
    """:func:`jobs` (whole GPUs, gangs, elastic ones that resize) plus fractions of three
    tenants, some gangs of fractions, some non-preemptible ones that preempt."""
    base = draw(jobs(count=8))
    out = list(base)
    for i in range(draw(st.integers(2, 14))):
        kind = draw(st.sampled_from(["inference", "batch", "training"]))
        replicas = draw(st.sampled_from([1, 1, 1, 2]))
        per = draw(st.sampled_from([0.25, 0.3, 0.5, 0.75]))
        out.append(
            JobRequest(
                id=f"s{i:03d}",
                tenant=draw(st.sampled_from(["vision", "nlp", "speech"])),
                kind=kind,
                gpus=per * replicas,
                replicas=replicas,
                priority=draw(st.integers(0, 3)),
                preemptible=kind != "inference",
                time_limit_s=draw(st.sampled_from([None, 600.0])),
                submitted_at=float(100 + i),
            )
        )
    return out


class SharesWorld(World):
    """The driver's own view (bindings, resizes, leaving replicas) checked after every pass:
    no GPU holds fractions of two tenants."""

    def check_gpus(self) -> None:
        super().check_gpus()
        tenants: dict[tuple[str, int], set[str]] = {}
        for jid, placements in [*self.holding.items(), *self.leaving.items()]:
            for p in placements:
                if p.share < 1:
                    for g in p.gpus:
                        tenants.setdefault((p.node, g), set()).add(self.jobs[jid].tenant)
        mixed = {gpu: who for gpu, who in tenants.items() if len(who) > 1}
        assert not mixed, f"GPUs holding two tenants' fractions: {mixed}"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=clusters(max_nodes=4), workload=fraction_heavy(), seed=st.integers(0, 3))
def test_no_gpu_ever_holds_two_tenants_fractions(nodes: list[NodeSpec], workload, seed):
    sched = make_scheduler("tessera", nodes, config=EngineConfig(seed=seed, exclusive_gpu_shares=True))
    world = run(sched, SharesWorld(nodes, [], workload), workload, steps=10, seed=seed)
    assert world.log  # every pass was checked
