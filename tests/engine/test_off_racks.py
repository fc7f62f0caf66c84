"""The search off the racks kept clear for rack gangs picks the node a node-by-node search picks."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine.fragmentation import FragmentationModel
from scheduling.engine.placement import Constraints, OffRacks, Placer
from scheduling.engine.state import ClusterState, ReplicaReq
from tests.engine.engine_cases import node

RACKS = [f"r{i}" for i in range(6)]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    per_rack=st.lists(st.integers(1, 8), min_size=len(RACKS), max_size=len(RACKS)),
    taken=st.dictionaries(st.integers(0, 39), st.integers(1, 8), max_size=30),
    clear=st.sets(st.sampled_from(RACKS)),
    banned=st.none() | st.sets(st.integers(0, 39)),
    count=st.sampled_from([1, 2, 4, 8]),
    seed=st.integers(0, 3),
)
def test_off_racks_picks_the_node_a_node_by_node_search_picks(per_rack, taken, clear, banned, count, seed):
    racks = [r for r, n in zip(RACKS, per_rack, strict=True) for _ in range(n)]
    specs = [node(f"n{i}", rack=r) for i, r in enumerate(racks)]
    state = ClusterState(specs, FragmentationModel(()), seed=seed)
    for i, gpus in taken.items():  # some nodes part full, so groups differ by rack
        if i < len(specs):
            state.take(f"j{i}", i, list(range(gpus)), 1000, 0, 0, 0)
    placer = Placer(state)
    req, c = ReplicaReq(1000, count), Constraints()

    def inner(i: int) -> bool:
        return banned is None or i not in banned

    def by_node(i: int) -> bool:
        return specs[i].rack not in clear and inner(i)

    expected = placer.best(req, c, by_node)
    got = placer.best(req, c, OffRacks(state.nodes, clear, None if banned is None else inner))
    assert got == expected
    if expected is not None:
        assert specs[expected[0]].rack not in clear
