"""The lean HTTP/1.1 server inside intercepted CONNECT tunnels, and of the forward proxy.

After the front end (`sidecar.proxy.front`) has answered a CONNECT to an intercepted host
and the TLS handshake with the host's leaf certificate is done, this protocol reads
the requests in the tunnel (`Tunnel`); for a client that sends the proxy its requests
themselves (`GET http://host/path`), the requests of its connection (`Forwarded`). It
hands each one to its handler
(`sidecar.wire.exchange.Handler`, which the router implements). It does the least a
request needs: its transport, the Rust core's stream (`sidecar.core.native.Stream`:
the socket, TLS, every byte sent), parses each request and hands over its head (one
call, one Python object per request), its body's bytes and its end; a hit is one call
of the handler, which names the stored body's file, and the stream sends it.

Requests are answered strictly in order (pipelined ones wait their turn). A request
body (PUT, POST) is streamed to the origin as it arrives, with backpressure. An upgrade
request (a WebSocket) is relayed to the origin after the requests before it, and the
connection is then the handler's relay's. The connection closes when the client asks for
it (`Connection: close`, HTTP/1.0), after a message whose framing RFC 9112 calls faulty
(Transfer-Encoding in HTTP/1.0), after `IDLE_TIMEOUT` without a request, on a request
refused (by the core's parser, or `sidecar.wire.framing`: a 400, 431, 501 or 505; a
malformed chunked body is answered at once and its upload cut off), and as soon as the
client closes its side: nothing is left half-open.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast

from sidecar.core import native
from sidecar.wire.client import Response, UpstreamError
from sidecar.wire.exchange import BodyFile, ClientGone, Handler, Immediate, Request
from sidecar.wire.framing import ends_by_close, faulty_framing, request_head_error
from sidecar.wire.sweep import Sweep

logger = logging.getLogger(__name__)

# A kept-alive connection without a request for this long is closed; data loaders keep
# their sessions for an epoch but reconnect transparently.
IDLE_TIMEOUT = 120.0  # seconds
# Reading stops while this much of a request body waits for the origin.
BODY_BUFFER = 1024 * 1024  # bytes
# Writers wait (backpressure) once this much is queued for the client.
WRITE_BUFFER = 1024 * 1024  # bytes
# At most this many pipelined requests are parsed ahead of the one being answered.
PIPELINE_DEPTH = 16

_CLOSE = object()  # ends a body stream


@dataclass(frozen=True)
class Tunnel:
    """The origin a CONNECT named: `host` as in the request (IPv6 in brackets); `tls`:
    whether the client speaks TLS inside (https URLs) or plain HTTP (http URLs)."""

    host: str
    port: int
    tls: bool = True

    def url(self, target: str) -> str:
        scheme, default_port = ("https", 443) if self.tls else ("http", 80)
        authority = self.host if self.port == default_port else f"{self.host}:{self.port}"
        return f"{scheme}://{authority}{target}"

    @property
    def scope(self) -> str:
        """What each request's target is read under: the URL up to its path."""
        return self.url("")

    def request_url(self, target: bytes, hosts: Sequence[str]) -> str:
        """The URL a request inside the tunnel asks for: the tunnel, not the request's
        Host or target, names the origin."""
        return self.url(origin_form_target(target))


@dataclass(frozen=True)
class Forwarded:
    """The clients of the forward proxy itself, which name their origins in each
    request's target (absolute-form, RFC 9112 §3.2.2: `GET http://host/path`), one
    request's origin perhaps not the next one's."""

    host: str = "the forward proxy"  # what the log says of a refused request
    scope: str = ""  # targets are whole URLs

    def request_url(self, target: bytes, hosts: Sequence[str]) -> str:
        """The URL an absolute-form target names, as the client sent it; 400 for any
        other form: "a client MUST send a request-target in absolute-form" to a proxy."""
        return absolute_form_target(target)


