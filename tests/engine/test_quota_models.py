"""Room is made and nodes are reserved for a job only on the models its quota admits it on: a
reservation on a model its quota refuses could never start it, and drained that model's nodes
while the job was told it would start there."""

from __future__ import annotations

from scheduling.engine.config import EngineConfig
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import JobRequest, QuotaSpec
from tests.engine.engine_cases import node

QUOTAS = [
    QuotaSpec("research", "H100", guaranteed=16, limit=16),
    QuotaSpec("research", "A100", guaranteed=0, limit=0),
    QuotaSpec("other", "*", guaranteed=16, limit=32),
]


def world() -> TesseraScheduler:
    """Two H100 nodes held by other's steady job until t=3600, two A100 nodes free; research's
    16-GPU rack gang takes H100 or A100, and its quota admits it on H100 only."""
    nodes = [
        node("h1", "H100", rack="rh"),
        node("h2", "H100", rack="rh"),
        node("a1", "A100", rack="ra"),
        node("a2", "A100", rack="ra"),
    ]
    s = TesseraScheduler(nodes, QUOTAS, EngineConfig(aging_s=60))
    s.submit(
        JobRequest(
            "hold",
            "other",
            "training",
            16,
            replicas=2,
            preemptible=False,
            accelerators=("H100",),
            time_limit_s=3600,
        )
    )
    assert [b.job_id for b in s.decide(0.0).bindings] == ["hold"]
    gang = JobRequest(
        "gang",
        "research",
        "training",
        16,
        replicas=2,
        preemptible=False,
        accelerators=("H100", "A100"),
        topology="rack",
        submitted_at=1,
        time_limit_s=3600,
    )
    s.submit(gang)
    return s


def test_its_nodes_are_reserved_on_the_model_its_quota_admits():
    s = world()
    d = s.decide(120.0)
    assert d.pending["gang"].code == "reserved"
    assert d.pending["gang"].estimated_start == 3600.0
    (r,) = [r for r in s.last_reservations if r.job_id == "gang"]
    assert {s.nodes[i].model for i in r.nodes} == {"H100"}


def test_the_free_nodes_of_the_refused_model_stay_free_for_others():
    s = world()
    s.decide(120.0)
    s.submit(
        JobRequest("long", "other", "batch", 8, accelerators=("A100",), submitted_at=130, time_limit_s=86400)
    )
    assert [b.job_id for b in s.decide(140.0).bindings] == ["long"]
