"""Fills: one upstream fetch per object, written into the buffer, read by many clients.

A fill belongs to no client, and its clients may be connected to any worker: the
worker that claims a key (`sidecar.buffer.claims`) runs the fill; clients
in that worker follow it through its `Fill`, clients in other workers through a
`RemoteFill` on the same partial file and its progress record (`sidecar.buffer.progress`).

The pump copies the origin's body into a partial file in the buffer at the origin's
pace; every client reading the object (the one that
started it, those that joined, Range readers) follows the file at its own pace, so a
slow client never slows the fill and little is held in memory. The core does the
copying (`Fill.tee`, a `native.Tee` on the file): the origin's stream writes each
piece into the file, takes its digest, and sends it on to the clients of the lean
front end that follow the tee, straight from the piece while a client keeps up and
as a range of the file when it does not; the fill hears how far the file has come
after each piece. Other readers (mitmproxy's front end, other workers) follow the file
itself, handed the ranges of it written so far (which the core sends from the file to
a client of the lean front end), and the segments of a body split over several
connections are written by Python (from a slow origin: readers read them back). Time
to first byte is the origin's: a reader is handed bytes as soon as they are on the
buffer (but for small bodies, below).

When the body is complete and its length matches Content-Length the partial file is
renamed into the buffer (commit); any failure deletes it. The body's last byte is
handed to readers once the whole body is in the partial file, while it is committed
(a small body by this worker, at once; any other by the keeper: a miss's client does
not wait for that round trip, and its next request meets the keeper's answer half
way). A request for the object that comes meanwhile waits for the commit, and is
answered as a hit (revalidated with `--revalidate`), never as a late joiner of the
fill: in this worker it waits for the fill to end; in another, its claim finds the
fill's until the commit, which frees it once the object is indexed
(`sidecar.buffer.claims`). A small body is handed to Python's readers whole, rather
than piece by piece: waiting for all of it costs its time to first byte a fraction of a
millisecond from a fast origin, and takes nothing from its whole. One stored from this
worker's lease is kept in memory by the core (`Fill.tee`, a `native.Tee`), which takes
its digest as it arrives and sends it on at once to the clients of the lean front end
that follow it: no piece of it passes through Python, and no task waits for it (its
response tells the fill of its end, `Response.feed`, and a pump then commits it, or
resumes it). It is written and committed once whole, after its readers have it: a
miss then costs its client little more than the origin's time. If the origin drops the
connection mid-body, the pump resumes from the byte it had with a Range request
validated by If-Range, a few times with backoff; if it cannot, every reader's
connection is aborted, so no client ever sees a short body with a success status.

A body whose length only its end tells (chunked, or delimited by the connection's
close) is stored another way (`UnsizedFill`): its one client relays the origin's stream
while it is written into the buffer, and nobody joins it (`sidecar.buffer.keeper` says
why).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.buffer.keeper import BUFFER_UNAVAILABLE, SMALL, UNSIZED, Buffer
from sidecar.buffer.progress import Progress, State
from sidecar.buffer.segments import SegmentedCopy, SegmentFailed, Target, may_split, pwrite_all
from sidecar.buffer.store import StoredObject, StoreError
from sidecar.cache import endpoints, policy
from sidecar.core import native
from sidecar.ipc import Message
from sidecar.metrics import Metrics
from sidecar.origins.upstream import Upstream, Validators, forwarded_headers, loggable_url
from sidecar.wire.client import Response, UpstreamError
from sidecar.wire.exchange import BodyFile, Channel

logger = logging.getLogger(__name__)

# Bytes per read of a body file; large, because each read becomes TLS records in one go.
CHUNK = 256 * 1024
# Bodies up to this size reach their readers whole, once all of it is in.
WHOLE_AT_END = 256 * 1024  # bytes
# Bytes of small bodies one worker keeps in memory at once (`Fill.tee`, at most SMALL
# each): a small body beyond them is stored through the keeper, in a partial file, as a
# larger one is, so that many concurrent misses never hold more than this.
IN_MEMORY = 16 * 1024 * 1024  # bytes
# A reader following a fill in another worker polls its progress this often at first,
# backing off to _POLL_MAX while nothing new arrives.
_POLL_MIN = 0.001  # seconds
_POLL_MAX = 0.02  # seconds
# A fill of unknown length asks for twice its room each time it outgrows it (a few round
# trips to the keeper for any body), but never for more than this beyond it: room held
# and not written is room another fill is refused.
GROWTH_MAX = 64 * 1024 * 1024  # bytes


class FillFailed(Exception):
    """The fill could not complete; readers must abort their responses."""


class BufferFailed(FillFailed):
    """The buffer refused the body (disk full, read-only): readers fetch the rest upstream."""


class Declined(Exception):
    """The object is not being stored (not cacheable, or no room): fetch it yourself."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class StoredMeanwhile(Exception):
    """The object was committed after the caller looked it up: serve it from there."""

    def __init__(self, key: str, joined: bool = False) -> None:
        """`joined`: the request came while the fill that stored it ran (it counts as
        coalesced, not as a hit)."""
        super().__init__(key)
        self.joined = joined


