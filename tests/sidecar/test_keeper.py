"""The keeper and two workers' handles on a real buffer directory, in one process: claims
and leases in the shared memory, the keeper over real channels. Small fills are stored
by their worker without a call; the leases never cost other objects room."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import pytest

from sidecar import ipc
from sidecar.buffer.claims import Claims
from sidecar.buffer.keeper import LEASE, SMALL, UNSTORED, Buffer, Keeper, lease_grant
from sidecar.buffer.store import Index, Store, StoredObject, StoreError, worker_partial
from sidecar.cache import policy
from sidecar.ipc import Message
from sidecar.shared import Shared

HEAD = {
    "headers": [["ETag", '"e"']],
    "generated_at": 0.0,
    "lifetime": 0.0,
    "etag": '"e"',
    "last_modified": None,
    "request_headers": [],
}


@dataclass
class Sidecar:
    """A keeper and the buffers of two workers, and every message the keeper got."""

    keeper: Keeper
    buffers: list[Buffer]
    indexes: list[Index]  # each buffer's
    ops: list[str]

    @property
    def store(self) -> Store:
        return self.keeper.store

    async def settle(self) -> None:
        """Until the keeper has handled what was sent to it."""
        for _ in range(20):
            await asyncio.sleep(0.005)


@asynccontextmanager
async def sidecar_on(
    directory: Path, capacity: int, eviction: str = "none"
) -> AsyncIterator[Sidecar]:
    store = Store(directory, capacity, eviction)  # type: ignore[arg-type]
    store.open()
    shared = Shared.create(2, Claims.size(2))
    keeper = Keeper(store, Claims(shared))
    ops: list[str] = []
    tasks = []
    buffers = []
    indexes = []
    for worker in range(2):
        ours, theirs = socket.socketpair()

        async def to_keeper(message: Message, worker: int = worker) -> Message | None:
            ops.append(message["op"])
            return await keeper.handle(worker, message)

        async def to_worker(message: Message) -> Message | None:
            return None

        side = ipc.Channel(ours, to_keeper)
        channel = ipc.Channel(theirs, to_worker)
        tasks += [asyncio.create_task(side.run()), asyncio.create_task(channel.run())]
        index = Index(directory)
        index.open()
        indexes.append(index)
        buffers.append(
            Buffer(index, channel, shared, Claims(shared), worker, False, policy.Uniform(()))
        )
    sidecar = Sidecar(keeper, buffers, indexes, ops)
    await sidecar.settle()  # the leases asked for at start
    try:
        yield sidecar
    finally:
        for task in tasks:
            task.cancel()
        for index in indexes:
            index.close()
        store.close()


def run(scenario: Callable[[], Any]) -> None:
    asyncio.run(scenario())


async def begin_small(buffer: Buffer, key: str, size: int) -> str:
    """What a worker does as a small miss begins: its claim, and room from the lease for
    `size` bytes (the body is kept in memory until it is whole); its rid."""
    assert await buffer.claim(key) == {"begin": True}
    rid = buffer.lease_room(key, size)
    assert rid is not None
    return rid


def partial_of(directory: Path, rid: str, worker: int = 0) -> Path:
    """Where `Buffer.commit_small` of `worker` writes the body of its fill `rid`."""
    return directory / "partial" / worker_partial(rid, worker)


async def store_small(buffer: Buffer, key: str, size: int) -> str:
    """What a worker does for a small miss: claim, room from the lease, commit."""
    assert buffer.lookup(key) is None
    body = os.urandom(size)
    rid = await begin_small(buffer, key, size)
    digest = blake3.blake3(body).hexdigest()
    assert buffer.commit_small(rid, body, digest, (("ETag", '"e"'),), 0.0, 0.0)
    return rid


def test_a_small_miss_is_stored_by_its_worker_without_a_call_to_the_keeper(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with sidecar_on(tmp_path, 64 * SMALL) as sidecar:
            assert sidecar.ops == ["lease", "lease"]
            for n in range(10):
                await store_small(sidecar.buffers[n % 2], f"k{n}", 1000 + n)
            await sidecar.settle()
            assert sidecar.ops == ["lease", "lease"]  # not one message more
            gauges = sidecar.keeper.gauges()
            assert gauges["entries"] == 10 and gauges["buffer_bytes"] == 10 * 4096
            assert gauges["reserved_bytes"] == 0 and gauges["fills_in_progress"] == 0
            assert gauges["leased_bytes"] == 2 * LEASE - 10 * 4096
            # Every worker serves it at once, from the index.
            found = sidecar.buffers[1].lookup("k0")
            assert found is not None and found.size == 1000
            assert not list((tmp_path / "partial").iterdir())

    run(scenario)


def test_a_claim_waits_for_a_small_fill_in_another_worker_and_finds_it_stored(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with sidecar_on(tmp_path, 64 * SMALL) as sidecar:
            first, second = sidecar.buffers
            assert first.lookup("a") is None and await first.claim("a") == {"begin": True}
            assert second.lookup("a") is None
            waiting = asyncio.create_task(second.claim("a"))
            await asyncio.sleep(0.01)
            assert not waiting.done()  # nobody follows a small fill: it waits
            rid = first.lease_room("a", 10)
            assert rid is not None
            assert first.commit_small(rid, bytes(10), "0" * 64, (), 0.0, 0.0)
            assert await waiting == {"stored": True, "joined": True}

    run(scenario)


def test_a_failed_small_fill_sends_its_waiter_to_the_origin_and_returns_its_room(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with sidecar_on(tmp_path, 64 * SMALL) as sidecar:
            first, second = sidecar.buffers
            rid = await begin_small(first, "a", 5000)
            waiting = asyncio.create_task(second.claim("a"))
            await asyncio.sleep(0.01)
            first.abort(rid)
            # It passes at once, as the fill's own client does, holding no claim: waiters
            # of an answer that is not cacheable are not sent to the origin one by one.
            assert await waiting == {"declined": UNSTORED}
            assert not list((tmp_path / "partial").iterdir())
            assert sidecar.keeper.claims.lease(0).held == 0
            assert sidecar.keeper.gauges()["fills_in_progress"] == 0
            assert await second.claim("a") == {"begin": True}  # a later request fetches it

    run(scenario)


def test_a_commit_between_a_lookup_and_its_claim_is_seen(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with sidecar_on(tmp_path, 64 * SMALL) as sidecar:
            first, second = sidecar.buffers
            assert second.lookup("a") is None  # misses before the other worker commits
            await store_small(first, "a", 10)
            assert await second.claim("a") == {"stored": True, "joined": False}
            assert sidecar.keeper.gauges()["fills_in_progress"] == 0

    run(scenario)


def test_a_larger_body_asks_for_its_room_and_others_join_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with sidecar_on(tmp_path, 64 * SMALL) as sidecar:
            first, second = sidecar.buffers
            assert await first.claim("big") == {"begin": True}
            started = await first.start_fill("big", 3 * SMALL, HEAD)
            assert Path(started["path"]).exists()
            joined = await second.claim("big")
            assert joined["join"]["path"] == started["path"]
            Path(started["path"]).write_bytes(bytes(3 * SMALL))
            assert await first.commit(started["rid"], "big", 3 * SMALL, "0" * 64, (), 0.0, 0.0)
            assert await second.claim("big") == {"stored": True, "joined": False}

    run(scenario)


def test_an_invalidation_keeps_a_small_fill_from_committing_and_others_pass(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with sidecar_on(tmp_path, 64 * SMALL) as sidecar:
            first, second = sidecar.buffers
            rid = await begin_small(first, "a", 10)
            await second.invalidate(["a"])
            assert await second.claim("a") == {"declined": "invalidated"}
            assert not first.commit_small(rid, bytes(10), "0" * 64, (), 0.0, 0.0)
            first.abort(rid)
            assert first.lookup("a") is None and sidecar.store.entries == 0
            assert not list((tmp_path / "partial").iterdir())
            assert await second.claim("a") == {"begin": True}  # the next one is stored

    run(scenario)


def test_a_dead_workers_claims_lease_and_partial_bodies_are_returned(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with sidecar_on(tmp_path, 64 * SMALL) as sidecar:
            first, second = sidecar.buffers
            await store_small(first, "kept", 10)
            rid = await begin_small(first, "a", 10)
            partial_of(tmp_path, rid).write_bytes(b"half")  # killed as it wrote the body
            # It dies having indexed one more object, and before counting it.
            index = Index(tmp_path)
            index.open()
            (tmp_path / "objects" / ("0" * 32)).write_bytes(bytes(10))
            index.insert("b", StoredObject("0" * 32, 10, "0" * 64, (), 0.0), 4096)
            index.close()
            waiting = asyncio.create_task(second.claim("a"))
            await asyncio.sleep(0.01)
            sidecar.keeper.worker_gone(0)
            assert await waiting == {"declined": UNSTORED}
            gauges = sidecar.keeper.gauges()
            assert gauges["entries"] == 2 and gauges["buffer_bytes"] == 2 * 4096
            assert sidecar.keeper.claims.lease(0).granted == 0
            assert gauges["leased_bytes"] == sidecar.keeper.claims.lease(1).idle
            assert gauges["fills_in_progress"] == 0
            assert not partial_of(tmp_path, rid).exists()

    run(scenario)


def test_leases_leave_as_much_free_and_are_taken_back_before_anything_is_refused(
    tmp_path: Path,
) -> None:
    assert lease_grant(free=100, lent=0, idle=0, block=1) == 50
    assert lease_grant(free=100, lent=50, idle=50, block=1) == 25
    assert lease_grant(free=10 * LEASE, lent=0, idle=LEASE // 4, block=4096) == LEASE * 3 // 4
    assert lease_grant(free=100, lent=100, idle=0, block=1) == 0

    async def scenario() -> None:
        async with sidecar_on(tmp_path, 8 * SMALL, eviction="lru") as sidecar:
            store = sidecar.store
            # Half of the free room is lent at most.
            assert sidecar.keeper.gauges()["leased_bytes"] <= 4 * SMALL
            for n in range(3):
                await store_small(sidecar.buffers[0], f"k{n}", SMALL)
            # A large object takes the idle leases back rather than evict for them.
            first = sidecar.buffers[1]
            assert await first.claim("big") == {"begin": True}
            started = await first.start_fill("big", 5 * SMALL, HEAD)
            assert "rid" in started, started
            assert store.entries == 3 and sidecar.keeper.gauges()["leased_bytes"] == 0
            assert store.used + store.reserved == 8 * SMALL

    run(scenario)


def test_a_store_error_of_a_small_commit_returns_everything(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with sidecar_on(tmp_path, 64 * SMALL) as sidecar:
            first = sidecar.buffers[0]
            rid = await begin_small(first, "a", 10)
            with pytest.raises(StoreError):
                first.commit_small(rid, b"short", "0" * 64, (), 0.0, 0.0)
            first.abort(rid)
            assert sidecar.keeper.claims.lease(0).held == 0
            assert sidecar.keeper.gauges()["fills_in_progress"] == 0

    run(scenario)


def test_a_claim_whose_index_read_fails_holds_no_claim(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with sidecar_on(tmp_path, 64 * SMALL) as sidecar:
            first, second = sidecar.buffers
            sidecar.indexes[0].close()  # every read of the first worker's fails
            with pytest.raises(StoreError):
                await first.claim("a")
            assert await asyncio.wait_for(second.claim("a"), 5) == {"begin": True}  # not held

    run(scenario)
