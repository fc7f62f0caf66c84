"""The placement cost weights: α (price), β (consolidation) and γ (expected wait for a preferred
model)."""

from __future__ import annotations

import math
import re
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine.config import EngineConfig
from scheduling.engine.geometry import constraints, geometry
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.state import fits_state
from scheduling.engine.types import JobRequest, Placement, RunningJob, Snapshot
from tests.engine.engine_cases import clusters, jobs, node, quota_sets
from tests.engine.engine_world import World

NOW = 10_000.0


def _one_gpu(job_id: str, **kw) -> JobRequest:
    return JobRequest(job_id, "t", "batch", 1, submitted_at=NOW - 60, **kw)


def _bound_node(config: EngineConfig, nodes, running, job: JobRequest) -> tuple[str, object]:
    snap = Snapshot(NOW, tuple(nodes), tuple(running), (job,))
    d = TesseraScheduler.from_snapshot(snap, config).decide(NOW)
    if d.bindings:
        return d.bindings[0].placements[0].node, None
    return "", d.pending[job.id]


# -- α ---------------------------------------------------------------------------------------------


def test_alpha_sends_a_job_to_the_cheapest_of_equal_nodes_and_without_it_prices_do_not_count():
    names = ("n1", "n2", "n3")
    plain = [node(n) for n in names]
    first, _ = _bound_node(EngineConfig(), plain, [], _one_gpu("j"))
    # the node the seeded order picks costs most, the one it would pick last least
    order = [first] + [n for n in names if n != first]
    priced = [replace(node(n), price_per_gpu_hour=9.0 - 4 * order.index(n)) for n in names]
    cheapest = order[-1]
    assert _bound_node(EngineConfig(), priced, [], _one_gpu("j"))[0] == first
    assert _bound_node(EngineConfig(alpha=1.0), priced, [], _one_gpu("j"))[0] == cheapest
    # α weighs price per GPU: a 4-GPU job saves four times as much on the cheaper node
    assert _bound_node(EngineConfig(alpha=0.3), priced, [], replace(_one_gpu("j"), gpus=4))[0] == cheapest


# -- β ---------------------------------------------------------------------------------------------


def _half_busy():
    """Two equal nodes; ``busy`` runs four 1-GPU jobs, ``idle`` nothing. Every request seen is
    one GPU, so fragmentation scores both nodes alike and only β (or the seeded order) decides."""
    nodes = [node("busy"), node("idle")]
    running = [RunningJob(_one_gpu(f"r{g}"), (Placement(0, "busy", (g,)),), NOW - 600) for g in range(4)]
    return nodes, running


def test_beta_puts_work_on_busy_nodes_and_keeps_idle_nodes_whole():
    nodes, running = _half_busy()
    for seed in range(10):
        got, _ = _bound_node(EngineConfig(seed=seed, beta=0.5), nodes, running, _one_gpu("new"))
        assert got == "busy"


def test_without_beta_the_seeded_node_order_breaks_the_tie():
    nodes, running = _half_busy()
    got = {_bound_node(EngineConfig(seed=seed), nodes, running, _one_gpu("new"))[0] for seed in range(10)}
    assert got == {"busy", "idle"}


# -- γ ---------------------------------------------------------------------------------------------


def _h100_full_until(end_in_s: float):
    """An H100 node held whole by a job whose time limit ends ``end_in_s`` from now, and an idle
    A100 node."""
    nodes = [node("h", "H100"), node("a", "A100")]
    limit = 3600.0
    holder = JobRequest("hold", "t", "training", 8, time_limit_s=limit, submitted_at=0)
    running = [RunningJob(holder, (Placement(0, "h", tuple(range(8))),), NOW - limit + end_in_s)]
    return nodes, running


def _prefers_h100() -> JobRequest:
    return _one_gpu("want", accelerators=("H100", "A100"))


def test_gamma_infinite_starts_now_on_the_less_preferred_model():
    nodes, running = _h100_full_until(300)
    assert EngineConfig().gamma == math.inf
    got, _ = _bound_node(EngineConfig(), nodes, running, _prefers_h100())
    assert got == "a"


def test_small_gamma_waits_for_the_preferred_model_when_it_frees_soon():
    nodes, running = _h100_full_until(300)
    got, reason = _bound_node(EngineConfig(gamma=1.0), nodes, running, _prefers_h100())
    assert got == ""
    assert reason.code == "model"
    assert "waiting for H100" in reason.message and "A100" in reason.message
    assert reason.estimated_start == NOW + 300


def test_gamma_weighs_the_wait_a_long_wait_starts_now():
    # one preference step is worth 1/gamma hours of waiting: 1 minute here, the wait is 5
    nodes, running = _h100_full_until(300)
    got, _ = _bound_node(EngineConfig(gamma=60.0), nodes, running, _prefers_h100())
    assert got == "a"
    # and 2 hours at gamma 1 (a step is worth 1 hour)
    nodes, running = _h100_full_until(7200)
    got, _ = _bound_node(EngineConfig(gamma=1.0), nodes, running, _prefers_h100())
    assert got == "a"


def test_gamma_never_waits_on_an_estimate_already_overrun():
    nodes, running = _h100_full_until(-600)  # its time limit passed; it still holds the node
    got, _ = _bound_node(EngineConfig(gamma=0.0), nodes, running, _prefers_h100())
    assert got == "a"


def test_gamma_leaves_jobs_without_a_preference_alone():
    nodes, running = _h100_full_until(300)
    got, _ = _bound_node(EngineConfig(gamma=0.0), nodes, running, _one_gpu("any"))
    assert got == "a"


# -- γ on random clusters: the invariants hold and every "waiting for" claim is true ---------------


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=clusters(),
    workload=jobs(),
    quotas=quota_sets(),
    gamma=st.sampled_from([0.0, 0.5]),
    ranked=st.sampled_from([("A100", "H100"), ("H100", "A100", "T4"), ("T4", "H100")]),
)
def test_with_a_finite_gamma_the_invariants_hold_and_waits_are_for_a_full_better_model(
    nodes, workload, quotas, gamma, ranked
):
    workload = [replace(j, accelerators=ranked) if j.gpus else j for j in workload]
    sched = TesseraScheduler(nodes, quotas, EngineConfig(gamma=gamma))
    world = World(nodes, quotas, workload)
    for j in workload:
        sched.submit(j)
    now = 0.0
    for _ in range(6):
        d = sched.decide(now)
        for jid, reason in d.pending.items():
            m = re.match(
                r"model: waiting for (\S+) \(choice (\d+) .* now on (\S+) \(choice (\d+)\)", reason.message
            )
            if not reason.message.startswith("model: waiting for"):
                continue
            assert m, reason.message
            job = world.jobs[jid]
            models, ranked = sched.models_for(job)
            assert ranked and models.index(m[1]) < models.index(m[3])
            assert reason.estimated_start is not None and reason.estimated_start > now
            geo = geometry(job)
            for n in sched.state.nodes:  # the model it waits for has no room for it now
                if (
                    n.spec.model == m[1]
                    and sched.placer.class_pref(n.cls, constraints(job)) is not None
                    and geo.need == 1
                ):
                    d_ = max(1, min(n.spec.nvlink_domain, n.spec.gpus))
                    assert not fits_state(n.key(), geo.req, d_, n.spec.gpus), reason.message
        world.apply(d)
        now += 400.0
        for jid in sorted(world.terminating):
            world.release(sched, jid, now)
            sched.requeue(world.jobs[jid])
        for jid in sorted(world.holding)[::3]:
            world.release(sched, jid, now)
