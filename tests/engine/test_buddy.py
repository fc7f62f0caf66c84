"""The buddy free lists: split, merge, and exact restoration."""

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.engine.buddy import IslandBuddy, order_for


def test_it_splits_the_smallest_block_and_keeps_the_halves():
    b = IslandBuddy(0, 8)
    b.take(0)
    assert b.blocks() == [(1, 1), (2, 2), (4, 4)]
    assert b.find(2) == 2 and b.find(4) == 4 and b.find(8) is None


def test_it_merges_buddies_back_into_the_whole_island():
    b = IslandBuddy(8, 8)
    for g in (8, 9, 10, 11):
        b.take(g)
    for g in (11, 8, 10, 9):
        b.give(g)
    assert b.blocks() == [(8, 8)]


def test_an_island_of_six_is_cut_into_four_and_two_and_never_merges_across():
    b = IslandBuddy(0, 6)
    assert b.blocks() == [(0, 4), (4, 2)]
    b.take(3)
    b.take(4)
    b.give(4)
    b.give(3)
    assert b.blocks() == [(0, 4), (4, 2)]


def test_unhealthy_gpus_are_never_listed():
    b = IslandBuddy(0, 4, unusable=(2,))
    assert (2, 1) not in b.blocks() and b.free_count() == 3


def test_order_for_rounds_up_to_a_power_of_two():
    assert [order_for(n) for n in (1, 2, 3, 4, 5, 8)] == [0, 1, 2, 2, 3, 3]


@settings(max_examples=150, deadline=None)
@given(size=st.integers(1, 16), data=st.data())
def test_freeing_everything_restores_the_free_lists_exactly(size, data):
    b = IslandBuddy(0, size)
    initial = b.blocks()
    order = data.draw(st.permutations(range(size)))
    k = data.draw(st.integers(0, size))
    taken = list(order[:k])
    for g in taken:
        b.take(g)
    assert b.free_count() == size - k
    for g in data.draw(st.permutations(taken)):
        b.give(g)
    assert b.blocks() == initial
