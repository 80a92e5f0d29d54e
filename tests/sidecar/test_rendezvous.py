import collections

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.origins.rendezvous import choose

names = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=8, unique=True)
keys = st.lists(st.text(max_size=40), min_size=1, max_size=50, unique=True)


@given(names, keys)
def test_the_choice_is_one_of_the_parents_and_ignores_their_order(
    parents: list[str], objects: list[str]
) -> None:
    for key in objects:
        chosen = choose(key, parents)
        assert chosen in parents
        assert choose(key, list(reversed(parents))) == chosen


@given(names, st.text(min_size=1, max_size=12), keys)
def test_adding_a_parent_moves_only_what_the_new_one_takes(
    parents: list[str], new: str, objects: list[str]
) -> None:
    if new in parents:
        return
    for key in objects:
        after = choose(key, [*parents, new])
        assert after in (choose(key, parents), new)


@given(names, keys)
def test_removing_a_parent_moves_only_its_own_objects(
    parents: list[str], objects: list[str]
) -> None:
    gone = parents[0]
    rest = parents[1:]
    if not rest:
        return
    for key in objects:
        before = choose(key, parents)
        if before != gone:
            assert choose(key, rest) == before


def test_objects_spread_evenly() -> None:
    parents = [f"http://squid-{i}:3128" for i in range(4)]
    counts = collections.Counter(choose(f"https://h/{n}.tar", parents) for n in range(4000))
    assert set(counts) == set(parents)
    assert all(800 < count < 1200 for count in counts.values()), counts


def test_no_parent_is_an_error() -> None:
    with pytest.raises(ValueError, match="no parent"):
        choose("k", [])
