"""Every pending reason's claim is true of the state the pass ended with."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings

from scheduling.engine.geometry import constraints, geometry
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.state import fits_state
from scheduling.engine.types import MILLI, JobRequest, NodeSpec
from tests.engine.engine_cases import clusters, jobs, node, quota_sets


def _allowed_nodes(s: TesseraScheduler, job: JobRequest):
    c = constraints(job)
    rack = dict(job.node_selector).get("rack")
    for n in s.state.nodes:
        if s.placer.class_pref(n.cls, c) is None or (rack and n.spec.rack != rack):
            continue
        yield n


def _fits_somewhere(s: TesseraScheduler, job: JobRequest) -> bool:
    geo = geometry(job)
    for n in _allowed_nodes(s, job):
        d = max(1, min(n.spec.nvlink_domain, n.spec.gpus)) if n.spec.gpus else 1
        if fits_state(n.key(), geo.req, d, n.spec.gpus):
            return True
    return False


def check_claim(s: TesseraScheduler, job: JobRequest, code: str, message: str) -> None:
    assert message.startswith(code + ":") or code in ("held", "backoff"), message
    geo = geometry(job)
    if code == "quota":
        m = re.search(r"uses ([\d.]+) of ([\d.]+) (\S+)", message)
        if m:
            used, limit, model = float(m[1]), float(m[2]), m[3]
            assert abs(s.quotas.used(job.tenant, model) / MILLI - used) < 0.01
            assert used + geo.charge * geo.need / MILLI > limit - 1e-9
    elif code in ("capacity", "fragmentation", "topology", "model", "node-selector") and (
        code != "capacity" or "the cluster has" not in message
    ):
        assert not _fits_somewhere(s, job) or geo.need > 1, message
    if code == "fragmentation" and "blocks of at most" in message:
        m = re.search(r"([\d.]+) \S+ free, in blocks of at most (\d+) per node", message)
        assert m, message
        free = sum(n.whole_free() for n in _allowed_nodes(s, job))
        assert abs(free - float(m[1])) < 1e-6
        assert free >= geo.req.count * geo.need
        assert max(n.whole_free() for n in _allowed_nodes(s, job)) == int(m[2])
        assert int(m[2]) < geo.req.count
    if code == "topology" and "largest free block is" in message:
        m = re.search(r"needs (\d+) GPUs in one NVLink island; largest free block is (\d+)", message)
        assert m, message
        largest = max((n.largest_block() for n in _allowed_nodes(s, job)), default=0)
        assert int(m[2]) == largest
        assert not any(
            sum(1 for g in range(i.base, i.base + i.size) if n.free[g] >= MILLI) >= int(m[1])
            for n in _allowed_nodes(s, job)
            for i in n.islands
        )
    if code == "gang" and "only" in message:
        assert _fits_somewhere(s, job)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=clusters(), workload=jobs(), quotas=quota_sets())
def test_every_pending_reason_is_true_of_the_final_state(nodes, workload, quotas):
    s = TesseraScheduler(nodes, quotas)
    for j in workload:
        s.submit(j)
    by_id = {j.id: j for j in workload}
    for t in (0.0, 500.0):
        d = s.decide(t)
        for jid, reason in d.pending.items():
            check_claim(s, by_id[jid], reason.code, reason.message)


def test_a_quota_reason_names_the_usage_and_the_limit():
    from scheduling.engine.types import QuotaSpec

    s = TesseraScheduler([node("h1"), node("h2")], [QuotaSpec("vision", "H100", 8, 8)])
    s.submit(JobRequest("a", "vision", "training", 8))
    s.submit(JobRequest("b", "vision", "training", 8, submitted_at=1))
    d = s.decide(0.0)
    assert d.pending["b"].code == "quota"
    assert d.pending["b"].message == "quota: vision uses 8 of 8 H100 (limit)"


def test_a_topology_reason_names_the_largest_free_block_and_its_node():
    s = TesseraScheduler([node("h100-03", nvlink=4)])
    s.submit(JobRequest("big", "vision", "training", 8, topology="nvlink"))
    d = s.decide(0.0)
    assert "big" in d.rejections  # an 8-GPU island does not exist at all: can never run
    s2 = TesseraScheduler([node("h100-03", nvlink=8)])
    s2.submit(JobRequest("small", "vision", "training", 1))
    s2.submit(JobRequest("big", "vision", "training", 8, topology="nvlink", submitted_at=1))
    d2 = s2.decide(0.0)
    assert d2.pending["big"].code in ("topology", "reserved")


def test_fragmentation_is_reported_when_free_gpus_are_scattered():
    nodes = [node(f"n{i}", gpus=4, nvlink=4) for i in range(3)]
    s = TesseraScheduler(nodes, config=None)
    for i in range(3):
        s.submit(JobRequest(f"f{i}", "vision", "training", 3, submitted_at=i))
    s.decide(0.0)
    s.submit(JobRequest("two", "vision", "training", 2, submitted_at=10))
    from scheduling.engine.config import EngineConfig

    s.config = EngineConfig(backfill=False)
    d = s.decide(1.0)
    assert d.pending["two"].code == "fragmentation"
    assert d.pending["two"].message.startswith("fragmentation: 3 GPUs free, in blocks of at most 1")


def test_a_job_asking_for_a_model_no_node_has_is_rejected_and_a_huge_one_waits():
    s = TesseraScheduler([node("h1")])
    s.submit(JobRequest("tpu", "vision", "training", 1, accelerators=("TPUv5",)))
    s.submit(JobRequest("huge", "vision", "training", 64, replicas=8))
    d = s.decide(0.0)
    assert "tpu" in d.rejections
    assert d.pending["huge"].code == "capacity"


def test_an_inference_job_kept_off_a_reserved_node_says_so_not_capacity():
    """Found by the property above: an inference job (which may preempt) that fits only in room
    held for a reserved job, with nothing it may preempt, was diagnosed on the final state as
    lacking CPUs ("lack 0 CPUs / 0 GiB free") when the room was free but held."""
    node = NodeSpec(name="n00", rack="r0", model="H100", gpus=4, nvlink_domain=1, cpus=0, memory_gib=512)
    s = TesseraScheduler([node], [])
    sizes = [0.25, 0.25, 0.25, 1, 1, 2, 1]
    jobs = [
        JobRequest(f"j{t:03}", "vision", "inference", gpus=g, preemptible=False, submitted_at=t)
        for t, g in enumerate(sizes)
    ]
    for j in jobs:
        s.submit(j)
    d = s.decide(0.0)
    assert d.pending["j005"].code == "reserved"
    why = d.pending["j006"]
    assert why.code == "reserved" and "held for job j005" in why.message, why


# --- what a reason tells one tenant of another's jobs: nothing (docs/api.md, "Who sees what") ---


def _names_a_job(text: str, job_id: str) -> bool:
    return re.search(rf"\b{re.escape(job_id)}\b", text) is not None


def test_room_held_for_another_tenants_job_is_said_without_naming_it():
    node_ = NodeSpec(name="n00", rack="r0", model="H100", gpus=4, nvlink_domain=1, cpus=0, memory_gib=512)
    s = TesseraScheduler([node_], [])
    for t, g in enumerate([0.25, 0.25, 0.25, 1, 1]):  # vision's running jobs leave 1.25 GPUs
        s.submit(JobRequest(f"j{t:03}", "vision", "inference", gpus=g, preemptible=False, submitted_at=t))
    assert len(s.decide(0.0).bindings) == 5
    s.submit(JobRequest("j005", "nlp", "inference", gpus=2, preemptible=False, submitted_at=5))
    s.submit(JobRequest("j006", "vision", "inference", gpus=1, preemptible=False, submitted_at=6))
    d = s.decide(10.0)
    assert d.pending["j005"].code == "reserved"
    why = d.pending["j006"]
    assert why.code == "reserved" and "another tenant's job" in why.message, why
    assert not _names_a_job(why.message, "j005"), why


def test_a_reserved_job_waiting_on_another_tenants_job_is_told_neither_its_id_nor_its_history():
    s = TesseraScheduler([node("a")])
    s.submit(JobRequest("secret-run", "nlp", "training", 8, submitted_at=0, time_limit_s=4000))
    s.decide(0.0)
    s.submit(JobRequest("mine", "vision", "training", 8, submitted_at=1, time_limit_s=100))
    d = s.decide(10.0)
    assert [r.job_id for r in s.last_reservations] == ["mine"]
    basis = s.estimate(d, 10.0)["mine"].basis
    assert "free when another tenant's job ends" in basis, basis
    assert not _names_a_job(basis, "secret-run") and "1.11 h" not in basis


def test_a_job_preempted_for_another_tenants_job_is_not_told_its_id():
    s = TesseraScheduler([node("a", gpus=4, nvlink=4)])
    s.submit(JobRequest("batchy", "nlp", "batch", 4, submitted_at=0))
    s.decide(0.0)
    s.submit(JobRequest("serve", "vision", "inference", 4, preemptible=False, submitted_at=950))
    d = s.decide(1000.0)
    (pre,) = d.preemptions
    assert pre.job_id == "batchy" and pre.for_job == "serve"
    assert not _names_a_job(pre.reason, "serve"), pre
    assert pre.reason.startswith("priority: for another tenant's job"), pre
