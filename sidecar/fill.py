"""Fills: one upstream fetch per object, written into the buffer, read by many clients.

A fill belongs to no client. Its pump copies the origin's body into a partial file
in the buffer at the origin's pace; every client reading the object (the one that
started it, those that joined, Range readers) follows the file at its own pace, so a
slow client never slows the fill and nothing is held in memory. Time to first byte
is the origin's: a reader is handed bytes as soon as they are on the buffer.

When the body is complete and its length matches Content-Length the partial file is
renamed into the buffer (commit); any failure deletes it. If the origin drops the
connection mid-body, the pump resumes from the byte it had with a Range request
validated by If-Range, a few times with backoff; if it cannot, every reader's
connection is aborted, so no client ever sees a short body with a success status.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from sidecar import policy
from sidecar.metrics import Metrics
from sidecar.segments import SegmentedCopy, SegmentFailed, Target, may_split
from sidecar.store import Reservation, Store, StoreError
from sidecar.upstream import Upstream, UpstreamError, Validators, forwarded_headers, loggable_url

logger = logging.getLogger(__name__)

# Bytes per read of a body file; large, because each read becomes TLS records in one go.
CHUNK = 256 * 1024


class FillFailed(Exception):
    """The fill could not complete; readers must abort their responses."""


class BufferFailed(FillFailed):
    """The buffer refused the body (disk full, read-only): readers fetch the rest upstream."""


class Declined(Exception):
    """The object is not being stored (not cacheable, or no room): fetch it yourself."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Head:
    """The response every reader of a fill sends: 200 with the stored headers."""

    size: int
    headers: tuple[tuple[str, str], ...]
    validators: Validators
    request_headers: list[tuple[str, str]]  # as sent upstream, for resuming


class Fill:
    """One object being copied from its origin into the buffer."""

    def __init__(self, key: str, url: str) -> None:
        self.key = key
        self.url = url
        self.head: asyncio.Future[Head] = asyncio.get_running_loop().create_future()
        self.written = 0
        self.failure: BaseException | None = None
        self.ended = asyncio.Event()
        self._progress = asyncio.Event()
        # One descriptor on the body, shared by all readers (pread needs no position):
        # it stays valid across the rename of a commit and the unlink of a failure.
        self._fd: int | None = None
        self._readers = 0
        self._ended = False

    def attach(self) -> None:
        """Count a reader in; every attach() is paired with a detach()."""
        self._readers += 1

    def detach(self) -> None:
        self._readers -= 1
        self._close_when_unused()

    def _close_when_unused(self) -> None:
        if self._ended and self._readers == 0 and self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _advance_to(self, prefix: int) -> None:
        self.written = prefix
        self._wake()

    def _finish(self, failure: BaseException | None) -> None:
        self.failure = failure
        self.ended.set()
        self._ended = True
        self._close_when_unused()
        if not self.head.done():
            self.head.set_exception(failure or FillFailed("fill ended before its headers"))
            self.head.exception()  # mark retrieved: nobody may be waiting
        self._wake()

    def _wake(self) -> None:
        self._progress.set()
        self._progress = asyncio.Event()

    async def read(self, start: int, end: int) -> AsyncIterator[bytes]:
        """Bytes [start, end) of the body, as soon as the pump has written them.

        Only for an attached reader, after `head` resolved.
        """
        offset = start
        while offset < end:
            if offset >= self.written:
                if isinstance(self.failure, OSError):
                    raise BufferFailed(str(self.failure))
                if self.failure is not None:
                    raise FillFailed(str(self.failure))
                await self._progress.wait()
                continue
            assert self._fd is not None
            for chunk in read_file(self._fd, offset, min(end, self.written)):
                offset += len(chunk)
                yield chunk


