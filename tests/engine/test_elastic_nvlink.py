"""An elastic job asking ``topology: nvlink`` grows when its own island frees, and only there."""

from __future__ import annotations

from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import JobRequest
from tests.engine.engine_cases import node


def _gpus(s: TesseraScheduler, jid: str) -> list[int]:
    return sorted(g for a in s.state.allocs[jid] for g in a.gpus)


def test_an_elastic_nvlink_job_grows_inside_its_island_and_never_into_another():
    s = TesseraScheduler([node("a", gpus=8, nvlink=4)])  # islands: GPUs 0-3 and 4-7
    s.submit(JobRequest("x", "nlp", "batch", 2, topology="nvlink"))
    s.submit(JobRequest("y", "nlp", "batch", 4, topology="nvlink", submitted_at=1))
    s.decide(2.0)
    assert _gpus(s, "x") == [0, 1] and _gpus(s, "y") == [4, 5, 6, 7]
    s.submit(
        JobRequest(
            "el",
            "vision",
            "training",
            2,
            replicas=2,
            topology="nvlink",
            elastic_min_gpus=2,
            elastic_max_gpus=4,
            submitted_at=3,
        )
    )
    d = s.decide(3.0)
    assert [b.job_id for b in d.bindings] == ["el"]
    assert _gpus(s, "el") == [2, 3]  # 2 of at most 4 GPUs fit in island 0

    s.release("y", 50.0)  # the other island frees: the job must not spread into it
    d = s.decide(50.0)
    assert not d.resizes
    assert _gpus(s, "el") == [2, 3]

    s.release("x", 60.0)  # its own island frees: it grows to its maximum there
    d = s.decide(60.0)
    assert [r.job_id for r in d.resizes] == ["el"]
    assert sorted(g for p in d.resizes[0].placements for g in p.gpus) == [0, 1, 2, 3]
    assert _gpus(s, "el") == [0, 1, 2, 3]
    assert s.quotas.used("vision", "H100") == 4000  # the grown replicas are charged
