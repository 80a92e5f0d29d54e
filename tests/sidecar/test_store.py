"""The store on a real buffer directory: what a restart finds, the `lru` order kept in the
index, and the background check, without a sidecar around it."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
from pathlib import Path

import blake3
import diskcache
import pytest

from sidecar.buffer import store as store_module
from sidecar.buffer.store import Index, Store, StoredObject, Verified, decode, encode, key_digest
from sidecar.cache import policy


def commit(store: Store, key: str, body: bytes) -> StoredObject:
    reservation = store.reserve(len(body))
    assert reservation is not None
    Path(reservation.path).write_bytes(body)
    digest = blake3.blake3(body).hexdigest()
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
    assert (again.entries, again.used, again.unverified) == (5, 5 * again.block, 5)
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
    assert (again.entries, again.used) == (1, again.block)
    assert not again.holds("bad") and again.holds("good")
    assert sorted(p.name for p in (tmp_path / "objects").iterdir()) == [good.file]
    again.close()


def test_the_check_hands_back_the_uniform_objects_it_verified(tmp_path: Path) -> None:
    """After a restart, each object the check verifies whose whole 200 answers every
    plain GET of its key is handed to `verified`: not one whose body
    is spoiled, not one of a `--http-freshness` host, not a signed range's part."""
    uniform = policy.Uniform(("fresh.example",))
    store = Store(tmp_path, 2**20, "none", uniform=uniform)
    store.open()
    kept = commit(store, "https://data.example/a", b"a" * 100)
    spoiled = commit(store, "https://data.example/b", b"b" * 100)
    fresh = commit(store, "https://fresh.example/c", b"c" * 100)
    part = commit(store, "https://data.example/d#bytes=0-99", b"d" * 100)
    assert (kept.uniform, fresh.uniform, part.uniform) == (True, False, False)
    store.close()
    (tmp_path / "objects" / spoiled.file).write_bytes(b"x" * 100)
    handed: list[Verified] = []
    again = Store(tmp_path, 2**20, "none", uniform=uniform, verified=handed.extend)
    again.open()
    asyncio.run(again.verify_existing())
    assert again.entries == 3
    assert handed == [Verified(key_digest("https://data.example/a"), kept)]
    again.close()


def test_only_rows_unchanged_since_the_check_read_them_are_handed_back(tmp_path: Path) -> None:
    """Between the read of a batch and its hand-over, an object may be removed, have
    its fields changed by a 304, or be moved to the end of the `lru` order: what is
    handed back is what the index holds as the check read it."""
    store = reopened(tmp_path, eviction="lru")
    keys = [f"https://data.example/{n}" for n in range(4)]
    for key in keys:
        commit(store, key, key.encode())
    with contextlib.closing(store_module._connect(tmp_path)) as reader:
        rows = store_module._next_rows(reader, 0, 4)
        store.remove(keys[0])
        store.update(keys[1], decode(rows[1][3]).file, (("ETag", '"f"'),), 0.0, 0.0)
        store.touch([keys[2]])
        checked = [(row, decode(row[3])) for row in rows]
        found = store_module._unchanged(reader, checked)  # type: ignore[arg-type]
    assert [v.slot for v in found] == [key_digest(keys[3])]
    store.close()


def test_an_index_written_under_other_freshness_hosts_is_emptied(tmp_path: Path) -> None:
    """Whether an object is uniform was decided at its commit: a start under other
    `--http-freshness` hosts starts empty rather than trust what other rules decided."""
    store = reopened(tmp_path)
    commit(store, "https://data.example/a", b"a")
    store.close()
    same = reopened(tmp_path)
    assert same.entries == 1
    same.close()
    other = Store(tmp_path, 2**20, "none", uniform=policy.Uniform(("data.example",)))
    other.open()
    assert other.entries == 0 and not other.holds("https://data.example/a")
    other.close()


