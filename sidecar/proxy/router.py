"""The router: each request to an intercepted host becomes a hit, a fill or a pass.

- hit: the object is stored and verified -> streamed from the buffer;
- miss: a new fill starts -> the client follows the fill (a body of unknown length: the
  client relays the origin's stream, which the fill stores on its way);
- coalesced: a fill for the object is running -> the client joins it;
- pass: not cacheable, or no room -> relayed from upstream, nothing stored.

Requests that may not be answered from the buffer at all (other methods, preconditions
on an object without a strong ETag) are forwarded with their bodies and relayed. A
failing buffer never fails a download: every buffer error falls back to upstream. The
front ends (`sidecar.wire.server`, `sidecar.mitm.addon`) parse requests; everything decided here is
the same for both.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from sidecar.buffer.fill import (
    Acquired,
    AnyFill,
    Declined,
    Fetched,
    FillFailed,
    Fills,
    StoredMeanwhile,
    UnsizedFill,
)
from sidecar.buffer.keeper import BUFFER_UNAVAILABLE, UNSIZED, Buffer
from sidecar.buffer.store import StoredObject, StoreError, key_digest
from sidecar.cache import endpoints, policy
from sidecar.core import native
from sidecar.metrics import Metrics
from sidecar.origins.upstream import (
    Upstream,
    forwarded_headers,
    interim_sink,
    loggable_url,
    response_headers,
)
from sidecar.proxy import upgrade
from sidecar.settings import Settings, host_matches
from sidecar.wire import conditionals, framing, ranges
from sidecar.wire.client import Interim, Response, UpstreamError
from sidecar.wire.exchange import Body, BodyFile, Channel, ClientGone, Immediate, Request
from sidecar.wire.fields import Fields, Headers, header
from sidecar.wire.server import status_and_fields
from sidecar.wire.tunnel import NOT_INTERCEPTED

logger = logging.getLogger(__name__)

# A Range reader whose range starts this far beyond what a running fill has written is
# answered by its own ranged upstream request instead of waiting for the fill.
RANGE_WAIT_WINDOW = 8 * 1024 * 1024  # bytes
# Hosts remembered by whether they follow RFC 9111 freshness.
REMEMBERED = 100_000
# Representations remembered by stored body (their replayed fields are computed once per
# object while it is read often): each holds a few KB of fields, so few of them.
REPRESENTATIONS = 4096


class Representation:
    """A complete 200 response that can be served in whole or in part; or the one part
    of it that a URL signed for a range names (`part`), which answers the ranges within
    it and nothing else.

    `generated_at` (see `policy.generated_at`) for a stored response, which is answered
    with its stored `Date` and the `Age` it has; None for the origin's response to the
    request that started a fill, whose `Date` and `Age` are the origin's.

    What an answer reads of it is worked out once, when it is made: most of a data
    loader's hits are the first of their object, and reading the fields once costs such a
    hit less than a cached property per value (a third of the time).
    """

    __slots__ = (
        "size",
        "headers",
        "generated_at",
        "etag",
        "last_modified",
        "modified",
        "part",
        "replayed",
        "_stamp",
        "_lines",
    )

    def __init__(
        self,
        size: int,
        headers: tuple[tuple[str, str], ...],
        generated_at: float | None,
        part: endpoints.SignedRange | None = None,
    ) -> None:
        """`part`: the range a part's key names (`endpoints.part_key`); its body is
        that part, as the stored `Content-Range` says (`policy.judge_response` kept only
        the 206 of exactly that range)."""
        self.size = size
        self.headers = headers
        self.generated_at = generated_at
        fields = Fields.of(headers)
        self.etag = fields.get("etag")
        self.last_modified = fields.get("last-modified")
        self.part: ranges.Part | None = None
        if part is not None:
            stored = ranges.parse_content_range(fields.get("content-range"))
            complete = stored.complete if stored is not None else None
            self.part = ranges.Part(part.first, part.last, complete)
        self.replayed = replayed_fields(headers, generated_at)
        # What `If-Modified-Since` is compared with: the Last-Modified, else the Date
        # (RFC 9111 §4.3.2: "a cache SHOULD use the stored response's Date field value").
        self.modified = self.last_modified or header(self.replayed, "Date")
        self._stamp: tuple[int, tuple[tuple[str, str], ...]] | None = None
        self._lines: bytes | None = None

    @property
    def head_lines(self) -> bytes:
        """The status line of a 200 and the replayed fields, encoded once: what the
        core's table of answers sends before the Age and the length."""
        if self._lines is None:
            self._lines = status_and_fields(200, self.replayed)
        return self._lines

    def stamped(self, now: float) -> tuple[tuple[str, str], ...]:
        """`replayed` with the `Age` of an answer at `now` (RFC 9111 §5.1), made once
        per second: hits only compare a number. The Age is the one at the second's end,
        so it is never younger than the truth. The stored `Date` stays: it says when
        the origin generated the response, and with the Age it lets the client's own
        caches compute the same freshness this one does."""
        assert self.generated_at is not None
        second = int(now)
        stamp = self._stamp
        if stamp is None or stamp[0] != second:
            age = policy.current_age(self.generated_at, second + 1)
            stamp = self._stamp = (second, (*self.replayed, ("Age", str(age))))
        return stamp[1]


