"""PreparedRead: SQL built once, rows as the ORM's ``values_list`` gives them."""

from __future__ import annotations

import pytest

from scheduling.models import Node
from scheduling.services.snapshot import PreparedRead
from tests.scheduling import helpers


def test_a_read_by_ids_gives_the_orms_rows_for_any_number_of_ids_and_repeats(db):
    nodes = [helpers.make_node(f"n{i}") for i in range(5)]
    ids = [n.pk for n in nodes]
    read = PreparedRead(lambda ids: Node.objects.filter(pk__in=ids).order_by("pk").values_list("id", "name"))
    for wanted in ([ids[0]], ids[:3], ids, [ids[4], ids[1], ids[4]], ids[1:2]):
        expected = list(Node.objects.filter(pk__in=wanted).order_by("pk").values_list("id", "name"))
        assert [tuple(row) for row in read.rows(wanted)] == expected


@pytest.mark.postgresql("one statement for any number of ids uses PostgreSQL's = ANY(%s)")
def test_on_postgresql_one_statement_serves_every_number_of_ids(db, require_postgres):
    nodes = [helpers.make_node(f"n{i}") for i in range(4)]
    built = []

    def build(ids):
        built.append(len(ids))
        return Node.objects.filter(pk__in=ids).values_list("id")

    read = PreparedRead(build)
    for n in (1, 2, 3, 4, 2, 1):
        assert len(read.rows([node.pk for node in nodes[:n]])) == n
    assert built == [1]


def test_a_read_by_names_works_with_one_statement_too(db):
    helpers.make_node("a"), helpers.make_node("b"), helpers.make_node("c")
    read = PreparedRead(
        lambda names: Node.objects.filter(name__in=names).order_by("name").values_list("name")
    )
    assert [r[0] for r in read.rows(["a"])] == ["a"]
    assert [r[0] for r in read.rows(["c", "a", "zz"])] == ["a", "c"]


def test_reads_together_give_what_each_read_gives_alone_in_order(db):
    from scheduling.services.snapshot import read_together

    nodes = [helpers.make_node(f"n{i}") for i in range(3)]
    by_ids = PreparedRead(
        lambda ids: Node.objects.filter(pk__in=ids).order_by("pk").values_list("id", "labels")
    )
    every = PreparedRead(lambda: Node.objects.order_by("-pk").values_list("name", "last_heartbeat"))
    ids = [nodes[2].pk, nodes[0].pk]
    alone = [by_ids.rows(ids), every.rows(), by_ids.rows([])]
    together = read_together((by_ids, ids), (every,), (by_ids, []))
    assert together == alone
    assert together[0][0][1] == {}  # converted as the ORM converts (JSON decoded)
