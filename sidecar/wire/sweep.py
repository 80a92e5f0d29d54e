"""Deadlines of many things, checked by one timer of the loop's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Sweep(Generic[T]):
    """Things watched for a deadline, each checked every `interval` seconds while any is
    watched, so that each is handled within `interval` after it is due. One timer for
    all of them: a timer of each connection's own, made and cancelled when it settled,
    cost a new connection per file a twelfth of its CPU."""

    def __init__(self, interval: float, check: Callable[[T, float], object]) -> None:
        """`check(thing, now)`, `now` on the clock of `time.monotonic()`, handles a thing
        that may be due; it may `forget` it."""
        self._interval = interval
        self._check = check
        self._watched: set[T] = set()
        self._timer: asyncio.TimerHandle | None = None

    def watch(self, thing: T) -> None:
        self._watched.add(thing)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._interval, self._sweep)

    def forget(self, thing: T) -> None:
        self._watched.discard(thing)

    def watched(self) -> list[T]:
        return list(self._watched)

    def _sweep(self) -> None:
        now = time.monotonic()
        for thing in list(self._watched):
            self._check(thing, now)
        self._timer = None
        if self._watched:
            self._timer = asyncio.get_running_loop().call_later(self._interval, self._sweep)

    def close(self) -> None:
        """Check no more."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