def replayed_fields(
    headers: tuple[tuple[str, str], ...], generated_at: float | None
) -> tuple[tuple[str, str], ...]:
    """A stored response's fields as sent with every answer (ranges always accepted),
    dated (`policy.dated`) when stored (`generated_at`)."""
    kept = [(k, v) for k, v in headers if k.lower() != "accept-ranges"]
    if generated_at is not None:
        kept = policy.dated(kept, generated_at)
    return (*kept, ("Accept-Ranges", "bytes"))


# Representation metadata a 304 leaves out (RFC 9110 §15.4.5): the client keeps its own.
_NOT_IN_304 = frozenset(("content-type", "content-range"))


@dataclass(frozen=True)
class Answer:
    """What a representation answers to one request: status, fields, body bytes
    [start, end) (none for HEAD, 304 and 416)."""

    status: int
    headers: list[tuple[str, str]]
    start: int = 0
    end: int = 0


def records_answers(settings: Settings) -> bool:
    """May the core's table send hits again without the router? Not when every hit must
    be logged (`--access-log`) or revalidated (`--revalidate`). Under `--eviction lru`
    the worker reports what the table answered as uses (`Buffer.touch`)."""
    return not (settings.access_log or settings.revalidate)


def record_answer(
    answers: native.Answers,
    digest: bytes,
    entry: StoredObject,
    generation: int,
    representation: Representation | None = None,
) -> bool:
    """Record in the core's table the whole 200 of the uniform `entry`, whose key has
    `digest` (its `representation`, for a caller that has it), found or stored under
    index `generation`; False if not recorded."""
    if representation is None:
        head = status_and_fields(200, replayed_fields(entry.headers, entry.born))
    else:
        head = representation.head_lines
    return answers.record(digest, head, entry.file.encode(), entry.size, entry.born, generation)


def answer(request: Request, representation: Representation, now: float) -> Answer | None:
    """The response to `request` from a complete representation at time `now`: 412 for a
    failed precondition, 304 for a matching conditional (RFC 9110 §13.2.2), 416 for an
    unsatisfiable range, 206 for a range that If-Range allows (§14.2, §13.1.5), else 200.
    None when the representation is a signed range's part and the request asks for
    anything but a range within it: only the origin can answer that."""
    size = representation.size
    if representation.generated_at is None:
        base = representation.replayed
    else:
        base = representation.stamped(now)
    asked = None
    # A request with none of the fields a hit's decision reads (a data loader's) gets the
    # whole 200 without their rules being asked.
    if not policy.HIT_FIELDS.isdisjoint(request.fields):
        asked = _asked(request, representation, base)
        if isinstance(asked, Answer):
            return asked
    part = representation.part
    if part is not None and asked is None:
        return None
    if asked is None:
        start, end = 0, size
        headers = [*base, ("Content-Length", str(size))]
        status = 200
    else:
        # A part's body holds the whole representation's bytes from its first on.
        offset, complete = (0, size) if part is None else (part.first, part.complete)
        start, end = asked.start - offset, asked.end - offset + 1
        content_range = ranges.content_range(asked.start, asked.end, complete)
        # A stored Content-Range (meaningless on the origin's 200) gives way to the part's.
        fields = [(k, v) for k, v in base if k.lower() != "content-range"]
        headers = [*fields, ("Content-Range", content_range), ("Content-Length", str(end - start))]
        status = 206
    if request.method == "HEAD":
        return Answer(status, headers)
    return Answer(status, headers, start, end)


