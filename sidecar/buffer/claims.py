"""Claims and leases: which worker fetches which key, and the room each may fill alone.

A worker whose lookup missed a key *claims* it here before fetching it, so that there is
one upstream fetch per object whichever worker a client lands on; a worker that finds
the key claimed waits for that fill, or joins it when others may follow it
(`keeper.Buffer.claim`). The table lives in the region of `sidecar.shared` that every
process maps, and every change to it is made under the region's lock, by whichever
process it concerns: so a small miss costs no message to the main process at all.

The table and the leases are the core's (`native.Claims`, whose source,
`sidecar/core/src/buffer/claims.rs`, has the layout): one claim is a 32-byte slot, the
key's 16-byte digest (`store.key_digest`, as the index names it), its owner (a worker's
index) and its state, in one of WINDOW slots from the one its digest names, found by a
search of that window rather than by probing until a free slot: so freeing a slot moves
no other and leaves no tombstone. A slot is written owner and digest first and state
last, and freed state first, so a process killed half way through either leaves a slot
that reads as free, and the keeper frees whatever a dead worker owned (`forget`). Each
call takes the lock once, in the core; this module names the states and turns keys
into digests.

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
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.buffer.store import key_digest
from sidecar.core import native
from sidecar.shared import Shared

# Concurrent claims the table holds, and the slots a key's claim may take (`native`).
SLOTS = native.CLAIM_SLOTS
WINDOW = native.CLAIM_WINDOW


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
        self._table = native.Claims(shared.fd, shared.lock_at, shared.region, shared.workers)
        self.workers = shared.workers

    @staticmethod
    def size(workers: int) -> int:
        """The bytes of shared region the table and `workers` leases need."""
        return native.Claims.size(workers)

    # -- claims -------------------------------------------------------------------------

    @property
    def commits(self) -> int:
        """New objects indexed so far: a lookup that read this before missing a key, then
        claimed it, knows from a changed count that it may have been stored meanwhile."""
        return self._table.commits

    def claim(self, key: str, worker: int) -> tuple[int, int] | None:
        """Claim `key` for `worker`: (State.FREE, worker) when it got it, the (state,
        owner) of the claim found otherwise, None when the table is full."""
        return self._table.claim(key_digest(key), worker)

    def state(self, key: str) -> int:
        """The state of the claim of `key` (State.FREE: none)."""
        return self._table.state(key_digest(key))

    def release(self, key: str, worker: int, held: int = 0) -> None:
        """`worker` is done with its RUNNING claim of `key` (invalidated or not), unstored;
        the `held` bytes its fill took from its lease are free again."""
        self._table.release(key_digest(key), worker, held)

    def commit(self, key: str, worker: int, held: int, insert: Callable[[], None]) -> bool:
        """Store the small fill of `worker`'s RUNNING claim of `key`, which holds `held`
        bytes of its lease: `insert()` its index row, count it, free the claim, all under
        the lock. False if a write invalidated it (nothing inserted); what `insert`
        raises. Either way, the caller then releases the claim and its room (`release`)."""
        return self._table.commit(key_digest(key), worker, held, insert)

    def announce(self, key: str, worker: int, state: State) -> bool:
        """(The keeper.) `worker`'s RUNNING claim of `key` is now a fill of `state`;
        False if it was invalidated (or is not that worker's)."""
        return self._table.announce(key_digest(key), worker, state)

    def invalidate(self, keys: list[str]) -> None:
        """(The keeper.) The fills of `keys` may not commit, nor be joined."""
        self._table.invalidate([key_digest(key) for key in keys])

    def end(self, key: str, worker: int, commit: Callable[[], object] | None = None) -> bool:
        """(The keeper.) Free `worker`'s claim of `key`, whatever its state; first, if
        given, `commit()` the fill's index row and count it in `commits`. False, and the
        claim left as it is, if a write invalidated it (nothing committed) or `commit`
        raised. Index rows are written under the lock by every process: so writers never
        wait on SQLite's own lock, whose wait sleeps a millisecond at least, claims held."""
        return self._table.end(key_digest(key), worker, commit)

    def running(self) -> int:
        """How many claims there are (fills in progress)."""
        return self._table.running()

    # -- leases -------------------------------------------------------------------------

    def lease(self, worker: int) -> Lease:
        """`worker`'s lease (read without the lock: each counter is one aligned word)."""
        return Lease(*self._table.lease(worker))

    def take(self, worker: int, charged: int) -> int | None:
        """Hold `charged` bytes of `worker`'s lease for a small fill: the bytes it has idle
        then; None, and nothing held, if it has not that many."""
        return self._table.take(worker, charged)

    def grant(self, worker: int, amount: int) -> None:
        """(The keeper.) Lend `worker` `amount` more bytes."""
        self._table.grant(worker, amount)

    def fold(self) -> tuple[int, int]:
        """(The keeper.) The bytes and objects workers committed since the last fold,
        taken out of their leases (and so out of the room the keeper counts as reserved)."""
        return self._table.fold()

    def revoke(self) -> int:
        """(The keeper.) Take back every idle byte of every lease; how many."""
        return self._table.revoke()

    def forget(self, worker: int, settle: Callable[[int, int, int], None]) -> None:
        """(The keeper.) `worker` died: fold every lease, free every claim it held and zero
        its lease, then `settle(lent, spent, stored)` under the same lock, so that no
        commit is half done meanwhile: `lent`, the dead worker's lease room; `spent` and
        `stored`, what was folded."""
        self._table.forget(worker, settle)
