"""A heartbeat's cost does not grow with the bindings it hands out (one log query for them all).

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