def test_the_check_runs_batches_side_by_side_below_the_workers_priority(
    tmp_path: Path,
) -> None:
    """More rows than the check's threads take at once: every corrupt body is dropped
    whichever batch holds it, what is published as checked only grows, and the threads
    that read the bodies run at the background's nice value."""
    store = reopened(tmp_path, capacity=2**30)
    count = store_module.CHECKERS * 1024 + 7  # a batch for every thread, and one more
    entries = [commit(store, f"k{n}", n.to_bytes(4)) for n in range(count)]
    store.close()
    corrupt = {5, 1500, 3100, count - 1}  # in different batches
    for n in corrupt:
        (tmp_path / "objects" / entries[n].file).write_bytes(b"bad!")
    published: list[tuple[int, int]] = []
    nices: set[int] = set()

    def checks(found: int, checked: int) -> None:
        published.append((found, checked))
        for task in Path("/proc/self/task").iterdir():  # the check's threads are running
            nices.add(int((task / "stat").read_text().rsplit(")", 1)[1].split()[16]))

    again = Store(tmp_path, 2**30, "none", checks=checks)
    again.open()
    asyncio.run(again.verify_existing())
    checked = [through for _, through in published]
    assert checked == sorted(checked) and published[-1] == (count, count)
    assert again.entries == count - len(corrupt) and again.unverified == 0
    assert [again.holds(f"k{n}") for n in sorted(corrupt)] == [False] * len(corrupt)
    assert again.holds("k6") and again.holds(f"k{count - 2}")
    assert store_module.BACKGROUND_NICE in nices and 0 in nices  # theirs and the loop's
    again.close()


def test_a_worker_finds_the_stored_part_that_holds_a_signed_range(tmp_path: Path) -> None:
    """Parts of one xorb stored under their signed ranges: a range inside one of them
    finds the smallest that holds it, one that straddles two finds none, and a part gone
    from the index (evicted, removed) is found no more."""
    xorb = "https://cas-bridge.xethub.hf.co/xorbs/default/" + "ab" * 32
    other = "https://cas-bridge.xethub.hf.co/xorbs/default/" + "cd" * 32

    def part(url: str, first: int, last: int) -> str:
        return f"{url}#bytes={first}-{last}"  # a part's key (`endpoints.part_key`)

    store = reopened(tmp_path)
    commit(store, part(xorb, 0, 999), bytes(1000))
    commit(store, part(xorb, 100, 299), bytes(200))
    commit(store, part(other, 0, 4999), bytes(5000))
    commit(store, "https://origin.test/plain", b"body")
    index = Index(tmp_path)
    index.open()
    assert index.container(xorb, 150, 199) == part(xorb, 100, 299)
    assert index.container(xorb, 250, 400) == part(xorb, 0, 999)
    assert index.container(xorb, 900, 1000) is None
    assert index.container(other, 0, 4999) == part(other, 0, 4999)
    store.remove(part(xorb, 100, 299))
    assert index.container(xorb, 150, 199) == part(xorb, 0, 999)
    store.remove(part(xorb, 0, 999))
    assert index.container(xorb, 150, 199) is None
    index.close()
    store.close()


def test_an_index_of_another_format_starts_empty(tmp_path: Path) -> None:
    store = reopened(tmp_path)
    entry = commit(store, "new", b"x" * 10)
    store.close()
    shutil.rmtree(tmp_path / "index")  # as an earlier version left it: pickles, no totals
    with diskcache.Cache(str(tmp_path / "index")) as index:
        index.set("old", entry)  # pickled, by a version that kept no totals
    again = reopened(tmp_path)
    assert (again.entries, again.used) == (0, 0)
    asyncio.run(again.verify_existing())
    assert not any((tmp_path / "objects").iterdir())  # the bodies went as leftovers
    again.close()


def test_an_index_whose_digests_are_sha256_starts_empty(tmp_path: Path) -> None:
    """Format 2 recorded SHA-256 digests: its objects are fetched again, never each
    dropped as corrupt by the check."""
    store = reopened(tmp_path)
    commit(store, "old", b"x" * 10)
    store.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "index" / diskcache.core.DBNAME)) as index:
        index.execute("UPDATE Buffer SET format = 2")
        index.commit()
    again = reopened(tmp_path)
    assert (again.entries, again.used) == (0, 0)
    again.close()


def test_the_totals_kept_by_the_index_survive_every_change(tmp_path: Path) -> None:
    store = reopened(tmp_path)
    for n in range(4):
        commit(store, f"k{n}", bytes(5000 * n))  # one block for the empty body, 2, 3, 4
    store.touch(["k1", "k2"])
    store.remove("k3")
    entry = commit(store, "k0", bytes(10_000))  # stored anew: the old one goes
    store.update("k0", entry.file, (("ETag", '"f"'),), 1.0, 2.0)
    expected = (store.entries, store.used)
    store.close()
    again = reopened(tmp_path)
    assert (again.entries, again.used) == expected == (3, (2 + 3 + 3) * again.block)
    again.close()


