"""Claims and leases: which worker fetches which key, and the room each may fill alone.

A worker whose lookup missed a key *claims* it here before fetching it, so that there is
one upstream fetch per object whichever worker a client lands on; a worker that finds
the key claimed waits for that fill, or joins it when others may follow it
(`keeper.Buffer.claim`). The table lives in the region of `sidecar.shared` that every
process maps, and every change to it is made under the region's lock, by whichever
process it concerns: so a small miss costs no message to the main process at all.

One claim is a 32-byte slot: the key's 16-byte digest (`store.key_digest`, as the index
names it), its owner (a worker's index), its state, and room to spare. A key's claim is
in one of the WINDOW slots from the one its digest names, found by a memory search of
that window (a few microseconds), rather than by probing until a free slot: so freeing
a slot moves no other and leaves no tombstone. A slot is written owner and digest first
and state last, and freed state first, so a process killed half way through either
leaves a slot that reads as free, and the keeper frees whatever a dead worker owned
(`forget`).

| state | set by | meaning | a worker that finds it |
| --- | --- | --- | --- |
| RUNNING | its worker, claiming | fetched; nobody follows it (yet) | waits until it is gone |
| FOLLOWED | the keeper (`start_fill`) | a partial body, a progress record | joins it |
| UNSIZED | the keeper (`start_unsized`) | a body of unknown length | passes |
| + INVALIDATED | the keeper (`invalidate`) | a write made it stale: no commit | passes |

A RUNNING claim is freed by its owner (stored or not); a FOLLOWED or UNSIZED one by the
keeper, which commits or aborts its room. Whoever commits an object frees its claim
under the lock after the index row is written and `commits` is bumped: a worker that
saw the claim gone, or the key absent at its lookup, finds the row (`keeper.Buffer`).

Each worker also holds a *lease*: room the keeper lent it out of free room, in batches
(`keeper.Keeper._lend`), so that a small body is stored without asking for room. Four
counters per worker, changed under the lock: `granted` (by the keeper), `held` (taken by
the worker's small fills in progress), `spent` and `stored` (the bytes and objects of
those it committed, which the keeper moves to its totals when it next looks: `fold`).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.buffer.store import key_digest
from sidecar.shared import Shared

# Concurrent claims the table holds: more than the fills one pod's clients run at once.
# A claim whose window is full is declined (its object passes, unstored): with a few
# hundred claims at once, the chance that any window is full is below 10^-12.
SLOTS = 4096
WINDOW = 32  # slots
_SLOT = struct.Struct("<16sii8x")  # digest, owner, state
_COUNTER = struct.Struct("<q")
_LEASE = struct.Struct("<qqqq")  # granted, held, spent, stored
_HEADER = 64  # bytes: the commits counter, and room to spare
_FREE = bytes(16)


class State(enum.IntEnum):
    FREE = 0
    RUNNING = 1
    FOLLOWED = 2
    UNSIZED = 3


INVALIDATED = 0x100  # a flag on any state but FREE


@dataclass(frozen=True)
class Lease:
    """One worker's lease (see the module docstring)."""

    granted: int
    held: int
    spent: int
    stored: int

    @property
    def room(self) -> int:
        """Bytes lent and not committed: held by fills in progress, or idle."""
        return self.granted - self.spent

    @property
    def idle(self) -> int:
        """Bytes the worker may still take."""
        return self.granted - self.spent - self.held