def _asked(
    request: Request, representation: Representation, base: tuple[tuple[str, str], ...]
) -> Answer | ranges.ByteRange | None:
    """What a request's preconditions, conditionals and range ask of a representation
    (replayed as `base`): the whole answer of a 412, 304 or 416; the range of a 206; or
    None for the whole body."""
    etag, last_modified = representation.etag, representation.last_modified
    if not conditionals.preconditions_hold(request.fields, etag, last_modified):
        return Answer(412, [("Content-Length", "0")])
    if conditionals.not_modified(request.fields, etag, representation.modified):
        return Answer(304, [(k, v) for k, v in base if k.lower() not in _NOT_IN_304])
    if representation.part is not None:
        if not conditionals.if_range_allows(request.header("If-Range"), etag, last_modified):
            return None
        return ranges.range_within(request.header("Range"), representation.part)
    wanted = ranges.parse_range(request.header("Range"), representation.size)
    if wanted is ranges.FULL or not conditionals.if_range_allows(
        request.header("If-Range"), etag, last_modified
    ):
        return None
    if isinstance(wanted, ranges.ByteRange):
        return wanted
    size = representation.size
    return Answer(416, [("Content-Range", f"bytes */{size}"), ("Content-Length", "0")])


class Router:
    """Built once per process with the program's Settings and its buffer."""

    def __init__(
        self,
        settings: Settings,
        buffer: Buffer,
        fills: Fills,
        upstream: Upstream,
        metrics: Metrics,
        answers: native.Answers | None = None,
    ) -> None:
        """`answers`: the core's table, where the hits it may send again are recorded
        (`records_answers`)."""
        self.settings = settings
        self.answers = answers if records_answers(settings) else None
        self.buffer = buffer
        self.fills = fills
        self.upstream = upstream
        self.metrics = metrics
        self._representations: dict[str, Representation] = {}
        self._intercepted_hosts: dict[str, bool] = {}  # by scheme://host[:port]
        # The key `hit_now` just found nothing for: `handle()` of the same request,
        # which follows at once, need not ask the index again (a miss would cost two
        # queries). Used once; an object stored meanwhile is found by the claim.
        self._just_missed: str | None = None
        if self.answers is not None:
            fills.on_stored = self._record

    async def handle(self, request: Request, channel: Channel, body: Body | None = None) -> None:
        """Answer one request; whatever goes wrong, the client never sees a short success.

        `body` is the request's body for methods that have one (forwarded upstream).
        """
        token = interim_sink.set(_interim_forwarder(request, channel))
        try:
            await self._handle(request, channel, body)
        finally:
            interim_sink.reset(token)

    async def _handle(self, request: Request, channel: Channel, body: Body | None) -> None:
        with channel.keep_alive():
            try:
                verdict = policy.request_may_hit(request.method, request.fields)
                if not self._intercepted(request.url):
                    # A client of the forward proxy may name any host: relayed untouched.
                    await self._pass(request, channel, NOT_INTERCEPTED, body, direct=True)
                elif verdict.cacheable:
                    await self._serve(request, channel)
                else:
                    await self._pass(request, channel, verdict.reason, body)
            except ClientGone:
                self.metrics.counters.client_aborts += 1
                channel.abort()
            except FillFailed as e:
                # Headers were sent already: abort, so the client sees an error.
                logger.warning("aborted %s: %s", loggable_url(request.url), e)
                channel.abort()
            except Exception:
                # A bug of ours must not cost a download: before any byte was sent, the
                # request is forwarded as it came; after, the client sees an error.
                logger.exception("unexpected error serving %s", loggable_url(request.url))
                if channel.started:
                    channel.abort()
                else:
                    await self._pass(request, channel, "internal-error", body)

    # -- routing ----------------------------------------------------------------------

    async def _serve(self, request: Request, channel: Channel, joined: bool = False) -> None:
        """`joined`: the object was stored by a fill that ran when this request came
        (`fill.StoredMeanwhile`): served from the buffer, counted as coalesced."""
        key = policy.cache_key(request.url)
        rules = endpoints.rules(key)
        if rules.kind in _NEVER_STORED:
            await self._pass(request, channel, rules.kind.value)
            return
        if rules.kind is endpoints.Kind.SIGNED:
            part = _part_asked(request, rules)
            if part is None:
                # Nothing stored could answer it, and a fill may ask for a signed range only.
                await self._pass(request, channel, policy.Reason.OUTSIDE_SIGNED_RANGE)
                return
            key, rules = part, endpoints.rules(part)
        entry = self._lookup(key)
        if entry is None and rules.part is not None:
            key, entry = self._container(request, key)
        if entry is not None and self.buffer.unchecked(key):
            entry = await self.buffer.check(key, entry)  # found at start: hashed first
        fetched: Fetched | None = None
        must_validate = entry is not None and self._must_validate(request, key, entry)
        if policy.only_if_cached(request.fields) and (entry is None or must_validate):
            await self._error(
                channel, 504, "burstbuffer: only-if-cached, and no stored response may answer"
            )
            return
        if entry is not None and must_validate:
            entry, fetched = await self._revalidate(request, key, entry)
            if entry is None and fetched is None:
                await self._error(
                    channel, 504, "burstbuffer: the origin cannot validate a stored response"
                )
                return
        if entry is not None:
            etag = self._representation(key, entry).etag
            verdict = policy.answers_preconditions(request.fields, etag)
            if verdict.cacheable:
                await self._serve_stored(request, channel, key, entry, joined)
            else:
                await self._pass(request, channel, verdict.reason)
            return
        verdict = policy.request_is_cacheable(request.method, request.fields)
        if not verdict.cacheable:
            # A HEAD miss or a no-store request never fills: relay an unstored exchange.
            if fetched is not None:
                await self._relay(request, channel, fetched.response, verdict.reason)
            else:
                await self._pass(request, channel, verdict.reason)
            return
        try:
            acquired = await self.fills.acquire(key, request.url, list(request.headers), fetched)
        except Declined as e:
            await self._pass(request, channel, e.reason)
            return
        except StoredMeanwhile as e:
            # Another worker committed it since the lookup above: a stored object now.
            await self._serve(request, channel, e.joined)
            return
        except UpstreamError as e:
            await self._error(channel, 502, f"burstbuffer: upstream request failed: {e}")
            return
        if acquired.fill is None:
            assert acquired.response is not None
            # The unconditional full response answers neither a Range nor a precondition;
            # but a signed range's fill asked what its client asks, if nothing more.
            asked_the_same = rules.part is not None and (
                request.header("Range") == rules.part.field
                and not conditionals.has_precondition(request.fields)
            )
            if not asked_the_same and (
                request.header("Range") is not None or conditionals.has_precondition(request.fields)
            ):
                acquired.release()
                await self._pass(request, channel, acquired.reason or UNSIZED)
            else:
                await self._relay(
                    request, channel, acquired.response, acquired.reason, acquired.unsized
                )
            return
        try:
            await self._serve_fill(request, channel, acquired.fill, acquired)
        finally:
            acquired.fill.detach()

    async def _serve_fill(
        self, request: Request, channel: Channel, fill: AnyFill, acquired: Acquired
    ) -> None:
        kind = acquired.kind
        try:
            head = await fill.head
        except Declined as e:
            await self._pass(request, channel, e.reason)
            return
        except (FillFailed, UpstreamError) as e:
            await self._error(channel, 502, f"burstbuffer: upstream request failed: {e}")
            return
        part = endpoints.rules(fill.key).part
        if kind == "miss":
            representation = Representation(head.size, acquired.relayed, None, part)
        else:
            representation = Representation(head.size, head.headers, head.generated_at, part)
        verdict = policy.answers_preconditions(request.fields, representation.etag)
        if not verdict.cacheable:
            await self._pass(request, channel, verdict.reason)
            return
        if _body_start(request, representation) > fill.written + RANGE_WAIT_WINDOW:
            await self._pass(request, channel, "range-ahead-of-fill")
            return
        if kind == "miss":
            self.metrics.counters.misses += 1
        else:
            self.metrics.counters.coalesced += 1

        body = functools.partial(self.fills.send, fill, channel)
        await self._send(request, channel, representation, kind, body)

    def _forget(self, key: str) -> None:
        """Drop an object whose body is gone, so that the next request fills it again."""
        self.buffer.remove(key)

    def _container(self, request: Request, key: str) -> tuple[str, StoredObject | None]:
        """A stored part of the same whole that holds the signed range of `key` (which is
        not stored), and its key, to answer `request` from; else `key` and None. Not one
        that must be validated first: its own signed URL is not at hand."""
        try:
            found = self.buffer.container(key)
        except StoreError as e:
            self.metrics.buffer_trouble("looking up an object", e)
            return key, None
        entry = None if found is None else self._lookup(found)
        if found is None or entry is None or self._must_validate(request, found, entry):
            return key, None
        return found, entry

    def _lookup(self, key: str) -> StoredObject | None:
        if key == self._just_missed:
            self._just_missed = None
            return None
        try:
            return self.buffer.lookup(key)
        except StoreError as e:
            self.metrics.buffer_trouble("looking up an object", e)
            return None

    async def _revalidate(
        self, request: Request, key: str, entry: StoredObject
    ) -> tuple[StoredObject | None, Fetched | None]:
        """Ask the origin whether a stored object is still current (RFC 9111 §4.3), in
        one request: the stored object to serve (it is), or the origin's full answer (it
        is not), which becomes the new fill or is relayed (RFC 9111 §4.3.3: "the cache
        MUST use the full response to satisfy the request"). An object without
        validators is asked for with a plain GET, whose answer serves the same way.
        """
        headers = forwarded_headers(request.headers, for_fill=True)
        part = endpoints.rules(key).part
        if part is not None:
            # Of a URL signed for ranges, the origin answers those ranges only.
            headers.append(("Range", part.field))
        headers += list(
            policy.conditional_headers(
                header(entry.headers, "ETag"), header(entry.headers, "Last-Modified")
            ).items()
        )
        stale_allowed = not self._by_freshness(key) or policy.may_serve_stale(entry.headers)
        try:
            fetched = await self.fills.fetch(request.url, headers)
        except UpstreamError as e:
            # The origin is unreachable: serving the stored copy beats failing (RFC 9111 §4.2.4).
            logger.warning(
                "revalidation of %s failed, %s: %s",
                loggable_url(request.url),
                "serving stored" if stale_allowed else "must not serve stored",
                e,
            )
            return (entry if stale_allowed else None), None
        status = fetched.response.status
        if status == 304:
            fetched.response.release()
            return await self._refreshed(key, entry, fetched), None
        if status >= 500:
            # RFC 9111 §4.3.3: on a 5xx the cache "can ... act as if the server failed to
            # respond", as for an unreachable origin, or relay it.
            if not stale_allowed:
                return None, fetched
            fetched.response.release()
            logger.warning(
                "revalidation of %s answered %d, serving stored", loggable_url(request.url), status
            )
            return entry, None
        logger.info("%s changed upstream (%d)", loggable_url(request.url), status)
        self._forget(key)
        return None, fetched

    def _must_validate(self, request: Request, key: str, entry: StoredObject) -> bool:
        """Must the origin be asked before `entry` answers `request`?"""
        if policy.needs_revalidation(self.settings.revalidate, request.fields):
            return True
        return self._by_freshness(key) and not policy.is_fresh(
            entry.headers, entry.lifetime, entry.born, request.fields, time.time()
        )

    def _intercepted(self, url: str) -> bool:
        """Is the host of `url` intercepted (`--intercept`)? Asked of every request,
        since a client of the forward proxy names its host in each; remembered by the
        URL's text up to its path."""
        origin = "/".join(url.split("/", 3)[:3])
        known = self._intercepted_hosts.get(origin)
        if known is None:
            if len(self._intercepted_hosts) >= REMEMBERED:
                self._intercepted_hosts.clear()
            known = host_matches(urlsplit(url).hostname or "", self.settings.intercept)
            self._intercepted_hosts[origin] = known
        return known

    def _by_freshness(self, key: str) -> bool:
        """Do objects of this key follow RFC 9111 freshness (`policy.Uniform`)?"""
        return self.buffer.uniform.by_freshness(key)

    async def _refreshed(self, key: str, entry: StoredObject, fetched: Fetched) -> StoredObject:
        """The stored object with the fields of the 304 that validated it (RFC 9111
        §4.3.4), and an age that starts again from the 304."""
        headers = policy.updated_headers(entry.headers, fetched.response.headers)
        refreshed = entry._replace(
            headers=tuple(headers),
            generated_at=fetched.generated_at,
            lifetime=fetched.lifetime(headers),
        )
        try:
            await self.buffer.update(key, refreshed)
        except StoreError as e:
            self.metrics.buffer_trouble("recording a validated object", e)
        return refreshed

    # -- responses --------------------------------------------------------------------

    async def _serve_stored(
        self, request: Request, channel: Channel, key: str, entry: StoredObject, joined: bool
    ) -> None:
        try:
            body = self.buffer.open_body(entry)
        except StoreError as e:
            self.metrics.buffer_trouble("opening a stored body", e)
            self._forget(key)
            await self._pass(request, channel, BUFFER_UNAVAILABLE)
            return
        if joined:
            self.metrics.counters.coalesced += 1
        else:
            self.metrics.counters.hits += 1
        handed_over = False

        async def from_file(start: int, end: int) -> None:
            nonlocal handed_over
            handed_over = True
            await channel.send_file(BodyFile(body, start, end))

        try:
            await self._send(
                request,
                channel,
                self._representation(key, entry),
                "coalesced" if joined else "hit",
                from_file,
            )
        finally:
            if not handed_over:
                os.close(body)

    async def _send(
        self,
        request: Request,
        channel: Channel,
        representation: Representation,
        kind: str,
        write_body: Callable[[int, int], Awaitable[None]],
    ) -> None:
        """Answer from a complete representation: 200, 206, 304, 416 or HEAD;
        `write_body(start, end)` writes those bytes of its body to `channel`."""
        started = time.monotonic()
        plan = answer(request, representation, time.time())
        if plan is None:
            # A signed range's part, asked for what it does not hold (an If-Range that
            # failed): the origin's question.
            await self._pass(request, channel, policy.Reason.OUTSIDE_SIGNED_RANGE)
            return
        await channel.start(plan.status, plan.headers)
        if plan.end > plan.start:
            await write_body(plan.start, plan.end)
            if kind == "hit":
                self.metrics.counters.bytes_from_buffer += plan.end - plan.start
        channel.finish()
        if self.settings.access_log:
            _log_object(kind, request, plan.status, channel.body_bytes, started)

    async def upgrade(
        self, request: Request, client: Any, early: bytearray, on_close: Callable[[], None]
    ) -> None:
        """Relay a protocol upgrade to the origin (`sidecar.proxy.upgrade`)."""
        await upgrade.relay(request, client, early, self.upstream, self.metrics, on_close)

    def hit_now(self, request: Request) -> Immediate | None:
        """The whole response to a request for a stored object, decided at once, its
        body named by its open file (the front end sends it); None for anything else (a
        miss, revalidation, buffer trouble), which then takes `handle()`'s way. Data
        loaders' hits take this one: no task, no awaits, no body byte in Python."""
        started = time.monotonic()
        if not policy.request_may_hit(request.method, request.fields).cacheable:
            return None
        if policy.needs_revalidation(self.settings.revalidate, request.fields):
            return None
        if not self._intercepted(request.url):
            return None
        try:
            key = policy.cache_key(request.url)
            rules = endpoints.rules(key)
            if rules.kind in _NEVER_STORED:
                return None
            if rules.kind is endpoints.Kind.SIGNED:
                part = _part_asked(request, rules)
                if part is None:
                    return None
                key = part
            entry = self.buffer.lookup(key)
        except (ValueError, StoreError):
            return None
        if entry is None:
            self._just_missed = key
            return None
        if self.buffer.unchecked(key):  # found at start: `handle()` checks it first
            return None
        if self._must_validate(request, key, entry):
            return None
        representation = self._representation(key, entry)
        if not policy.answers_preconditions(request.fields, representation.etag).cacheable:
            return None
        plan = answer(request, representation, time.time())
        if plan is None:
            return None
        body = None
        if plan.end > plan.start:
            try:
                body = BodyFile(self.buffer.open_body(entry), plan.start, plan.end)
            except StoreError:
                return None
        size = plan.end - plan.start
        if (
            body is not None
            and plan.status == 200
            and request.method == "GET"
            and policy.HIT_FIELDS.isdisjoint(request.fields)
        ):
            # The same request gets the same answer until the object is removed: the
            # core's table sends it from now on, in every worker.
            self._record(key, entry, self.buffer.generation, representation)
        counters = self.metrics.counters
        counters.hits += 1
        counters.bytes_from_buffer += size
        if self.settings.access_log:
            _log_object("hit", request, plan.status, size, started)
        return Immediate(plan.status, plan.headers, body)

    def _record(
        self,
        key: str,
        entry: StoredObject,
        generation: int,
        representation: Representation | None = None,
    ) -> None:
        """Record the whole 200 of a uniform `entry` (its `representation`, when the
        caller has it) for a GET of any URL of `key` with no field the decision reads in
        the core's table, unless the index moved on from `generation` (what `entry` was
        found or stored under): after `hit_now` answered it so, and after a fill of `key`
        was committed (the answer `hit_now` would give), so that the first request after
        a miss is the table's."""
        if self.answers is None or not entry.uniform:
            return
        if representation is None:
            representation = self._representation(key, entry)
        record_answer(self.answers, key_digest(key), entry, generation, representation)

    def _representation(self, key: str, entry: StoredObject) -> Representation:
        """The representation of `entry`, stored under `key`."""
        known = self._representations.get(entry.file)
        if known is None or (known.headers, known.generated_at) != (entry.headers, entry.born):
            # new, or updated by a 304
            if len(self._representations) >= REPRESENTATIONS:
                self._representations.clear()
            known = self._representations[entry.file] = Representation(
                entry.size, entry.headers, entry.born, endpoints.rules(key).part
            )
        return known

    async def _pass(
        self,
        request: Request,
        channel: Channel,
        reason: str,
        body: Body | None = None,
        direct: bool = False,
    ) -> None:
        """Forward the client's own request (Range, conditionals, body kept) and relay;
        `direct`: to the origin itself, never through the parent tier."""
        headers = forwarded_headers(request.headers, for_fill=False)
        self.metrics.counters.upstream_requests += 1
        try:
            response = await self.upstream.get(
                request.url, headers, method=request.method, body=body, direct=direct
            )
        except UpstreamError as e:
            self.metrics.counters.upstream_errors += 1
            await self._error(channel, 502, f"burstbuffer: upstream request failed: {e}")
            return
        try:
            await self.invalidate(request.method, request.url, response.status, response.headers)
        except BaseException:
            response.release()
            raise
        await self._relay(request, channel, response, reason)

    async def invalidate(self, method: str, url: str, status: int, headers: Headers) -> None:
        """After a write, forget what it made stale (RFC 9111 §4.4), in every worker,
        before the client sees the response: a read that follows it never gets the old
        object."""
        keys = policy.invalidated_keys(method, status, url, headers)
        if not keys:
            return
        try:
            await self.buffer.invalidate(keys)
        except StoreError as e:
            self.metrics.buffer_trouble("invalidating written objects", e)
            return
        logger.info(
            "%s %s -> %d: invalidated %d URLs", method, loggable_url(url), status, len(keys)
        )

    async def _relay(
        self,
        request: Request,
        channel: Channel,
        response: Response,
        reason: str,
        unsized: UnsizedFill | None = None,
    ) -> None:
        """Stream an upstream response to the client as it arrives: a pass for `reason`,
        or the miss that starts an `unsized` fill, which stores it on its way."""
        started = time.monotonic()
        relayed = 0  # body bytes, without the chunked framing
        chunks: AsyncIterator[bytes]
        if unsized is None:
            self.metrics.count_pass(reason)
            chunks = response.chunks()
        else:
            self.metrics.counters.misses += 1
            chunks = unsized.chunks(response)
        try:
            headers = response_headers(response.headers.items())
            length = response.headers.get("Content-Length")
            bodiless = request.method == "HEAD" or response.status in (204, 304)
            # Of unknown length, a body goes to an HTTP/1.1 client chunked; to an HTTP/1.0
            # one, which chunked means nothing to (RFC 9112 §7.1), it ends with the
            # connection: the front end closes after a response without framing.
            chunked = length is None and not bodiless and request.http_version != "HTTP/1.0"
            if chunked:
                headers.append(("Transfer-Encoding", "chunked"))
            await channel.start(response.status, headers)
            if not bodiless:
                # The body ends where the origin framed it; one cut short raises. The
                # core forwards it where it holds the client's connection and nothing
                # stores it; else it comes through here.
                try:
                    forwarded = None if unsized else await channel.relay(response, chunked)
                    if forwarded is None:
                        relayed = await self._write(channel, chunks, chunked)
                    else:
                        self.metrics.counters.bytes_from_upstream += forwarded
                        relayed = forwarded
                except UpstreamError as e:
                    self.metrics.counters.upstream_errors += 1
                    self.upstream.broke_off(response)
                    raise FillFailed(f"upstream broke off: {e}") from e
                if await response.settle():
                    logger.warning(
                        "%s: the origin sent more than its Content-Length; relayed its"
                        " first %d bytes",
                        loggable_url(request.url),
                        relayed,
                    )
            channel.finish()
        finally:
            if unsized is not None:
                unsized.close()
            response.release()
        if unsized is None:
            _log_object(f"pass ({reason})", request, response.status, relayed, started)
        elif self.settings.access_log:
            _log_object("miss", request, response.status, relayed, started)

    async def _write(self, channel: Channel, pieces: AsyncIterator[bytes], chunked: bool) -> int:
        """Write a body to the client as it arrives (in chunks if `chunked`); its bytes."""
        written = 0
        async for piece in pieces:
            self.metrics.counters.bytes_from_upstream += len(piece)
            written += len(piece)
            await channel.write(framing.chunk(piece) if chunked else piece)
        if chunked:
            await channel.write(framing.LAST_CHUNK)
        return written

    async def _error(self, channel: Channel, status: int, message: str) -> None:
        body = (message + "\n").encode()
        await channel.start(
            status,
            [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("Content-Length", str(len(body))),
                ("Cache-Control", "no-store"),
            ],
        )
        await channel.write(body)
        channel.finish()
        logger.warning("%d: %s", status, message)