@dataclass(frozen=True)
class Hosted:
    """The plain-HTTP clients of a captured listener (hostAliases' :80, transparent),
    which reached the sidecar as if it were the origin: each request's Host names its
    origin (RFC 9112 §3.2), its target is the path."""

    host: str = "a captured origin"  # what the log says of a refused request
    scope: str = "http://"  # the Host completes each URL (`native.Stream.answer_from`)

    def request_url(self, target: bytes, hosts: Sequence[str]) -> str:
        """`http://` and the request's one Host, then its origin-form target; 400 without
        a Host (an HTTP/1.0 request: nothing names its origin) or with one that is not an
        authority."""
        if len(hosts) != 1 or not _AUTHORITY.fullmatch(hosts[0]):
            raise BadRequest(
                HTTPStatus.BAD_REQUEST, "a captured request needs one Host naming its origin"
            )
        return f"{self.scope}{hosts[0]}{origin_form_target(target)}"


# A Host field's value as an authority (RFC 9110 §7.2): a reg-name or an IP literal in
# brackets, and a port; nothing that would change where a URL made with it points.
_AUTHORITY = re.compile(r"(?:[A-Za-z0-9._~!$&'()*+,;=%-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")


def absolute_form_target(target: bytes) -> str:
    """An http or https URL in absolute form (RFC 9112 §3.2.2), as sent, with a host;
    BadRequest for anything else."""
    try:
        text = target.decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest(HTTPStatus.BAD_REQUEST, "the request target is not ASCII") from None
    scheme, sep, rest = text.partition("://")
    authority = rest.split("/", 1)[0].split("?", 1)[0]
    if not sep or scheme.lower() not in ("http", "https") or not authority or "@" in authority:
        raise BadRequest(
            HTTPStatus.BAD_REQUEST,
            f"a proxy's request target must be an absolute http(s) URL, not {text[:80]!r}",
        )
    return text


