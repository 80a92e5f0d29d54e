"""Copying one body from its origin into a file, in segments, resuming what breaks off.

Every fill is a list of segments, each fetched until complete: when an origin drops
the connection or stalls, the segment is resumed from the byte it had with a Range
request validated by If-Range (so bytes of a changed object are never appended to an
older one), a few times with backoff; from the origin when a parent cache broke off.
A small body, or one whose origin cannot serve ranges, is a single segment: the
fill's original response. The first segment's bytes never pass through Python: the
core takes them (`Target.tee`), takes their digest and sends them on to the clients
that follow it, and writes them into the file, or, for a small body, keeps them in
memory until its fill has it written into the buffer once whole, off its clients' way.

Many dataset hosts cap throughput per connection (Nezha measured 3.49 MB/s to a far
host). A fill always starts on the original response alone; if, after PROBE_SECONDS,
that connection delivers less than SLOW_RATE and the origin supports ranges, the rest
of the body is split into equal segments of at most SEGMENT bytes, fetched over
`connections` connections at once, each with `Range` and `If-Range` (so a piece of a
changed object is refused, never mixed in). A fast origin is never split: on a fast
link the extra connections only cost CPU. Pieces land in the partial file at their
offsets; readers only ever see the contiguous prefix, so clients still receive the
body in order, as fast as the slowest of the segments in front of them allows.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from sidecar.core import native
from sidecar.metrics import Metrics
from sidecar.origins.upstream import CannotResume, Upstream, Validators, loggable_url
from sidecar.wire.client import Response, UpstreamError

logger = logging.getLogger(__name__)

SEGMENT = 16 * 1024 * 1024  # bytes per ranged request, at most
# The original connection is measured for this long before the rest may be split ...
PROBE_SECONDS = 1.0
# ... and it is split only when it delivers less than this.
SLOW_RATE = 50e6  # bytes/s
# Attempts per segment, and the first backoff (doubled each time).
SEGMENT_ATTEMPTS = 4
SEGMENT_BACKOFF = 0.25  # seconds
_HASH_STEP = 1024 * 1024  # bytes read back per digest update
# Bodies up to this size are hashed on the event loop as they arrive (at ~5 GB/s,
# a fifth of a millisecond in all): handing each piece to the hashing thread would cost
# more than the hashing.
INLINE_HASH = 1024 * 1024  # bytes
# Larger bodies are hashed on this thread, off the event loop (`native.Digest` releases
# the GIL), in the order the bytes are submitted: one worker keeps every digest's
# updates in order.
_HASHER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="digest")


class SegmentFailed(Exception):
    """A segment could not be fetched (origin refused to resume, or kept failing)."""


def segment_size(size: int, connections: int) -> int:
    """Equal segments of at most SEGMENT, in a multiple of `connections`, so that the
    connections finish together instead of one fetching a lonely tail."""
    rounds = math.ceil(size / (connections * SEGMENT))
    return max(math.ceil(size / (rounds * connections)), 1)


def may_split(
    connections: int, size: int, accept_ranges: str | None, validators: Validators
) -> bool:
    """Only a body that is large, rangeable, and can be validated with If-Range."""
    return (
        connections > 1
        and size > SEGMENT
        and (accept_ranges or "").strip().lower() == "bytes"
        and validators.if_range is not None
    )


@dataclass(frozen=True)
class Target:
    """Where one body comes from and where it goes."""

    url: str
    headers: list[tuple[str, str]]
    validators: Validators
    size: int
    # The file, read and written (segments land at their offsets; the digest reads back
    # what became contiguous); None: into `tee`, in memory, one segment.
    fd: int | None
    tee: native.Tee | None = None
    # False: a body that broke off fails its fill rather than being asked for again from
    # the byte it had (a URL signed for one range is good for that range only).
    resumable: bool = True


class SegmentedCopy:
    """Fetch one body in segments; `advance(prefix)` is told the contiguous bytes in the
    file, and `whole(body)` a body kept in memory once it is complete."""

    def __init__(
        self,
        upstream: Upstream,
        metrics: Metrics,
        target: Target,
        advance: Callable[[int], None],
        whole: Callable[[bytes], None],
        connections: int,
    ) -> None:
        """`connections`: how many the body may be split over (1: never split)."""
        self._upstream = upstream
        self._metrics = metrics
        self._target = target
        self._advance = advance
        self._whole = whole
        self._connections = connections if target.fd is not None else 1
        self._bounds = [(0, target.size)]  # one segment until the probe says otherwise
        self._progress = [0]
        self._next = 1  # segment 0 comes from the original response
        self._first_incomplete = 0
        self._hashed = 0  # bytes submitted to the digest, always a prefix of the body
        self._digest = native.Digest()
        self._hashing: concurrent.futures.Future[None] | None = None
        self.body: bytes | None = None  # an in-memory body, once complete
        self._group: asyncio.TaskGroup | None = None
        # The response whose body the core writes into the file (`_into_file`).
        self._writing: Response | None = None
        if target.tee is not None and target.fd is not None:
            target.tee.on_progress = self._tee_wrote
        self._started = time.monotonic()
        # A response went on past its announced end: the copy may be whole, but is not
        # trusted enough to be stored.
        self.overlong = False

    async def run(self, first: Response) -> str:
        """Copy the whole body; its digest (hex) when done.

        An in-memory body is told `whole` as soon as it is `body`."""
        try:
            return await self._run(first)
        finally:
            if self._target.tee is not None:
                self._target.tee.on_progress = None  # the tee no longer keeps this alive

    async def _run(self, first: Response) -> str:
        if self._connections <= 1:
            # Never split: no tasks of its own (most fills are small, and take this way).
            await self._worker(first)
            tee = self._target.tee
            if tee is not None:
                digest = tee.hexdigest()
                assert digest is not None  # the copy ended whole, or raised
                return digest
            return await self._hexdigest()
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                group.create_task(self._worker(first))
        except BaseExceptionGroup as failures:
            # The first failure says why; the others were cancelled because of it.
            raise failures.exceptions[0] from failures
        return await self._hexdigest()

    async def _hexdigest(self) -> str:
        if self._hashing is not None:
            await asyncio.wrap_future(self._hashing)
        return self._digest.hexdigest()

    def _maybe_split(self) -> None:
        """After the probe, split the rest of a slow body over more connections (once)."""
        elapsed = time.monotonic() - self._started
        if self._connections <= 1 or elapsed < PROBE_SECONDS or len(self._bounds) > 1:
            return
        if self._progress[0] / elapsed >= SLOW_RATE:
            self._connections = 1  # fast enough: never split this body
            return
        position = self._progress[0]
        rest = self._target.size - position
        size = segment_size(rest, self._connections)
        if rest <= size:
            return
        self._bounds = [(0, position + size)] + [
            (start, min(start + size, self._target.size))
            for start in range(position + size, self._target.size, size)
        ]
        self._progress += [0] * (len(self._bounds) - 1)
        logger.info(
            "%s: %.1f MB/s on one connection; fetching the remaining %d bytes over %d",
            loggable_url(self._target.url),
            self._progress[0] / elapsed / 1e6,
            rest,
            self._connections,
        )
        assert self._group is not None
        for _ in range(min(self._connections, len(self._bounds)) - 1):
            self._group.create_task(self._worker(None))

    def _hash(self, work: Callable[[], None]) -> None:
        if self._target.size <= INLINE_HASH:
            work()
        else:
            self._hashing = _HASHER.submit(work)

    def _length(self, index: int) -> int:
        start, end = self._bounds[index]
        return end - start

    async def _worker(self, response: Response | None) -> None:
        if response is not None:
            await self._segment(0, response)
        while self._next < len(self._bounds):
            index = self._next
            self._next += 1
            await self._segment(index, None)

    async def _segment(self, index: int, response: Response | None) -> None:
        attempt = 0
        while self._progress[index] < self._length(index):
            start, end = self._bounds[index]
            offset = start + self._progress[index]
            broke: Response | None = None  # a response whose body stopped short
            try:
                if response is None:
                    self._metrics.counters.upstream_requests += 1
                    response = await self._upstream.resume(
                        self._target.url,
                        self._target.headers,
                        offset,
                        end,
                        self._target.size,
                        self._target.validators,
                    )
                await self._copy(index, response)
                if response.complete:
                    self.overlong |= await response.settle()
                error: BaseException = UpstreamError(f"segment {index} ended early")
                broke = response
            except CannotResume as e:
                raise SegmentFailed(f"segment {index}: {e}") from e
            except UpstreamError as e:
                error = e
                broke = response
            finally:
                if response is not None:
                    # Kept for the next fill only when it ended cleanly where it said
                    # (not the first response of a split body, which goes on).
                    response.release()
                response = None
            if self._progress[index] == self._length(index):
                return
            if broke is not None:
                # From a parent, the resume then goes to the origin.
                self._upstream.broke_off(broke)
            attempt += 1
            self._metrics.counters.upstream_errors += 1
            if not self._target.resumable:
                raise SegmentFailed(f"segment {index}: cannot be resumed: {error}")
            if attempt > SEGMENT_ATTEMPTS:
                raise SegmentFailed(f"segment {index}: gave up after {SEGMENT_ATTEMPTS}: {error}")
            logger.warning(
                "%s: upstream failed at byte %d (%s); resuming (attempt %d of %d)",
                loggable_url(self._target.url),
                start + self._progress[index],
                error,
                attempt,
                SEGMENT_ATTEMPTS,
            )
            await asyncio.sleep(SEGMENT_BACKOFF * 2 ** (attempt - 1))

    async def _copy(self, index: int, response: Response) -> None:
        tee = self._target.tee
        if tee is not None and self._target.fd is not None and index == 0:
            await self._into_file(tee, response)
            return
        if tee is not None and self._target.fd is None:
            await self._into(tee, response)
            return
        async for data in response.chunks():
            start, end = self._bounds[index]  # segment 0 may shrink when the body is split
            position = start + self._progress[index]
            piece = data[: end - position]
            self._metrics.counters.bytes_from_upstream += len(piece)
            self._write(index, piece, position)
            if position + len(piece) >= end:
                return

    async def _into(self, tee: native.Tee, response: Response) -> None:
        """An in-memory body's one segment, from where the tee has it to its end."""
        before = tee.received
        try:
            await response.into(tee)
        finally:
            self._metrics.counters.bytes_from_upstream += tee.received - before
            self._progress[0] = tee.received
        self.body = tee.body()
        if self.body is not None:
            self._whole(self.body)

    async def _into_file(self, tee: native.Tee, response: Response) -> None:
        """The first segment of a body the core writes into the file itself, with its
        digest, from where the tee has it to the segment's end (`_tee_wrote`)."""
        self._writing = response
        try:
            await response.into(tee)
        except UpstreamError:
            # Or stopped by `_tee_wrote`: the segment is whole, or the file cannot be
            # written.
            if tee.error is None and tee.received < self._bounds[0][1]:
                raise
        finally:
            self._writing = None
        if tee.error is not None:
            raise OSError(tee.error)

    def _tee_wrote(self, received: int) -> None:
        """The core wrote the first segment's bytes up to `received` into the file, and
        took their digest: what `_write` does for a piece of any other segment."""
        tee = self._target.tee
        assert tee is not None
        self._metrics.counters.bytes_from_upstream += received - self._progress[0]
        self._progress[0] = self._hashed = received
        if received == self._bounds[0][1]:
            # The rest of a split body is hashed here, going on from the tee's digest.
            self._digest = tee.digest()
        if self._first_incomplete == 0:
            self._move_frontier()
        self._maybe_split()
        tee.stop_at(self._bounds[0][1])
        if self._writing is None:
            return
        # The origin's response goes on past what the tee may write: stopped (on the
        # loop's next turn, out of the origin's stream that called).
        if tee.error is not None:
            reason = f"cannot write the body: {tee.error}"
        elif received == self._bounds[0][1] < self._target.size:
            reason = "the first segment is whole"
        else:
            return
        asyncio.get_running_loop().call_soon(self._writing.stop, reason)

    def _write(self, index: int, piece: bytes, position: int) -> None:
        assert self._target.fd is not None
        pwrite_all(self._target.fd, piece, position)
        if position == self._hashed:
            # In order: hash it as it is rather than reading it back later.
            self._hash(partial(self._digest.update, piece))
            self._hashed += len(piece)
        self._progress[index] += len(piece)
        if index == self._first_incomplete:
            self._move_frontier()
        if index == 0:
            self._maybe_split()

    def _move_frontier(self) -> None:
        while self._first_incomplete < len(self._bounds) and self._progress[
            self._first_incomplete
        ] == self._length(self._first_incomplete):
            self._first_incomplete += 1
        if self._first_incomplete == len(self._bounds):
            frontier = self._target.size
        else:
            start = self._bounds[self._first_incomplete][0]
            frontier = start + self._progress[self._first_incomplete]
        # The digest covers bytes in order: read back what just became contiguous (from
        # the page cache or tmpfs, far cheaper than the network that brought it).
        if self._hashed < frontier:
            self._hash(partial(self._read_back, self._hashed, frontier))
            self._hashed = frontier
        self._advance(frontier)

    def _read_back(self, start: int, end: int) -> None:
        """Hash bytes [start, end) of the file (on the hashing thread)."""
        assert self._target.fd is not None
        while start < end:
            data = os.pread(self._target.fd, min(_HASH_STEP, end - start), start)
            if not data:
                raise OSError("the partial body is shorter than what was written")
            self._digest.update(data)
            start += len(data)


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """Write all of `data` at `offset` (pwrite may write less than asked)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written
