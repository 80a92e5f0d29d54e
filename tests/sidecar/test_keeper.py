"""The keeper on a real buffer directory: the provisional room a claim begins with, and
what it may never cost other objects."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.buffer import keeper as keeper_module
from sidecar.buffer.keeper import PROVISIONAL, UNSIZED, UNSIZED_ROOM, Keeper
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


async def commit(keeper: Keeper, begun: dict[str, Any], key: str, size: int) -> Any:
    """The commit of a small body written into its provisional room (made by the worker)."""
    Path(begun["path"]).write_bytes(bytes(size))
    return await keeper.handle(0, {"op": "commit", "rid": begun["rid"], "key": key,
                                   "size": size, "sha256": "0" * 64, "headers": HEAD["headers"],
                                   "generated_at": 0.0, "lifetime": 0.0})  # fmt: skip


def store_small(keeper: Keeper, key: str, size: int, worker: int = 0) -> None:
    """A claim, the body that fits its provisional room, and the commit."""
    begun = call(keeper, "claim", worker, key=key)
    assert "rid" in begun, begun
    assert asyncio.run(commit(keeper, begun, key, size)) == {}


def test_a_small_body_takes_its_claims_room_and_joiners_find_it_stored(
    tmp_path: Path, keeper_on: KeeperOn
) -> None:
    keeper = keeper_on(tmp_path, 8 * PROVISIONAL)

    async def scenario() -> None:
        begun = await keeper.handle(0, {"op": "claim", "key": "a"})
        assert begun["begin"] and not Path(begun["path"]).exists()  # the worker makes it
        assert keeper.store.reserved == PROVISIONAL
        joining = asyncio.create_task(keeper.handle(1, {"op": "claim", "key": "a"}))
        await asyncio.sleep(0)
        assert not joining.done()  # nobody follows a small fill: it waits for the commit
        assert await commit(keeper, begun, "a", 1000) == {}
        assert await joining == {"stored": True, "joined": True}
        assert keeper.store.reserved == 0 and keeper.store.used == keeper.store.charge(1000)

    asyncio.run(scenario())


def test_a_failed_small_fill_sends_its_waiters_upstream_and_returns_its_room(
    tmp_path: Path, keeper_on: KeeperOn
) -> None:
    keeper = keeper_on(tmp_path, 8 * PROVISIONAL)

    async def scenario() -> None:
        begun = await keeper.handle(0, {"op": "claim", "key": "a"})
        Path(begun["path"]).write_bytes(b"half")
        joining = asyncio.create_task(keeper.handle(1, {"op": "claim", "key": "a"}))
        await asyncio.sleep(0)
        await keeper.handle(0, {"op": "abort", "rid": begun["rid"]})
        assert "declined" in await joining
        assert keeper.store.reserved == 0 and not Path(begun["path"]).exists()
        again = await keeper.handle(1, {"op": "claim", "key": "a"})
        assert again["begin"]

    asyncio.run(scenario())


def test_a_larger_body_asks_for_its_room_and_gives_the_provisional_back(
    tmp_path: Path, keeper_on: KeeperOn
) -> None:
    keeper = keeper_on(tmp_path, 8 * PROVISIONAL)
    begun = call(keeper, "claim", key="big")
    Path(begun["path"]).touch()
    started = call(keeper, "start_fill", key="big", size=3 * PROVISIONAL, head=HEAD)
    assert "rid" in started and keeper.store.reserved == 3 * PROVISIONAL
    assert not Path(begun["path"]).exists() and Path(started["path"]).exists()
    joined = call(keeper, "claim", worker=1, key="big")
    assert joined["join"]["path"] == started["path"]


def test_a_body_of_unknown_length_gives_the_provisional_room_back_and_its_waiters_pass(
    tmp_path: Path, keeper_on: KeeperOn
) -> None:
    keeper = keeper_on(tmp_path, 8 * PROVISIONAL)

    async def scenario() -> None:
        begun = await keeper.handle(0, {"op": "claim", "key": "u"})
        Path(begun["path"]).touch()  # as the worker makes it
        waiting = asyncio.create_task(keeper.handle(1, {"op": "claim", "key": "u"}))
        await asyncio.sleep(0)
        started = await keeper.handle(0, {"op": "start_unsized", "key": "u"})
        assert keeper.store.reserved == keeper.store.charge(UNSIZED_ROOM)  # not both
        assert not Path(begun["path"]).exists() and Path(started["path"]).exists()
        assert await waiting == {"declined": UNSIZED}
        assert await keeper.handle(1, {"op": "claim", "key": "u"}) == {"declined": UNSIZED}
        assert await commit(keeper, started, "u", 10) == {}
        assert keeper.store.reserved == 0 and keeper.store.used == keeper.store.charge(10)

    asyncio.run(scenario())


def test_a_declined_claim_returns_its_provisional_room(
    tmp_path: Path, keeper_on: KeeperOn
) -> None:
    keeper = keeper_on(tmp_path, 8 * PROVISIONAL)
    assert "rid" in call(keeper, "claim", key="a")
    call(keeper, "decline", key="a", reason="no-store")
    assert keeper.store.reserved == 0 and call(keeper, "claim", key="a")["begin"]


def test_a_dead_workers_small_fill_is_failed_and_its_room_returned(
    tmp_path: Path, keeper_on: KeeperOn
) -> None:
    keeper = keeper_on(tmp_path, 8 * PROVISIONAL)
    begun = call(keeper, "claim", key="a")
    Path(begun["path"]).write_bytes(b"half")
    keeper.worker_gone(0)
    assert keeper.store.reserved == 0 and not Path(begun["path"]).exists()
    assert call(keeper, "claim", worker=1, key="a")["begin"]


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


def test_a_claim_knows_from_the_commits_since_its_lookup_whether_its_key_was_stored(
    tmp_path: Path, keeper_on: KeeperOn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keeper_module, "RECENT_COMMITS", 2)
    keeper = keeper_on(tmp_path, 8 * PROVISIONAL)
    store_small(keeper, "a", 10)  # commit 1
    assert call(keeper, "claim", key="a", since=0) == {"stored": True}
    assert call(keeper, "claim", key="a", since=None) == {"stored": True}  # asks the index
    keeper.store.remove("a")
    # A lookup that saw commit 1 and missed "a" saw it removed: fetch it again.
    assert call(keeper, "claim", key="a", since=1)["begin"]
    call(keeper, "decline", key="a", reason="test")
    # Committed since, and removed since: the index says.
    assert call(keeper, "claim", key="a", since=0)["begin"]
    call(keeper, "decline", key="a", reason="test")
    store_small(keeper, "b", 10)
    store_small(keeper, "c", 10)  # commit 3: "a" is no longer remembered
    store_small(keeper, "a", 10)
    assert call(keeper, "claim", key="b", since=0) == {"stored": True}  # asks the index
    assert call(keeper, "claim", key="a", since=3) == {"stored": True}
    assert call(keeper, "claim", key="d", since=3)["begin"]
