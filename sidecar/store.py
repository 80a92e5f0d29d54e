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
can never overshoot the cap together.

Entries found at start (a restarted sidecar on the same emptyDir) are only served
once their body has been checked against the size and SHA-256 recorded at commit;
until then they are tagged `unverified` in the index and count as misses. The check
runs in the background so that the sidecar is ready at once.

Two sides share the directory: `Store`, in the parent process, is the one writer of
the index and keeps the accounting (cap, reservations, recency); `Index`, in every
worker, only reads it to answer hits. diskcache's SQLite index (WAL mode) is made
for several processes: a worker sees an object as soon as its commit is written.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import logging
import os
import shutil
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import diskcache

from sidecar import progress
from sidecar.settings import Eviction

logger = logging.getLogger(__name__)

# Bytes hashed per read when verifying a body after a restart.
_VERIFY_CHUNK = 1024 * 1024
# diskcache waits this long for SQLite's lock before raising Timeout. Index calls run
# on the event loop and only the parent writes the index, so a lock held longer
# means something is wrong: fail open quickly rather than stall every client.
_INDEX_TIMEOUT = 0.25  # seconds
# The index tag of an entry found at start whose body is not checked yet.
UNVERIFIED = "unverified"
# Deletes removed bodies off the event loop, in order.
_JANITOR = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="unlink")
# After a failed write (disk full, read-only), admit nothing for this long: downloads
# pass through once instead of failing into the buffer and resuming upstream each time.
FAILURE_BACKOFF = 30.0  # seconds


class StoreError(Exception):
    """The buffer could not do what was asked (disk full, read-only, corrupt index)."""


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


@dataclass(frozen=True)
class StoredObject:
    """What the index records for one complete, committed object."""

    file: str  # body file name inside objects/
    size: int  # body bytes (== Content-Length of the stored 200 response)
    sha256: str  # hex digest of the body, computed while filling
    headers: tuple[tuple[str, str], ...]  # end-to-end response headers to replay
    stored_at: float  # time.time() of the commit
    # time.time() the origin generated or last validated it (`policy.generated_at`);
    # objects stored by an earlier version count from their commit.
    generated_at: float = 0.0
    # Seconds it stays fresh (`policy.freshness_lifetime`), for --http-freshness hosts.
    lifetime: float = 0.0

    @property
    def born(self) -> float:
        return self.generated_at or self.stored_at


class Reservation:
    """Room for one fill: `size` bytes held against the cap until commit or abort."""

    def __init__(self, store: Store, size: int, path: Path) -> None:
        self.store = store
        self.size = size
        self.path = path
        self.settled = False


