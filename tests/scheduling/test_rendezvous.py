"""Where a job's replicas meet: MASTER_ADDR/PORT, WORLD_SIZE, RANK, LOCAL_RANK per replica."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scheduling.services.rendezvous import GANG_PORT_BASE, PORT_BASE, Placed, rendezvous


def test_a_two_node_gang_meets_at_its_first_replicas_node_on_a_port_from_its_gpu():
    placed = [
        Placed(0, 1, "10.0.0.1", 4, 1000),
        Placed(0, 1, "10.0.0.1", 5, 1000),
        Placed(1, 1, "10.0.0.1", 6, 1000),
        Placed(2, 2, "10.0.0.2", 0, 1000),
    ]
    meet = rendezvous(42, placed)
    assert {r: (m["rank"], m["local_rank"]) for r, m in meet.items()} == {0: (0, 0), 1: (1, 1), 2: (2, 0)}
    assert {(m["master_addr"], m["master_port"], m["world_size"]) for m in meet.values()} == {
        ("10.0.0.1", PORT_BASE + 4, 3)
    }


def test_a_job_on_one_node_meets_on_the_loopback_and_one_without_a_whole_gpu_gets_its_port_there():
    (whole,) = rendezvous(1, [Placed(0, 1, "10.0.0.1", 3, 1000)]).values()
    assert (whole["master_addr"], whole["master_port"], whole["world_size"]) == (
        "127.0.0.1",
        PORT_BASE + 3,
        1,
    )
    (share,) = rendezvous(2, [Placed(0, 1, "10.0.0.1", 3, 500)]).values()
    assert share["master_port"] is None  # its agent picks one (agent/node.py)
    cpu_gang = rendezvous(1234, [Placed(0, 1, "a", None, 1000), Placed(1, 2, "b", None, 1000)])
    assert {m["master_port"] for m in cpu_gang.values()} == {GANG_PORT_BASE + 234}


@given(st.permutations(range(8)), st.lists(st.integers(1, 3), min_size=1, max_size=8))
def test_jobs_holding_whole_gpus_of_one_node_never_share_a_master_port(gpus, sizes):
    # Jobs whose master replicas share a node hold disjoint GPUs there (a GPU is one job's)
    ports, free = [], list(gpus)
    for job_id, size in enumerate(sizes):
        if len(free) < size:
            break
        mine, free = free[:size], free[size:]
        (meet,) = rendezvous(job_id, [Placed(0, 1, "n", g, 1000) for g in mine]).values()
        ports.append(meet["master_port"])
    assert len(ports) == len(set(ports))
