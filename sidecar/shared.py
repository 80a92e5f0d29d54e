"""Numbers every process of one sidecar shares, in one anonymous memory file.

The main process creates it and every worker inherits its descriptor. Each slot is
a signed 64-bit word, written by one process only (aligned 8-byte stores are atomic
on the platforms pods run on), so no lock is needed:

| slot | written by | meaning |
| --- | --- | --- |
| 0 | the main process | index generation: bumped whenever a stored object is removed |
| 1 + i | worker i | its open client connections (`front.Balance`) |

Workers remember stored objects between requests; a changed generation tells them
to forget what they remember (`keeper.Buffer`).
"""

from __future__ import annotations

import mmap
import os

_SLOT = 8  # bytes


class Shared:
    """The shared slots, mapped into this process."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.workers = os.fstat(fd).st_size // _SLOT - 1
        self._slots = memoryview(mmap.mmap(fd, (self.workers + 1) * _SLOT)).cast("q")

    @classmethod
    def create(cls, workers: int) -> Shared:
        fd = os.memfd_create("burstbuffer-shared", 0)  # inherited by workers on purpose
        os.ftruncate(fd, (workers + 1) * _SLOT)
        return cls(fd)

    @property
    def generation(self) -> int:
        return int(self._slots[0])

    def bump_generation(self) -> None:
        self._slots[0] += 1

    @property
    def connections(self) -> memoryview:
        """Open client connections per worker (one slot each)."""
        return self._slots[1:]