class Store:
    """The buffer directory with a hard cap and an admission policy."""

    def __init__(
        self,
        directory: Path,
        capacity: int,
        eviction: Eviction,
        changed: Callable[[], None] = lambda: None,
    ) -> None:
        """`changed()` is called after each object is removed from the index or has its
        fields changed."""
        self.directory = directory
        self._changed = changed
        self.capacity = capacity
        self.eviction = eviction
        self.objects_dir = directory / "objects"
        self.partial_dir = directory / "partial"
        self.used = 0  # bytes of committed bodies
        self.reserved = 0  # bytes held by fills in progress
        # key -> size, least recently used first (for `lru` and for accounting).
        self._recency: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._unverified: set[str] = set()
        self._index: diskcache.Cache | None = None
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
            self._index = _open_index(self.directory)
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
        index = self._require_index()
        referenced: set[str] = set()
        for key in list(index.iterkeys()):
            entry = index.get(key)
            body = self.objects_dir / entry.file if isinstance(entry, StoredObject) else None
            if body is None or not body.is_file() or body.stat().st_size != entry.size:
                logger.warning("buffer: dropping an index entry whose body is missing or short")
                index.delete(key)
                continue
            referenced.add(entry.file)
            index.set(key, entry, tag=UNVERIFIED)
            self._recency[key] = entry.size
            self._unverified.add(key)
            self.used += entry.size
        for body in self.objects_dir.iterdir():
            if body.name not in referenced:
                body.unlink(missing_ok=True)
        if self._recency:
            logger.info(
                "buffer: found %d objects (%d bytes) from before a restart; verifying them",
                len(self._recency),
                self.used,
            )

    async def verify_existing(self) -> None:
        """Check every entry found at start against its recorded size and digest."""
        if self._open_failure is not None or not self._unverified:
            return
        for key in list(self._unverified):
            try:
                entry = self._get(key)
                ok = entry is not None and await asyncio.to_thread(
                    _body_matches, self.objects_dir / entry.file, entry
                )
                if key not in self._unverified:
                    continue  # a new fill of the key committed meanwhile
                self._unverified.discard(key)
                if ok and entry is not None:
                    self._set(key, entry)  # drops the tag: workers may serve it now
                else:
                    logger.warning("buffer: dropping an object that does not match its digest")
                    self.remove(key)
            except StoreError as e:
                logger.warning("buffer: cannot verify an object, dropping it: %s", e)
                self._recency.pop(key, None)
                self._unverified.discard(key)
        logger.info("buffer: verified; %d objects ready", len(self._recency))

    # -- accounting ---------------------------------------------------------------------

    def touch(self, keys: list[str]) -> None:
        """Objects just served: the most recently used now (for `lru`)."""
        for key in keys:
            if key in self._recency:
                self._recency.move_to_end(key)

    def holds(self, key: str) -> bool:
        """Is `key` stored, complete and verified (workers serve it)?"""
        return key in self._recency and key not in self._unverified

    @property
    def entries(self) -> int:
        return len(self._recency)

    @property
    def unverified(self) -> int:
        return len(self._unverified)

    # -- admission, commit, abort -------------------------------------------------------

    def reserve(self, size: int, evict: bool = True) -> Reservation | None:
        """Hold room for a `size`-byte fill, or None if the policy admits no more;
        without `evict`, only room that is free now.

        None is not an error: the object is then passed through uncached.
        """
        if size > self.capacity:
            return None
        if self.eviction == "lru" and evict:
            self._evict_until_free(size)
        if self.used + self.reserved + size > self.capacity:
            return None
        reservation = Reservation(self, size, self.partial_dir / uuid.uuid4().hex)
        try:
            try:
                _create_partial(reservation.path)
            except FileNotFoundError:
                # Someone emptied the buffer directory under us: start again.
                self.partial_dir.mkdir(parents=True, exist_ok=True)
                self.objects_dir.mkdir(parents=True, exist_ok=True)
                _create_partial(reservation.path)
        except OSError as e:
            with contextlib.suppress(OSError):
                reservation.path.unlink(missing_ok=True)
            raise StoreError(f"cannot create a partial body: {_describe(e)}") from e
        self.reserved += size
        return reservation

    def resize(self, reservation: Reservation, size: int) -> None:
        """Hold `size` bytes for a fill instead of what it reserved (never more: room
        is only ever taken by `reserve`)."""
        if reservation.settled or size > reservation.size:
            raise StoreError(f"cannot grow a reservation of {reservation.size} bytes to {size}")
        self.reserved -= reservation.size - size
        reservation.size = size

    def _evict_until_free(self, size: int) -> None:
        while self._recency and self.used + self.reserved + size > self.capacity:
            victim = next(iter(self._recency))
            logger.info("buffer: evicting the least recently used object to admit a new one")
            self.remove(victim)

    def commit(
        self,
        reservation: Reservation,
        key: str,
        sha256: str,
        headers: tuple[tuple[str, str], ...],
        generated_at: float,
        lifetime: float,
    ) -> StoredObject:
        """Make a complete fill servable: move its body into objects/ and index it."""
        if reservation.settled:
            raise StoreError("reservation already settled")
        reservation.settled = True
        self.reserved -= reservation.size
        name = reservation.path.name
        entry = StoredObject(
            name, reservation.size, sha256, headers, time.time(), generated_at, lifetime
        )
        try:
            size_on_disk = reservation.path.stat().st_size
            if size_on_disk != reservation.size:
                raise StoreError(f"body has {size_on_disk} bytes, expected {reservation.size}")
            os.rename(reservation.path, self.objects_dir / name)
            progress.remove(reservation.path)
            if key in self._recency:
                self.remove(key)  # a concurrent fill of the same key committed first
            self._require_index().set(key, entry)
        except (OSError, sqlite3.Error, diskcache.Timeout) as e:
            (self.objects_dir / name).unlink(missing_ok=True)
            reservation.path.unlink(missing_ok=True)
            raise StoreError(f"cannot commit an object: {_describe(e)}") from e
        self._recency[key] = entry.size
        self.used += entry.size
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
        self.reserved -= reservation.size
        # A buffer that refuses the unlink (read-only) is cleaned at the next start.
        with contextlib.suppress(OSError):
            progress.mark_failed(reservation.path)
            progress.remove(reservation.path)
            reservation.path.unlink(missing_ok=True)

    def remove(self, key: str) -> None:
        """Delete one object (evicted, stale or corrupt)."""
        size = self._recency.pop(key, None)
        self._unverified.discard(key)
        if size is None:
            return
        self.used -= size
        entry = self._get(key)
        try:
            self._require_index().delete(key)
        except (sqlite3.Error, diskcache.Timeout) as e:
            raise StoreError(f"cannot remove an object: {_describe(e)}") from e
        finally:
            self._changed()
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
        entry = self._get(key)
        if entry is None or entry.file != file or key in self._unverified:
            return
        self._set(
            key,
            dataclasses.replace(
                entry, headers=headers, generated_at=generated_at, lifetime=lifetime
            ),
        )
        if headers != entry.headers:
            # Workers forget what they remember; an age alone they may overestimate.
            self._changed()

    def close(self) -> None:
        if self._index is not None:
            self._index.close()

    # -- internals --------------------------------------------------------------------

    def _require_index(self) -> diskcache.Cache:
        if self._index is None:
            raise StoreError("the buffer is not open")
        return self._index

    def _get(self, key: str) -> StoredObject | None:
        try:
            entry = self._require_index().get(key)
        except (OSError, sqlite3.Error, diskcache.Timeout) as e:
            raise StoreError(f"cannot read the index: {_describe(e)}") from e
        return entry if isinstance(entry, StoredObject) else None

    def _set(self, key: str, entry: StoredObject) -> None:
        try:
            self._require_index().set(key, entry)
        except (OSError, sqlite3.Error, diskcache.Timeout) as e:
            raise StoreError(f"cannot write the index: {_describe(e)}") from e