@dataclass(frozen=True)
class Head:
    """The response the readers of a fill send: 200 with the stored headers (the one
    whose request started the fill gets the origin's own, `Acquired.relayed`)."""

    size: int
    headers: tuple[tuple[str, str], ...]
    validators: Validators
    request_headers: list[tuple[str, str]]  # as sent upstream, for resuming
    generated_at: float  # see policy.generated_at
    lifetime: float  # see policy.freshness_lifetime

    def to_message(self) -> dict[str, object]:
        return {
            "headers": [list(h) for h in self.headers],
            "generated_at": self.generated_at,
            "lifetime": self.lifetime,
            "etag": self.validators.etag,
            "last_modified": self.validators.last_modified,
            "request_headers": [list(h) for h in self.request_headers],
        }

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> Head:
        return cls(
            message["size"],
            tuple((k, v) for k, v in message["headers"]),
            Validators(message["etag"], message["last_modified"]),
            [(k, v) for k, v in message["request_headers"]],
            message["generated_at"],
            message["lifetime"],
        )


class Fill:
    """One object being copied from its origin into the buffer, by this worker."""

    def __init__(self, key: str, url: str, invalidations: int) -> None:
        """`invalidations`: the count of invalidations when it began (`sidecar.shared`)."""
        self.key = key
        self.url = url
        self.invalidations = invalidations
        self.head: asyncio.Future[Head] = asyncio.get_running_loop().create_future()
        self.written = 0  # the prefix readers may read
        self._complete = 0  # the prefix the pump has written
        self._last = 0  # the largest prefix published before the fill ends
        self.failure: BaseException | None = None
        self.ended = asyncio.Event()
        # What readers waiting for more wait on: made by the first of them, set and
        # dropped at the pump's next step (most steps have nobody waiting).
        self._progress_event: asyncio.Event | None = None
        # One descriptor on the body, written by the pump and shared by all readers
        # (pwrite and pread need no position): it stays valid across the rename of a
        # commit and the unlink of a failure, and is closed when the last reader is done.
        self._fd: int | None = None
        self._shared: Progress | None = None  # the record readers in other workers follow
        self._readers = 0
        self._ended = False
        # Every byte is written and handed out; only the commit is pending.
        self.committing = False
        # The body on its way in the core, which sends it on to its followers: a small
        # one kept in memory while it arrives, or a larger one written into the file.
        self.tee: native.Tee | None = None
        self.in_memory = 0  # its bytes counted against the worker's IN_MEMORY
        # A small body kept in memory, once whole (`hand_over`): its readers take it.
        self._body: bytes | None = None

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
            self.tee = None  # and the tee's own descriptor (its followers have theirs)

    def _advance_to(self, prefix: int) -> None:
        self._complete = prefix
        # The last byte waits for the commit (see the module docstring).
        prefix = min(prefix, self._last)
        self.written = prefix
        if self._shared is not None:
            self._shared.advance(prefix)
        if self.tee is not None:
            self.tee.publish(prefix)
        self._wake()

    def hand_over(self, body: bytes) -> None:
        """A body kept in memory is whole: its readers get it now, and a request that
        comes meanwhile waits for its commit."""
        self._body = body
        self.tee = None  # its followers have it all; readers from now on take `body`
        self.committing = True
        self._last = len(body)
        self._advance_to(len(body))

    def _finish(self, failure: BaseException | None) -> None:
        self._last = self._complete
        self._advance_to(self._complete)
        self.failure = failure
        self.ended.set()
        self._ended = True
        if self._shared is not None:
            if failure is None:
                state = State.COMMITTED
            elif isinstance(failure, OSError):
                state = State.BUFFER_FAILED
            else:
                state = State.FAILED
            self._shared.end(state)
            self._shared.close()
            self._shared = None
        self._close_when_unused()
        if not self.head.done():
            self.head.set_exception(failure or FillFailed("fill ended before its headers"))
            self.head.exception()  # mark retrieved: nobody may be waiting
        self._wake()

    def _wake(self) -> None:
        event = self._progress_event
        if event is not None:
            self._progress_event = None
            event.set()

    async def read(self, start: int, end: int) -> AsyncIterator[Piece]:
        """Bytes [start, end) of the body, as soon as the pump has written them: those
        of a body kept in memory, else ranges of its file.

        Only for an attached reader, after `head` resolved.
        """
        offset = start
        while offset < end:
            if offset >= self.written:
                await self._progress()
                continue
            body = self._body
            if body is not None:
                # The whole of it without a copy, as most readers want it.
                piece = body if offset == 0 and end >= len(body) else body[offset:end]
                offset += len(piece)
                yield piece
                continue
            assert self._fd is not None
            upto = min(end, self.written)
            yield BodyFile(os.dup(self._fd), offset, upto)
            offset = upto

    async def whole(self) -> None:
        """Wait until every byte of the body is written (FillFailed if it never is,
        BufferFailed if the buffer refused it).

        Only after `head` resolved."""
        size = self.head.result().size
        while self.written < size:
            await self._progress()

    async def _progress(self) -> None:
        """Wait until the pump writes more, or raise what ended it short: BufferFailed
        if the buffer refused the body, else FillFailed."""
        if isinstance(self.failure, OSError):
            raise BufferFailed(str(self.failure))
        if self.failure is not None:
            raise FillFailed(str(self.failure))
        if self._progress_event is None:
            self._progress_event = asyncio.Event()
        await self._progress_event.wait()

    async def outcome(self) -> int:
        """Wait until the fill has ended: its size if stored, else FillFailed."""
        head = await self.head
        await self.ended.wait()
        if self.failure is not None:
            raise FillFailed(str(self.failure))
        return head.size


