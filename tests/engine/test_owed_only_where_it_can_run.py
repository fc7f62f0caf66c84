"""A model is owed to a tenant waiting within its guarantee only where that tenant's waiting job
could run: its node selector and tolerations count. Otherwise another tenant's borrowers were
kept off GPUs nobody waiting could use (the demo: vision's job pinned to one T4 node by its
node selector kept nlp's batch jobs off twelve free A100s)."""

from __future__ import annotations

from scheduling.engine.config import EngineConfig
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import JobRequest, QuotaSpec
from tests.engine.engine_cases import node

QUOTAS = [QuotaSpec("vision", "*", guaranteed=8, limit=16), QuotaSpec("nlp", "*", guaranteed=4, limit=16)]


def world(**pinned: object) -> TesseraScheduler:
    """An A100 node free, a T4 node labelled ``demo=idle`` full with vision's own job; vision's
    second job (within its guarantee) waits, pinned as ``pinned`` says."""
    nodes = [
        node("a100", model="A100", gpus=8, nvlink=4),
        node("t4", model="T4", gpus=4, nvlink=1, labels=(("demo", "idle"),), taints=("idle",)),
    ]
    s = TesseraScheduler(nodes, QUOTAS, EngineConfig())
    s.submit(
        JobRequest(
            "fill",
            "vision",
            "batch",
            4,
            submitted_at=0,
            node_selector=(("demo", "idle"),),
            tolerations=("idle",),
        )
    )
    s.decide(0.0)
    s.submit(JobRequest("wants", "vision", "batch", 1, submitted_at=1, **pinned))  # type: ignore[arg-type]
    s.decide(1.0)
    return s


def nlp_batch(s: TesseraScheduler) -> str:
    s.submit(JobRequest("b", "nlp", "batch", 8, preemptible=True, submitted_at=2))
    d = s.decide(2.0)
    return "started" if any(b.job_id == "b" for b in d.bindings) else d.pending["b"].code


def test_a_job_pinned_to_another_node_is_owed_nothing_on_the_free_model():
    pinned = world(node_selector=(("demo", "idle"),), tolerations=("idle",))
    assert nlp_batch(pinned) == "started"
