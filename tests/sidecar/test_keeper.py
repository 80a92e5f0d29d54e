"""The keeper on a real buffer directory: the provisional room a claim begins with, and
what it may never cost other objects."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.buffer.keeper import PROVISIONAL, Keeper
from sidecar.buffer.store import Store

HEAD = {
    "headers": [["ETag", '"e"']],
    "generated_at": 0.0,
    "lifetime": 0.0,
    "etag": '"e"',
    "last_modified": None,
    "request_headers": [],
}


KeeperOn = Callable[..., Keeper]


@pytest.fixture
def keeper_on() -> Iterator[KeeperOn]:
    """`keeper_on(directory, capacity, eviction="none")`: a keeper of a store opened there."""
    stores: list[Store] = []

    def make(directory: Path, capacity: int, eviction: str = "none") -> Keeper:
        store = Store(directory, capacity, eviction)  # type: ignore[arg-type]
        store.open()
        stores.append(store)
        return Keeper(store)

    yield make
    for store in stores:
        store.close()


def call(keeper: Keeper, op: str, worker: int = 0, **fields: Any) -> Any:
    return asyncio.run(keeper.handle(worker, {"op": op, **fields}))


def store_small(keeper: Keeper, key: str, size: int, worker: int = 0) -> None:
    """A claim, the body that fits its provisional room, and the commit."""
    begun = call(keeper, "claim", worker, key=key)
    assert "rid" in begun, begun
    call(keeper, "filling", worker, rid=begun["rid"], key=key, size=size, head=HEAD)
    Path(begun["path"]).write_bytes(bytes(size))
    assert call(keeper, "commit", worker, rid=begun["rid"], key=key, sha256="0" * 64,
                headers=HEAD["headers"], generated_at=0.0, lifetime=0.0) == {}  # fmt: skip


def test_a_small_body_takes_its_claims_room_and_joiners_get_it(
    tmp_path: Path, keeper_on: KeeperOn
) -> None:
    keeper = keeper_on(tmp_path, 8 * PROVISIONAL)
    begun = call(keeper, "claim", key="a")
    assert begun["begin"] and Path(begun["path"]).exists()
    assert keeper.store.reserved == PROVISIONAL
    call(keeper, "filling", rid=begun["rid"], key="a", size=1000, head=HEAD)
    assert keeper.store.reserved == keeper.store.charge(1000) == 4096  # the rest is free again
    joined = call(keeper, "claim", worker=1, key="a")
    assert joined["join"]["size"] == 1000 and joined["join"]["path"] == begun["path"]


def test_a_larger_body_asks_for_its_room_and_gives_the_provisional_back(
    tmp_path: Path, keeper_on: KeeperOn
) -> None:
    keeper = keeper_on(tmp_path, 8 * PROVISIONAL)
    begun = call(keeper, "claim", key="big")
    call(keeper, "abort", rid=begun["rid"])
    started = call(keeper, "start_fill", key="big", size=3 * PROVISIONAL, head=HEAD)
    assert "rid" in started and keeper.store.reserved == 3 * PROVISIONAL
    assert not Path(begun["path"]).exists()


def test_provisional_room_leaves_as_much_free_and_is_never_evicted_for(
    tmp_path: Path, keeper_on: KeeperOn
) -> None:
    keeper = keeper_on(tmp_path, 6 * PROVISIONAL, eviction="lru")
    for n in range(5):
        store_small(keeper, f"k{n}", PROVISIONAL)
    # One object's room is free: a claim then takes none, and evicts nothing for it.
    begun = call(keeper, "claim", key="late")
    assert "rid" not in begun and keeper.store.entries == 5 and keeper.store.reserved == 0
    # Concurrent claims on an empty buffer hold at most half of what is free.
    fresh = keeper_on(tmp_path / "fresh", 9 * PROVISIONAL)
    claims = [call(fresh, "claim", key=f"c{n}") for n in range(6)]
    held = sum("rid" in c for c in claims)
    assert held == 4 and fresh.store.reserved == 4 * PROVISIONAL
