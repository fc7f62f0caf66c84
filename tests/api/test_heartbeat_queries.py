"""A heartbeat's cost does not grow with the bindings it hands out (one log query for them all),
nor with the jobs a node runs (one read of its held replicas).

The world is ``tests/conftest.py``'s: alice in ``vision``; the node registers with a join token.
"""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.agent import helpers as h


def _heartbeat_queries(node) -> tuple[int, list[dict]]:
    with CaptureQueriesContext(connection) as queries:
        start = h.heartbeat(node)["start"]
    return len(queries.captured_queries), start


def test_a_heartbeat_with_four_bindings_costs_the_queries_of_one(world):
    node, _ = h.register(h.new_join_token(), "hb-01")
    _heartbeat_queries(node)  # the node's credential is looked up once, then kept a few seconds
    h.bind(h.submit(world.alice, world.vision), "hb-01", [0, 1])
    one, start = _heartbeat_queries(node)
    assert len(start) == 1
    for gpus in ([2, 3], [4, 5], [6, 7]):
        h.bind(h.submit(world.alice, world.vision), "hb-01", gpus)
    four, start = _heartbeat_queries(node)
    assert len(start) == 4 and four == one
    assert [b["log_offset"] for b in start] == [0, 0, 0, 0]


def _steady(node, running: list[dict]) -> tuple[list[str], dict]:
    """A heartbeat with nothing to start or stop: the SQL it ran, and its answer."""
    with CaptureQueriesContext(connection) as queries:
        answer = h.heartbeat(node, running)
    assert answer["start"] == [] and answer["stop"] == []
    return [q["sql"] for q in queries.captured_queries], answer


def _running(jobs) -> list[dict]:
    return [{"job_id": j.pk, "attempt": 0, "replica": 0, "pid": 100 + n} for n, j in enumerate(jobs)]


def test_a_steady_heartbeat_of_a_busy_node_reads_the_held_replicas_in_one_query(world):
    node, _ = h.register(h.new_join_token(), "hb-01")
    h.heartbeat(node)  # the node's credential is looked up once, then kept a few seconds
    jobs = [h.bind(h.submit(world.alice, world.vision), "hb-01", [0, 1])]
    h.heartbeat(node, _running(jobs))  # marks it running
    one, answer = _steady(node, _running(jobs))
    for gpus in ([2, 3], [4, 5], [6, 7]):
        jobs.append(h.bind(h.submit(world.alice, world.vision), "hb-01", gpus))
    h.heartbeat(node, _running(jobs))
    four, answer = _steady(node, _running(jobs))
    assert len(four) == len(one)
    # One read, of the held replicas and the columns of their jobs it needs: not their commands
    # and environments, nor the world of jobs that cannot change size (their binding's stays).
    reads = [sql for sql in four if sql.startswith("SELECT")]
    assert len(reads) == 1 and '"command"' not in reads[0] and '"env"' not in reads[0]
    assert answer["worlds"] == []
    assert {h.state_of(j) for j in jobs} == {"running"}


def test_a_heartbeat_tells_the_world_only_of_jobs_that_can_change_size(world):
    node, _ = h.register(h.new_join_token(), "hb-01")
    fixed = h.bind(h.submit(world.alice, world.vision), "hb-01", [0, 1])
    elastic = h.submit(world.alice, world.vision, elastic_min_gpus=2, elastic_max_gpus=4)
    elastic = h.bind(elastic, "hb-01", [2, 3])
    h.heartbeat(node, _running([fixed, elastic]))
    _, answer = _steady(node, _running([fixed, elastic]))
    assert [(w["job_id"], w["world_size"], w["rank"]) for w in answer["worlds"]] == [(elastic.pk, 1, 0)]
