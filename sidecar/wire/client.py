"""The sidecar's HTTP/1.1 client: pooled connections to origins, parents and a proxy.

A cache has to know exactly where each response ends, so the client frames responses
itself: the Rust core's stream parses them (`sidecar/core/src/wire/http1.rs`, as it parses the
front end's requests) and hands each head over in one call, then its body and its end:

- A body longer than its `Content-Length` is cut at `Content-Length`, as Squid, nginx,
  Varnish and Traffic Server do: the response says `overlong`, the caller relays what
  was announced and stores nothing, and the connection is never used again. General
  purpose clients reject the whole response instead.
- Bytes the origin sends while nothing was asked (on an idle connection) close it.
- 1xx interim responses are handed to the caller before the final one (RFC 9110 §15.2).
- A status outside 100-599, or a 1xx that announces a body, is an `UpstreamError` and
  the connection is closed (`sidecar.wire.framing`), as it is after a response whose framing
  RFC 9112 calls faulty (Transfer-Encoding in HTTP/1.0; its `version` tells the cache
  rules not to store it), and after one the core cannot read (a 502 to the client).
- A request can be sent in absolute form on a plain or TLS connection (to a parent
  cache), or through a proxy's CONNECT tunnel (`--upstream-proxy`).

Every connection is a stream of the Rust core (`sidecar.core.native.Stream`): TLS to an
origin or a parent, and inside a proxy's tunnel, is rustls's client side, started by
`secure` after the TCP connect or the CONNECT (`sidecar.wire.tls`). Origin certificates
are always verified, with the configuration the caller gives. A kept-alive
connection that the origin closed just as it was reused is retried once on a new one;
requests that could not be sent twice (a body, a method that is not idempotent) always
get a new connection. Anything else that fails is an `UpstreamError`.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, NamedTuple
from urllib.parse import SplitResult, unquote, urlsplit

from multidict import CIMultiDict, CIMultiDictProxy

from sidecar.core import native
from sidecar.wire import framing, tls
from sidecar.wire.framing import faulty_framing, response_head_error

logger = logging.getLogger(__name__)

# A connect (TCP, and TLS or a proxy's CONNECT) that takes longer than this fails.
CONNECT_TIMEOUT = 30.0  # seconds
# An idle kept-alive connection is closed after this long (origins close theirs after
# 5 s to 75 s; a closed one is only found when it is reused).
KEEPALIVE = 15.0  # seconds
# At most this many idle connections are kept per route.
MAX_IDLE = 32
# Reading from the origin pauses while this much body waits for its reader. A fill
# writes what arrives at once, so this only bounds a slow reader; a quarter of it made
# a fast origin stop and start four times as often (a 256 MiB miss: 150-180 MB/s
# against 300-380 here).
BODY_BUFFER = 1024 * 1024  # bytes
# Closing waits this long for the connections' TLS shutdowns.
CLOSE_TIMEOUT = 1.0  # seconds
# What a name resolved to is used for new connections this long; at most this many
# names are remembered.
DNS_TTL = 60.0  # seconds
MAX_NAMES = 1024
# What an origin writes right after a response (a stray segment or TLS record past its
# Content-Length) is read by the time the event loop has turned this often since the
# response ended: the loop polls its sockets between two turns.
SETTLE_TURNS = 3
# Methods that may be sent again when a reused connection turns out to be closed.
_IDEMPOTENT = frozenset(("GET", "HEAD", "PUT", "DELETE", "OPTIONS"))

# Where interim (1xx) responses go: `(status, fields)`.
Interim = Callable[[int, list[tuple[str, str]]], Coroutine[Any, Any, None]]
# How names are resolved to addresses, when not by the system.
Resolve = Callable[[str], Awaitable[list[str]]]


class UpstreamError(Exception):
    """The origin could not be reached, refused TLS verification, or broke off."""


class _Stale(UpstreamError):
    """A reused connection was closed by the origin before any byte of the response."""


class Route(NamedTuple):
    """How requests reach an origin: the first hop, and what is said on it. A tuple:
    the pool looks its idle connections up by it for every request, and a tuple's hash
    and comparison cost no Python call."""

    host: str  # the first hop's name (a TLS first hop is verified against it)
    port: int
    context: native.ClientTls | None  # TLS: on the first hop, or inside the tunnel
    address: str | None = None  # where `host` is reached, when pinned to one address
    tunnel: str | None = None  # CONNECT to this authority through the first hop, then TLS
    absolute_form: bool = False  # the first hop is a proxy: the request line has the URL
    proxy_authorization: str | None = None

    @property
    def tls_host(self) -> str:
        """The name the origin's certificate is checked against."""
        return _unbracket(self.tunnel.rsplit(":", 1)[0]) if self.tunnel else self.host