class BadRequest(Exception):
    """A request this server refuses, with the status to answer."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def origin_form_target(target: bytes) -> str:
    """The path and query of a request target inside a tunnel (RFC 9112 §3.2).

    Origin-form (`/path?q`) is what clients send; absolute-form is accepted for its path
    only, since the tunnel, not the request, names the origin.
    """
    try:
        text = target.decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest(HTTPStatus.BAD_REQUEST, "the request target is not ASCII") from None
    if text.startswith("/"):
        return text
    scheme, sep, rest = text.partition("://")
    if sep and scheme.lower() in ("http", "https"):
        slash = rest.find("/")
        return rest[slash:] if slash >= 0 else "/"
    raise BadRequest(HTTPStatus.BAD_REQUEST, f"unsupported request target {text[:80]!r}")


class _BodyStream:
    """A request body from the parser to the upstream request, with backpressure."""

    def __init__(self, pause: Callable[[], None], resume: Callable[[], None]) -> None:
        self._chunks: collections.deque[Any] = collections.deque()
        self._buffered = 0
        self.complete = False  # the parser saw the body's end
        self._waiter: asyncio.Future[None] | None = None
        self._pause = pause
        self._resume = resume

    def feed(self, chunk: Any) -> None:
        self._chunks.append(chunk)
        if chunk is _CLOSE:
            self.complete = True
        if isinstance(chunk, bytes):
            self._buffered += len(chunk)
            if self._buffered > BODY_BUFFER:
                self._pause()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def chunks(self) -> AsyncIterator[bytes]:
        while True:
            while not self._chunks:
                self._waiter = asyncio.get_running_loop().create_future()
                await self._waiter
            chunk = self._chunks.popleft()
            if chunk is _CLOSE:
                return
            if isinstance(chunk, BaseException):
                raise chunk
            self._buffered -= len(chunk)
            if self._buffered <= BODY_BUFFER:
                self._resume()
            yield chunk


class _Response:
    """The `Channel` of one request on a lean connection."""

    def __init__(self, connection: Http1Connection, method: str, close: bool) -> None:
        self._connection = connection
        self._method = method
        self._close = close
        self._head: bytes | None = None
        self._started = False
        self.done = False
        self.body_bytes = 0

    @property
    def started(self) -> bool:
        return self._started

    async def interim(self, status: int, headers: list[tuple[str, str]]) -> None:
        await self._connection.send(response_head(status, headers, close=False))

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        if ends_by_close(self._method, status, headers):
            self._close = True
        # Sent with the first body bytes: one TLS write for the head and a chunk.
        self._head = response_head(status, headers, self._close)
        self._started = True

    async def write(self, data: bytes) -> None:
        self.body_bytes += len(data)
        if self._head is not None:
            head, self._head = self._head, None
            await self._connection.send(head, data)
        else:
            await self._connection.send(data)

    async def send_file(self, file: BodyFile) -> None:
        self.body_bytes += file.end - file.start
        head, self._head = self._head or b"", None
        await self._connection.send_file(head, file)

    async def follow(
        self, tee: native.Tee, start: int, end: int, whole: Callable[[], Awaitable[None]]
    ) -> bool:
        self.body_bytes += end - start
        head, self._head = self._head or b"", None
        await self._connection.follow(head, tee, start, end, whole)
        return True

    async def relay(self, response: Response, chunked: bool) -> int | None:
        head, self._head = self._head or b"", None
        sent = await self._connection.relay(head, response, chunked)
        self.body_bytes += sent
        return sent

    def finish(self) -> None:
        if self._head is not None:
            self._connection.send_now(self._head)
            self._head = None
        self.done = True

    def abort(self) -> None:
        self.done = True
        self._close = True
        self._connection.abort()

    @property
    def closes(self) -> bool:
        return self._close

    def keep_alive(self) -> contextlib.nullcontext[None]:
        # The idle timer only runs between requests.
        return contextlib.nullcontext()


_REASONS = {status.value: status.phrase.encode("ascii") for status in HTTPStatus}


def response_head(status: int, headers: Sequence[tuple[str, str]], close: bool) -> bytes:
    """An HTTP/1.1 status line and fields; `close` adds `Connection: close`."""
    ending = b"Connection: close\r\n\r\n" if close else b"\r\n"
    return status_and_fields(status, headers) + ending


def status_and_fields(status: int, headers: Sequence[tuple[str, str]]) -> bytes:
    """An HTTP/1.1 status line and field lines, each with its CRLF: a head without its
    end."""
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))]
    for name, value in headers:
        lines.append(b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1")))
    return b"".join(lines)


@dataclass
class _Pending:
    request: Request
    body: _BodyStream | None
    close: bool


class Idleness:
    """Closes the lean server's connections that went IDLE_TIMEOUT without a request, in
    one sweep of one loop's connections every tenth of the timeout: each is closed
    within a tenth of the timeout after it is due. Those a listener's door served
    without a protocol (`native.Door`) are streams, idle since the table last answered
    them."""

    def __init__(self) -> None:
        interval = IDLE_TIMEOUT / 10
        self._connections: Sweep[Http1Connection] = Sweep(interval, Http1Connection.close_if_idle)
        self._streams: Sweep[native.Stream] = Sweep(interval, _close_if_idle)

    def watch(self, connection: Http1Connection) -> None:
        self._connections.watch(connection)

    def forget(self, connection: Http1Connection) -> None:
        self._connections.forget(connection)

    def watch_stream(self, stream: native.Stream) -> None:
        self._streams.watch(stream)

    def forget_stream(self, stream: native.Stream) -> None:
        self._streams.forget(stream)

    def close(self) -> None:
        self._connections.close()
        self._streams.close()


def _close_if_idle(stream: native.Stream, now: float) -> None:
    if now - stream.answered_at >= IDLE_TIMEOUT:
        stream.close()


class Http1Connection(asyncio.Protocol):
    """One client's tunnel to one intercepted origin (TLS, or plain HTTP), or one
    client of the forward proxy itself (`Forwarded`)."""

    def __init__(
        self,
        tunnel: Tunnel | Forwarded | Hosted,
        handler: Handler,
        on_close: Callable[[], None],
        idleness: Idleness,
        answers: native.Answers | None = None,
    ) -> None:
        """`idleness`: closes this connection once it idles too long; `answers`: the
        core's table of recorded answers, which then answers the requests it can without
        this protocol hearing of them."""
        self._tunnel = tunnel
        self._handler = handler
        self._on_close = on_close
        self._idleness = idleness
        self._answers = answers
        self._transport: native.Stream | None = None
        self._queue: collections.deque[_Pending] = collections.deque()
        self._current: tuple[_Pending, _Response] | None = None  # being answered
        self._answering = False
        self._worker: asyncio.Task[None] | None = None  # while it is suspended
        self._writable: asyncio.Event = asyncio.Event()
        self._writable.set()
        # Since when no request was asked (`time.monotonic`); None while one is answered.
        self._idle_since: float | None = time.monotonic()
        self._closed = False
        self._refused = False  # a refusal was sent ahead of its request's answer
        self._reading = True
        # The body of the request being received.
        self._body: _BodyStream | None = None
        # An upgrade request, from its head until the relay takes the connection over.
        self._upgrade: Request | None = None
        self._early = bytearray()  # what the client sent after it
        self._relaying: asyncio.Task[None] | None = None
        # The origin's response whose body the core forwards to this client (`relay`):
        # its reading pauses while the client's buffer is full.
        self._forwarding: Response | None = None

    # -- transport events ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(native.Stream, transport)
        self._transport.set_write_buffer_limits(high=WRITE_BUFFER)
        if self._answers is not None:
            self._transport.answer_from(self._answers, self._tunnel.scope.encode())
        self._idleness.watch(self)

    def data_received(self, data: bytes) -> None:
        # Bytes, not requests, come only after an upgrade request's head.
        self._early += data

    def eof_received(self) -> bool:
        # The client closed its side; a TLS transport cannot stay half-open, so close.
        self._fail_body(ClientGone("the client closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._idleness.forget(self)
        self._writable.set()  # wake a writer: it sees the closed connection
        self._fail_body(ClientGone("the client closed the connection"))
        if self._forwarding is not None:
            self._forwarding.stop("the client closed the connection")
        self._on_close()

    def pause_writing(self) -> None:
        self._writable.clear()
        if self._forwarding is not None:
            self._forwarding.pause()

    def resume_writing(self) -> None:
        self._writable.set()
        if self._forwarding is not None:
            self._forwarding.resume()

    # -- requests, as the core's stream parses them --------------------------------------

    def request_received(
        self,
        method: str,
        target: bytes,
        version: str,
        fields: list[tuple[str, str]],
        hosts: list[str],
        transfer_encoding: str | None,
        keep_alive: bool,
        upgrade: bool,
        has_body: bool,
    ) -> None:
        """A request head: `version` as its line gave it (`0.9` for none), `hosts` the
        values of its Host lines, `transfer_encoding` that field's lines joined."""
        self._idle_since = None
        self._body = None
        try:
            request = self._request(method, target, version, fields, hosts, transfer_encoding)
        except BadRequest as e:
            self._refuse(e)
            return
        close = not keep_alive or faulty_framing(version, transfer_encoding)
        if upgrade:
            self._upgrade = request  # relayed after the requests before it
            self._start_upgrade()
            return
        if method not in ("GET", "HEAD") and has_body:
            self._body = _BodyStream(self._pause_reading, self._resume_reading)
            if _expects_continue(fields) and self._transport is not None:
                # We forward the body anyway; the origin's answer follows it.
                self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        elif not self._answering and not self._queue and self._writable.is_set():
            # Nothing ahead of it, and the client keeps up: a hit is answered right here.
            immediate = self._handler.hit_now(request)
            if immediate is not None:
                self._answer_now(immediate, close)
                self._idle()
                return
        self._queue.append(_Pending(request, self._body, close))
        if len(self._queue) > PIPELINE_DEPTH:
            self._pause_reading()
        if not self._answering:
            # The loop may run tasks eagerly: a hit can be answered before this returns.
            self._answering = True
            task = asyncio.get_running_loop().create_task(self._answer())
            if not task.done():
                self._worker = task

    def _request(
        self,
        method: str,
        target: bytes,
        version: str,
        fields: list[tuple[str, str]],
        hosts: list[str],
        transfer_encoding: str | None,
    ) -> Request:
        if method == "CONNECT":
            # A tunnel inside the tunnel, to an origin server: RFC 9110 §9.3.6 is for
            # proxies, and an origin "SHOULD respond with the 501" to a method it lacks.
            # The forward proxy answers a CONNECT to `host:port` as a connection's first
            # request only (`sidecar.proxy.front`).
            raise BadRequest(
                HTTPStatus.NOT_IMPLEMENTED, "CONNECT here: only a first request to host:port"
            )
        url = self._tunnel.request_url(target, hosts)
        refusal = request_head_error(version, hosts, target.decode("ascii"), transfer_encoding)
        if refusal is not None:
            raise BadRequest(*refusal)
        return Request(method, url, tuple(fields), "HTTP/" + version)

    def body_received(self, data: bytes) -> None:
        # A GET or HEAD with a body (allowed, meaningless): dropped.
        if self._body is not None:
            self._body.feed(data)

    def message_complete(self) -> None:
        if self._body is not None:
            self._body.feed(_CLOSE)
            self._body = None

    def request_refused(self, status: int, reason: str) -> None:
        """A request the stream could not read (a 400 or 431); it reads no more."""
        self._refuse(BadRequest(HTTPStatus(status), f"malformed request: {reason}"))

    # -- answering ----------------------------------------------------------------------

    async def _answer(self) -> None:
        try:
            while self._queue and not self._closed:
                pending = self._queue.popleft()
                response = _Response(self, pending.request.method, pending.close)
                self._current = (pending, response)
                body = pending.body.chunks() if pending.body is not None else None
                await self._handler.handle(pending.request, response, body)
                unread_body = pending.body is not None and not pending.body.complete
                if not response.done or response.closes or unread_body:
                    # What follows on the connection cannot be trusted to be in step.
                    self._close()
                    return
                self._resume_reading()
        finally:
            self._current = None
            self._answering = False
            self._worker = None
            self._idle_since = time.monotonic()
            self._idle()

    def _answer_now(self, immediate: Immediate, close: bool) -> None:
        head = response_head(immediate.status, immediate.headers, close)
        body = immediate.body
        if body is None:
            self.send_now(head)
        elif self._transport is None or self._transport.is_closing():
            os.close(body.fd)
        else:
            self._transport.send_file(head, body.fd, body.start, body.end)
        self._idle_since = time.monotonic()
        if close:
            self._close()

    async def send(self, *parts: bytes) -> None:
        """Write `parts` to the client as one write, waiting while its buffer is full."""
        if self._closed or self._transport is None or self._transport.is_closing():
            raise ClientGone("the client closed the connection")
        self._transport.writelines(parts)
        if not self._writable.is_set():
            await self._writable.wait()
            if self._closed:
                raise ClientGone("the client closed the connection")

    async def send_file(self, head: bytes, file: BodyFile) -> None:
        """Write `head`, then the file's bytes (the stream sends them from the file and
        closes it), waiting while the client's buffer is full."""
        if self._closed or self._transport is None or self._transport.is_closing():
            os.close(file.fd)
            raise ClientGone("the client closed the connection")
        self._transport.send_file(head, file.fd, file.start, file.end)
        if not self._writable.is_set():
            await self._writable.wait()
            if self._closed:
                raise ClientGone("the client closed the connection")

    async def follow(
        self,
        head: bytes,
        tee: native.Tee,
        start: int,
        end: int,
        whole: Callable[[], Awaitable[None]],
    ) -> None:
        """Write `head`, then have the core send bytes [start, end) of `tee`'s body as
        they arrive; return once `whole()` does and the client's buffer is not full."""
        if self._closed or self._transport is None or self._transport.is_closing():
            raise ClientGone("the client closed the connection")
        tee.follow(self._transport, head, start, end)
        await whole()
        if not self._writable.is_set():
            await self._writable.wait()
        if self._closed:
            raise ClientGone("the client closed the connection")

    async def relay(self, head: bytes, response: Response, chunked: bool) -> int:
        """Write `head`, then have the core forward `response`'s body as it arrives (in
        chunks if `chunked`); return its bytes once it ended and the client's buffer is
        not full. UpstreamError if the origin breaks off, ClientGone if the client left
        (the origin's connection is then closed)."""
        if self._closed or self._transport is None or self._transport.is_closing():
            raise ClientGone("the client closed the connection")
        self._forwarding = response
        if not self._writable.is_set():
            response.pause()
        try:
            sent = await response.forward(self._transport, chunked, head)
        except UpstreamError:
            if self._closed:
                raise ClientGone("the client closed the connection") from None
            raise
        finally:
            self._forwarding = None
        if not self._writable.is_set():
            await self._writable.wait()
        if self._closed:
            raise ClientGone("the client closed the connection")
        return sent

    def send_now(self, data: bytes) -> None:
        """Write without waiting (a response head without a body)."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def abort(self) -> None:
        # A refusal sent at once (see `_refuse`) is left to be delivered; anything else
        # queued for the client is dropped with the connection.
        if self._transport is not None and not self._refused:
            self._transport.abort()

    # -- internals ----------------------------------------------------------------------

    def _refuse(self, error: BadRequest) -> None:
        """Answer a request we cannot parse (after the ones before it) and close.

        A body found malformed on its way to the origin ends that upload unfinished (RFC
        9112 §8: "A message body that uses the chunked transfer coding is incomplete if
        the zero-sized chunk that terminates the encoding has not been received"), so
        the origin never takes a part for the whole; its request is answered with the
        400 at once, unless the origin's answer has begun (then the connection is cut).
        """
        logger.info("refused a request to %s: %s", self._tunnel.host, error)
        self._pause_reading()
        body = f"burstbuffer: {error}\n".encode()
        head = (
            f"HTTP/1.1 {error.status.value} {error.status.phrase}\r\n"
            "Content-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        broken = self._body
        self._fail_body(ClientGone(f"the request body is malformed: {error}"))
        if broken is not None and self._current is not None:
            pending, response = self._current
            if pending.body is broken and not response.started:
                self.send_now(head + body)
                self._refused = True
                self._close()
                return

        async def after_the_others() -> None:
            if self._worker is not None:
                with contextlib.suppress(BaseException):
                    await asyncio.shield(self._worker)
            self.send_now(head + body)
            self._close()

        self._queue.clear()
        asyncio.get_running_loop().create_task(after_the_others())

    def _start_upgrade(self) -> None:
        """Relay the upgrade request after the requests before it; the relay then owns
        the connection (and says when it is closed)."""
        self._pause_reading()
        request = self._upgrade
        assert request is not None

        async def after_the_others() -> None:
            if self._worker is not None:
                with contextlib.suppress(BaseException):
                    await asyncio.shield(self._worker)
            if self._closed or self._transport is None:
                return
            self._idleness.forget(self)
            self._closed = True  # to this protocol: from here on the relay's
            await self._handler.upgrade(request, self._transport, self._early, self._on_close)

        self._relaying = asyncio.get_running_loop().create_task(after_the_others())

    def _close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def _fail_body(self, error: BaseException) -> None:
        if self._body is not None:
            self._body.feed(error)
            self._body = None
        for pending in self._queue:
            if pending.body is not None:
                pending.body.feed(error)

    def _pause_reading(self) -> None:
        if self._reading and self._transport is not None:
            self._reading = False
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if (
            not self._reading
            and self._transport is not None
            and not self._closed
            and self._upgrade is None
        ):
            self._reading = True
            self._transport.resume_reading()

    def _idle(self) -> None:
        """Every request handed over is answered: the core's table may answer the next."""
        if self._transport is not None and not self._closed:
            self._transport.idle()

    def close_if_idle(self, now: float) -> None:
        """Close the connection if it has gone IDLE_TIMEOUT without a request by `now`
        (`time.monotonic`)."""
        if self._closed or self._idle_since is None:
            return
        if self._transport is not None:
            # The core's table answers requests this protocol never hears of.
            self._idle_since = max(self._idle_since, self._transport.answered_at)
        if now - self._idle_since >= IDLE_TIMEOUT:
            self._close()


def _expects_continue(fields: list[tuple[str, str]]) -> bool:
    return any(k.lower() == "expect" and v.lower() == "100-continue" for k, v in fields)
