"""An elastic ``rack`` gang starts where it can run at its largest: it grows only inside its rack."""

from __future__ import annotations

from scheduling.engine.policy import TesseraScheduler
from scheduling.engine.types import JobRequest
from tests.engine.engine_cases import node


def _cluster() -> list:
    # Rack "tight": 2 nodes. Rack "roomy": 4 nodes. Both idle.
    return [node(f"t{i}", rack="tight") for i in range(2)] + [node(f"r{i}", rack="roomy") for i in range(4)]


def _racks(s: TesseraScheduler, jid: str) -> set[str]:
    return {s.state.nodes[a.node].spec.rack for a in s.state.allocs[jid]}


def test_an_elastic_rack_gang_starts_at_its_maximum_where_a_rack_has_room():
    s = TesseraScheduler(_cluster())
    s.submit(JobRequest("el", "nlp", "training", 32, replicas=4, topology="rack",
                        elastic_min_gpus=16, elastic_max_gpus=32))  # fmt: skip
    d = s.decide(1.0)
    assert [b.job_id for b in d.bindings] == ["el"]
    assert len(d.bindings[0].placements) == 4  # all four replicas, not the minimum two
    assert _racks(s, "el") == {"roomy"}


def test_a_rigid_rack_gang_still_takes_the_tightest_rack_that_holds_it():
    s = TesseraScheduler(_cluster())
    s.submit(JobRequest("g", "nlp", "training", 16, replicas=2, topology="rack"))
    s.decide(1.0)
    assert _racks(s, "g") == {"tight"}  # the roomy rack stays whole for a bigger gang


def test_with_no_rack_big_enough_it_starts_as_large_as_one_rack_allows():
    s = TesseraScheduler(_cluster())
    s.submit(JobRequest("el", "nlp", "training", 48, replicas=6, topology="rack",
                        elastic_min_gpus=16, elastic_max_gpus=48))  # fmt: skip
    s.decide(1.0)
    assert _racks(s, "el") == {"roomy"}
    assert len(s.state.allocs["el"]) == 4
