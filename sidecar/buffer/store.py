"""The burst buffer: stored objects, their index, and admission control.

Layout of `--buffer-dir`:

    index/      a diskcache Cache: cache key -> StoredObject (metadata only, small)
    objects/    one body file per stored object, named by a random id
    partial/    bodies being filled; renamed into objects/ on commit (same file
                system, so committing never copies the body)

diskcache keeps the index transactional and crash-safe; the bodies are ours because
diskcache's own file values would copy a finished fill once more on `set()`, and
its `size_limit` is soft while an emptyDir that outgrows its `sizeLimit` gets the
whole pod evicted. So the hard cap and the admission policy live here:

- `none` ("no replacement"): once full, what is stored stays, new objects pass
  through uncached. A scan over a dataset larger than the buffer then keeps a steady
  hit ratio of buffer/dataset per epoch, where LRU would keep nothing.
- `lru`: least recently used objects are evicted to make room.

Fills in progress reserve their full Content-Length up front, so concurrent fills
can never overshoot the cap together; a body whose length only its end tells (chunked)
holds room that grows ahead of what it writes (`grow`), and gives back the rest at its
commit. Under `lru` that growth evicts as a reservation does, so such a body that turns
out larger than the whole buffer has evicted what it grew over before it is abandoned
(one of known length that large is refused at once).

Nothing is done per stored object before a restarted sidecar is ready. The index keeps
its totals as it changes: diskcache's own object count, and the bytes charged against
the cap in a one-row table (`Buffer`) that triggers update in the transaction of every
insert and delete, from the `tag` column (each object's charge). Start reads those and
the largest rowid, a few pages whatever the number of objects; rowids say what was
found at start: every row up to that largest one (`found_through`). A background check
reads those rows in rowid order and hashes their bodies against the size and digest
(BLAKE3, `native.Digest`) recorded at commit in several threads (CHECKERS: each waits on
its own reads, so the disk, not one thread's latency, sets the pace), drops those that
do not match, and publishes how far it has come (`checked_through`). A row found at
start and not checked yet is verified by the worker that serves it first
(`keeper.Buffer`), so the check's threads run at a lower priority than the workers
(BACKGROUND_NICE): a hit never waits for them. New commits get larger rowids, and an
object moved to the end of the `lru` order (a new rowid) was served, hence verified.
What was found at start is neither rewritten nor held in memory. The check hands each
verified object whose whole 200 answers every plain GET of its key (`StoredObject.uniform`,
decided at its commit by `policy.Uniform`) to `verified`, once its row is seen unchanged
in the same step of the event loop as the hand-over: the core's table of answers
(`runtime.main`) gets the object back without waiting for a first hit through Python,
which a dataset read once per epoch would pay for every file. The rules of that decision
(the `--http-freshness` hosts) are kept with the index, which a start under other rules
empties, as one of another format: a verified object is never put back under rules it
was not decided by.

A row is small because a buffer holds up to a million of them, in the same volume as the
bodies (and, on tmpfs, in the pod's memory): its key is a 16-byte digest of the cache key
rather than the URL, and its value a packed record (`encode`) rather than a pickle, about
200 bytes with a typical response's three fields, that a worker decodes in a few microseconds.

Bodies are charged in whole blocks of the buffer's file system, at least one each: a body
of 1 KiB takes a 4 KiB page of tmpfs, and the volume's `sizeLimit` counts pages, not
content. The one block of an empty body stands for its inode and index row, and bounds
the number of objects by the cap (the injector sizes the index's room from that).

Two sides share the directory: `Store`, in the parent process, keeps the accounting
(cap, reservations, recency) and writes the index for everything but small fills;
`Index`, in every worker, reads it to answer hits, and inserts the row of a small fill
that worker stored from its lease (`keeper.Buffer`, `insert_row`: the same row, so the
triggers keep the totals, which the parent reads back if that worker dies). diskcache's
SQLite index (WAL mode) is made for several processes: a worker sees an object as soon
as its commit is written.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import logging
import os
import shutil
import sqlite3
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import diskcache

from sidecar.buffer import progress
from sidecar.cache import endpoints, policy
from sidecar.core import native
from sidecar.settings import Eviction

logger = logging.getLogger(__name__)

# Index rows the background check reads and hashes per batch: a thread's work between
# two reports of how far the check has come (a few milliseconds of small bodies, so that
# progress is published often and removals wait little).
_CHECK_BATCH = 1024
# Threads of the background check that open, read and hash bodies, each a batch at a time
# (the file system calls and the hashing release the GIL). One thread waits on every
# uncached read in turn: a million bodies of 4 KiB on a virtual disk (~40 us a read)
# took two minutes; four keep the disk busy and then the Python of the check, about a
# core, is what bounds it.
CHECKERS = 4
# The nice value of the background threads (the check and the leftover sweep), against
# the workers' 0: on a busy sidecar they take what the workers leave. The check cannot
# hold a hit back: a worker verifies an object the check has not reached when it serves it.
BACKGROUND_NICE = 10
# SQLite's page cache per connection (diskcache's default is 32 MiB), and no memory
# map: an index of a million rows is hundreds of MB, and each process mapping the part
# it touched would hold it again. Lookups are one indexed query; the OS caches pages.
SQLITE_CACHE_KIB = 4096
# The index's format (`Buffer.format`): an index of another one is emptied at start
# (3: bodies' digests are BLAKE3, where 2's were SHA-256; 4: a record says whether the
# object is uniform, and the index which rules decided it).
FORMAT = 4
# A packed index value: body file (`body_name`'s 16 bytes), digest, size, stored_at,
# generated_at, lifetime, uniform; then the fields, names and values separated by NUL,
# which no field may hold (RFC 9110 §5.5).
_RECORD = struct.Struct("<16s32sQddd?")
_NAME_BYTES = 16  # the body file's name, first in a record
# Index values are kept in their rows up to this size (diskcache files larger ones): every
# value of ours, where a worker reads it.
_DISK_MIN_FILE_SIZE = 2**20  # bytes
# Start waits this long for SQLite's lock: workers open the index at the same time.
_OPEN_TIMEOUT = 10.0  # seconds
# diskcache waits this long for SQLite's lock before raising Timeout. Index calls run
# on the event loop and only the parent writes the index, so a lock held longer
# means something is wrong: fail open quickly rather than stall every client.
_INDEX_TIMEOUT = 0.25  # seconds
# Deletes removed bodies off the event loop, in order.
_JANITOR = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="unlink")
# After a failed write (disk full, read-only), admit nothing for this long: downloads
# pass through once instead of failing into the buffer and resuming upstream each time.
FAILURE_BACKOFF = 30.0  # seconds


class StoreError(Exception):
    """The buffer could not do what was asked (disk full, read-only, corrupt index)."""


class Corrupt(StoreError):
    """A stored body does not match the size and digest recorded at its commit."""


class UnusableBufferDir(Exception):
    """The buffer directory can never hold a buffer (not a directory, not writable)."""


def check_buffer_dir(directory: Path) -> None:
    """Raise UnusableBufferDir unless `directory` is, or can be made, a writable directory.

    A configuration error, found at start: a buffer that fails later is worked around
    (every download then comes from upstream), but one that cannot ever work is a
    mistake for the operator to fix, named as such.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UnusableBufferDir(f"{directory} exists and is not a directory") from None
    except OSError as e:
        raise UnusableBufferDir(f"cannot create {directory}: {_describe(e)}") from None
    if not directory.is_dir():
        raise UnusableBufferDir(f"{directory} is not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
            pass
    except OSError as e:
        raise UnusableBufferDir(f"cannot write into {directory}: {_describe(e)}") from None


class StoredObject(NamedTuple):
    """What the index records for one complete, committed object.

    A named tuple rather than a frozen dataclass: a worker decodes one for every object
    it serves first, a tuple is made in a third of the time, and one that holds only
    strings and numbers is left alone by the garbage collector once it has seen it (a
    worker remembers thousands of them)."""

    file: str  # body file name inside objects/
    size: int  # body bytes (== Content-Length of the stored 200 response)
    digest: str  # hex digest of the body, computed while filling
    headers: tuple[tuple[str, str], ...]  # end-to-end response headers to replay
    stored_at: float  # time.time() of the commit
    # time.time() the origin generated or last validated it (`policy.generated_at`);
    # objects stored by an earlier version count from their commit.
    generated_at: float = 0.0
    # Seconds it stays fresh (`policy.freshness_lifetime`), for --http-freshness hosts.
    lifetime: float = 0.0
    # Its whole 200 answers every GET of its key that carries no HIT_FIELDS
    # (`policy.Uniform`, decided at its commit): the core's table may hold it.
    uniform: bool = False

    @property
    def born(self) -> float:
        return self.generated_at or self.stored_at


class Verified(NamedTuple):
    """A uniform object the background check verified: its index key and its record."""

    slot: bytes
    entry: StoredObject


class Reservation:
    """Room for one fill: `size` bytes of body, `charged` against the cap (whole blocks)
    until commit or abort, and its partial body `path` (a plain string)."""

    def __init__(self, size: int, charged: int, partial_dir: str) -> None:
        self.size = size
        self.charged = charged
        self.name = body_name()
        self.path = os.path.join(partial_dir, self.name)
        self.settled = False


class Store:
    """The buffer directory with a hard cap and an admission policy."""

    def __init__(
        self,
        directory: Path,
        capacity: int,
        eviction: Eviction,
        changed: Callable[[bytes], None] = lambda slot: None,
        checks: Callable[[int, int], None] = lambda found, checked: None,
        uniform: policy.Uniform | None = None,
        verified: Callable[[list[Verified]], None] = lambda found: None,
    ) -> None:
        """`changed(slot)` is called with the index key of each object removed from the
        index or whose fields changed, after the change; `checks(found_through,
        checked_through)` whenever the background check moves on
        (`Shared.publish_checks`); `verified(found)` with uniform objects the check
        verified, unchanged since (see the module docstring);
        `uniform` decides which objects are, at their commit (by default, with no
        `--http-freshness` host)."""
        self.directory = directory
        self._changed = changed
        self._uniform = uniform or policy.Uniform(())
        self._verified = verified
        self.capacity = capacity
        self.eviction = eviction
        self.objects_dir = bodies_dir(directory)
        self.partial_dir = directory / "partial"
        self._objects = str(self.objects_dir)
        self._partial = str(self.partial_dir)
        self._checks = checks
        self.used = 0  # bytes charged for committed bodies (`charge`)
        self.reserved = 0  # bytes charged for fills in progress
        self.block = 4096  # bytes: the file system's block, read at open
        self.entries = 0  # committed objects
        self.unverified = 0  # objects found at start that the background check has not reached
        self._found_through = 0  # the largest rowid at open
        self._opened_at = 0.0  # time.time() of open; older unknown bodies are leftovers
        self._index: diskcache.Cache | None = None
        self._inserter: sqlite3.Connection | None = None  # commits' rows (`insert_row`)
        self._refuse_until = 0.0  # time.monotonic() until which nothing is admitted
        self._failure = ""  # why, the last time a write failed
        self._open_failure: str | None = "not opened yet"

    # -- start ------------------------------------------------------------------------

    def open(self) -> None:
        """Open (or create) the buffer; drop leftovers of an earlier, killed sidecar."""
        try:
            self.objects_dir.mkdir(parents=True, exist_ok=True)
            if self.partial_dir.exists():
                # A fill interrupted by a crash can never be completed: its client is gone.
                shutil.rmtree(self.partial_dir, ignore_errors=True)
            self.partial_dir.mkdir(exist_ok=True)
            self.block = os.statvfs(self.objects_dir).f_frsize or self.block
            self._index = _open_index(self.directory)
            self._inserter = _connect(self.directory, write=True)
            self._load_index()
        except (OSError, sqlite3.Error, diskcache.Timeout) as e:
            self._open_failure = f"cannot open the buffer in {self.directory}: {_describe(e)}"
            raise StoreError(self._open_failure) from e
        self._open_failure = None

    @property
    def unavailable(self) -> str | None:
        """Why nothing can be stored now (the buffer failed), or None while it works."""
        if self._open_failure is not None:
            return self._open_failure
        if time.monotonic() < self._refuse_until:
            return self._failure
        return None

    def _load_index(self) -> None:
        with _writer(self.directory) as writer:
            rules = self._uniform.rules
            if not _adopt(writer, rules):
                # Written by another version, or under other rules. An emptyDir is only
                # reopened by its own pod, whose image and flags are the same: start
                # empty (the bodies are deleted as leftovers by the background check).
                # diskcache makes its table anew.
                logger.warning(
                    "buffer: the index is of another version or other --http-freshness"
                    " hosts; starting empty"
                )
                self._require_index().close()
                self._index = _open_index(self.directory)
                _adopt(writer, rules)
            self._opened_at = time.time()
            # A few pages: two one-row lookups and the end of the rowid b-tree.
            ((self.used,),) = writer.execute("SELECT used FROM Buffer")
            ((self.entries,),) = writer.execute("SELECT value FROM Settings WHERE key = 'count'")
            ((last,),) = writer.execute("SELECT MAX(rowid) FROM Cache")
        self.unverified = self.entries
        self._found_through = last or 0
        self._checks(self._found_through, 0)
        if self.entries:
            logger.info(
                "buffer: found %d objects (%d bytes) from before a restart; checking them in"
                " the background",
                self.entries,
                self.used,
            )

    async def verify_existing(self) -> None:
        """Check every object found at start against its recorded size and digest,
        dropping those that do not match; then delete leftover bodies.

        The index is read, and the bodies checked, only while there are rows found at
        start: an empty buffer holds no connection or thread for it."""
        if self._open_failure is not None:
            return
        loop = asyncio.get_running_loop()
        if self._found_through:
            await self._check_found(loop)
        self.unverified = 0
        self._checks(self._found_through, self._found_through)
        logger.info("buffer: checked; %d objects stored", self.entries)
        with concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="sweep", initializer=_in_background
        ) as pool:
            removed = await loop.run_in_executor(
                pool, _sweep, self.directory, self._opened_at, self.entries
            )
        if removed:
            logger.info("buffer: deleted %d bodies no object refers to", removed)

    async def _check_found(self, loop: asyncio.AbstractEventLoop) -> None:
        """Batches of rows are read in rowid order and checked by CHECKERS threads at once;
        their results are taken in order, so `checked_through` only ever covers batches
        that are done."""
        objects_dir = str(self.objects_dir)
        with (
            _reader(self.directory) as reader,
            _reader(self.directory) as rereader,
            concurrent.futures.ThreadPoolExecutor(
                CHECKERS, thread_name_prefix="check", initializer=_in_background
            ) as pool,
        ):
            running: collections.deque[asyncio.Future[_Checked]] = collections.deque()
            read_through = 0
            while True:
                while read_through < self._found_through and len(running) < CHECKERS:
                    rows = await loop.run_in_executor(
                        pool, _next_rows, reader, read_through, self._found_through
                    )
                    if not rows:
                        read_through = self._found_through
                        break
                    read_through = rows[-1][0]
                    running.append(loop.run_in_executor(pool, _check_rows, objects_dir, rows))
                if not running:
                    return
                checked = await running.popleft()
                for key, rowid in checked.corrupt:
                    logger.warning("buffer: dropping an object that does not match its digest")
                    self._remove_row(key, rowid)
                if checked.uniform:
                    self._verified(_unchanged(rereader, checked.uniform))
                self.unverified = max(0, self.unverified - checked.count)
                self._checks(self._found_through, checked.last)

    def _remove_row(self, slot: bytes, rowid: int) -> None:
        """Remove the object at `slot` if its index row is still `rowid` (not stored anew
        meanwhile)."""
        with _reader(self.directory) as reader:
            found = reader.execute(
                "SELECT rowid FROM Cache WHERE key = ? AND raw = 1", (slot,)
            ).fetchone()
        if found is not None and found[0] == rowid:
            try:
                self._drop(slot)
            except StoreError as e:
                logger.warning("buffer: cannot drop a corrupt object: %s", e)

    # -- accounting ---------------------------------------------------------------------

    def touch(self, keys: list[str]) -> None:
        """Objects just served: the most recently used now (for `lru`).

        An object's place in the `lru` order is its rowid: moved to the end, it gets a
        new, largest one (and, having been served, counts as checked).
        """
        index = self._require_index()
        try:
            with index.transact():
                for key in keys:
                    slot = key_digest(key)
                    value, charged = index.pop(slot, tag=True)
                    if value is not None:
                        index.set(slot, value, tag=charged)
        except (OSError, sqlite3.Error, diskcache.Timeout) as e:
            raise StoreError(f"cannot record what was used: {_describe(e)}") from e

    def holds(self, key: str) -> bool:
        """Is `key` stored (workers serve it, checking it first if found at start)?"""
        try:
            return key_digest(key) in self._require_index()
        except (OSError, sqlite3.Error, diskcache.Timeout) as e:
            raise StoreError(f"cannot read the index: {_describe(e)}") from e

    # -- admission, commit, abort -------------------------------------------------------

    def reserve(self, size: int) -> Reservation | None:
        """Hold room for a `size`-byte fill, or None if the policy admits no more.

        The fill gets its partial body and progress record made here, so that readers in
        any worker can open them at once (a small fill of a worker's own is made by that
        worker: `keeper.Buffer`).

        None is not an error: the object is then passed through uncached.
        """
        charged = self.charge(size)
        if charged > self.capacity:
            return None
        if self.eviction == "lru":
            self._evict_until_free(charged)
        if self.used + self.reserved + charged > self.capacity:
            return None
        reservation = Reservation(size, charged, self._partial)
        try:
            if not os.path.isdir(self._partial):
                # Someone emptied the buffer directory under us: start again.
                self.partial_dir.mkdir(parents=True, exist_ok=True)
                self.objects_dir.mkdir(parents=True, exist_ok=True)
            _create_partial(reservation.path)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(reservation.path)
            raise StoreError(f"cannot create a partial body: {_describe(e)}") from e
        self.reserved += charged
        return reservation

    def charge(self, size: int) -> int:
        return charge(size, self.block)

    def resize(self, reservation: Reservation, size: int) -> None:
        """Hold `size` bytes for a fill instead of what it reserved (never more: room
        is only ever taken by `reserve`)."""
        if reservation.settled or size > reservation.size:
            raise StoreError(f"cannot grow a reservation of {reservation.size} bytes to {size}")
        charged = self.charge(size)
        self.reserved -= reservation.charged - charged
        reservation.size, reservation.charged = size, charged

    def grow(self, reservation: Reservation, size: int) -> bool:
        """Hold `size` bytes for a fill instead of the fewer it holds, evicting for them
        as `reserve` does; False (nothing changed) if the policy admits no more."""
        charged = self.charge(size)
        if reservation.settled or charged > self.capacity:
            return False
        more = charged - reservation.charged
        if self.eviction == "lru":
            self._evict_until_free(more)
        if self.used + self.reserved + more > self.capacity:
            return False
        self.reserved += more
        reservation.size, reservation.charged = size, charged
        return True

    def _evict_until_free(self, charged: int) -> None:
        while self.entries and self.used + self.reserved + charged > self.capacity:
            try:
                (victim, _), _ = self._require_index().peekitem(last=False, tag=True)
            except KeyError:
                return  # nothing left to evict
            except (OSError, sqlite3.Error, diskcache.Timeout) as e:
                raise StoreError(f"cannot read the index: {_describe(e)}") from e
            logger.info("buffer: evicting the least recently used object to admit a new one")
            self._drop(victim)

    def commit(
        self,
        reservation: Reservation,
        key: str,
        digest: str,
        headers: tuple[tuple[str, str], ...],
        generated_at: float,
        lifetime: float,
        size: int | None = None,
    ) -> StoredObject:
        """Make a complete fill servable: move its body into objects/ and index it.

        `size`: the body's, for a fill that did not know it up front (its room shrinks
        to it); else the room it reserved is its size."""
        if reservation.settled:
            raise StoreError("reservation already settled")
        if size is not None and size < reservation.size:
            self.resize(reservation, size)
        reservation.settled = True
        self.reserved -= reservation.charged
        name = reservation.name
        entry = StoredObject(
            name,
            reservation.size,
            digest,
            headers,
            time.time(),
            generated_at,
            lifetime,
            self._uniform(key),
        )
        body = os.path.join(self._objects, name)
        try:
            size_on_disk = os.stat(reservation.path).st_size
            if size_on_disk != reservation.size:
                raise StoreError(f"body has {size_on_disk} bytes, expected {reservation.size}")
            value = encode(entry)
            os.rename(reservation.path, body)
            progress.remove(reservation.path)
            slot = key_digest(key)
            assert self._inserter is not None
            if not insert_row(self._inserter, slot, value, reservation.charged):
                self._drop(slot)  # a concurrent fill of the same key committed first
                self._require_index().set(slot, value, tag=reservation.charged)
            insert_part(self._inserter, key, slot)
        except (OSError, ValueError, sqlite3.Error, diskcache.Timeout) as e:
            for path in (body, reservation.path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            raise StoreError(f"cannot commit an object: {_describe(e)}") from e
        self.entries += 1
        self.used += reservation.charged
        return entry

    def report_failure(self, why: str) -> None:
        """A write into the buffer failed: stop admitting for FAILURE_BACKOFF seconds."""
        self._refuse_until = time.monotonic() + FAILURE_BACKOFF
        self._failure = why

    def abort(self, reservation: Reservation) -> None:
        """Forget a fill that will not complete; its partial body is deleted."""
        if reservation.settled:
            return
        reservation.settled = True
        self.reserved -= reservation.charged
        # A buffer that refuses the unlink (read-only) is cleaned at the next start.
        with contextlib.suppress(OSError):
            progress.mark_failed(reservation.path)
            progress.remove(reservation.path)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(reservation.path)

    def remove_partials(self, worker: int) -> None:
        """Delete the partial bodies of a worker's small fills (it died)."""
        suffix = worker_partial("", worker)
        with contextlib.suppress(OSError):
            for partial in os.scandir(self._partial):
                if partial.name.endswith(suffix):
                    with contextlib.suppress(OSError):
                        os.unlink(partial.path)

    def remove(self, key: str) -> None:
        """Delete one object (evicted, stale or corrupt)."""
        self._drop(key_digest(key))

    def _drop(self, slot: bytes) -> None:
        """Delete the object whose index key is `slot`."""
        try:
            value, charged = self._require_index().pop(slot, tag=True)
        except (OSError, sqlite3.Error, diskcache.Timeout) as e:
            self._changed(slot)  # whatever happened, workers look again
            raise StoreError(f"cannot remove an object: {_describe(e)}") from e
        if value is None:
            return
        self.entries -= 1
        self.used -= charged if isinstance(charged, int) else 0
        self._changed(slot)
        entry = decode(value) if isinstance(value, bytes) else None
        if entry is not None:
            # Unlinking a large tmpfs file takes tens of milliseconds: not on the event
            # loop. Readers that still have it open keep reading it.
            _JANITOR.submit(_unlink_quietly, self.objects_dir / entry.file)

    def update(
        self,
        key: str,
        file: str,
        headers: tuple[tuple[str, str], ...],
        generated_at: float,
        lifetime: float,
    ) -> None:
        """Record a stored object's fields and age after a 304 validated it; nothing if
        the object was replaced or removed meanwhile."""
        slot = key_digest(key)
        index = self._require_index()
        try:
            value, charged = index.get(slot, tag=True)
            entry = decode(value) if isinstance(value, bytes) else None
            if entry is None or entry.file != file:
                return
            updated = entry._replace(headers=headers, generated_at=generated_at, lifetime=lifetime)
            index.set(slot, encode(updated), tag=charged)
        except (OSError, ValueError, sqlite3.Error, diskcache.Timeout) as e:
            raise StoreError(f"cannot write the index: {_describe(e)}") from e
        if headers != entry.headers:
            # Workers forget what they remember; an age alone they may overestimate.
            self._changed(slot)

    def close(self) -> None:
        if self._inserter is not None:
            self._inserter.close()
        if self._index is not None:
            self._index.close()

    # -- internals --------------------------------------------------------------------

    def recount(self) -> None:
        """Take the totals of what is stored from the index (its triggers keep them),
        after a worker that indexed objects itself died."""
        writer = self._inserter
        if writer is None:
            return
        try:
            ((self.used,),) = writer.execute("SELECT used FROM Buffer")
            ((self.entries,),) = writer.execute("SELECT value FROM Settings WHERE key = 'count'")
        except sqlite3.Error as e:
            raise StoreError(f"cannot read the index: {_describe(e)}") from e

    def _require_index(self) -> diskcache.Cache:
        if self._index is None:
            raise StoreError("the buffer is not open")
        return self._index


class Found(NamedTuple):
    """A stored object as a worker's index read finds it, with its index row (a tuple:
    one is made for every first hit)."""

    rowid: int
    entry: StoredObject


class Index:
    """A worker's view of the buffer: stored objects and their bodies, and the rows of
    its small fills (`insert`).

    It reads diskcache's table itself, on a read-only connection of its own: diskcache's
    `get` does not say which row an object is in, and the row says whether the object
    was found at start (see the module docstring).
    """

    def __init__(self, directory: Path) -> None:
        self._objects_dir = str(bodies_dir(directory))
        self.partial_dir = str(directory / "partial")
        self._directory = directory
        self._reader: sqlite3.Connection | None = None
        self._writer: sqlite3.Connection | None = None  # opened by the first `insert`
        self._block = 4096  # bytes: the file system's block, read at open

    def open(self) -> None:
        try:
            _open_index(self._directory).close()  # creates it if this worker is first
            self._reader = _connect(self._directory)
            self._block = os.statvfs(self._objects_dir).f_frsize or self._block
        except (OSError, sqlite3.Error, diskcache.Timeout) as e:
            raise StoreError(f"cannot open the buffer in {self._directory}: {e}") from e

    def find(self, key: str) -> Found | None:
        """The row stored under `key`, or None (a miss); StoreError if the index fails."""
        if self._reader is None:
            raise StoreError("the buffer is not open")
        try:
            found = self._reader.execute(
                "SELECT rowid, value FROM Cache WHERE key = ? AND raw = 1", (key_digest(key),)
            ).fetchone()
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"cannot read the index: {_describe(e)}") from e
        if found is None or not isinstance(found[1], bytes):
            return None
        entry = decode(found[1])
        return None if entry is None else Found(found[0], entry)

    def charge(self, size: int) -> int:
        return charge(size, self._block)

    def insert(self, key: str, entry: StoredObject, charged: int) -> None:
        """Index a new object whose body is in objects/ already, charged `charged` bytes
        (a worker's small fill: `keeper.Buffer`); StoreError if it cannot, or if `key`
        is stored already (claims make that a broken promise: nothing is replaced)."""
        try:
            if self._writer is None:
                self._writer = _connect(self._directory, write=True)
            slot = key_digest(key)
            inserted = insert_row(self._writer, slot, encode(entry), charged)
            if inserted:
                insert_part(self._writer, key, slot)
        except (OSError, ValueError, sqlite3.Error) as e:
            raise StoreError(f"cannot index an object: {_describe(e)}") from e
        if not inserted:
            raise StoreError("the object was stored meanwhile")

    def container(self, whole: str, first: int, last: int) -> str | None:
        """The key of a stored part of `whole` (`Parts`) that holds bytes `first` to
        `last`, the smallest if several do, or None; StoreError if the index fails."""
        if self._reader is None:
            raise StoreError("the buffer is not open")
        try:
            found = self._reader.execute(
                "SELECT Parts.part FROM Parts JOIN Cache ON Cache.key = Parts.slot"
                " AND Cache.raw = 1 WHERE Parts.whole = ? AND Parts.first <= ?"
                " AND Parts.last >= ? ORDER BY Parts.last - Parts.first LIMIT 1",
                (key_digest(whole), first, last),
            ).fetchone()
        except sqlite3.OperationalError as e:
            if _NO_PARTS in str(e):
                return None  # no part was ever stored (`insert_part` makes the table)
            raise StoreError(f"cannot read the index: {_describe(e)}") from e
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"cannot read the index: {_describe(e)}") from e
        return None if found is None else str(found[0])

    def body_path(self, entry: StoredObject) -> str:
        return f"{self._objects_dir}/{entry.file}"

    def open_body(self, entry: StoredObject) -> int:
        """A descriptor of a stored body (it stays readable even if evicted)."""
        try:
            return os.open(self.body_path(entry), os.O_RDONLY)
        except OSError as e:
            raise StoreError(f"cannot read a stored body: {_describe(e)}") from e

    def close(self) -> None:
        for connection in (self._reader, self._writer):
            if connection is not None:
                connection.close()


