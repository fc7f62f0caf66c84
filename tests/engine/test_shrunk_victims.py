"""A victim shrunk earlier in the same pass: its removed replicas are leaving (counted as room
coming free), so a preemption search must not count their GPUs again through the victim."""

from __future__ import annotations

from scheduling.engine.config import EngineConfig
from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import JobRequest
from tests.engine.engine_cases import node


def test_a_gang_does_not_count_a_shrunk_victims_leaving_replicas_twice():
    cfg = EngineConfig(starve_s=3600.0, aging_s=600.0, backfill=False)
    s = TesseraScheduler([node(f"n{i}", gpus=4, nvlink=4) for i in range(4)], config=cfg)
    s.submit(JobRequest("el", "nlp", "training", 12, replicas=3, checkpoint_s=600.0,
                        elastic_min_gpus=4, elastic_max_gpus=12, submitted_at=5.0))  # fmt: skip
    s.submit(JobRequest("young", "speech", "training", 4, submitted_at=5.0))
    assert len(s.decide(5.0).bindings) == 2
    assert len(s.state.allocs["el"]) == 3
    s.submit(JobRequest("gang", "vision", "training", 12, replicas=3, submitted_at=0.0))
    s.checkpoint("el", 3600.0)  # "el" loses less than "young"
    s.submit(JobRequest("serve", "prod", "inference", 4, preemptible=False, submitted_at=3690.0))
    d = s.decide(3700.0)
    # the service shrinks "el" to its minimum (two replicas leave, one node is held for the
    # service); the starving gang needs three nodes: the other leaving one, el's last one and
    # young's. Counting el's leaving replicas again through el, it took el alone.
    assert [r.job_id for r in d.resizes] == ["el"]
    assert sorted(p.job_id for p in d.preemptions) == ["el", "young"]
    for jid in ("el", "young"):
        s.release(jid, 3730.0)
    s.release_leaving("el", 3730.0)
    started = {b.job_id for b in s.decide(3730.0).bindings}
    assert {"serve", "gang"} <= started