class RemoteFill:
    """A fill running in another worker, followed through its files."""

    def __init__(self, key: str, url: str, fill: dict[str, Any]) -> None:
        """Raises FileNotFoundError when the fill ended before we could open it."""
        self.key = key
        self.url = url
        path = fill["path"]
        self._progress = Progress(path)
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError:
            self._progress.close()
            raise
        self.head: asyncio.Future[Head] = asyncio.get_running_loop().create_future()
        self.head.set_result(Head.from_message(fill))

    @property
    def written(self) -> int:
        return self._progress.read()[0]

    def detach(self) -> None:
        os.close(self._fd)
        self._progress.close()

    async def read(self, start: int, end: int) -> AsyncIterator[Piece]:
        """Ranges [start, end) of the body's file, as soon as its fill has written them."""
        offset = start
        pause = _POLL_MIN
        while offset < end:
            written, state = self._progress.read()
            if offset < written:
                pause = _POLL_MIN
                upto = min(end, written)
                yield BodyFile(os.dup(self._fd), offset, upto)
                offset = upto
                continue
            if state == State.BUFFER_FAILED:
                raise BufferFailed("the buffer refused the body")
            if state != State.RUNNING:
                raise FillFailed("the fill ended before this range was written")
            await asyncio.sleep(pause)
            pause = min(pause * 2, _POLL_MAX)

    async def outcome(self) -> int:
        pause = _POLL_MIN
        while (state := self._progress.read()[1]) == State.RUNNING:
            await asyncio.sleep(pause)
            pause = min(pause * 2, _POLL_MAX)
        if state != State.COMMITTED:
            raise FillFailed("the fill failed")
        return self.head.result().size


AnyFill = Fill | RemoteFill
# What a reader of a fill is handed: bytes kept in memory, or a range of the body's file
# (with a descriptor of its own, which the one it is handed to closes).
Piece = bytes | BodyFile


