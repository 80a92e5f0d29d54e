"""What every process of one sidecar shares, in one anonymous memory file.

The main process creates it and every worker inherits its descriptor. It holds
numbered slots, then the lock (`lock`), then the table of clients that refused the pod
CA's certificate (`wire.rejections`), then the table of answers the Rust core sends
without asking Python (`core.native.Answers`), then a region the buffer keeps its claims
in (`buffer.claims`).

Each slot is a signed 64-bit word, written by one process only (aligned 8-byte stores
are atomic on the platforms pods run on), so no lock is needed:

| slot | written by | meaning |
| --- | --- | --- |
| 0 | the main process | index generation: bumped whenever a stored object is removed or changed |
| 1 | the main process | invalidations: bumped whenever a write invalidates a URL |
| 2 | the main process | found through: index rows up to this one were there at start |
| 3 | the main process | checked through: rows found at start up to this one are verified |
| 4 | the main process, once | how many workers there are |
| 5 | the main process, once | bytes of the table of answers |
| 6 + i | worker i | its open client connections × 2, + 1 while it accepts none (`front.Balance`) |

Workers remember stored objects between requests; a changed generation tells them
to forget what they remember (`keeper.Buffer`). A worker lets a new request join a
fill it runs without asking the keeper only while no invalidation happened since the
fill began (`fill.Fills`): a fill that a write made stale must not gain readers. A
stored object whose index row was found at start and is not checked yet is verified by
the worker that serves it first (`keeper.Buffer`); until the store has opened the
index, every row counts as found at start and unchecked.

The table of answers is written by any worker under `lock`, one at a time, and read
without it, each entry a sequence lock of its own (see `sidecar/core/src/buffer/answers.rs`);
an answer is written only while the index is at the generation its lookup saw, and the
main process forgets a removed or changed object's answer, that one alone, after bumping
the generation. Its size follows
`--index-objects` (`settings.index_memory`); only the pages answers are written into
take memory.

The clients' table and the region are written by any process, but only under `lock`:
the core's `SharedLock`, a process-shared, robust pthread mutex in the file itself,
after the slots. Taken and given back without a system call while no other process
holds it (a `flock` cost two each time, several times a miss); a process killed holding
it leaves it to the next, which goes on, so a `kill -9` never leaves it held, and what it
guards is written so that a change cut short reads as none (`buffer.claims`).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable
from pathlib import Path

from sidecar.core import native

_SLOT = 8  # bytes
_COMMON = 6  # slots before the per-worker ones
# In a worker's connections slot: it is accepting no connection at the moment.
NOT_ACCEPTING = 1
_UNKNOWN = 2**63 - 1  # "found through" before the store has looked: every row
# Bytes of the table of clients that refused the pod CA (`sidecar.wire.rejections`).
CLIENTS_TABLE = 8 * 1024
# Where the index generation is (slot 0), for the core's table of answers.
GENERATION_AT = 0
# The memory file's name (`/memfd:<name>` in a process's maps).
MEMORY_FILE = "burstbuffer-shared"


class Shared:
    """The shared slots, table and region, mapped into this process."""

    def __init__(self, fd: int, create: bool = False) -> None:
        self.fd = fd
        self.memory = mmap.mmap(fd, os.fstat(fd).st_size)
        self.workers = workers = int.from_bytes(self.memory[4 * _SLOT : 5 * _SLOT], "little")
        self._slots = memoryview(self.memory)[: (workers + _COMMON) * _SLOT].cast("q")
        # The lock follows the slots, the tables the lock, the region the tables.
        self.lock_at = lock_at = (workers + _COMMON) * _SLOT
        self.clients = lock_at + native.SHARED_LOCK_BYTES
        self.answers = self.clients + CLIENTS_TABLE
        self.region = self.answers + int(self._slots[5])
        # `with shared.lock:` holds the lock of the tables and the region.
        self.lock = native.SharedLock(fd, lock_at, create=create)

    @classmethod
    def create(cls, workers: int, region: int = 0, answers: int = 0) -> Shared:
        """Slots for `workers` workers, the clients' table, `answers` bytes of the table
        of answers, then `region` bytes, all zero."""
        fd = os.memfd_create(MEMORY_FILE, 0)  # inherited by workers on purpose
        slots = (workers + _COMMON) * _SLOT
        size = slots + native.SHARED_LOCK_BYTES + CLIENTS_TABLE + answers + region
        os.ftruncate(fd, size)
        os.pwrite(fd, workers.to_bytes(_SLOT, "little"), 4 * _SLOT)
        os.pwrite(fd, answers.to_bytes(_SLOT, "little"), 5 * _SLOT)
        shared = cls(fd, create=True)
        shared._slots[2] = _UNKNOWN
        for index in range(workers):
            shared.worker_gone(index)
        return shared

    @property
    def generation(self) -> int:
        return int(self._slots[0])

    def bump_generation(self) -> None:
        self._slots[0] += 1

    @property
    def invalidations(self) -> int:
        return int(self._slots[1])

    def bump_invalidations(self) -> None:
        self._slots[1] += 1

    @property
    def found_through(self) -> int:
        return int(self._slots[2])

    @property
    def checked_through(self) -> int:
        return int(self._slots[3])

    def publish_checks(self, found_through: int, checked_through: int) -> None:
        """Rows up to `found_through` were found at start; of those, rows up to
        `checked_through` are verified (or gone)."""
        self._slots[3] = checked_through
        self._slots[2] = found_through

    @property
    def connections(self) -> memoryview:
        """Each worker's slot of `front.Balance`: its open client connections times
        two, plus NOT_ACCEPTING while it accepts none."""
        return self._slots[_COMMON:]

    def answers_table(
        self,
        objects: int,
        bodies: Path,
        deciding: Iterable[str],
        keys: native.KeyRules,
        track_touches: bool = False,
    ) -> native.Answers:
        """The core's table of answers in this memory, for `objects` answers of bodies in
        the directory `bodies`; `deciding`: the request fields a hit's decision reads;
        `keys`: the rule of the key a request's answer is found by (`native.Answers`)."""
        return native.Answers(
            self.fd,
            GENERATION_AT,
            self.lock_at,
            self.answers,
            self.region - self.answers,
            objects,
            str(bodies),
            sorted(deciding),
            keys,
            track_touches=track_touches,
        )

    def client_connections(self) -> int:
        """The client connections open in every worker."""
        return sum(slot & ~NOT_ACCEPTING for slot in self.connections) // 2

    def worker_gone(self, index: int) -> None:
        """Worker `index` is not running (not started yet, or exited): no connections,
        none accepted until it runs again."""
        self._slots[_COMMON + index] = NOT_ACCEPTING
