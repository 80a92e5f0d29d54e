"""The buffer's keeper (in the parent process) and each worker's handle on it.

Workers answer hits on their own: they read the index and the body files directly
(`store.Index`). Everything that changes the buffer goes through the keeper, the
one writer of the index, so that every guarantee of a single process holds across
workers:

- one upstream fetch per object: a worker *claims* a key before fetching it; whoever
  claims a key already being fetched joins that fill, in whichever worker it runs
  (its partial body and progress record are in the buffer directory);
- the `--buffer-size` cap and the `none`/`lru` policy: reservations, commits and
  evictions happen here, in order (`store.Store`);
- a crashed worker's fills are failed and their room returned (`worker_gone`), so
  nothing it half-wrote is ever served.

Calls and their replies (`sidecar.ipc`):

| call | reply |
| --- | --- |
| `claim {key, since}` | `{begin}` (fetch it; see below), `{join: fill}`, `{stored}`, `{declined}` |
| `start_fill {key, size, head}` | `{rid, path}` or `{refused: reason}` |
| `start_unsized {key}` | `{rid, path, size}` (room of UNSIZED_ROOM bytes) or `{refused: reason}` |
| `grow {rid, size}` | `{}` or `{refused: reason}` |
| `commit {rid key size sha256 headers generated_at lifetime}` | `{}`, `{error}`, `{invalidated}` |
| `invalidate {keys}` | `{}` once the objects are gone and their fills will not commit |
| `update {key, file, headers, generated_at, lifetime}` (after a 304) | `{}` once recorded |

Notifications: `decline {key, reason}`, `abort {rid}`, `remove {key}`, `failure {}`,
`touch {keys}`.

Most objects are small, and a miss waits for every round trip it makes here (each
costs both processes a wake-up). So a `begin` comes with room for an object of up to
PROVISIONAL bytes, held against the cap like any fill's (`rid`, `path`). A body that
fits is stored there without a word to the keeper until its commit, which says its
size: its miss costs two round trips (claim, commit) and nothing else. Nobody follows
such a fill while it runs: its readers get it whole at its end anyway
(`fill.WHOLE_AT_END`), so a claim of the same key from another worker waits for
the commit and is answered `stored` and `joined` (it counts as coalesced, and is
served from the buffer), and its partial body is made by the
worker with no progress record. A larger body asks with `start_fill`, which returns
the provisional room first; a declined one returns it with `decline`. Provisional
room is only ever free room, and only while at least as much stays free besides: so
it never makes `lru` evict, and never turns away an object that fits in half the room
that is free (near a full buffer, every claim takes the three round trips).

A body whose length only its end tells (chunked, or delimited by the connection's
close) is a fill of its own kind (`start_unsized`): its room grows as it is written
(`grow`), and nobody joins it: requests for its key pass (UNSIZED) until it ends. A
joiner follows the partial body, but this one may outgrow its room and be abandoned
half-written, and the rest of it is then nowhere a joiner could read it: the origin's
stream is read in one worker, at its one client's pace, and a body of unknown length
cannot be resumed elsewhere with a Range.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from sidecar import ipc
from sidecar.buffer.store import (
    Corrupt,
    Index,
    Reservation,
    Store,
    StoredObject,
    StoreError,
    check_body,
)
from sidecar.ipc import Message
from sidecar.metrics import Metrics
from sidecar.shared import Shared

logger = logging.getLogger(__name__)

# The pass reason of objects not stored because the buffer does not work (see /stats).
BUFFER_UNAVAILABLE = "buffer-unavailable"
# The pass reason of requests for a URL written to while its fill was running.
INVALIDATED = "invalidated"
# The pass reason of requests for a URL whose body of unknown length is being stored.
UNSIZED = "filling-unsized"
# Served keys are reported to the keeper (for `lru`) at most this often.
TOUCH_INTERVAL = 0.5  # seconds
# Room held for the fill of a claim that begins, until its size is known: nine in ten
# of an ImageNet-like set's files fit in it.
PROVISIONAL = 256 * 1024  # bytes
# Keys of the latest commits, remembered so that a claim seldom needs an index query
# to know whether its key was stored since the worker looked it up (`Shared.commits`).
RECENT_COMMITS = 4096
# Room a fill of unknown length starts with (it grows as the body comes): as much as a
# claim's provisional room, so that near a full buffer it is turned away no sooner.
UNSIZED_ROOM = PROVISIONAL  # bytes
# Bytes a worker spends remembering stored objects (so that a hit costs no SQLite
# query and no decoding): about 1.2 KB each with three response fields (`_cost`).
REMEMBERED_BYTES = 16 * 2**20
# Bytes of Python objects around a remembered StoredObject and each of its fields,
# measured with tracemalloc (a dict slot, _Known, the object, its hex strings; a tuple
# and two strings' headers per field).
_REMEMBERED_OVERHEAD = 600
_FIELD_OVERHEAD = 150
# An object found at start that nobody has checked yet is hashed before its first hit:
# at once when it is this small (a millisecond), else in a thread.
CHECK_AT_ONCE = 1024 * 1024  # bytes


@dataclass
class _Claim:
    """A key being fetched by one worker."""

    owner: int
    waiters: list[asyncio.Future[Message]] = field(default_factory=list)
    fill: Message | None = None  # what joiners need, once the body is being stored
    rid: str | None = None  # its room: provisional while `fill` is None
    # A write made what this fill fetches stale: it gets no new readers and is not
    # committed; requests for the key pass until it ends.
    invalidated: bool = False
    unsized: bool = False  # a body of unknown length: nobody joins it (see above)


class Keeper:
    """The registry of fills and the buffer's accounting, for every worker."""

    def __init__(
        self,
        store: Store,
        invalidated: Callable[[], None] = lambda: None,
        committed: Callable[[], None] = lambda: None,
    ) -> None:
        """`invalidated()` is called after each invalidation (`Shared.bump_invalidations`),
        `committed()` once each new object is in the index (`Shared.bump_commits`)."""
        self.store = store
        self._invalidated = invalidated
        self._committed = committed
        self._commits = 0  # as `Shared.commits`
        # The latest commit of each recent key; every commit from `_recent_from` on is here.
        self._recent: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._recent_from = 1
        # The buffer trouble met here (a worker counts its own in its Metrics).
        self.metrics = Metrics()
        self._claims: dict[str, _Claim] = {}
        self._reservations: dict[str, tuple[int, str, Reservation]] = {}
        self._provisional: set[str] = set()  # reservations of PROVISIONAL bytes, by rid

    def state(self) -> str:
        """The buffer's state for /stats: `available`, or `unavailable: <why>`."""
        why = self.store.unavailable
        return "available" if why is None else f"unavailable: {why}"

    def gauges(self) -> dict[str, int]:
        return {
            "buffer_available": int(self.store.unavailable is None),
            "entries": self.store.entries,
            "unverified_entries": self.store.unverified,
            "buffer_bytes": self.store.used,
            "reserved_bytes": self.store.reserved,
            "capacity_bytes": self.store.capacity,
            "fills_in_progress": len(self._reservations),
        }

    async def handle(self, worker: int, message: Message) -> Message | None:
        op = message["op"]
        if op == "claim":
            return await self._claim(worker, message["key"], message.get("since"))
        if op == "start_fill":
            return self._start_fill(worker, message["key"], message["size"], message["head"])
        if op == "start_unsized":
            return self._start_unsized(worker, message["key"])
        if op == "grow":
            return self._grow(message["rid"], message["size"])
        if op == "commit":
            return self._commit(message)
        if op == "invalidate":
            return self._invalidate(message["keys"])
        if op == "update":
            self._update(message)
            return {}
        if op == "decline":
            self._settle(message["key"], worker, {"declined": message["reason"]})
        elif op == "abort":
            self._abort(message["rid"])
        elif op == "remove":
            self._remove(message["key"])
        elif op == "failure":
            self.store.report_failure(message["why"])
        elif op == "touch":
            self._touch(message["keys"])
        else:
            raise ValueError(f"unknown operation {op!r}")
        return None

    def worker_gone(self, worker: int) -> None:
        """Fail the fills of a worker that died; return their room."""
        for key, claim in list(self._claims.items()):
            if claim.owner == worker:
                self._settle(key, worker, {"declined": "worker-died"})
        for rid, (owner, _, _) in list(self._reservations.items()):
            if owner == worker:
                self._abort(rid)

    # -- operations ---------------------------------------------------------------------

    async def _claim(self, worker: int, key: str, since: int | None) -> Message:
        claim = self._claims.get(key)
        if claim is None:
            if self._stored_since(key, since):
                # Committed after the worker looked it up: one fetch per object still.
                return {"stored": True}
            claim = self._claims[key] = _Claim(worker)
            reservation = self._provisional_room()
            if reservation is None:
                return {"begin": True}
            rid = claim.rid = reservation.name
            self._reservations[rid] = (worker, key, reservation)
            self._provisional.add(rid)
            return {"begin": True, "rid": rid, "path": reservation.path}
        if claim.invalidated:
            return {"declined": INVALIDATED}
        if claim.unsized:
            return {"declined": UNSIZED}
        if claim.fill is not None:
            return {"join": claim.fill}
        waiter: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        claim.waiters.append(waiter)
        return await waiter

    def _stored_since(self, key: str, since: int | None) -> bool:
        """Is `key` stored, for a worker whose lookup missed it after `since` commits
        (None: unknown)? Only a commit since then can have stored it (and the index
        says whether it is still there)."""
        if since is not None and since + 1 >= self._recent_from:
            if self._recent.get(key, 0) <= since:
                return False
        return self.store.holds(key)

    def _note_commit(self, key: str) -> None:
        """`key` is in the index now (see `_stored_since`)."""
        self._commits += 1
        self._recent.pop(key, None)
        self._recent[key] = self._commits
        if len(self._recent) > RECENT_COMMITS:
            self._recent_from = self._recent.popitem(last=False)[1] + 1
        self._committed()

    def _start_fill(self, worker: int, key: str, size: int, head: Message) -> Message:
        claimed = self._claims.get(key)
        if claimed is not None and claimed.invalidated:
            return {"refused": INVALIDATED}  # the worker's decline settles the claim
        self._return_provisional(claimed)  # too large for it
        reservation, reason = self._reserve(size, followed=True)
        if reservation is None:
            self._settle(key, worker, {"declined": reason})
            return {"refused": reason}
        rid = reservation.name
        self._reservations[rid] = (worker, key, reservation)
        self._announce(self._claims.setdefault(key, _Claim(worker)), rid, reservation, head)
        return {"rid": rid, "path": reservation.path}

    def _start_unsized(self, worker: int, key: str) -> Message:
        claimed = self._claims.get(key)
        if claimed is not None and claimed.invalidated:
            return {"refused": INVALIDATED}
        self._return_provisional(claimed)
        reservation, reason = self._reserve(UNSIZED_ROOM, followed=True)
        if reservation is None:
            self._settle(key, worker, {"declined": reason})
            return {"refused": reason}
        rid = reservation.name
        self._reservations[rid] = (worker, key, reservation)
        claim = self._claims.setdefault(key, _Claim(worker))
        claim.rid = rid
        claim.unsized = True
        for waiter in claim.waiters:
            if not waiter.done():
                waiter.set_result({"declined": UNSIZED})
        claim.waiters.clear()
        return {"rid": rid, "path": reservation.path, "size": reservation.size}

    def _grow(self, rid: str, size: int) -> Message:
        found = self._reservations.get(rid)
        if found is None:
            return {"refused": "the fill was cancelled"}
        if self.store.unavailable is not None:
            return {"refused": BUFFER_UNAVAILABLE}
        try:
            grown = self.store.grow(found[2], size)
        except StoreError as e:
            self.metrics.buffer_trouble("growing room", e)
            return {"refused": BUFFER_UNAVAILABLE}
        return {} if grown else {"refused": "no-room"}

    def _return_provisional(self, claim: _Claim | None) -> None:
        """A claim's body needs room of another kind: its provisional room is returned."""
        if claim is not None and claim.fill is None and claim.rid is not None:
            self._release(claim.rid)
            claim.rid = None

    def _provisional_room(self) -> Reservation | None:
        """PROVISIONAL bytes for a claim, if that leaves at least as much free room as
        all the provisional room then held (see the module docstring)."""
        store = self.store
        free = store.capacity - store.used - store.reserved - PROVISIONAL
        if free < (len(self._provisional) + 1) * PROVISIONAL:
            return None
        return self._reserve(PROVISIONAL, evict=False, followed=False)[0]

    def _reserve(
        self, size: int, evict: bool = True, followed: bool = False
    ) -> tuple[Reservation | None, str]:
        """Room for a fill of `size` bytes (see `Store.reserve`), or None and why not."""
        if self.store.unavailable is not None:
            return None, BUFFER_UNAVAILABLE
        try:
            return self.store.reserve(size, evict, followed), "no-room"
        except StoreError as e:
            self.metrics.buffer_trouble("reserving room", e)
            self.store.report_failure(str(e))
            return None, BUFFER_UNAVAILABLE

    @staticmethod
    def _announce(claim: _Claim, rid: str, reservation: Reservation, head: Message) -> None:
        """The claim's body is being stored: whoever waits for it joins it."""
        claim.rid = rid
        claim.fill = {**head, "size": reservation.size, "path": reservation.path}
        for waiter in claim.waiters:
            if not waiter.done():
                waiter.set_result({"join": claim.fill})
        claim.waiters.clear()

    def _commit(self, message: Message) -> Message:
        rid = message["rid"]
        claim = self._claims.get(self._reservations[rid][1]) if rid in self._reservations else None
        if claim is not None and claim.rid == rid and claim.invalidated:
            # The worker aborts it once its readers have every byte.
            return {"invalidated": True}
        found = self._reservations.pop(rid, None)
        if found is None:
            return {"error": "the fill was cancelled"}
        _, key, reservation = found
        self._provisional.discard(rid)
        headers = tuple((name, value) for name, value in message["headers"])
        try:
            self.store.commit(
                reservation,
                key,
                message["sha256"],
                headers,
                message["generated_at"],
                message["lifetime"],
                message["size"],  # a provisional room or an unsized one shrinks to it
            )
        except StoreError as e:
            self.store.abort(reservation)
            self._forget_claim(key, rid, {"declined": BUFFER_UNAVAILABLE})
            return {"error": str(e)}
        self._note_commit(key)
        # Whoever waited on a fill nobody could follow finds it stored now.
        self._forget_claim(key, rid, {"stored": True, "joined": True})
        return {}

    def _abort(self, rid: str) -> None:
        found = self._reservations.get(rid)
        if found is not None:
            self._release(rid)
            self._forget_claim(found[1], rid, {"declined": "fill-failed"})

    def _release(self, rid: str) -> None:
        """Return a fill's room; its partial body is deleted."""
        self._provisional.discard(rid)
        found = self._reservations.pop(rid, None)
        if found is not None:
            self.store.abort(found[2])

    def _invalidate(self, keys: list[str]) -> Message:
        for key in keys:
            self._remove(key)
            claim = self._claims.get(key)
            if claim is not None:
                claim.invalidated = True
        self._invalidated()
        return {}

    def _update(self, message: Message) -> None:
        headers = tuple((name, value) for name, value in message["headers"])
        try:
            self.store.update(
                message["key"],
                message["file"],
                headers,
                message["generated_at"],
                message["lifetime"],
            )
        except StoreError as e:
            self.metrics.buffer_trouble("updating an object", e)

    def _touch(self, keys: list[str]) -> None:
        try:
            self.store.touch(keys)
        except StoreError as e:
            self.metrics.buffer_trouble("recording what was used", e)

    def _remove(self, key: str) -> None:
        try:
            self.store.remove(key)
        except StoreError as e:
            self.metrics.buffer_trouble("removing an object", e)

    def _settle(self, key: str, worker: int, outcome: Message) -> None:
        """End a claim that never became a fill that others follow (its provisional
        room is returned); its waiters get `outcome`."""
        claim = self._claims.get(key)
        if claim is None or claim.owner != worker or claim.fill is not None:
            return
        if claim.rid is not None:
            self._release(claim.rid)
        self._end_claim(key, claim, outcome)

    def _forget_claim(self, key: str, rid: str, outcome: Message) -> None:
        """The fill `rid` is over: its claim ends, and whoever still waits gets `outcome`."""
        claim = self._claims.get(key)
        if claim is not None and claim.rid == rid:
            self._end_claim(key, claim, outcome)

    def _end_claim(self, key: str, claim: _Claim, outcome: Message) -> None:
        del self._claims[key]
        for waiter in claim.waiters:
            if not waiter.done():
                waiter.set_result(outcome)