class Index:
    """A worker's read-only view of the buffer: stored objects and their bodies."""

    def __init__(self, directory: Path) -> None:
        self._objects_dir = str(directory / "objects")
        self._directory = directory
        self._index: diskcache.Cache | None = None

    def open(self) -> None:
        try:
            self._index = _open_index(self._directory)
        except (OSError, sqlite3.Error, diskcache.Timeout) as e:
            raise StoreError(f"cannot open the buffer in {self._directory}: {e}") from e

    def lookup(self, key: str) -> StoredObject | None:
        """The complete, verified object stored under `key`, or None (a miss)."""
        if self._index is None:
            raise StoreError("the buffer is not open")
        try:
            entry, tag = self._index.get(key, tag=True)
        except (OSError, sqlite3.Error, diskcache.Timeout) as e:
            raise StoreError(f"cannot read the index: {_describe(e)}") from e
        if tag == UNVERIFIED or not isinstance(entry, StoredObject):
            return None
        return entry

    def open_body(self, entry: StoredObject) -> int:
        """A descriptor of a stored body (it stays readable even if evicted)."""
        try:
            return os.open(os.path.join(self._objects_dir, entry.file), os.O_RDONLY)
        except OSError as e:
            raise StoreError(f"cannot read a stored body: {_describe(e)}") from e

    def close(self) -> None:
        if self._index is not None:
            self._index.close()


def _open_index(directory: Path) -> diskcache.Cache:
    return diskcache.Cache(
        str(directory / "index"),
        eviction_policy="none",  # eviction is ours: see the module docstring
        size_limit=2**62,
        timeout=_INDEX_TIMEOUT,
        statistics=False,
    )


def _create_partial(path: Path) -> None:
    """An empty partial body and its progress record, made by the keeper so that
    readers in any worker can open them at once."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    progress.create(path)


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        # Left for the next start, which deletes bodies the index does not know.
        logger.warning("buffer: cannot delete a removed body: %s", e)


def _describe(error: BaseException) -> str:
    return str(error) or type(error).__name__  # diskcache.Timeout has no message


def _body_matches(path: Path, entry: StoredObject) -> bool:
    digest = hashlib.sha256()
    size = 0
    try:
        with open(path, "rb") as body:
            while chunk := body.read(_VERIFY_CHUNK):
                digest.update(chunk)
                size += len(chunk)
    except OSError:
        return False
    return size == entry.size and digest.hexdigest() == entry.sha256
