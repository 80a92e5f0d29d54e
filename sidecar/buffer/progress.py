"""How far a fill has come, readable by every worker process.

A fill's pump runs in one worker; clients of the same object may be connected to
any worker. Beside each partial body lies a 16-byte progress record, mapped into
memory by whoever follows the fill: the contiguous bytes written so far, and the
fill's state. The pump updates it after each write (a store into shared memory, no
system call); readers in other workers poll it. A crashed worker cannot mark its
own fills failed, so the parent does (`mark_failed`).

x86 and arm64 store aligned 8-byte words atomically, and the body bytes are written
with pwrite (a system call, hence ordered) before the count that announces them.
"""

from __future__ import annotations

import enum
import mmap
import os
import struct
from pathlib import Path

_RECORD = struct.Struct("<QQ")  # written, state
SUFFIX = ".progress"


class State(enum.IntEnum):
    RUNNING = 0
    COMMITTED = 1
    FAILED = 2
    BUFFER_FAILED = 3  # the buffer refused the body: readers fetch the rest upstream


def path_for(partial: Path) -> Path:
    return partial.with_name(partial.name + SUFFIX)


def create(partial: Path) -> None:
    """Create the record of a new fill (running, nothing written)."""
    fd = os.open(path_for(partial), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, _RECORD.pack(0, State.RUNNING))
    finally:
        os.close(fd)


class Progress:
    """A mapped progress record (opened by the pump and by readers alike)."""

    def __init__(self, partial: Path) -> None:
        """Raises FileNotFoundError when the fill is over and its record gone."""
        fd = os.open(path_for(partial), os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, _RECORD.size)
        finally:
            os.close(fd)  # the mapping stays valid, even after the file is unlinked

    def read(self) -> tuple[int, State]:
        written, state = _RECORD.unpack_from(self._map)
        return written, State(state)

    def advance(self, written: int) -> None:
        struct.pack_into("<Q", self._map, 0, written)

    def end(self, state: State) -> None:
        struct.pack_into("<Q", self._map, 8, state)

    def close(self) -> None:
        self._map.close()


def mark_failed(partial: Path) -> None:
    """Tell readers in other workers that a fill is over without a body."""
    try:
        progress = Progress(partial)
    except OSError:
        return
    progress.end(State.FAILED)
    progress.close()


def remove(partial: Path) -> None:
    path_for(partial).unlink(missing_ok=True)