def test_the_volume_never_fills_before_the_cap(tmp_path: Path) -> None:
    """Bodies of 1–4 KiB take whole blocks: counted as such, what the cap admits fits a
    volume of the cap's size."""
    capacity = 64 * 4096
    store = reopened(tmp_path, capacity=capacity)
    n = 0
    while (reservation := store.reserve(1024 + 1000 * (n % 4))) is not None:
        Path(reservation.path).write_bytes(bytes(reservation.size))
        store.commit(reservation, f"k{n}", "0" * 64, (), 0.0, 0.0)
        n += 1
    on_disk = sum(body.stat().st_blocks * 512 for body in (tmp_path / "objects").iterdir())
    assert n == 64 and on_disk <= store.used == capacity
    store.close()


def test_an_index_value_is_packed_and_read_back() -> None:
    entry = StoredObject(
        "0123456789abcdef0123456789abcdef",
        12,
        "ab" * 32,
        (("Content-Type", "text/plain; charset=utf-8"), ("X-Note", "caf\xe9 \u2603"), ("E", "")),
        1.5,
        2.5,
        3.0,
    )
    assert decode(encode(entry)) == entry
    bare = StoredObject(entry.file, 1, entry.digest, (), 0.0)
    assert decode(encode(bare)) == bare
    assert decode(b"short") is None
    with pytest.raises(ValueError):
        encode(StoredObject(entry.file, 1, entry.digest, (("X", "a\0b"),), 0.0))


def test_lru_evicts_the_least_recently_touched_across_a_restart(tmp_path: Path) -> None:
    store = reopened(tmp_path, capacity=3 * 4096, eviction="lru")
    for key in ("a", "b", "c"):
        commit(store, key, bytes(100))  # a block each
    store.touch(["a"])  # b is now the least recently used
    store.close()
    again = reopened(tmp_path, capacity=3 * 4096, eviction="lru")
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
    assert found is not None and found.entry == entry
    store.touch(["k"])  # moved to the end of the lru order: a new, larger row
    moved = index.find("k")
    assert moved is not None and moved.rowid > found.rowid
    assert index.find("missing") is None
    index.close()
    store.close()


def test_a_commit_writes_the_row_diskcache_itself_would(tmp_path: Path) -> None:
    store = reopened(tmp_path)
    first = commit(store, "k", b"a" * 300)
    head = (("ETag", '"e"'), ("X-Large", "x" * 40_000))
    reservation = store.reserve(10)
    assert reservation is not None
    Path(reservation.path).write_bytes(bytes(10))
    large = store.commit(reservation, "large", "0" * 64, head, 0.0, 0.0)
    again = commit(store, "k", b"b" * 200)  # the same key committed anew replaces it
    store.close()
    with diskcache.Cache(str(tmp_path / "index")) as cache:
        assert len(cache) == 2 and cache.volume() > 0
        assert sorted(tag for _, tag in (cache.get(k, tag=True) for k in cache)) == [
            store.block
        ] * 2
    reader = Index(tmp_path)
    reader.open()
    for key, entry in (("k", again), ("large", large)):
        found = reader.find(key)
        assert found is not None and found.entry == entry != first
    reader.close()
    restarted = reopened(tmp_path)
    assert (restarted.entries, restarted.used) == (2, 2 * store.block)
    restarted.close()


def test_room_of_unknown_length_grows_within_the_cap_and_shrinks_to_its_body(
    tmp_path: Path,
) -> None:
    store = reopened(tmp_path)
    block = store.block
    store.capacity = 10 * block  # whatever the file system's block
    reservation = store.reserve(block)
    assert reservation is not None
    assert store.grow(reservation, 6 * block) and store.reserved == 6 * block
    assert not store.grow(reservation, 10 * block + 1)  # never beyond the cap
    other = store.reserve(3 * block)
    assert other is not None
    assert not store.grow(reservation, 8 * block) and store.reserved == 9 * block
    store.abort(other)
    body = b"z" * (4 * block + block // 2)
    Path(reservation.path).write_bytes(body)
    store.commit(reservation, "k", blake3.blake3(body).hexdigest(), (), 0.0, 0.0, len(body))
    assert (store.used, store.reserved, store.entries) == (5 * block, 0, 1)
    store.close()


def test_room_that_grows_evicts_under_lru_and_never_under_none(tmp_path: Path) -> None:
    for eviction, kept in (("lru", False), ("none", True)):
        store = reopened(tmp_path / eviction, eviction=eviction)
        block = store.block
        store.capacity = 3 * block
        commit(store, "old", bytes(2 * block))
        reservation = store.reserve(block)
        assert reservation is not None
        assert store.grow(reservation, 3 * block) != kept
        assert store.holds("old") == kept
        store.close()