def _port(url: SplitResult) -> int:
    return url.port or (443 if url.scheme == "https" else 80)


def _host_port(url: SplitResult) -> str:
    """`host:port` of a URL, always with the port (a CONNECT target)."""
    host = url.hostname or ""
    return f"[{host}]:{_port(url)}" if ":" in host else f"{host}:{_port(url)}"


def _unbracket(host: str) -> str:
    return host[1:-1] if host.startswith("[") else host


def direct_route(url: SplitResult, context: native.ClientTls) -> Route:
    """Straight to the URL's origin."""
    tls = context if url.scheme == "https" else None
    return Route(url.hostname or "", _port(url), tls)


def proxied_route(url: SplitResult, proxy: str, context: native.ClientTls) -> Route:
    """Through an HTTP proxy (`http://[user:password@]host:port`): a CONNECT tunnel for
    https, an absolute-form request for http."""
    hop = urlsplit(proxy)
    credentials = None
    if hop.username is not None:
        pair = f"{unquote(hop.username)}:{unquote(hop.password or '')}"
        credentials = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
    if url.scheme == "https":
        return Route(
            hop.hostname or "",
            _port(hop),
            context,
            tunnel=_host_port(url),
            proxy_authorization=credentials,
        )
    return Route(
        hop.hostname or "", _port(hop), None, absolute_form=True, proxy_authorization=credentials
    )


def parent_route(parent: str, address: str | None, context: native.ClientTls) -> Route:
    """To a parent cache (`http://` or `https://`), which gets the whole URL and fetches
    the origin itself; `address`: the one member of a multi-address name to use."""
    hop = urlsplit(parent)
    tls = context if hop.scheme == "https" else None
    return Route(hop.hostname or "", _port(hop), tls, address=address, absolute_form=True)