class _Known(NamedTuple):
    """A stored object this worker remembers: its index row and record, and whether its
    body is known to match its digest (or known not to, until the keeper removes it).

    Immutable, replaced when it learns either: a tuple of strings, numbers and such
    tuples, the garbage collector stops tracking it, so that thousands remembered do not
    make each collection longer (as the StoredObject it holds)."""

    rowid: int
    entry: StoredObject
    checked: bool
    cost: int  # bytes it takes (`_cost`)
    corrupt: bool = False


class Buffer:
    """A worker's handle on the buffer: the index it reads, the keeper it asks.

    Stored objects found in the index are remembered, least recently used forgotten
    first beyond REMEMBERED_BYTES, until the keeper removes any object: that bumps the
    shared index generation, and everything remembered is looked up again.

    An object whose index row was found at start and is beyond the store's background
    check (`Shared.checked_through`) is hashed before this worker serves it; one that
    does not match is removed and never served.
    """

    def __init__(
        self, index: Index, keeper: ipc.Channel, shared: Shared, track_recency: bool
    ) -> None:
        """`track_recency`: report served keys to the keeper (only `lru` needs them)."""
        self._index = index
        self._keeper = keeper
        self._shared = shared
        self._known: collections.OrderedDict[str, _Known] = collections.OrderedDict()
        self._known_bytes = 0
        self._known_generation = shared.generation
        self._track_recency = track_recency
        # The key the last index query missed, and the commits it saw (`Shared.commits`).
        self._missed: tuple[str, int] | None = None
        self._touched: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._last_touch_report = time.monotonic()

    def lookup(self, key: str) -> StoredObject | None:
        """The stored object of `key`, or None; StoreError if the index fails. A large
        one that still needs its check (`unchecked`) must pass `check` first."""
        known = self._remembered(key)
        if known is None or known.corrupt:
            return None
        entry = known.entry
        if not known.checked and entry.size <= CHECK_AT_ONCE:
            if not self._check_now(key, known, entry):
                return None
        if self._track_recency:
            self._touched[key] = None
            self._touched.move_to_end(key)
            self._report_touches()
        return entry

    def unchecked(self, key: str) -> bool:
        """Must the object `lookup` just found for `key` pass `check` before a hit?"""
        known = self._known.get(key)
        return known is not None and not known.checked

    async def check(self, key: str, entry: StoredObject) -> StoredObject | None:
        """`entry` once its body matches its digest (hashed in a thread), or None: a
        body that does not match is removed, and the request is a miss."""
        known = self._known.get(key)
        try:
            fd = self.open_body(entry)
        except StoreError:
            return None
        try:
            await asyncio.to_thread(check_body, fd, entry)
        except Corrupt:
            self._drop_corrupt(key, known)
            return None
        finally:
            os.close(fd)
        if known is not None:
            self._learn(key, known, known._replace(checked=True))
        return entry

    def _remembered(self, key: str) -> _Known | None:
        self._missed = None
        generation = self._shared.generation
        if generation != self._known_generation:
            self._known.clear()
            self._known_bytes = 0
            self._known_generation = generation
        known = self._known.get(key)
        if known is not None:
            self._known.move_to_end(key)
            return known
        commits = self._shared.commits  # before the query: it sees at least these
        found = self._index.find(key)
        if found is None:
            self._missed = key, commits
            return None
        checked = (
            found.rowid > self._shared.found_through or found.rowid <= self._shared.checked_through
        )
        cost = _cost(key, found.entry)
        known = self._known[key] = _Known(found.rowid, found.entry, checked, cost)
        self._known_bytes += cost
        while self._known_bytes > REMEMBERED_BYTES:
            self._known_bytes -= self._known.popitem(last=False)[1].cost
        return known

    def _check_now(self, key: str, known: _Known, entry: StoredObject) -> bool:
        try:
            fd = self.open_body(entry)
        except StoreError:
            return False
        try:
            check_body(fd, entry)
        except Corrupt:
            self._drop_corrupt(key, known)
            return False
        finally:
            os.close(fd)
        self._learn(key, known, known._replace(checked=True))
        return True

    def _drop_corrupt(self, key: str, known: _Known | None) -> None:
        logger.warning("buffer: a stored body found at start does not match its digest")
        if known is not None:
            # A miss until the keeper's removal reaches every worker.
            self._learn(key, known, known._replace(corrupt=True))
        self.remove(key)

    def _learn(self, key: str, known: _Known, learned: _Known) -> None:
        """Remember `learned` of `key` in place of `known`, unless `key` was forgotten or
        looked up again meanwhile."""
        if self._known.get(key) is known:
            self._known[key] = learned

    def _forget(self, key: str) -> None:
        known = self._known.pop(key, None)
        if known is not None:
            self._known_bytes -= known.cost

    def open_body(self, entry: StoredObject) -> int:
        return self._index.open_body(entry)

    def _report_touches(self) -> None:
        now = time.monotonic()
        if now - self._last_touch_report >= TOUCH_INTERVAL:
            self._last_touch_report = now
            self._keeper.notify("touch", keys=list(self._touched))
            self._touched.clear()

    async def claim(self, key: str) -> Message:
        """Fetch `key`, or join whoever does (see the table above); StoreError if the
        keeper cannot be asked."""
        missed = self._missed
        since = missed[1] if missed is not None and missed[0] == key else None
        return await self._call("claim", key=key, since=since)

    async def start_fill(self, key: str, size: int, head: Message) -> Message:
        return await self._call("start_fill", key=key, size=size, head=head)

    async def start_unsized(self, key: str) -> Message:
        """Room for a claimed body of unknown length (see the module docstring)."""
        return await self._call("start_unsized", key=key)

    async def grow(self, rid: str, size: int) -> bool:
        """Hold `size` bytes for a fill of unknown length; False if refused."""
        return "refused" not in await self._call("grow", rid=rid, size=size)

    async def commit(
        self,
        rid: str,
        key: str,
        size: int,
        sha256: str,
        headers: tuple[tuple[str, str], ...],
        generated_at: float,
        lifetime: float,
    ) -> bool:
        """Make a complete body of `size` bytes servable: False if a write invalidated it
        meanwhile (the caller aborts it), StoreError if the keeper could not."""
        reply = await self._call(
            "commit",
            rid=rid,
            key=key,
            size=size,
            sha256=sha256,
            headers=[list(h) for h in headers],
            generated_at=generated_at,
            lifetime=lifetime,
        )
        if "error" in reply:
            raise StoreError(reply["error"])
        return "invalidated" not in reply

    async def invalidate(self, keys: list[str]) -> None:
        """Remove the objects of `keys` and keep their running fills from committing;
        returns once that is done in every worker's view. StoreError if the keeper
        cannot be asked."""
        await self._call("invalidate", keys=keys)

    @property
    def invalidations(self) -> int:
        """How many invalidations happened (see `sidecar.shared`)."""
        return self._shared.invalidations

    async def _call(self, op: str, **fields: object) -> Message:
        try:
            return await self._keeper.call(op, **fields)
        except (ipc.PeerGone, ipc.CallFailed) as e:
            raise StoreError(f"the buffer's keeper did not answer: {e}") from e

    def decline(self, key: str, reason: str) -> None:
        self._keeper.notify("decline", key=key, reason=reason)

    def abort(self, rid: str) -> None:
        self._keeper.notify("abort", rid=rid)

    def remove(self, key: str) -> None:
        self._keeper.notify("remove", key=key)

    async def update(self, key: str, entry: StoredObject) -> None:
        """Record the fields and age of an object a 304 validated; returns once every
        worker's next lookup sees them (the validated response is served after that).
        StoreError if the keeper cannot be asked."""
        self._forget(key)  # looked up again, as the keeper recorded it
        await self._call(
            "update",
            key=key,
            file=entry.file,
            headers=[list(h) for h in entry.headers],
            generated_at=entry.generated_at,
            lifetime=entry.lifetime,
        )

    def report_failure(self, why: str) -> None:
        """A write into the buffer failed: the keeper admits nothing for a while."""
        self._keeper.notify("failure", why=why)


def _cost(key: str, entry: StoredObject) -> int:
    fields = entry.headers
    text = sum(len(name) + len(value) for name, value in fields)
    return len(key) + text + _FIELD_OVERHEAD * len(fields) + _REMEMBERED_OVERHEAD