class UnsizedFill:
    """A body of unknown length being stored while its one client relays it (`chunks`).

    Its room grows ahead of what is written (`Buffer.grow`). It is committed once the
    body ended whole (`Response.whole`: the last chunk, or a close that RFC 9112 §9.8
    trusts), before the relay writes the response's own end, so that a request after
    that finds it stored; the body is hashed as it passes (on the event loop: the relay
    paces it). Anything else abandons it, and the client still gets every byte the origin
    sends: a body that outgrows the room the buffer can give, a failing buffer, a write
    that invalidated it meanwhile. If the origin breaks off, so does the client's
    response: with no length, there is no resuming with a Range. Unlike other fills it
    is read at its client's pace and ends with its client (who would read on for
    nobody?). The caller `close()`s it, whatever happened, with the response.
    """

    def __init__(
        self,
        buffer: Buffer,
        metrics: Metrics,
        key: str,
        url: str,
        reserved: tuple[str, int, int],
        kept: policy.Kept,
        log_objects: bool,
        on_stored: Callable[[str, StoredObject, int], None],
    ) -> None:
        """`reserved`: the keeper's room (rid, its size) and the partial body open for
        writing; `kept`: what is kept of the origin's response; `on_stored`: told once it is
        committed, as `Fills.on_stored` is."""
        self._buffer = buffer
        self._metrics = metrics
        self._key = key
        self._url = url
        self._rid: str | None = reserved[0]  # None once committed or abandoned
        self._room = reserved[1]
        self._fd: int | None = reserved[2]
        self._headers = kept.stored
        self._generated_at = kept.generated_at
        self._lifetime = kept.lifetime
        self._log_objects = log_objects
        self._on_stored = on_stored
        self._size = 0
        self._stored = False
        self.abandoned: str | None = None  # why it is not stored, once it never will be
        self._digest = native.Digest()
        self._started = time.monotonic()

    async def chunks(self, response: Response) -> AsyncIterator[bytes]:
        """The body of `response` as it arrives, stored on its way; UpstreamError if it
        stops short."""
        async for chunk in response.chunks():
            if self._rid is not None:
                await self._write(chunk)
            yield chunk
        if self._rid is not None:
            await self._commit(response)

    async def drain(self, response: Response) -> int | None:
        """Store the body with nobody to relay it to (stage-in): its size once stored,
        else None."""
        try:
            async for _ in self.chunks(response):
                pass
        except UpstreamError as e:
            self._abandon(str(e))
            return None
        return self._size if self._stored else None

    async def _write(self, chunk: bytes) -> None:
        end = self._size + len(chunk)
        if end > self._room and not await self._grow(end):
            self._abandon(f"it outgrew the room the buffer could give it ({self._room} bytes)")
            return
        assert self._fd is not None
        try:
            pwrite_all(self._fd, chunk, self._size)
        except OSError as e:
            self._buffer.report_failure(f"cannot write a body: {e}")
            self._metrics.buffer_trouble("writing a body", e)
            self._abandon("the buffer refused it")
            return
        self._digest.update(chunk)
        self._size = end

    async def _grow(self, end: int) -> bool:
        assert self._rid is not None
        wanted = max(end, min(2 * self._room, self._room + GROWTH_MAX))
        for size in dict.fromkeys((wanted, end)):  # then only what this chunk needs
            try:
                if await self._buffer.grow(self._rid, size):
                    self._room = size
                    return True
            except StoreError as e:
                self._metrics.buffer_trouble("growing room", e)
                return False
        return False

    async def _commit(self, response: Response) -> None:
        assert self._rid is not None
        if await response.settle():
            self._abandon("the origin sent more after the body's end")
            return
        if not response.whole:
            self._abandon("the connection closed without TLS's closure alert")
            return
        generation = self._buffer.generation_now
        try:
            stored = await self._buffer.commit(
                self._rid,
                self._key,
                self._size,
                self._digest.hexdigest(),
                self._headers,
                self._generated_at,
                self._lifetime,
            )
        except StoreError as e:
            self._metrics.buffer_trouble("committing a body", e)
            self._abandon("the buffer could not commit it")
            return
        if stored is None:
            self._abandon("written to while it was fetched")
            return
        self._rid = None
        self._stored = True
        self._on_stored(self._key, stored, generation)
        if self._log_objects:
            elapsed = time.monotonic() - self._started
            logger.info(
                "stored %s: %d bytes of unknown length in %.2fs",
                loggable_url(self._url),
                self._size,
                elapsed,
            )

    def _abandon(self, why: str) -> None:
        # A line per object only with --access-log, as for the objects stored: without
        # it, a dataset of bodies larger than the buffer would log every one. A failing
        # buffer is logged where it is counted (`Metrics.buffer_trouble`), and stage-in
        # names `abandoned` in its warning.
        self.abandoned = why
        level = logging.INFO if self._log_objects else logging.DEBUG
        logger.log(level, "not stored %s: %s", loggable_url(self._url), why)
        self.close()

    def close(self) -> None:
        """Done: the room and partial body go back unless the body was committed."""
        if self._rid is not None:
            self._buffer.abort(self._rid)
            self._rid = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass(frozen=True)