def request_head(
    route: Route, method: str, url: SplitResult, fields: Sequence[tuple[str, str]], chunked: bool
) -> bytes:
    """The request line and fields, as sent on `route`."""
    if method == "CONNECT":
        target = url.netloc  # authority-form (RFC 9112 §3.2.3)
    elif route.absolute_form:
        target = url.geturl()
    else:
        target = (url.path or "/") + (f"?{url.query}" if url.query else "")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {framing.authority(url.scheme, url.netloc)}"]
    lines += [f"{name}: {value}" for name, value in fields]
    if route.absolute_form and route.proxy_authorization:
        lines.append(f"Proxy-Authorization: {route.proxy_authorization}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class Response:
    """A final response: status and fields now, the body as it arrives.

    The caller reads the body and then calls `release()` (the connection is kept for
    another request when that is safe), or `close()` to drop the connection.
    """

    def __init__(
        self,
        connection: _Connection,
        version: str,
        status: int,
        reason: str,
        headers: CIMultiDict[str],
    ) -> None:
        self._connection = connection
        self.version = version  # of its status line: "1.1" or "1.0"
        self.status = status
        self.reason = reason
        self.headers = CIMultiDictProxy(headers)
        # The origin sent more than the response it announced (by `Content-Length` or
        # the last chunk): the body is cut where it said it ends, and is not stored.
        self.overlong = False
        self._done = False

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; UpstreamError if it stops short or stalls."""
        connection = self._connection
        connection.watch(lambda: connection.arrived)
        while True:
            chunk = connection.next_chunk()
            if chunk is not None:
                yield chunk
            elif connection.complete:
                return
            else:
                await connection.wait_body()

    async def forward(self, to: native.Stream, chunked: bool, head: bytes) -> int:
        """`head`, then the body to `to` as it arrives, framed in chunks (the last one
        included) if `chunked`, until it ends: the core sends it, and no piece of it
        comes through Python. The body bytes sent; UpstreamError if it stops short or
        stalls (not while its reading is paused: `pause`)."""
        connection = self._connection
        stream = connection.transport
        assert stream is not None
        before, forwarding = stream.forwarded, not connection.complete
        sent = connection.forward_to(to, chunked, head)
        connection.watch(lambda: stream.forwarded)
        while not connection.complete:
            connection.raise_failure()
            await connection.wait_body()
        if forwarding and connection.until_close:
            # The core ends what it forwards where the framing says; this body ended
            # with the connection, which only this side hears of.
            stream.end_forward()
        return sent + stream.forwarded - before

    def pause(self) -> None:
        """Read no more of the body for now (where it goes is full)."""
        if self._connection.transport is not None:
            self._connection.transport.pause_reading()

    def resume(self) -> None:
        """Read the body again."""
        self._connection.resume()

    async def into(self, tee: native.Tee) -> None:
        """The body into `tee` (the core keeps it and sends it on: no piece of it comes
        through Python), until it ends; UpstreamError if it stops short or stalls."""
        connection = self._connection
        connection.body_into(tee)
        connection.watch(lambda: tee.received)
        while not connection.complete:
            connection.raise_failure()
            await connection.wait_body()

    @property
    def complete(self) -> bool:
        """The whole response has arrived (its body may still wait to be read)."""
        return self._connection.complete

    @property
    def whole(self) -> bool:
        """Complete, and known to be: RFC 9112 §9.8, "A response that has neither
        chunked transfer coding nor Content-Length is complete only if a valid closure
        alert has been received." Over plain TCP the close is all there is (nginx and
        Squid store such bodies too); over TLS, a close without the alert may be a cut."""
        return self._connection.complete and not self._connection.unconfirmed

    def feed(self, tee: native.Tee, ended: Callable[[], None]) -> None:
        """The body into `tee`, as `into`, with no task waiting for it: `ended()` is
        called once the response has ended, whole or broken off (a stall of the read
        timeout breaks it off), and has settled (`settle`). After a break, `into`
        raises why."""
        self._connection.feed(tee, ended)

    async def settle(self) -> bool:
        """`overlong`, once what the origin sent right after the response has been read
        (SETTLE_TURNS): one wait, whose wakeup is the last turn."""
        settled = asyncio.get_running_loop().create_future()
        after_turns(SETTLE_TURNS - 1, settled.set_result, None)
        await settled
        return self.overlong

    async def read(self, limit: int) -> bytes:
        """The body up to `limit` bytes (more may be read, not returned)."""
        data = bytearray()
        async for chunk in self.chunks():
            data += chunk
            if len(data) >= limit:
                break
        return bytes(data[:limit])

    def detach(self) -> tuple[native.Stream, bytes]:
        """The connection of a 101 (Switching Protocols), handed over to the caller with
        what the origin sent after it; the caller gives the stream a protocol before its
        next await. The pool forgets it."""
        assert self.status == 101 and not self._done
        self._done = True
        return self._connection.detach()

    def release(self) -> None:
        """Done with this response: the connection goes back to the pool if it can."""
        if not self._done:
            self._done = True
            self._connection.finish(reuse=True)

    def close(self) -> None:
        """Done with this response, and with its connection."""
        if not self._done:
            self._done = True
            self._connection.finish(reuse=False)

    def stop(self, reason: str) -> None:
        """Read no more of the body: the connection closes, and its reader (`chunks`,
        `into`) gets UpstreamError(reason)."""
        self._connection.stop(reason)


class _Connection(asyncio.Protocol):
    """One connection, one exchange at a time."""

    def __init__(self, pool: Pool, route: Route, read_timeout: float) -> None:
        self._pool = pool
        self.route = route
        self._read_timeout = read_timeout
        self._loop = asyncio.get_running_loop()
        self.transport: native.Stream | None = None
        self._lost = False
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._idle_timer: asyncio.TimerHandle | None = None
        self.gone = asyncio.Event()  # set once the connection is closed
        self.used = False  # it carried an exchange before the current one
        self._watch: asyncio.TimerHandle | None = None
        self._clear()

    def _clear(self) -> None:
        """No exchange in progress."""
        if self._watch is not None:
            self._watch.cancel()
        self._asked = False  # a request was sent and its response is read
        self._method = ""
        self._interim: Interim | None = None
        self._interims: list[asyncio.Task[None]] = []
        self._head: asyncio.Future[Response] | None = None
        self._response: Response | None = None
        self._version = ""
        self._transfer_encoding: str | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self.arrived = 0  # body bytes that came through `body_received`
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        # A body going into a tee with no task waiting (`feed`): whom to tell of its end.
        self._fed: Callable[[], None] | None = None
        # The timer that finds the body stalled, and how much of it arrived (`watch`).
        self._watch = None
        self._watched: Callable[[], int] | None = None
        self._error: BaseException | None = None
        self._received = False  # any part of the response arrived
        self.complete = False  # the final response has ended
        self.unconfirmed = False  # ... with the connection, without TLS's closure alert
        self.overlong = False
        self._keep_alive = False
        self._until_close = False
        self._sending: asyncio.Task[None] | None = None
        self._upgrade = False  # the request asks to switch protocols
        self._switched = bytearray()  # the new protocol's bytes, after a 101

    # asyncio.Protocol, and the responses the stream parses

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        # Only after a 101: the new protocol's, kept until the caller takes them.
        self._switched += data

    def eof_received(self) -> bool:
        self._ended(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.gone.set()
        self._can_write.set()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._pool.forget(self)
        self._ended(exc)

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def response_received(
        self,
        version: str,
        status: int,
        reason: str,
        fields: list[tuple[str, str]],
        transfer_encoding: str | None,
        keep_alive: bool,
        until_close: bool,
    ) -> None:
        """`until_close`: the connection's end delimits the body (RFC 9112 §6.3)."""
        assert self._head is not None
        self._received = True
        refusal = response_head_error(status, fields, self._upgrade)
        if refusal is not None:
            self._fail(UpstreamError(refusal))
            self._close()
            return
        if status == 101:
            # The connection is the new protocol's now, and never the pool's again.
            self.complete = True
        elif status < 200:
            # 100 answers an Expect the front end already answered itself.
            if status != 100 and self._interim is not None:
                task = self._loop.create_task(self._interim(status, fields))
                self._interims.append(task)
            return
        self._version = version
        self._transfer_encoding = transfer_encoding
        self._keep_alive = keep_alive and status != 101
        self._until_close = until_close
        if not self._head.done():
            self._response = Response(self, version, status, reason, CIMultiDict(fields))
            self._head.set_result(self._response)

    def body_received(self, body: bytes) -> None:
        self._chunks.append(body)
        self.arrived += len(body)
        self._buffered += len(body)
        if self._buffered >= BODY_BUFFER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def message_complete(self) -> None:
        if self._head is not None and self._head.done():
            self.complete = True
            self._keep_alive = (
                self._keep_alive
                and self._method != "CONNECT"
                and not faulty_framing(self._version, self._transfer_encoding)
            )
        self._wake()

    def response_refused(self, reason: str) -> None:
        self._fail(UpstreamError(f"malformed response from the origin: {reason}"))
        self._close()

    def unasked_received(self) -> None:
        """The origin sent more after its response (it ended before those bytes), or
        spoke while nothing was asked: whatever it meant, the connection is not in a
        state anyone can use, and a response it ends is not to be trusted."""
        if self._asked and self.complete:
            self._excess()
        else:
            self._close()

    # The exchange

    async def exchange(
        self,
        method: str,
        url: SplitResult,
        fields: Sequence[tuple[str, str]],
        body: AsyncIterator[bytes] | None,
        interim: Interim | None,
        upgrade: bool = False,
    ) -> Response:
        """Send a request and wait for its final response's head; `upgrade`: it asks to
        switch protocols, and a 101 is its final response."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._lost or self.transport is None:
            raise _Stale("the origin closed a kept-alive connection")
        self.transport.expect_response(method)
        self._asked = True
        self._upgrade = upgrade
        self._method = method
        self._interim = interim
        self._head = self._loop.create_future()
        if body is None:
            # No body goes with it (the front ends drop a GET's, which has "no generally
            # defined semantics", RFC 9110 §9.3.1), nor may its length: the origin would
            # wait for a body that never comes.
            fields = [(k, v) for k, v in fields if k.lower() != "content-length" or v == "0"]
        has_length = "content-length" in [name.lower() for name, _ in fields]
        chunked = body is not None and not has_length
        self.transport.write(request_head(self.route, method, url, fields, chunked))
        if body is not None:
            self._sending = self._loop.create_task(self._send(body, chunked))
        waiting = self._loop.call_later(self._read_timeout, self._no_head)
        try:
            response = await self._head
        except BaseException:
            self._close()
            raise
        finally:
            waiting.cancel()
        try:
            for task in self._interims:
                await task
        except BaseException:
            response.close()
            raise
        return response

    async def _send(self, body: AsyncIterator[bytes], chunked: bool) -> None:
        try:
            async for piece in body:
                if not piece:
                    continue
                await self._can_write.wait()
                if self._lost or self.transport is None:
                    return
                self.transport.write(framing.chunk(piece) if chunked else piece)
            if chunked and not self._lost and self.transport is not None:
                self.transport.write(framing.LAST_CHUNK)
        except Exception as e:
            # The request body failed (its client went away): so does the exchange.
            self._fail(e)
            self._close()

    def body_into(self, tee: native.Tee) -> None:
        """The body goes into `tee` from here on: what has arrived first."""
        while self._chunks:
            tee.write(self._chunks.popleft())
        self._buffered = 0
        self._resume_reading()
        if not self.complete and self.transport is not None:
            tee.take_body(self.transport)

    def feed(self, tee: native.Tee, ended: Callable[[], None]) -> None:
        """See `Response.feed`."""
        self.body_into(tee)
        self._fed = ended
        self.watch(lambda: tee.received)
        self._tell_fed()

    def watch(self, received: Callable[[], int]) -> None:
        """Fail the response if its body stalls: no byte for the read timeout
        (`received()`: how much of it has arrived, wherever it went) while its reading
        is not paused (for where it goes, which is no stall of the origin's; the
        timeout starts over when reading resumes). One timer per body, moved on only
        when it fires: waits for the body need none."""
        self._watched = received
        self._arm()

    def _arm(self) -> None:
        assert self._watched is not None
        if self._watch is not None:
            self._watch.cancel()
        self._watch = self._loop.call_later(self._read_timeout, self._stalled, self._watched())

    def _stalled(self, before: int) -> None:
        """The read timeout passed since the body had `before` bytes."""
        self._watch = None
        if self.complete or self._error is not None or self._watched is None:
            return
        now = self._watched()
        if now != before or (self.transport is not None and not self.transport.is_reading()):
            self._watch = self._loop.call_later(self._read_timeout, self._stalled, now)
            return
        self._fail(UpstreamError(f"the origin sent nothing for {self._read_timeout:g}s"))
        self._close()

    def resume(self) -> None:
        """Read the body again, after a pause for where it goes: the read timeout starts
        over (`watch`), since the origin may have waited for us."""
        if self.transport is not None:
            self.transport.resume_reading()
            if self._watch is not None:
                self._arm()

    def _tell_fed(self) -> None:
        """A fed body that ended, whole or not, is told so once it has settled."""
        ended = self._fed
        if ended is None or not (self.complete or self._error is not None):
            return
        self._fed = None
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        after_turns(SETTLE_TURNS, ended)

    @property
    def until_close(self) -> bool:
        """The connection's end delimits the response's body (RFC 9112 §6.3)."""
        return self._until_close

    def forward_to(self, to: native.Stream, chunked: bool, head: bytes) -> int:
        """`head`, then the body, go to `to` from here on (see `Response.forward`): what
        has arrived first, whose bytes it returns, then the rest as the core reads it.
        The head leaves with the first body bytes, in one write."""
        arrived = list(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        parts = [framing.chunk(a) for a in arrived] if chunked else arrived
        if chunked and self.complete:
            parts.append(framing.LAST_CHUNK)  # else the core sends it at the end
        if parts or self.complete:
            to.writelines([head, *parts])
            head = b""
        self._resume_reading()
        if not self.complete and self.transport is not None:
            self.transport.forward_to(to, chunked, head)
        return sum(map(len, arrived))

    def raise_failure(self) -> None:
        """Raise what broke the response off, if anything did."""
        if self._error is not None and not self.complete:
            raise self._error

    def next_chunk(self) -> bytes | None:
        """All the body that has arrived and not been read, in one piece (each of them
        costs its reader a turn: a write, a digest update)."""
        if not self._chunks:
            self.raise_failure()
            return None
        if len(self._chunks) == 1:
            chunk = self._chunks.popleft()
        else:
            chunk = b"".join(self._chunks)
            self._chunks.clear()
        self._buffered -= len(chunk)
        self._resume_reading()
        return chunk

    def _resume_reading(self) -> None:
        """Read the origin again if its body was paused (`body_received`) and less than
        half of BODY_BUFFER of it waits to be read now."""
        if self._paused and self._buffered < BODY_BUFFER // 2 and self.transport is not None:
            self._paused = False
            self.resume()

    async def wait_body(self) -> None:
        """Wait for more body, its end, or a failure (a stall is one, `watch`)."""
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def stop(self, reason: str) -> None:
        self._fail(UpstreamError(reason))
        self._close()

    def finish(self, reuse: bool) -> None:
        """The caller is done with the exchange: keep the connection or close it."""
        reusable = (
            reuse
            and self.complete
            and not self.overlong
            and self._keep_alive
            and self._error is None
            and (self._sending is None or self._sending.done())
            and not self._lost
        )
        if self._sending is not None and not self._sending.done():
            self._sending.cancel()
        for task in self._interims:
            task.cancel()
        self._clear()
        if reusable:
            self.used = True
            self._idle_timer = self._loop.call_later(KEEPALIVE, self._close)
            self._pool.keep(self)
        else:
            self._close()

    def detach(self) -> tuple[native.Stream, bytes]:
        """The connection after a 101, for the caller's protocol, and what came after."""
        assert self.transport is not None
        self._pool.forget(self)
        switched = bytes(self._switched)
        self._clear()
        return self.transport, switched

    async def tunnel(self, target: str, credentials: str | None) -> None:
        """Ask the proxy on the other end for a tunnel to `target` (CONNECT)."""
        fields = [("Proxy-Authorization", credentials)] if credentials else []
        response = await self.exchange("CONNECT", urlsplit(f"//{target}"), fields, None, None)
        if response.status != 200:
            response.close()
            raise UpstreamError(
                f"the upstream proxy refused CONNECT {target}: {response.status} {response.reason}"
            )
        self._clear()

    # Internals

    def _no_head(self) -> None:
        """The read timeout passed with no response to the request sent (one that came
        in the same turn is taken)."""
        if self._head is not None and not self._head.done():
            self._fail(UpstreamError(f"no response within {self._read_timeout:g}s"))
            self._close()

    def _excess(self) -> None:
        # The caller, who knows the URL, says so in the log.
        self.overlong = True
        if self._response is not None:
            self._response.overlong = True
        self._close()

    def _ended(self, exc: Exception | None) -> None:
        """The origin closed its side (or the connection was lost)."""
        if not self._asked or self.complete:
            return
        head_done = self._head is not None and self._head.done() and not self._head.exception()
        # Many servers end a body delimited by the connection's end without TLS's
        # close_notify; a reset is a break, not an end.
        clean = exc is None or isinstance(exc, native.Truncated)
        if head_done and clean and self._until_close:
            self.complete = True  # a body delimited by the end of the connection
            self.unconfirmed = exc is not None
        elif not self._received and self.used:
            self._fail(_Stale("the origin closed a kept-alive connection"))
        elif head_done:
            self._fail(UpstreamError(f"the origin broke off the body{_because(exc)}"))
        else:
            self._fail(UpstreamError(f"the origin closed the connection{_because(exc)}"))
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        if self._fed is not None:
            self._tell_fed()

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def after_turns(turns: int, callback: Callable[..., object], *args: object) -> None:
    """Call `callback(*args)` once the running event loop has turned `turns` times (at
    least one): each turn but the last schedules the next with the loop's own
    `call_soon`, so that no Python function runs between them."""
    call_soon = asyncio.get_running_loop().call_soon
    for _ in range(turns - 1):
        args = (callback, *args)
        callback = call_soon
    call_soon(callback, *args)


