"""The buffer's keeper (in the parent process) and each worker's handle on it.

Workers answer hits on their own: they read the index and the body files directly
(`store.Index`). They also claim the keys they fetch, and store small bodies, on their
own, in what every process shares (`sidecar.buffer.claims`): a small miss costs no
message to the main process. Everything else that changes the buffer goes through the
keeper, so that every guarantee of a single process holds across workers:

- one upstream fetch per object: a worker *claims* a key before fetching it
  (`Buffer.claim`); whoever finds a key claimed waits for its fill, or joins it in
  whichever worker it runs when it is one others may follow (its partial body and
  progress record are in the buffer directory, announced here);
- the `--buffer-size` cap and the `none`/`lru` policy: reservations, leases, evictions
  and the totals happen here, in order (`store.Store`);
- a crashed worker's fills are failed, its claims freed and its lease and room returned
  (`worker_gone`), so nothing it half-wrote is ever served.

Calls and their replies (`sidecar.ipc`):

| call | reply |
| --- | --- |
| `join {key}` (the key's claim is FOLLOWED) | `{join: fill}`, or `{}` once it ended |
| `start_fill {key, size, head}` | `{rid, path}` (the claim is FOLLOWED) or `{refused: reason}` |
| `start_unsized {key}` | `{rid, path, size}` (room of UNSIZED_ROOM bytes) or `{refused: reason}` |
| `grow {rid, size}` | `{}` or `{refused: reason}` |
| `commit {rid key size digest headers generated_at lifetime}` | `{}`, `{error}`, `{invalidated}` |
| `invalidate {keys}` | `{}` once the objects are gone and their fills will not commit |
| `update {key, file, headers, generated_at, lifetime}` (after a 304) | `{}` once recorded |

Notifications: `lease {}`, `abort {rid}`, `remove {key}`, `failure {why}`, `touch {keys}`.

Most objects are small, and a miss waits for every round trip it makes here (each
costs both processes a wake-up). So each worker holds a *lease*: free room the keeper
lends it in batches of up to LEASE bytes (`lease`, asked for when less than half is
left). A body of up to SMALL bytes whose claim began in this worker is kept in memory
by its fill and stored from that lease by the worker itself (`Buffer.commit_small`): it
writes the body into a partial file of its own (which the keeper deletes if the worker
dies), then renames it into objects/, inserts its index row and frees its claim under
the claims' lock (`claims.Claims.commit`), and the keeper moves those bytes and objects
from the lease to its totals the next time it looks (`Claims.fold`). No other worker
follows such a fill while it runs (its body is in this worker's memory): a worker that
finds its key claimed waits until the claim is gone, and then finds the object stored
(it counts as coalesced, and is served from the buffer). From a fast origin that wait
is shorter than the keeper's two round trips; readers of a body of up to
`fill.WHOLE_AT_END` get it whole at its end anyway. A larger body, one of unknown
length, one beyond what a worker keeps in memory at once (`fill.IN_MEMORY`), an object
replacing one this worker asked the keeper to remove (outdated or corrupt: the keeper
removes it first, as it handles messages in order), or one that finds too little left
of its lease asks the keeper for room (`start_fill`) and for its commit: two round
trips. Leases are lent only out of free room, and only while at least as much stays
free besides (`lease_grant`): so lending never makes `lru` evict, and never turns away
an object that fits in half the room that is free; a reservation that finds too little
room takes every lease's idle bytes back first (`Claims.revoke`).

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
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from sidecar import ipc
from sidecar.buffer.claims import INVALIDATED as CLAIM_INVALIDATED
from sidecar.buffer.claims import Claims, State
from sidecar.buffer.segments import pwrite_all
from sidecar.buffer.store import (
    Corrupt,
    Index,
    Reservation,
    Store,
    StoredObject,
    StoreError,
    body_name,
    check_body,
    worker_partial,
)
from sidecar.cache import endpoints, policy
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
# The pass reason of a miss that found every claim of the table taken (`claims.SLOTS`).
NO_CLAIM = "too-many-fills"
# The pass reason of a request that waited for another's fill of its key, which ended
# without storing it (its answer was not cacheable, or its fetch failed): like the
# fill's own client, it goes to the origin at once, rather than after each other waiter.
UNSTORED = "fill-not-stored"
# Served keys are reported to the keeper (for `lru`) at most this often.
TOUCH_INTERVAL = 0.5  # seconds
# Bodies up to this size are stored by the worker that fetched them, from its lease:
# nearly all of an ImageNet-like set's files (their median is about 110 KiB).
SMALL = 1024 * 1024  # bytes
# Room lent to a worker at most (see the module docstring): four of the largest small
# bodies, forty of a typical one, per message to the keeper.
LEASE = 4 * SMALL  # bytes
# A worker asks for more lease at most this often while it finds too little left.
LEASE_ASK_INTERVAL = 0.02  # seconds
# A worker waiting for a claim nobody follows looks again this often, at first every
# millisecond (most small fills end within a few), backing off while it lasts.
CLAIM_POLL_MIN = 0.001  # seconds
CLAIM_POLL_MAX = 0.01  # seconds
# Removals a worker asked for and remembers until it sees them done (`Buffer.remove`):
# far more than it ever has on its way to the keeper.
REMOVALS_REMEMBERED = 1024
# Room a fill of unknown length starts with (it grows as the body comes).
UNSIZED_ROOM = 256 * 1024  # bytes
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


def lease_grant(free: int, lent: int, idle: int, block: int) -> int:
    """Bytes to lend a worker that has `idle` bytes of lease left, when `free` bytes of
    the cap are neither used nor reserved (lent room counts as reserved) and `lent` are
    lent to every worker: up to LEASE in its hands, and only while at least as much
    room stays free as is lent, this grant included. Whole blocks."""
    amount = min(LEASE - idle, (free - lent) // 2)
    return max(0, amount // block * block)


class Keeper:
    """The announced fills and the buffer's accounting, for every worker."""

    def __init__(
        self,
        store: Store,
        claims: Claims,
        invalidated: Callable[[], None] = lambda: None,
    ) -> None:
        """`invalidated()` is called after each invalidation (`Shared.bump_invalidations`)."""
        self.store = store
        self.claims = claims
        self._invalidated = invalidated
        # The buffer trouble met here (a worker counts its own in its Metrics).
        self.metrics = Metrics()
        self._followed: dict[str, Message] = {}  # what joiners of a FOLLOWED claim need
        self._reservations: dict[str, tuple[int, str, Reservation]] = {}

    def state(self) -> str:
        """The buffer's state for /stats: `available`, or `unavailable: <why>`."""
        why = self.store.unavailable
        return "available" if why is None else f"unavailable: {why}"

    def gauges(self) -> dict[str, int]:
        self._fold()
        idle = sum(self.claims.lease(worker).idle for worker in range(self.claims.workers))
        return {
            "buffer_available": int(self.store.unavailable is None),
            "entries": self.store.entries,
            "unverified_entries": self.store.unverified,
            "buffer_bytes": self.store.used,
            "reserved_bytes": self.store.reserved - idle,
            "leased_bytes": idle,
            "capacity_bytes": self.store.capacity,
            "fills_in_progress": self.claims.running(),
        }

    async def handle(self, worker: int, message: Message) -> Message | None:
        op = message["op"]
        if op == "join":
            fill = self._followed.get(message["key"])
            return {} if fill is None else {"join": fill}
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
        if op == "lease":
            self._lend(worker)
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
        """Fail the fills of a worker that died, free its claims, take back its lease and
        its room; its small fills' partial bodies are deleted, and what it stored itself
        is counted from the index."""
        for rid, (owner, _, _) in list(self._reservations.items()):
            if owner == worker:
                self._abort(rid)
        store = self.store

        def settle(lent: int, spent: int, stored: int) -> None:
            store.reserved -= lent + spent
            store.used += spent
            store.entries += stored
            try:
                store.recount()  # what it indexed and died before counting
            except StoreError as e:
                self.metrics.buffer_trouble("counting what is stored", e)

        self.claims.forget(worker, settle)
        store.remove_partials(worker)

    # -- operations ---------------------------------------------------------------------

    def _lend(self, worker: int) -> None:
        """Top up `worker`'s lease (see the module docstring)."""
        store = self.store
        if store.unavailable is not None:
            return
        self._fold()
        lent = sum(self.claims.lease(w).room for w in range(self.claims.workers))
        free = store.capacity - store.used - store.reserved
        amount = lease_grant(free, lent, self.claims.lease(worker).idle, store.block)
        if amount > 0:
            self.claims.grant(worker, amount)
            store.reserved += amount

    def _fold(self) -> None:
        """Move what workers stored from their leases since the last fold to the totals."""
        spent, stored = self.claims.fold()
        self.store.reserved -= spent
        self.store.used += spent
        self.store.entries += stored

    def _start_fill(self, worker: int, key: str, size: int, head: Message) -> Message:
        reservation, reason = self._reserve(size)
        if reservation is None:
            return {"refused": reason}  # the worker frees its claim
        if not self.claims.announce(key, worker, State.FOLLOWED):
            self.store.abort(reservation)
            return {"refused": INVALIDATED}
        rid = reservation.name
        self._reservations[rid] = (worker, key, reservation)
        self._followed[key] = {**head, "size": reservation.size, "path": reservation.path}
        return {"rid": rid, "path": reservation.path}

    def _start_unsized(self, worker: int, key: str) -> Message:
        reservation, reason = self._reserve(UNSIZED_ROOM)
        if reservation is None:
            return {"refused": reason}
        if not self.claims.announce(key, worker, State.UNSIZED):
            self.store.abort(reservation)
            return {"refused": INVALIDATED}
        rid = reservation.name
        self._reservations[rid] = (worker, key, reservation)
        return {"rid": rid, "path": reservation.path, "size": reservation.size}

    def _grow(self, rid: str, size: int) -> Message:
        found = self._reservations.get(rid)
        if found is None:
            return {"refused": "the fill was cancelled"}
        if self.store.unavailable is not None:
            return {"refused": BUFFER_UNAVAILABLE}
        self._make_room(self.store.charge(size) - found[2].charged)
        try:
            grown = self.store.grow(found[2], size)
        except StoreError as e:
            self.metrics.buffer_trouble("growing room", e)
            return {"refused": BUFFER_UNAVAILABLE}
        return {} if grown else {"refused": "no-room"}

    def _reserve(self, size: int) -> tuple[Reservation | None, str]:
        """Room for a followed fill of `size` bytes (see `Store.reserve`), or None and
        why not."""
        if self.store.unavailable is not None:
            return None, BUFFER_UNAVAILABLE
        self._make_room(self.store.charge(size))
        try:
            return self.store.reserve(size), "no-room"
        except StoreError as e:
            self.metrics.buffer_trouble("reserving room", e)
            self.store.report_failure(str(e))
            return None, BUFFER_UNAVAILABLE

    def _make_room(self, charged: int) -> None:
        """Before `charged` more bytes are reserved: if they do not fit in the free room,
        the idle room of every lease is taken back first, rather than refused or evicted
        for."""
        self._fold()
        store = self.store
        if store.used + store.reserved + charged > store.capacity:
            store.reserved -= self.claims.revoke()

    def _commit(self, message: Message) -> Message:
        rid = message["rid"]
        found = self._reservations.get(rid)
        if found is None:
            return {"error": "the fill was cancelled"}
        worker, key, reservation = found
        headers = tuple((name, value) for name, value in message["headers"])
        try:
            committed = self.claims.end(
                key,
                worker,
                lambda: self.store.commit(
                    reservation,
                    key,
                    message["digest"],
                    headers,
                    message["generated_at"],
                    message["lifetime"],
                    message["size"],  # an unsized fill's room shrinks to it
                ),
            )
        except StoreError as e:
            self._abort(rid)
            return {"error": str(e)}
        if not committed:
            # The worker aborts it once its readers have every byte.
            return {"invalidated": True}
        del self._reservations[rid]
        self._followed.pop(key, None)
        return {}

    def _abort(self, rid: str) -> None:
        """Return a fill's room (its partial body is deleted) and free its claim."""
        found = self._reservations.pop(rid, None)
        if found is not None:
            worker, key, reservation = found
            self.store.abort(reservation)
            self._followed.pop(key, None)
            self.claims.end(key, worker)

    def _invalidate(self, keys: list[str]) -> Message:
        # Fills first: a worker's small fill either committed before (its object is
        # removed next) or sees its claim invalidated and does not commit.
        self.claims.invalidate(keys)
        for key in keys:
            self._followed.pop(key, None)
            self._remove(key)
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

    It claims the keys it fetches, and stores small bodies from its lease, itself (see
    the module docstring).
    """

    def __init__(
        self,
        index: Index,
        keeper: ipc.Channel,
        shared: Shared,
        claims: Claims,
        worker: int,
        track_recency: bool,
        uniform: policy.Uniform,
    ) -> None:
        """`worker`: this worker's index; `track_recency`: report served keys to the
        keeper (only `lru` needs them); `uniform`: which objects it commits are uniform
        (the keeper's `Store` decides by the same rules)."""
        self.uniform = uniform
        self._index = index
        self._keeper = keeper
        self._shared = shared
        self._claims = claims
        self._worker = worker
        # The small fills stored from the lease, by rid: (key, size, charged, partial body).
        self._small: dict[str, tuple[str, int, int, str]] = {}
        self._lease_asked = -LEASE_ASK_INTERVAL  # time.monotonic()
        # The rows of the keys this worker asked the keeper to remove (`remove`).
        self._removing: dict[str, int] = {}
        self._ask_for_lease()  # before the first miss needs it
        self._known: collections.OrderedDict[str, _Known] = collections.OrderedDict()
        self._known_bytes = 0
        self._known_generation = shared.generation
        self._track_recency = track_recency
        # The key the last index query missed, and the commits it saw (`Claims.commits`).
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

    def container(self, key: str) -> str | None:
        """The key of a stored part of the same whole that holds the range of the part
        `key` (`endpoints.part_key`), or None; StoreError if the index fails."""
        rules = endpoints.rules(key)
        if rules.part is None or rules.whole is None:
            return None
        return self._index.container(rules.whole, rules.part.first, rules.part.last)

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
        commits = self._claims.commits  # before the query: it sees at least these
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

    @property
    def generation(self) -> int:
        """The index generation what `lookup` found is valid for (`Shared.generation`
        when it last looked)."""
        return self._known_generation

    @property
    def generation_now(self) -> int:
        """The index generation at this moment: what a commit that follows is valid
        for."""
        return self._shared.generation

    def touch(self, keys: Iterable[str]) -> None:
        """Count `keys` as used now, as `lookup` does for those it finds (the hits the
        core's table sent: see `sidecar.runtime.worker`); and report what was used
        since the last report, if it is time."""
        if not self._track_recency:
            return
        for key in keys:
            self._touched[key] = None
            self._touched.move_to_end(key)
        self._report_touches()

    def _report_touches(self) -> None:
        now = time.monotonic()
        if self._touched and now - self._last_touch_report >= TOUCH_INTERVAL:
            self._last_touch_report = now
            self._keeper.notify("touch", keys=list(self._touched))
            self._touched.clear()

    async def claim(self, key: str) -> Message:
        """Fetch `key` (`{begin}`), join the fill of whoever does (`{join: fill}`), serve it
        (`{stored}`, and `joined` if this waited for its fill) or pass (`{declined:
        reason}`, UNSTORED if the fill it waited for did not store it); StoreError if the
        keeper or the index cannot be asked (and no claim is held). See `sidecar.buffer.claims`."""
        missed = self._missed
        since = missed[1] if missed is not None and missed[0] == key else None
        waited = False
        pause = CLAIM_POLL_MIN
        while True:
            found = self._claims.claim(key, self._worker)
            if found is None:
                return {"declined": NO_CLAIM}
            state, _ = found
            if state == State.FREE:
                # Ours. Stored since the lookup that missed it only if a commit came
                # since: its claim was freed after its row was written, and before ours.
                if waited or since is None or self._claims.commits != since:
                    try:
                        stored = self._stored(key)
                    except StoreError:
                        self._claims.release(key, self._worker)
                        raise
                    if stored or waited:
                        self._claims.release(key, self._worker)
                        if not stored:
                            return {"declined": UNSTORED}
                        return {"stored": True, "joined": waited}
                return {"begin": True}
            if state & CLAIM_INVALIDATED:
                return {"declined": INVALIDATED}
            if state == State.UNSIZED:
                return {"declined": UNSIZED}
            waited = True
            if state == State.FOLLOWED:
                answer = await self._call("join", key=key)
                if "join" in answer:
                    return answer
                continue  # it ended meanwhile: stored, or not
            # Nobody follows it: wait until it is gone.
            await asyncio.sleep(pause)
            pause = min(2 * pause, CLAIM_POLL_MAX)

    def _stored(self, key: str) -> bool:
        """Is `key` stored, and not by the row this worker asked the keeper to remove?"""
        found = self._index.find(key)
        if found is not None and self._removing.get(key) == found.rowid:
            return False
        self._removing.pop(key, None)
        return found is not None

    def lease_room(self, key: str, size: int) -> str | None:
        """Room from this worker's lease for the small body of `key`, which this worker
        claimed: its rid (`commit_small` stores it); None if too little is left, or if
        this worker asked for the key's stored object to be removed (the fill asks the
        keeper instead, which removes it first: it handles messages in order)."""
        if key in self._removing:
            return None
        charged = self._index.charge(size)
        idle = self._claims.take(self._worker, charged)
        if idle is None or idle < LEASE // 2:
            self._ask_for_lease()
        if idle is None:
            return None
        rid = body_name()
        path = f"{self._index.partial_dir}/{worker_partial(rid, self._worker)}"
        self._small[rid] = (key, size, charged, path)
        return rid

    def _ask_for_lease(self) -> None:
        now = time.monotonic()
        if now - self._lease_asked >= LEASE_ASK_INTERVAL:
            self._lease_asked = now
            self._keeper.notify("lease")

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
        digest: str,
        headers: tuple[tuple[str, str], ...],
        generated_at: float,
        lifetime: float,
    ) -> StoredObject | None:
        """Make a complete body of `size` bytes servable: what the index now holds for it,
        None if a write invalidated it meanwhile (the caller aborts it), StoreError if it
        could not be stored (the caller aborts it too). A small fill from the lease is
        stored by `commit_small`."""
        reply = await self._call(
            "commit",
            rid=rid,
            key=key,
            size=size,
            digest=digest,
            headers=[list(h) for h in headers],
            generated_at=generated_at,
            lifetime=lifetime,
        )
        if "error" in reply:
            raise StoreError(reply["error"])
        if "invalidated" in reply:
            return None
        return StoredObject(
            rid, size, digest, headers, time.time(), generated_at, lifetime, self.uniform(key)
        )

    def commit_small(
        self,
        rid: str,
        body: bytes,
        digest: str,
        headers: tuple[tuple[str, str], ...],
        generated_at: float,
        lifetime: float,
    ) -> StoredObject | None:
        """Store a small fill from the lease (`lease_room`), whose fill kept `body` in
        memory, here and now: written into its partial file, then committed (see
        `Claims.commit`). Returns and raises as `commit` does; OSError if the body
        cannot be written (a partial body a killed worker left is the keeper's)."""
        key, size, charged, partial = self._small[rid]
        if len(body) != size:
            raise StoreError(f"body has {len(body)} bytes, expected {size}")
        _write_new(partial, body)
        entry = StoredObject(
            rid, size, digest, headers, time.time(), generated_at, lifetime, self.uniform(key)
        )
        stored = self._index.body_path(entry)

        def insert() -> None:
            try:
                os.rename(partial, stored)
            except OSError as e:
                raise StoreError(f"cannot commit an object: {e}") from e
            try:
                self._index.insert(key, entry, charged)
            except StoreError:
                _unlink(stored)
                raise

        if not self._claims.commit(key, self._worker, charged, insert):
            return None
        del self._small[rid]
        return entry

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

    def decline(self, key: str) -> None:
        """This worker's claim of `key` ends without a fill others follow, unstored."""
        self._claims.release(key, self._worker)

    def abort(self, rid: str) -> None:
        """A fill that will not be stored: its room is returned, its partial body deleted,
        its claim freed."""
        small = self._small.pop(rid, None)
        if small is None:
            self._keeper.notify("abort", rid=rid)
            return
        key, _, charged, partial = small
        _unlink(partial)
        self._claims.release(key, self._worker, charged)

    def remove(self, key: str) -> None:
        """Have the keeper remove the object of `key` (a corrupt or outdated one); until
        it has, this worker takes its row for absent (`_stored`)."""
        known = self._known.get(key)
        try:
            found = known or self._index.find(key)
        except StoreError:
            found = None
        if found is not None:
            if len(self._removing) >= REMOVALS_REMEMBERED:
                self._removing.clear()
            self._removing[key] = found.rowid
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


def _write_new(path: str, body: bytes) -> None:
    """A new file at `path` holding `body`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        pwrite_all(fd, body, 0)
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    # A buffer that refuses the unlink (read-only) is cleaned at the next start.
    with contextlib.suppress(OSError):
        os.unlink(path)


def _cost(key: str, entry: StoredObject) -> int:
    fields = entry.headers
    text = sum(len(name) + len(value) for name, value in fields)
    return len(key) + text + _FIELD_OVERHEAD * len(fields) + _REMEMBERED_OVERHEAD