def charge(size: int, block: int) -> int:
    """The bytes a body of `size` bytes counts against the cap: whole `block`s, at least
    one (see the module docstring)."""
    return max(1, -(-size // block)) * block


def bodies_dir(directory: Path) -> Path:
    """The directory of the stored bodies in the buffer at `directory`."""
    return directory / "objects"


def body_name() -> str:
    """A new body's file name: 128 random bits in hex (16 bytes in its index value)."""
    return os.urandom(16).hex()


def worker_partial(name: str, worker: int) -> str:
    """The file name in partial/ of the small fill `name` of `worker` (`keeper.Buffer`):
    the keeper deletes a worker's own if it dies (`Store.remove_partials`)."""
    return f"{name}.w{worker}"


def insert_row(writer: sqlite3.Connection, slot: bytes, value: bytes, charged: int) -> bool:
    """Index a new object, as diskcache's `set` would (its triggers and ours keep the
    totals), in one statement: `set` takes six (a transaction, a look for the key, a
    cull), the cost of every miss. False if `slot` is indexed already. Every value is
    kept in its row (`_open_index`), where a worker reads it.
    """
    if len(value) >= _DISK_MIN_FILE_SIZE:
        raise ValueError("an index value too large for its row")
    now = time.time()
    try:
        writer.execute(
            "INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count,"
            " tag, size, mode, filename, value) VALUES (?, 1, ?, NULL, ?, 0, ?, ?, ?, NULL, ?)",
            (slot, now, now, charged, len(value), diskcache.core.MODE_RAW, value),
        )
    except sqlite3.IntegrityError:
        return False
    return True


def insert_part(writer: sqlite3.Connection, key: str, slot: bytes) -> None:
    """Record the object just indexed under `key` (its row `slot`) in `Parts` when it is
    a signed range's part of a whole (`endpoints.part_key`), so that a range of the whole
    inside it is found by `Index.container`; nothing for any other key."""
    rules = endpoints.rules(key)
    if rules.part is None or rules.whole is None:
        return
    row = (key_digest(rules.whole), rules.part.first, rules.part.last, key, slot)
    insert = "INSERT OR REPLACE INTO Parts(whole, first, last, part, slot) VALUES (?, ?, ?, ?, ?)"
    try:
        writer.execute(insert, row)
    except sqlite3.OperationalError as e:
        if _NO_PARTS not in str(e):
            raise
        # The first part this buffer stores: the table is made for it, so that an index
        # that holds none (most) is not a page larger per table for it.
        for statement in _PARTS:
            writer.execute(statement)
        writer.execute(insert, row)


def encode(entry: StoredObject) -> bytes:
    """An index value: `entry` packed (see _RECORD); ValueError for fields holding NUL."""
    fields = [part for field in entry.headers for part in field]
    text = "\0".join(fields)
    if text.count("\0") != max(len(fields) - 1, 0):
        raise ValueError("a response field holds NUL")
    record = _RECORD.pack(
        bytes.fromhex(entry.file),
        bytes.fromhex(entry.digest),
        entry.size,
        entry.stored_at,
        entry.generated_at,
        entry.lifetime,
        entry.uniform,
    )
    return record + text.encode("utf-8", "surrogatepass")


def decode(encoded: bytes) -> StoredObject | None:
    """The StoredObject of an index value, or None for anything else."""
    try:
        file, digest, size, stored_at, generated_at, lifetime, uniform = _RECORD.unpack_from(
            encoded
        )
        text = encoded[_RECORD.size :].decode("utf-8", "surrogatepass")
    except (struct.error, UnicodeDecodeError):
        return None
    fields = text.split("\0") if text else []
    if len(fields) % 2:
        return None
    # One iterator twice pairs names and values without slicing (a worker decodes a
    # record on every first hit); their number is even, checked above.
    names_and_values = iter(fields)
    headers = tuple(zip(names_and_values, names_and_values, strict=False))
    return StoredObject(
        file.hex(), size, digest.hex(), headers, stored_at, generated_at, lifetime, uniform
    )


def check_body(fd: int, entry: StoredObject) -> None:
    """Raise Corrupt unless the body open as `fd` has the size and digest of `entry`."""
    try:
        sound = native.body_matches(fd, entry.size, entry.digest)
    except OSError as e:
        raise Corrupt(f"cannot read a stored body: {_describe(e)}") from e
    if not sound:
        raise Corrupt("a stored body does not match its digest")


def _open_index(directory: Path) -> diskcache.Cache:
    return diskcache.Cache(
        str(directory / "index"),
        eviction_policy="none",  # eviction is ours: see the module docstring
        size_limit=2**62,
        timeout=_INDEX_TIMEOUT,
        statistics=False,
        tag_index=False,  # the totals are kept by triggers: see the module docstring
        disk_min_file_size=_DISK_MIN_FILE_SIZE,
        sqlite_cache_size=-SQLITE_CACHE_KIB,  # negative: KiB rather than pages
        sqlite_mmap_size=0,
    )


@functools.lru_cache(maxsize=1024)
def key_digest(key: str) -> bytes:
    """The index's key for a cache key: a digest of fixed size, however long the URL,
    the one the core's table of answers finds the key by (`native.key_digest`: BLAKE2b
    of 16 bytes). Remembered for the last keys: a miss asks for its key's four times (the
    lookup, the claim, the commit, the row)."""
    return native.key_digest(key.encode("utf-8", "surrogatepass"))


def _adopt(connection: sqlite3.Connection, rules: str) -> bool:
    """Make the index one of FORMAT, written under `rules` (`policy.Uniform.rules`), that
    keeps its totals (see the module docstring); False if it held rows of another format
    or rules: they are dropped with diskcache's table, which the caller has diskcache
    make anew before adopting it again."""
    try:
        ((found_format, found_rules),) = connection.execute("SELECT format, rules FROM Buffer")
    except (sqlite3.OperationalError, ValueError):
        found_format = found_rules = None
    if (found_format, found_rules) == (FORMAT, rules):
        return True
    connection.execute("BEGIN IMMEDIATE")
    try:
        ((other,),) = connection.execute("SELECT EXISTS (SELECT 1 FROM Cache)")
        connection.execute("DROP TABLE IF EXISTS Buffer")
        if other:
            connection.execute("DROP TABLE Cache")  # its indexes and triggers with it
            connection.execute("DROP TABLE IF EXISTS Parts")
            connection.execute("UPDATE Settings SET value = 0 WHERE key IN ('count', 'size')")
        else:
            for statement in _TOTALS:
                connection.execute(statement)
            connection.execute("INSERT INTO Buffer VALUES (?, 0, ?)", (FORMAT, rules))
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    return not other


# The `Buffer` table (the index's format and rules, and its total of the bytes charged)
# and the triggers that keep that total (of each row's `tag`) in the transaction of each
# change to the index.
_TOTALS = (
    "CREATE TABLE Buffer (format INTEGER NOT NULL, used INTEGER NOT NULL, rules TEXT NOT NULL)",
    "CREATE TRIGGER IF NOT EXISTS Buffer_used_insert AFTER INSERT ON Cache BEGIN"
    " UPDATE Buffer SET used = used + IFNULL(NEW.tag, 0); END",
    "CREATE TRIGGER IF NOT EXISTS Buffer_used_delete AFTER DELETE ON Cache BEGIN"
    " UPDATE Buffer SET used = used - IFNULL(OLD.tag, 0); END",
    "CREATE TRIGGER IF NOT EXISTS Buffer_used_update AFTER UPDATE OF tag ON Cache BEGIN"
    " UPDATE Buffer SET used = used + IFNULL(NEW.tag, 0) - IFNULL(OLD.tag, 0); END",
)
# The parts of wholes that signed ranges name (`insert_part`, which makes them with the
# first part stored), by the digest of the whole's key; a row goes with its object's. A
# row a crash left without its object (or with another object of the same key) finds
# nothing that is not indexed: the lookup joins the index, and the part's own key names
# its range.
_NO_PARTS = "no such table: Parts"
_PARTS = (
    "CREATE TABLE IF NOT EXISTS Parts (whole BLOB NOT NULL, first INTEGER NOT NULL,"
    " last INTEGER NOT NULL, part TEXT NOT NULL, slot BLOB NOT NULL,"
    " PRIMARY KEY (whole, first, last)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS Parts_slot ON Parts(slot)",
    "CREATE TRIGGER IF NOT EXISTS Parts_gone AFTER DELETE ON Cache BEGIN"
    " DELETE FROM Parts WHERE slot = OLD.key; END",
)


def _create_partial(path: str) -> None:
    """An empty partial body and its progress record, made by the keeper so that
    readers in any worker can open them at once."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    progress.create(path)


def _connect(
    directory: Path, write: bool = False, timeout: float = _INDEX_TIMEOUT
) -> sqlite3.Connection:
    """A read-only connection to the index (or a writing one, in autocommit mode and as
    durable as diskcache's own), with the page cache of `_open_index`."""
    uri = f"file:{directory / 'index' / diskcache.core.DBNAME}?mode={'rw' if write else 'ro'}"
    connection = sqlite3.connect(
        uri,
        uri=True,
        timeout=timeout,
        check_same_thread=False,
        isolation_level=None if write else "DEFERRED",
    )
    connection.execute(f"PRAGMA cache_size = -{SQLITE_CACHE_KIB}")
    connection.execute("PRAGMA mmap_size = 0")
    if write:
        connection.execute("PRAGMA synchronous = NORMAL")  # diskcache's: WAL, no fsync per row
    return connection


@contextlib.contextmanager
def _reader(directory: Path) -> Iterator[sqlite3.Connection]:
    connection = _connect(directory)
    try:
        yield connection
    finally:
        connection.close()


@contextlib.contextmanager
def _writer(directory: Path) -> Iterator[sqlite3.Connection]:
    """A connection that may change the index, in explicit transactions only; it waits
    for the lock as long as diskcache's own start does (workers open it meanwhile)."""
    connection = _connect(directory, write=True, timeout=_OPEN_TIMEOUT)
    try:
        yield connection
    finally:
        connection.close()


# An index row as the background check reads it: rowid, key, raw, value.
_Row = tuple[int, bytes, int, object]


@dataclass(frozen=True)
class _Checked:
    """One batch of the background check: its last rowid, how many rows it read, the
    (key, rowid) of those whose body does not match, and the rows of uniform objects
    whose body does."""

    last: int
    count: int
    corrupt: list[tuple[bytes, int]]
    uniform: list[tuple[_Row, StoredObject]]


def _next_rows(reader: sqlite3.Connection, after: int, through: int) -> list[_Row]:
    """The next batch of rows found at start, in rowid order (none: all read)."""
    rows: list[_Row] = reader.execute(
        "SELECT rowid, key, raw, value FROM Cache WHERE rowid > ? AND rowid <= ?"
        " ORDER BY rowid LIMIT ?",
        (after, through, _CHECK_BATCH),
    ).fetchall()
    return rows


def _check_rows(objects_dir: str, rows: list[_Row]) -> _Checked:
    """Check the bodies of a batch of rows (run in a thread: the core reads and hashes
    them without the GIL, `native.bodies_match`)."""
    corrupt = []
    found = []
    for row in rows:
        rowid, key, raw, value = row
        entry = decode(value) if raw == 1 and isinstance(value, bytes) else None
        if entry is None:
            corrupt.append((key, rowid))  # not an object of ours: dropped as corrupt
        else:
            found.append((row, entry))
    matched = native.bodies_match(
        objects_dir, [(entry.file, entry.size, entry.digest) for _, entry in found]
    )
    uniform = []
    for (row, entry), sound in zip(found, matched, strict=True):
        if not sound:
            corrupt.append((row[1], row[0]))
        elif entry.uniform:
            uniform.append((row, entry))
    return _Checked(rows[-1][0], len(rows), corrupt, uniform)


def _unchanged(
    reader: sqlite3.Connection, checked: list[tuple[_Row, StoredObject]]
) -> list[Verified]:
    """The objects of the rows `checked` still indexed as they were read: same key, same
    row, same value (a 304 rewrites the value in place; an `lru` use moves the row, and
    a removal drops it). One query for the batch."""
    read = {row[0]: (row[1], row[3], entry) for row, entry in checked}
    marks = ",".join("?" * len(read))
    now = reader.execute(
        f"SELECT rowid, key, value FROM Cache WHERE rowid IN ({marks})",  # noqa: S608
        tuple(read),
    ).fetchall()
    found = []
    for rowid, key, value in now:
        was = read.get(rowid)
        if was is not None and was[:2] == (key, value):
            found.append(Verified(key, was[2]))
    return found


def _in_background() -> None:
    """Lower the priority of the calling thread (Linux schedules threads one by one)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        # Left for the next start, which deletes bodies the index does not know.
        logger.warning("buffer: cannot delete a removed body: %s", e)


def _describe(error: BaseException) -> str:
    return str(error) or type(error).__name__  # diskcache.Timeout has no message


def _sweep(directory: Path, opened_at: float, entries: int) -> int:
    """Delete bodies older than `opened_at` that no object refers to (left by a crash
    between writing a body and indexing it, or by a failed unlink); how many.

    Run in a background thread once the check is done. Bodies written since `opened_at`
    may not be indexed yet, so they stay; every older one that an object still refers to
    is in one snapshot of the index. The names seen there go into a Bloom filter of 64
    bits per object (8 MB for a million, where a set of names would take ~100 MB), so
    about one leftover in a thousand is kept until a later start; a referenced body never
    goes. A name is the first bytes of its record (`_RECORD`), read as SQLite cuts them
    out: decoding a million records took seconds of a core the workers' hits want.

    Most starts find no leftover, and counting the bodies tells (a tenth of a second for
    a million): objects/ then holds no more of them than there are objects (`entries`,
    counted before; objects removed since only make the count smaller, and a leftover
    then waits for a later start).
    """
    with os.scandir(bodies_dir(directory)) as bodies:
        if sum(1 for _ in bodies) <= entries:
            return 0
    bits = 1 << max(16, (64 * entries).bit_length())
    seen = bytearray(bits // 8)
    with _reader(directory) as reader:
        for (name,) in reader.execute("SELECT substr(value, 1, ?) FROM Cache", (_NAME_BYTES,)):
            if isinstance(name, bytes) and len(name) == _NAME_BYTES:
                for slot in _slots(int.from_bytes(name), bits):
                    seen[slot >> 3] |= 1 << (slot & 7)
    removed = 0
    for body in os.scandir(bodies_dir(directory)):
        slots: tuple[int, ...]
        try:
            slots = _slots(int(body.name, 16), bits)
        except ValueError:
            slots = ()  # not a body's name: nothing refers to it
        if slots and all(seen[slot >> 3] & (1 << (slot & 7)) for slot in slots):
            continue
        with contextlib.suppress(OSError):
            if body.stat(follow_symlinks=False).st_ctime < opened_at:
                os.unlink(body.path)
                removed += 1
    return removed


def _slots(number: int, bits: int) -> tuple[int, int]:
    """Two Bloom filter positions of a body named by `number` (`body_name`: random bits)."""
    return number % bits, (number >> 80) % bits