class Claims:
    """The claims table and the leases, in the shared region."""

    def __init__(self, shared: Shared) -> None:
        self._shared = shared
        self._memory = shared.memory
        self._commits = shared.region
        self._leases = shared.region + _HEADER
        self._start = self._leases + shared.workers * _LEASE.size
        self._end = self._start + (SLOTS + WINDOW - 1) * _SLOT.size  # windows do not wrap
        self.workers = shared.workers

    @staticmethod
    def size(workers: int) -> int:
        """The bytes of shared region the table and `workers` leases need."""
        return _HEADER + workers * _LEASE.size + (SLOTS + WINDOW - 1) * _SLOT.size

    # -- claims -------------------------------------------------------------------------

    @property
    def commits(self) -> int:
        """New objects indexed so far: a lookup that read this before missing a key, then
        claimed it, knows from a changed count that it may have been stored meanwhile."""
        return int(_COUNTER.unpack_from(self._memory, self._commits)[0])

    def claim(self, key: str, worker: int) -> tuple[int, int] | None:
        """Claim `key` for `worker`: (State.FREE, worker) when it got it, the (state,
        owner) of the claim found otherwise, None when the table is full."""
        digest = key_digest(key)
        with self._shared.lock:
            found = self._find(digest)
            if found is not None:
                _, owner, state = _SLOT.unpack_from(self._memory, found)
                return state, owner
            free = self._find(digest, free=True)
            if free is None:
                return None
            memory = self._memory
            struct.pack_into("<i", memory, free + 16, worker)
            memory[free : free + 16] = digest
            struct.pack_into("<i", memory, free + 20, State.RUNNING)
        return State.FREE, worker

    def state(self, key: str) -> int:
        """The state of the claim of `key` (State.FREE: none)."""
        with self._shared.lock:
            found = self._find(key_digest(key))
            return State.FREE if found is None else self._state(found)

    def release(self, key: str, worker: int, held: int = 0) -> None:
        """`worker` is done with its RUNNING claim of `key` (invalidated or not), unstored;
        the `held` bytes its fill took from its lease are free again."""
        with self._shared.lock:
            found = self._find(key_digest(key))
            if found is not None and self._owned(found, worker, None):
                self._free(found)
            if held:
                self._add(worker, held=-held)

    def commit(self, key: str, worker: int, held: int, insert: Callable[[], None]) -> bool:
        """Store the small fill of `worker`'s RUNNING claim of `key`, which holds `held`
        bytes of its lease: `insert()` its index row, count it, free the claim. False
        if a write invalidated it (nothing inserted); what `insert` raises. Either way,
        the caller then releases the claim and its room (`release`)."""
        with self._shared.lock:
            found = self._find(key_digest(key))
            if found is None or not self._owned(found, worker, State.RUNNING):
                return False
            insert()
            self._bump_commits()
            self._add(worker, held=-held, spent=held, stored=1)
            self._free(found)
        return True

    def announce(self, key: str, worker: int, state: State) -> bool:
        """(The keeper.) `worker`'s RUNNING claim of `key` is now a fill of `state`;
        False if it was invalidated (or is not that worker's)."""
        with self._shared.lock:
            found = self._find(key_digest(key))
            if found is None or not self._owned(found, worker, State.RUNNING):
                return False
            struct.pack_into("<i", self._memory, found + 20, state)
        return True

    def invalidate(self, keys: list[str]) -> None:
        """(The keeper.) The fills of `keys` may not commit, nor be joined."""
        with self._shared.lock:
            for key in keys:
                found = self._find(key_digest(key))
                if found is not None:
                    state = self._state(found) | INVALIDATED
                    struct.pack_into("<i", self._memory, found + 20, state)

    def end(self, key: str, worker: int, commit: Callable[[], object] | None = None) -> bool:
        """(The keeper.) Free `worker`'s claim of `key`, whatever its state; first, if
        given, `commit()` the fill's index row and count it in `commits`. False, and the
        claim left as it is, if a write invalidated it (nothing committed) or `commit`
        raised. Index rows are written under the lock by every process: so writers never
        wait on SQLite's own lock, whose wait sleeps a millisecond at least, claims held."""
        with self._shared.lock:
            found = self._find(key_digest(key))
            if commit is not None:
                if found is not None and self._state(found) & INVALIDATED:
                    return False
                commit()
                self._bump_commits()
            if found is not None and _SLOT.unpack_from(self._memory, found)[1] == worker:
                self._free(found)
        return True

    def running(self) -> int:
        """How many claims there are (fills in progress)."""
        with self._shared.lock:
            return sum(
                self._state(offset) != State.FREE
                for offset in range(self._start, self._end, _SLOT.size)
            )

    # -- leases -------------------------------------------------------------------------

    def lease(self, worker: int) -> Lease:
        """`worker`'s lease (read without the lock: each counter is one aligned word)."""
        return Lease(*_LEASE.unpack_from(self._memory, self._leases + worker * _LEASE.size))

    def take(self, worker: int, charged: int) -> int | None:
        """Hold `charged` bytes of `worker`'s lease for a small fill: the bytes it has idle
        then; None, and nothing held, if it has not that many."""
        at = self._leases + worker * _LEASE.size
        with self._shared.lock:
            granted, held, spent, stored = _LEASE.unpack_from(self._memory, at)
            idle = granted - spent - held - charged
            if idle < 0:
                return None
            _LEASE.pack_into(self._memory, at, granted, held + charged, spent, stored)
        return idle

    def grant(self, worker: int, amount: int) -> None:
        """(The keeper.) Lend `worker` `amount` more bytes."""
        with self._shared.lock:
            self._add(worker, granted=amount)

    def fold(self) -> tuple[int, int]:
        """(The keeper.) The bytes and objects workers committed since the last fold,
        taken out of their leases (and so out of the room the keeper counts as reserved)."""
        with self._shared.lock:
            return self._fold()

    def revoke(self) -> int:
        """(The keeper.) Take back every idle byte of every lease; how many."""
        revoked = 0
        with self._shared.lock:
            for worker in range(self.workers):
                idle = self.lease(worker).idle
                self._add(worker, granted=-idle)
                revoked += idle
        return revoked

    def forget(self, worker: int, settle: Callable[[int, int, int], None]) -> None:
        """(The keeper.) `worker` died: fold every lease, free every claim it held and zero
        its lease, then `settle(lent, spent, stored)` under the same lock, so that no
        commit is half done meanwhile: `lent`, the dead worker's lease room; `spent` and
        `stored`, what was folded."""
        with self._shared.lock:
            spent, stored = self._fold()
            lent = self.lease(worker).granted
            _LEASE.pack_into(self._memory, self._leases + worker * _LEASE.size, 0, 0, 0, 0)
            for offset in range(self._start, self._end, _SLOT.size):
                if _SLOT.unpack_from(self._memory, offset)[1] == worker:
                    self._free(offset)
            settle(lent, spent, stored)

    # -- under the lock -----------------------------------------------------------------

    def _find(self, digest: bytes, free: bool = False) -> int | None:
        """The offset of the live slot named `digest` (or, `free`, of a free slot in its
        window)."""
        memory = self._memory
        start = self._start + int.from_bytes(digest[:4], "little") % SLOTS * _SLOT.size
        end = start + WINDOW * _SLOT.size
        wanted = _FREE if free else digest
        at = memory.find(wanted, start, end)
        while at != -1:
            if (at - start) % _SLOT.size == 0 and (self._state(at) == State.FREE) == free:
                return at
            at = memory.find(wanted, at + 1, end)
        return None

    def _state(self, offset: int) -> int:
        return int(struct.unpack_from("<i", self._memory, offset + 20)[0])

    def _owned(self, offset: int, worker: int, state: State | None) -> bool:
        """Is the slot at `offset` `worker`'s, in `state` exactly (None: RUNNING,
        invalidated or not)?"""
        _, owner, found = _SLOT.unpack_from(self._memory, offset)
        if state is None:
            return bool(owner == worker and found & ~INVALIDATED == State.RUNNING)
        return bool(owner == worker and found == state)

    def _free(self, offset: int) -> None:
        struct.pack_into("<i", self._memory, offset + 20, State.FREE)
        _SLOT.pack_into(self._memory, offset, _FREE, 0, 0)

    def _bump_commits(self) -> None:
        _COUNTER.pack_into(self._memory, self._commits, self.commits + 1)

    def _add(
        self, worker: int, granted: int = 0, held: int = 0, spent: int = 0, stored: int = 0
    ) -> None:
        # The counters as they are, not a `Lease`: a miss adds to them twice.
        at = self._leases + worker * _LEASE.size
        was_granted, was_held, was_spent, was_stored = _LEASE.unpack_from(self._memory, at)
        _LEASE.pack_into(
            self._memory,
            at,
            was_granted + granted,
            was_held + held,
            was_spent + spent,
            was_stored + stored,
        )

    def _fold(self) -> tuple[int, int]:
        spent = stored = 0
        for worker in range(self.workers):
            lease = self.lease(worker)
            self._add(worker, granted=-lease.spent, spent=-lease.spent, stored=-lease.stored)
            spent += lease.spent
            stored += lease.stored
        return spent, stored