# The kinds of URL never answered from the buffer nor stored (`endpoints`).
_NEVER_STORED = frozenset((endpoints.Kind.EXPIRING, endpoints.Kind.SIGNED_RANGES))


def _part_asked(request: Request, rules: endpoints.Rules) -> str | None:
    """The key of the part that answers `request` for a URL signed for ranges (`rules`
    of its key): the signed range that holds the one range it asks for, of a
    representation whose length is not known yet (`endpoints.part_key`); None for any
    other request. If-Range is left to the origin: the part's validators are not known
    before it is looked up."""
    if request.header("If-Range") is not None:
        return None
    asked = ranges.closed_range(request.header("Range"))
    return None if asked is None else endpoints.part_key(rules, asked.start, asked.end)


def _body_start(request: Request, representation: Representation) -> int:
    """Where in its representation's body the answer to `request` starts."""
    part = representation.part
    if part is None:
        wanted = ranges.parse_range(request.header("Range"), representation.size)
        return wanted.start if isinstance(wanted, ranges.ByteRange) else 0
    within = ranges.range_within(request.header("Range"), part)
    return within.start - part.first if within is not None else 0


def _interim_forwarder(request: Request, channel: Channel) -> Interim | None:
    """Where the origin's 1xx responses to `request` go: to its client, unless that
    speaks HTTP/1.0 (RFC 9110 §15.2), and only before the final answer begins."""
    if request.http_version == "HTTP/1.0":
        return None

    async def forward(status: int, headers: list[tuple[str, str]]) -> None:
        if not channel.started:
            await channel.interim(status, response_headers(headers))

    return forward


def _log_object(kind: str, request: Request, status: int, size: int, started: float) -> None:
    elapsed = time.monotonic() - started
    logger.info(
        "%s %s %s -> %d, %d bytes in %.3fs (%.1f MB/s)",
        kind,
        request.method,
        loggable_url(request.url),
        status,
        size,
        elapsed,
        size / max(elapsed, 1e-6) / 1e6,
    )