class Fetched:
    """An origin's answer to a GET, and when it was asked for and came (for its age)."""

    response: Response
    requested: float  # time.time()
    received: float  # time.time()

    @property
    def generated_at(self) -> float:
        headers = self.response.headers
        return policy.generated_at(
            self.requested, self.received, headers.get("Date"), headers.get("Age")
        )

    def lifetime(self, stored: Sequence[tuple[str, str]]) -> float:
        """The freshness lifetime of `stored` fields that came with this response."""
        return policy.freshness_lifetime(stored, self.response.headers.get("Date"), self.received)


@dataclass(frozen=True)
class Acquired:
    """What `Fills.acquire` found: a fill to follow, or a response to relay unstored."""

    fill: AnyFill | None
    kind: str  # "miss" (this request started it) or "coalesced" (it joined one)
    response: Response | None = None
    reason: str = ""
    relayed: tuple[tuple[str, str], ...] = ()  # a miss: the origin's fields for its client
    # A miss of unknown length: `response` is relayed through it, and stored.
    unsized: UnsizedFill | None = None

    def release(self) -> None:
        """Done with `response` unread (and with the fill of unknown length, if any)."""
        if self.unsized is not None:
            self.unsized.close()
        if self.response is not None:
            self.response.release()


class Fills:
    """The fills this worker runs or follows, and the pumps that drive its own."""

    def __init__(
        self,
        buffer: Buffer,
        upstream: Upstream,
        metrics: Metrics,
        connections: int,
        log_objects: bool = False,
    ) -> None:
        """`connections`: how many origin connections one large fill may use;
        `log_objects`: an INFO line per object stored, and per one of unknown length
        that is not (`--access-log`)."""
        self._buffer = buffer
        self._upstream = upstream
        self._metrics = metrics
        self._connections = connections
        self._log_objects = log_objects
        self._active: dict[str, Fill] = {}
        self._claiming: dict[str, asyncio.Future[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_memory = 0  # bytes of the small bodies of running fills (IN_MEMORY)
        # Told of each object a fill committed: its key, what the index holds and the
        # generation it was committed under.
        self.on_stored: Callable[[str, StoredObject, int], None] | None = None

    def __len__(self) -> int:
        return len(self._active)

    async def fetch(self, url: str, headers: list[tuple[str, str]]) -> Fetched:
        """GET `url` with `headers` as they are; UpstreamError if the origin cannot be
        reached. The caller releases the response, or hands it to `acquire()`."""
        self._metrics.counters.upstream_requests += 1
        requested = time.time()
        try:
            response = await self._upstream.get(url, headers)
        except UpstreamError:
            self._metrics.counters.upstream_errors += 1
            raise
        return Fetched(response, requested, time.time())

    async def acquire(
        self,
        key: str,
        url: str,
        request_headers: list[tuple[str, str]],
        fetched: Fetched | None = None,
    ) -> Acquired:
        """Follow the fill of `key`, wherever it runs, or start one.

        The fill in the result is attached for the caller, who must `detach()` it.
        Without a fill, `response` is the origin's answer, not stored for `reason`:
        the caller relays it and releases it. Raises Declined when the fill this
        request joined is not storing the object (the caller fetches it itself),
        StoredMeanwhile when another worker committed it since the caller's lookup, and
        UpstreamError when the origin cannot be reached.

        `fetched`: the origin's full answer to this request, already in hand (a
        revalidation that found the object changed): a new fill starts from it, and
        when it is not stored it is the `response` to relay.
        """
        try:
            return await self._acquire(key, url, request_headers, fetched)
        except Declined as e:
            if fetched is None:
                raise
            return Acquired(None, "miss", fetched.response, e.reason)
        except StoredMeanwhile:
            _release(fetched)
            raise

    async def _acquire(
        self,
        key: str,
        url: str,
        request_headers: list[tuple[str, str]],
        fetched: Fetched | None,
    ) -> Acquired:
        while (pending := self._claiming.get(key)) is not None:
            await asyncio.shield(pending)  # another client of this worker is asking
        local = self._active.get(key)
        if local is not None and local.invalidations == self._buffer.invalidations:
            if local.committing:
                # The response that started it has ended: a hit, once committed.
                await local.ended.wait()
                raise StoredMeanwhile(key)
            _release(fetched)
            local.attach()
            return Acquired(local, "coalesced")
        # After a write anywhere, the claims table says whether this fill may be joined.
        claimed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._claiming[key] = claimed
        try:
            answer = await self._buffer.claim(key)
            if "begin" in answer:
                fill = self._active[key] = Fill(key, url, self._buffer.invalidations)
        except StoreError as e:
            self._metrics.buffer_trouble("claiming a fill", e)
            raise Declined(BUFFER_UNAVAILABLE) from e
        finally:
            del self._claiming[key]
            claimed.set_result(None)
        if "declined" in answer:
            raise Declined(answer["declined"])
        if "stored" in answer:
            raise StoredMeanwhile(key, joined="joined" in answer)
        if "join" in answer:
            try:
                joined = RemoteFill(key, url, answer["join"])
            except OSError:
                # It ended since the keeper answered: stored, or to be claimed anew.
                raise StoredMeanwhile(key, joined=True) from None
            _release(fetched)
            return Acquired(joined, "coalesced")
        try:
            return await self._decide(fill, request_headers, fetched)
        except BaseException as e:
            if not fill.head.done():
                self._buffer.decline(key)
                self._end(fill, e if isinstance(e, Exception) else FillFailed("cancelled"))
            raise

    async def _decide(
        self, fill: Fill, request_headers: list[tuple[str, str]], fetched: Fetched | None
    ) -> Acquired:
        headers = forwarded_headers(request_headers, for_fill=True)
        signed = endpoints.rules(fill.key).part
        if signed is not None:
            # The origin answers that range of the URL only: never an unranged fill.
            headers.append(("Range", signed.field))
        if fetched is None:
            fetched = await self.fetch(fill.url, headers)
        response = fetched.response
        kept = policy.judge_response(
            response.status,
            response.version,
            response.headers,
            fetched.requested,
            fetched.received,
            signed,
        )
        if isinstance(kept, policy.Verdict):
            return self._decline(fill, response, kept.reason)
        size = kept.size
        if size is None:
            return await self._start_unsized(fill, response, kept)
        validators = Validators(kept.etag, kept.last_modified)
        head = Head(size, kept.stored, validators, headers, kept.generated_at, kept.lifetime)
        # A small body is stored from this worker's lease, kept in memory (while the
        # worker holds few enough) until it is whole: no other worker follows it (see
        # `sidecar.buffer.keeper`). Any other asks for its room, and is written into a
        # partial body that readers in any worker follow.
        small = size <= SMALL and self._in_memory + size <= IN_MEMORY
        rid = self._buffer.lease_room(fill.key, size) if small else None
        if rid is None:
            answer = await self._room(self._buffer.start_fill(fill.key, size, head.to_message()))
            if "refused" in answer:
                return self._decline(fill, response, answer["refused"])
            rid, path = answer["rid"], answer["path"]
            try:
                # Made by the keeper, so that readers in other workers could open it at once.
                fill._fd = os.open(path, os.O_RDWR)
                fill._shared = Progress(path)
            except OSError as e:
                return self._cannot_open(fill, response, rid, e)
        fill._last = 0 if size <= WHOLE_AT_END else size - 1
        if fill._fd is None:
            fill.tee = native.Tee(size)
            fill.in_memory = size
            self._in_memory += size
        else:
            # The core writes it into its file and sends it on, its last byte held back.
            fill.tee = native.Tee(size, fill._fd, fill._last)
        fill.attach()
        fill.head.set_result(head)
        started = time.monotonic()
        if fill._fd is None:
            # It goes into memory with no task until its response ends (most misses'
            # bodies are small): a pump then stores it, or resumes it.
            response.feed(fill.tee, functools.partial(self._arrived, fill, response, rid, started))
        else:
            self._start_pump(fill, response, rid, started)
        return Acquired(fill, "miss", relayed=kept.relayed)

    def _arrived(self, fill: Fill, response: Response, rid: str, started: float) -> None:
        """The response of an in-memory body ended (`Response.feed`)."""
        assert fill.tee is not None
        self._metrics.counters.bytes_from_upstream += fill.tee.received
        self._start_pump(fill, response, rid, started)

    def _start_pump(self, fill: Fill, response: Response, rid: str, started: float) -> None:
        task = asyncio.get_running_loop().create_task(self._pump(fill, response, rid, started))
        if not task.done():
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _room(self, asked: Awaitable[Message]) -> Message:
        """The keeper's answer to a fill's request for room; a failing buffer refuses."""
        try:
            answer = await asked
        except StoreError as e:
            self._metrics.buffer_trouble("reserving room", e)
            return {"refused": BUFFER_UNAVAILABLE}
        if answer.get("refused") == "no-room":
            self._metrics.counters.admissions_refused += 1
        return answer

    async def _start_unsized(self, fill: Fill, response: Response, kept: policy.Kept) -> Acquired:
        answer = await self._room(self._buffer.start_unsized(fill.key))
        if "refused" in answer:
            return self._decline(fill, response, answer["refused"])
        rid = answer["rid"]
        try:
            fd = os.open(answer["path"], os.O_WRONLY)
        except OSError as e:
            return self._cannot_open(fill, response, rid, e)
        # Requests for it in this worker pass, as the keeper makes those of others.
        self._end(fill, Declined(UNSIZED))
        reserved = (rid, answer["size"], fd)
        unsized = UnsizedFill(
            self._buffer,
            self._metrics,
            fill.key,
            fill.url,
            reserved,
            kept,
            self._log_objects,
            self._tell_stored,
        )
        return Acquired(None, "miss", response, unsized=unsized)

    def _cannot_open(self, fill: Fill, response: Response, rid: str, e: OSError) -> Acquired:
        """The partial body the keeper made for `rid` cannot be opened: the room goes
        back, and the response passes (the buffer is unavailable)."""
        self._buffer.abort(rid)
        self._buffer.report_failure(f"cannot open a partial body: {e}")
        self._metrics.buffer_trouble("opening a partial body", e)
        self._end(fill, Declined(BUFFER_UNAVAILABLE))
        return Acquired(None, "miss", response, BUFFER_UNAVAILABLE)

    def _decline(self, fill: Fill, response: Response, reason: str) -> Acquired:
        self._buffer.decline(fill.key)
        self._end(fill, Declined(reason))
        return Acquired(None, "miss", response, reason)

    async def send(self, fill: AnyFill, channel: Channel, start: int, end: int) -> None:
        """Send bytes [start, end) of a fill's body to `channel` as they come: the core
        sends them where it keeps the body and holds the client's connection (`Fill.tee`),
        the fill's reader writes them otherwise; what the buffer fails to keep comes from
        the origin with a validated Range request (fail open)."""
        sent = start
        try:
            if isinstance(fill, Fill) and fill.tee is not None:
                tee = fill.tee
                try:
                    if await channel.follow(tee, start, end, fill.whole):
                        return
                except BufferFailed:
                    # What the core sent stays sent.
                    sent = min(end, max(start, tee.published))
                    raise
            async for piece in fill.read(start, end):
                if isinstance(piece, bytes):
                    await channel.write(piece)
                    sent += len(piece)
                else:
                    # The core sends it from the file, as the client takes it.
                    await channel.send_file(piece)
                    sent = piece.end
        except BufferFailed:
            async for chunk in self._from_origin(fill, sent, end):
                await channel.write(chunk)

    async def _from_origin(self, fill: AnyFill, start: int, end: int) -> AsyncIterator[bytes]:
        """Bytes [start, end) of a fill's body from its origin, with a Range request
        validated by If-Range: for a reader whose bytes the buffer failed to keep."""
        if start >= end:
            return
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
            async for chunk in response.chunks():
                self._metrics.counters.bytes_from_upstream += len(chunk)
                received += len(chunk)
                yield chunk
        except UpstreamError as e:
            raise FillFailed(f"origin broke off: {e}") from e
        finally:
            response.release()
        if received != end - start:
            raise FillFailed(f"origin sent {received} of {end - start} bytes")

    def _end(self, fill: Fill, failure: BaseException | None) -> None:
        if self._active.get(fill.key) is fill:
            del self._active[fill.key]
        self._in_memory -= fill.in_memory
        fill.in_memory = 0
        fill._finish(failure)

    async def _pump(self, fill: Fill, response: Response, rid: str, started: float) -> None:
        head = fill.head.result()
        failure: BaseException | None = None
        stored: StoredObject | None = None
        try:
            digest, overlong, body = await self._copy(fill, head, response)
            if overlong:
                # Relayed as announced, as other caches do; the rest of it was a broken
                # or hostile origin's, and nothing says the announced part is right.
                logger.warning(
                    "not stored %s: the origin sent more than its Content-Length;"
                    " relayed its first %d bytes",
                    loggable_url(fill.url),
                    head.size,
                )
                return
            generation = self._buffer.generation_now
            if body is not None:
                # Kept in memory (from the lease): its readers have it (`hand_over`).
                stored = self._buffer.commit_small(
                    rid, body, digest, head.headers, head.generated_at, head.lifetime
                )
            else:
                fill.committing = True
                fill._last = head.size
                fill._advance_to(head.size)
                stored = await self._buffer.commit(
                    rid, fill.key, head.size, digest, head.headers, head.generated_at, head.lifetime
                )
            elapsed = time.monotonic() - started
            if stored is not None and self._log_objects:
                logger.info(
                    "stored %s: %d bytes in %.2fs (%.1f MB/s)",
                    loggable_url(fill.url),
                    head.size,
                    elapsed,
                    head.size / max(elapsed, 1e-6) / 1e6,
                )
            elif stored is None:
                # Its readers finish it; what a later request gets comes from the origin.
                logger.info(
                    "not stored %s: written to while it was fetched", loggable_url(fill.url)
                )
        except OSError as e:
            failure = e
            self._buffer.report_failure(f"cannot write a body: {e}")
            self._metrics.buffer_trouble("writing a body", e)
        except StoreError as e:
            # The body is complete on disk; readers finish from their open descriptors.
            self._metrics.buffer_trouble("committing a body", e)
        except (FillFailed, SegmentFailed) as e:
            failure = e
            logger.warning("fill %s failed: %s", loggable_url(fill.url), e)
        except Exception as e:
            # A bug of ours: its readers must still see a failed fill (they abort), never
            # a fill that ended without one, which they would wait on for ever.
            failure = FillFailed(f"{type(e).__name__}: {e}")
            logger.exception("fill %s failed unexpectedly", loggable_url(fill.url))
        finally:
            if stored is None:
                self._buffer.abort(rid)
            self._end(fill, failure)
        if stored is not None:
            self._tell_stored(fill.key, stored, generation)

    def _tell_stored(self, key: str, stored: StoredObject, generation: int) -> None:
        if self.on_stored is not None:
            self.on_stored(key, stored, generation)

    async def _copy(
        self, fill: Fill, head: Head, response: Response
    ) -> tuple[str, bool, bytes | None]:
        """Copy the body into the fill's file, or into memory when it has none; its
        digest (hex) when complete, whether the origin sent more than it announced, and
        the body if in memory.

        A large body from a slow origin that serves ranges is split over several
        connections; any other is one segment, resumed where it broke off. An in-memory
        body that arrived whole (`Response.feed`) needs no copy.
        """
        tee = fill.tee
        if fill._fd is None and tee is not None and response.complete:
            body = tee.body()
            if body is not None:
                digest = tee.hexdigest()
                assert digest is not None
                overlong = response.overlong
                response.release()
                fill.hand_over(body)
                return digest, overlong, body
        # A signed range is fetched in one piece, never resumed: its URL is good for
        # that one range, and the origin refuses any other.
        resumable = endpoints.rules(fill.key).part is None
        accept_ranges = response.headers.get("Accept-Ranges")
        splittable = resumable and may_split(
            self._connections, head.size, accept_ranges, head.validators
        )
        target = Target(
            fill.url,
            head.request_headers,
            head.validators,
            head.size,
            fill._fd,
            fill.tee,
            resumable,
        )
        copy = SegmentedCopy(
            self._upstream,
            self._metrics,
            target,
            fill._advance_to,
            fill.hand_over,
            connections=self._connections if splittable else 1,
        )
        digest = await copy.run(response)
        return digest, copy.overlong, copy.body

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _release(fetched: Fetched | None) -> None:
    if fetched is not None:
        fetched.response.release()


def read_file(fd: int, start: int, end: int) -> Iterator[bytes]:
    """Bytes [start, end) of a body file, in CHUNK-sized reads."""
    offset = start
    while offset < end:
        chunk = os.pread(fd, min(CHUNK, end - offset), offset)
        if not chunk:
            raise FillFailed("a body file is shorter than recorded")
        offset += len(chunk)
        yield chunk