def _because(exc: Exception | None) -> str:
    return f": {exc}" if exc else ""


class Pool:
    """The connections of one worker, kept alive per route."""

    def __init__(self, read_timeout: float, resolve: Resolve | None = None) -> None:
        """`read_timeout`: a response that stalls this long fails; `resolve`: how names
        are resolved (default: the system's resolver)."""
        self._read_timeout = read_timeout
        self._resolve = resolve
        self._idle: dict[Route, list[_Connection]] = {}
        self._all: set[_Connection] = set()
        self._resolved: dict[str, tuple[float, list[str]]] = {}  # name -> (until, addresses)

    async def request(
        self,
        route: Route,
        method: str,
        url: str,
        fields: Sequence[tuple[str, str]],
        body: AsyncIterator[bytes] | None = None,
        interim: Interim | None = None,
        upgrade: bool = False,
    ) -> Response:
        """Send a request on `route` and return its final response (body unread);
        `upgrade`: it asks to switch protocols (on a connection of its own, which a 101
        hands over: `Response.detach`)."""
        parts = urlsplit(url)
        if body is not None or method not in _IDEMPOTENT or upgrade:
            # It could not be sent again if a kept-alive connection turned out closed
            # (as Squid, it never gets one).
            connection = await self._connect(route)
            return await connection.exchange(method, parts, fields, body, interim, upgrade)
        connection = self._idle_connection(route) or await self._connect(route)
        try:
            return await connection.exchange(method, parts, fields, body, interim)
        except _Stale:
            pass
        # Once more on a new connection, which cannot be stale.
        connection = await self._connect(route)
        return await connection.exchange(method, parts, fields, body, interim)

    async def open(self, route: Route) -> native.Stream:
        """A new connection on `route`, handed over to the caller (a tunnel), who must
        give its stream a protocol before the next await; the pool forgets it. A route
        without a TLS context is bare TCP (through the proxy's CONNECT, if any)."""
        connection = await self._connect(route)
        self.forget(connection)
        assert connection.transport is not None
        return connection.transport

    def keep(self, connection: _Connection) -> None:
        idle = self._idle.setdefault(connection.route, [])
        idle.append(connection)
        if len(idle) > MAX_IDLE:
            idle.pop(0)._close()

    def forget(self, connection: _Connection) -> None:
        self._all.discard(connection)
        idle = self._idle.get(connection.route)
        if idle and connection in idle:
            idle.remove(connection)
            if not idle:
                del self._idle[connection.route]  # origins come and go

    async def close(self) -> None:
        """Close every connection, and wait (briefly) until they are closed."""
        connections = list(self._all)
        for connection in connections:
            connection._close()
        self._idle.clear()
        if connections:
            waits = [asyncio.ensure_future(c.gone.wait()) for c in connections]
            _, pending = await asyncio.wait(waits, timeout=CLOSE_TIMEOUT)
            for wait in pending:
                wait.cancel()

    def _idle_connection(self, route: Route) -> _Connection | None:
        idle = self._idle.get(route)
        while idle:
            connection = idle.pop()  # the most recently used: the least likely closed
            if not idle:
                del self._idle[route]
            if connection.transport is not None and not connection.transport.is_closing():
                return connection
        return None

    async def _connect(self, route: Route) -> _Connection:
        target = f"{route.host}:{route.port}"
        connection = _Connection(self, route, self._read_timeout)
        stream: native.Stream | None = None
        limit = min(CONNECT_TIMEOUT, self._read_timeout)
        try:
            async with asyncio.timeout(limit):
                addresses = await self._addresses(route)
                last: OSError | None = None
                for address in addresses:
                    try:
                        stream = await _open(address, route.port)
                        if route.context is not None and route.tunnel is None:
                            stream.secure(route.context, route.host)
                            await tls.handshake(stream)
                        break
                    except native.CertificateRejected:
                        raise
                    except OSError as e:
                        _abandon(stream)
                        stream, last = None, e
                if stream is None:
                    raise last or OSError(f"{route.host} resolves to no address")
                stream.start(connection, responses=True)
                self._all.add(connection)
                if route.tunnel is not None:
                    await connection.tunnel(route.tunnel, route.proxy_authorization)
                if route.tunnel is not None and route.context is not None:
                    # Inside the proxy's tunnel, the origin's own TLS.
                    stream.pause_reading()
                    stream.secure(route.context, route.tls_host)
                    await tls.handshake(stream)
                    stream.resume_reading()
        except native.CertificateRejected as e:
            _abandon(stream)
            raise UpstreamError(f"origin certificate rejected ({route.tls_host}): {e}") from e
        except TimeoutError:
            _abandon(stream)
            raise UpstreamError(f"cannot connect to {target} within {limit:g}s") from None
        except (OSError, ValueError) as e:  # ValueError: a name TLS cannot verify
            _abandon(stream)
            # The name may have moved: resolve it again next time.
            self._resolved.pop(_unbracket(route.address or route.host), None)
            raise UpstreamError(f"cannot connect to {target}: {e}") from e
        except BaseException:
            _abandon(stream)
            raise
        return connection

    async def _addresses(self, route: Route) -> list[str]:
        host = _unbracket(route.address or route.host)
        if is_ip(host):
            return [host]
        loop = asyncio.get_running_loop()
        until, addresses = self._resolved.get(host, (0.0, []))
        if loop.time() < until:
            return addresses
        if self._resolve is not None:
            addresses = await self._resolve(host)
        else:
            found: list[Any] = await loop.getaddrinfo(host, route.port, type=socket.SOCK_STREAM)
            addresses = list(dict.fromkeys(entry[4][0] for entry in found))
        if len(self._resolved) > MAX_NAMES:
            self._resolved.clear()
        self._resolved[host] = (loop.time() + DNS_TTL, addresses)
        return addresses


async def _open(address: str, port: int) -> native.Stream:
    """A TCP connection to `address`, as a plain stream of the core."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.get_running_loop().sock_connect(sock, (address, port))
    except BaseException:
        sock.close()
        raise
    return native.Stream(sock.detach(), asyncio.get_running_loop())


def _abandon(stream: native.Stream | None) -> None:
    if stream is not None:
        stream.abort()


def is_ip(host: str) -> bool:
    """Is `host` an IPv4 or IPv6 address (not a name)?"""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
            return True
        except OSError:
            continue
    return False