class Fills:
    """The fills in progress, keyed by cache key, and the pumps that drive them."""

    def __init__(
        self, store: Store, upstream: Upstream, metrics: Metrics, connections: int
    ) -> None:
        """`connections`: how many origin connections one large fill may use."""
        self._store = store
        self._upstream = upstream
        self._metrics = metrics
        self._connections = connections
        self._active: dict[str, Fill] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._active)

    def join(self, key: str) -> Fill | None:
        """The running fill of `key`, attached for the caller (who must detach), or None."""
        fill = self._active.get(key)
        if fill is not None:
            fill.attach()
        return fill

    async def begin(
        self, key: str, url: str, request_headers: list[tuple[str, str]]
    ) -> tuple[Fill | None, aiohttp.ClientResponse | None, str]:
        """Fetch `url` upstream and decide whether it becomes a fill.

        Returns (fill, None, "") when the body is being stored (the fill attached for
        the caller, who must detach), or (None, response, reason) when it is passed
        through: the caller relays `response` and releases it. Raises UpstreamError when
        the origin cannot be reached. Clients that ask for the key meanwhile join this
        attempt through `join()`.
        """
        fill = Fill(key, url)
        self._active[key] = fill
        try:
            return await self._decide(fill, request_headers)
        except BaseException as e:
            if not fill.head.done():
                self._end(fill, e if isinstance(e, Exception) else FillFailed("cancelled"))
            raise

    async def _decide(
        self, fill: Fill, request_headers: list[tuple[str, str]]
    ) -> tuple[Fill | None, aiohttp.ClientResponse | None, str]:
        headers = forwarded_headers(request_headers, for_fill=True)
        self._metrics.counters.upstream_requests += 1
        try:
            response = await self._upstream.get(fill.url, headers)
        except UpstreamError:
            self._metrics.counters.upstream_errors += 1
            raise
        verdict = policy.response_is_cacheable(response.status, response.headers)
        size = policy.content_length(response.headers)
        reservation = None
        reason: str = verdict.reason
        if verdict.cacheable and size is not None:
            reservation = self._reserve(size)
            if reservation is None:
                reason = "no-room"
                self._metrics.counters.admissions_refused += 1
        if reservation is None:
            self._end(fill, Declined(reason))
            return None, response, reason
        try:
            # Created before anyone reads, so that readers can open it at once.
            out, fill._fd = _open_partial(reservation.path)
        except OSError as e:
            self._store.abort(reservation)
            self._store.report_failure()
            self._metrics.buffer_trouble("creating a partial body", e)
            self._end(fill, Declined("buffer-error"))
            return None, response, "buffer-error"
        validators = Validators(response.headers.get("ETag"), response.headers.get("Last-Modified"))
        stored = tuple(policy.stored_headers(response.headers))
        fill.attach()
        fill.head.set_result(Head(reservation.size, stored, validators, headers))
        task = asyncio.create_task(self._pump(fill, response, reservation, out))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return fill, None, ""

    async def read(self, fill: Fill, start: int, end: int) -> AsyncIterator[bytes]:
        """Bytes [start, end) of a fill's body; if the buffer fails under the fill, the
        rest comes from the origin with a validated Range request (fail open)."""
        offset = start
        buffer_failed = False
        try:
            async for chunk in fill.read(start, end):
                offset += len(chunk)
                yield chunk
        except BufferFailed:
            buffer_failed = True
        if buffer_failed and offset < end:
            async for chunk in self._from_upstream(fill, offset, end):
                yield chunk

    async def _from_upstream(self, fill: Fill, start: int, end: int) -> AsyncIterator[bytes]:
        head = fill.head.result()
        self._metrics.counters.upstream_requests += 1
        try:
            response = await self._upstream.resume(
                fill.url, head.request_headers, start, end, head.size, head.validators
            )
        except UpstreamError as e:
            self._metrics.counters.upstream_errors += 1
            raise FillFailed(f"buffer failed and the origin cannot resume: {e}") from e
        received = 0
        try:
            async for chunk in response.content.iter_any():
                self._metrics.counters.bytes_from_upstream += len(chunk)
                received += len(chunk)
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as e:
            raise FillFailed(f"origin broke off: {e}") from e
        finally:
            response.release()
        if received != end - start:
            raise FillFailed(f"origin sent {received} of {end - start} bytes")

    def _reserve(self, size: int) -> Reservation | None:
        try:
            return self._store.reserve(size)
        except StoreError as e:
            self._metrics.buffer_trouble("reserving room", e)
            return None

    def _end(self, fill: Fill, failure: BaseException | None) -> None:
        if self._active.get(fill.key) is fill:
            del self._active[fill.key]
        fill._finish(failure)

    async def _pump(
        self,
        fill: Fill,
        response: aiohttp.ClientResponse,
        reservation: Reservation,
        out: int,
    ) -> None:
        started = time.monotonic()
        head = fill.head.result()
        failure: BaseException | None = None
        try:
            sha256 = await self._copy(fill, head, response, out)
            entry = self._store.commit(reservation, fill.key, sha256, head.headers)
            elapsed = time.monotonic() - started
            logger.info(
                "stored %s: %d bytes in %.2fs (%.1f MB/s)",
                loggable_url(fill.url),
                entry.size,
                elapsed,
                entry.size / max(elapsed, 1e-6) / 1e6,
            )
        except OSError as e:
            failure = e
            self._store.report_failure()
            self._metrics.buffer_trouble("writing a body", e)
        except StoreError as e:
            # The body is complete on disk; readers finish from their open descriptors.
            self._metrics.buffer_trouble("committing a body", e)
        except (FillFailed, SegmentFailed) as e:
            failure = e
            logger.warning("fill %s failed: %s", loggable_url(fill.url), e)
        finally:
            os.close(out)
            self._store.abort(reservation)  # no-op after a commit
            self._end(fill, failure)

    async def _copy(
        self, fill: Fill, head: Head, response: aiohttp.ClientResponse, out: int
    ) -> str:
        """Copy the body into the partial file; its SHA-256 (hex) when complete.

        A large body from a slow origin that serves ranges is split over several
        connections; any other is one segment, resumed where it broke off.
        """
        accept_ranges = response.headers.get("Accept-Ranges")
        splittable = may_split(self._connections, head.size, accept_ranges, head.validators)
        assert fill._fd is not None
        target = Target(fill.url, head.request_headers, head.validators, head.size, out, fill._fd)
        copy = SegmentedCopy(
            self._upstream,
            self._metrics,
            target,
            fill._advance_to,
            connections=self._connections if splittable else 1,
        )
        return await copy.run(response)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def read_file(fd: int, start: int, end: int) -> Iterator[bytes]:
    """Bytes [start, end) of a body file, in CHUNK-sized reads."""
    offset = start
    while offset < end:
        chunk = os.pread(fd, min(CHUNK, end - offset), offset)
        if not chunk:
            raise FillFailed("a body file is shorter than recorded")
        offset += len(chunk)
        yield chunk


def _open_partial(path: Path) -> tuple[int, int]:
    """Create a partial body: a descriptor to write it and one for its readers."""
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        return out, os.open(path, os.O_RDONLY)
    except OSError:
        os.close(out)
        raise


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
