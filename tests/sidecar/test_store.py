"""The store on a real buffer directory: what a restart finds, the `lru` order kept in the
index, and the background check, without a sidecar around it."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import diskcache

from sidecar.buffer.store import Index, Store, StoredObject, decode


def commit(store: Store, key: str, body: bytes) -> StoredObject:
    reservation = store.reserve(len(body))
    assert reservation is not None
    reservation.path.write_bytes(body)
    digest = hashlib.sha256(body).hexdigest()
    return store.commit(reservation, key, digest, (("ETag", '"e"'),), 0.0, 0.0)


def reopened(directory: Path, capacity: int = 2**20, eviction: str = "none") -> Store:
    store = Store(directory, capacity, eviction)  # type: ignore[arg-type]
    store.open()
    return store


def test_a_restart_counts_what_it_finds_from_the_index_alone(tmp_path: Path) -> None:
    store = reopened(tmp_path)
    for n in range(5):
        commit(store, f"k{n}", bytes(100 + n))
    store.close()
    published: list[tuple[int, int]] = []
    again = Store(tmp_path, 2**20, "none", checks=lambda *p: published.append(p))
    again.open()
    assert (again.entries, again.used, again.unverified) == (5, 510, 5)
    assert published == [(5, 0)]  # five rows found at start, none checked yet
    asyncio.run(again.verify_existing())
    assert again.unverified == 0 and published[-1] == (5, 5)
    assert again.entries == 5
    again.close()


def test_the_check_drops_a_corrupt_body_and_deletes_leftovers(tmp_path: Path) -> None:
    store = reopened(tmp_path)
    good, bad = commit(store, "good", b"a" * 300), commit(store, "bad", b"b" * 300)
    store.close()
    (tmp_path / "objects" / bad.file).write_bytes(b"c" * 300)
    (tmp_path / "objects" / "0123456789abcdef0123456789abcdef").write_bytes(b"left over")
    again = reopened(tmp_path)
    asyncio.run(again.verify_existing())
    assert (again.entries, again.used) == (1, 300)
    assert not again.holds("bad") and again.holds("good")
    assert sorted(p.name for p in (tmp_path / "objects").iterdir()) == [good.file]
    again.close()


def test_an_index_of_another_format_starts_empty(tmp_path: Path) -> None:
    store = reopened(tmp_path)
    entry = commit(store, "new", b"x" * 10)
    store.close()
    with diskcache.Cache(str(tmp_path / "index")) as index:
        index.set("old", entry)  # no size in its tag: written by another version
    again = reopened(tmp_path)
    assert (again.entries, again.used) == (0, 0)
    asyncio.run(again.verify_existing())
    assert not any((tmp_path / "objects").iterdir())  # the bodies went as leftovers
    again.close()


def test_lru_evicts_the_least_recently_touched_across_a_restart(tmp_path: Path) -> None:
    store = reopened(tmp_path, capacity=300, eviction="lru")
    for key in ("a", "b", "c"):
        commit(store, key, bytes(100))
    store.touch(["a"])  # b is now the least recently used
    store.close()
    again = reopened(tmp_path, capacity=300, eviction="lru")
    commit(again, "d", bytes(100))
    assert [again.holds(k) for k in "abcd"] == [True, False, True, True]
    again.close()


def test_a_worker_reads_an_object_and_its_row(tmp_path: Path) -> None:
    store = reopened(tmp_path)
    entry = commit(store, "k", b"body")
    commit(store, "other", b"body")
    index = Index(tmp_path)
    index.open()
    found = index.find("k")
    assert found is not None and decode(found.encoded) == entry
    store.touch(["k"])  # moved to the end of the lru order: a new, larger row
    moved = index.find("k")
    assert moved is not None and moved.rowid > found.rowid
    assert index.find("missing") is None
    index.close()
    store.close()


def test_room_of_unknown_length_grows_within_the_cap_and_shrinks_to_its_body(
    tmp_path: Path,
) -> None:
    store = reopened(tmp_path, capacity=1000)
    reservation = store.reserve(100)
    assert reservation is not None
    assert store.grow(reservation, 600) and store.reserved == 600
    assert not store.grow(reservation, 1001)  # never beyond the cap
    other = store.reserve(300)
    assert other is not None
    assert not store.grow(reservation, 800) and store.reserved == 900  # held by another
    store.abort(other)
    body = b"z" * 450
    reservation.path.write_bytes(body)
    store.commit(reservation, "k", hashlib.sha256(body).hexdigest(), (), 0.0, 0.0, len(body))
    assert (store.used, store.reserved, store.entries) == (450, 0, 1)
    store.close()


def test_room_that_grows_evicts_under_lru_and_never_under_none(tmp_path: Path) -> None:
    for eviction, kept in (("lru", False), ("none", True)):
        store = reopened(tmp_path / eviction, capacity=300, eviction=eviction)
        commit(store, "old", bytes(200))
        reservation = store.reserve(100)
        assert reservation is not None
        assert store.grow(reservation, 300) != kept
        assert store.holds("old") == kept
        store.close()
