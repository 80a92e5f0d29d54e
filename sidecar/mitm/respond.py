"""The fast response path: HTTP/1.1 responses written straight into a client connection.

mitmproxy's supported ways of answering from an addon hold the whole body in memory
(`Response.make`) or push every 64 KiB chunk through its layer stack (~250 MB/s, one
core saturated). Hits are the product's speed, so here, inside an async `request`
hook, the response head and body are encrypted with the client connection's own
TLS object and written to its socket in large chunks, with asyncio backpressure.
While the hook runs, mitmproxy's HTTP layer for this connection is paused; its TLS
layer only touches the TLS object when data arrives, and we drain what we encrypt
before every await, so the two never interleave inside a record.

Afterwards mitmproxy finishes the exchange as usual (keep-alive included) with the
headers-only response we leave in `flow.response`; `_install()` teaches its
HTTP/1 server to write nothing for responses we already wrote (and to answer a
malformed request body with a 400 before it closes, as the lean front end does).

The mitmproxy internals used here are pinned to one version (`sidecar.mitm`: importing
the package with another fails loudly), and tests/sidecar cover keep-alive, HEAD, ranges
and aborts through a real proxy so an upgrade that breaks them is seen.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence

from mitmproxy import http
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.connection import ConnectionState
from mitmproxy.net.http import http1, status_codes
from mitmproxy.proxy import commands
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import (
    RequestProtocolError,
    ResponseData,
    ResponseEndOfMessage,
    ResponseHeaders,
)
from mitmproxy.proxy.server import ConnectionHandler
from OpenSSL import SSL

from sidecar.buffer.fill import read_file
from sidecar.core import native
from sidecar.metrics import Counters
from sidecar.mitm.handoff import CountingWriter
from sidecar.wire.client import Response
from sidecar.wire.exchange import BodyFile, ClientGone

logger = logging.getLogger(__name__)

# Largest TLS output drained from the memory BIO at once; a 256 KiB chunk becomes ~16
# records, far below this.
_BIO_READ_SIZE = 4 * 1024 * 1024

# Responses whose head and body this module wrote itself.
_written_by_us: weakref.WeakSet[http.Response] = weakref.WeakSet()


def _install() -> None:
    """Make mitmproxy's HTTP/1 server skip responses this module already wrote, and
    refuse a malformed request body with a 400."""
    original = _http1.Http1Server.send
    if getattr(original, "_burstbuffer", False):
        return

    def send(self: _http1.Http1Server, event):  # type: ignore[no-untyped-def]
        if isinstance(event, ResponseHeaders) and event.response in _written_by_us:
            # Record the response (mark_done reads it for keep-alive), write nothing.
            self.response = event.response
            return
        if isinstance(event, ResponseData) and self.response in _written_by_us:
            return
        if isinstance(event, ResponseEndOfMessage) and self.response in _written_by_us:
            # A chunked body's last chunk was ours to write too: only end the exchange.
            yield from self.mark_done(response=True)
            return
        yield from original(self, event)

    send._burstbuffer = True  # type: ignore[attr-defined]
    _http1.Http1Server.send = send  # type: ignore[method-assign]

    read_body = _http1.Http1Server.read_body

    def read_body_or_refuse(self: _http1.Http1Server, event):  # type: ignore[no-untyped-def]
        # mitmproxy closes a connection whose request body is malformed without a word
        # (its close comes just before the protocol error it reports). RFC 9112 §7.1
        # makes such a body an error and nginx answers it 400, as the lean front end
        # does: so a 400 goes first, unless a response has begun.
        held = None
        for command in read_body(self, event):
            if isinstance(command, commands.CloseConnection) and held is None:
                held = command
                continue
            if held is not None:
                if (
                    isinstance(command, ReceiveHttp)
                    and isinstance(command.event, RequestProtocolError)
                    and self.response is None
                    and self.conn.state & ConnectionState.CAN_WRITE
                ):
                    message = f"malformed request body: {command.event.message}"
                    yield commands.SendData(self.conn, _http1.make_error_response(400, message))
                yield held
                held = None
            yield command
        if held is not None:
            yield held

    _http1.Http1Server.read_body = read_body_or_refuse  # type: ignore[method-assign,assignment]


_install()


class Connections:
    """The TLS objects of live client connections, keyed by connection id."""

    def __init__(self, proxyserver: Proxyserver) -> None:
        self._proxyserver = proxyserver
        self._tls: dict[str, SSL.Connection] = {}

    def tls_established(self, client_id: str, ssl_conn: SSL.Connection | None) -> None:
        if ssl_conn is not None:
            self._tls[client_id] = ssl_conn

    def forget(self, client_id: str) -> None:
        self._tls.pop(client_id, None)

    def tunnelled(self, client_id: str, counters: Counters) -> None:
        """Count the bytes of this client connection from now on in `counters`
        (it became a tunnel to a host that is not intercepted)."""
        handler = self._proxyserver.connections.get(client_id)
        io = handler.transports.get(handler.client) if handler is not None else None
        if io is not None and isinstance(io.writer, CountingWriter):
            io.writer.tally.counters = counters

    def channel(self, flow: http.HTTPFlow) -> ClientChannel:
        """A writer for `flow`'s client (TLS-intercepted or plain HTTP)."""
        client = flow.client_conn
        handler = self._proxyserver.connections.get(client.id)
        if handler is None:
            raise ClientGone("the client connection is already closed")
        ssl_conn = self._tls.get(client.id) if client.tls else None
        if client.tls and ssl_conn is None:
            raise RuntimeError("TLS client connection without a recorded TLS object")
        return ClientChannel(flow, handler, ssl_conn)


class ClientChannel:
    """One response, written by us into one client connection."""

    def __init__(
        self, flow: http.HTTPFlow, handler: ConnectionHandler, ssl_conn: SSL.Connection | None
    ) -> None:
        self._flow = flow
        self._handler = handler
        self._ssl = ssl_conn
        self._head: http.Response | None = None
        self.body_bytes = 0

    @property
    def started(self) -> bool:
        return self._head is not None

    async def start(self, status: int, headers: Sequence[tuple[str, str]]) -> None:
        """Write the status line and headers (Content-Length or chunked set by the caller)."""
        request = self._flow.request
        fields = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        if request.http_version == "HTTP/1.0":
            fields.append((b"Connection", b"close"))
        head = http.Response(
            http_version=b"HTTP/1.1",
            status_code=status,
            reason=status_codes.RESPONSES.get(status, "").encode(),
            headers=http.Headers(fields),
            content=b"",
            trailers=None,
            timestamp_start=time.time(),
            timestamp_end=None,
        )
        self._head = head
        await self._write(http1.assemble_response_head(head))

    async def interim(self, status: int, headers: Sequence[tuple[str, str]]) -> None:
        """Write a 1xx interim response."""
        fields = "".join(f"{name}: {value}\r\n" for name, value in headers)
        reason = status_codes.RESPONSES.get(status, "")
        await self._write(f"HTTP/1.1 {status} {reason}\r\n{fields}\r\n".encode("latin-1"))

    async def write(self, data: bytes) -> None:
        """Write body bytes, waiting while the client's socket buffer is full."""
        self.body_bytes += len(data)
        await self._write(data)

    async def send_file(self, file: BodyFile) -> None:
        """Write body bytes read from the file, then close it."""
        try:
            for chunk in read_file(file.fd, file.start, file.end):
                await self.write(chunk)
        finally:
            os.close(file.fd)

    async def follow(
        self, tee: native.Tee, start: int, end: int, whole: Callable[[], Awaitable[None]]
    ) -> bool:
        """mitmproxy holds the client's connection, not the core: the caller writes."""
        return False

    async def relay(self, response: Response, chunked: bool) -> int | None:
        """mitmproxy holds the client's connection, not the core: the caller writes."""
        return None

    def finish(self) -> None:
        """Hand the exchange back to mitmproxy: it completes it without writing."""
        assert self._head is not None, "finish() before start()"
        self._head.timestamp_end = time.time()
        _written_by_us.add(self._head)
        self._flow.response = self._head

    def abort(self) -> None:
        """Close the client connection mid-response, so it sees an error, never a
        short body with a success status."""
        writer = self._writer()
        if writer is not None and not writer.is_closing():
            writer.transport.abort()
        if self._head is not None:
            _written_by_us.add(self._head)
            self._flow.response = self._head
        self._flow.kill()

    def keep_alive(self):  # type: ignore[no-untyped-def]
        """A context manager that stops mitmproxy's idle timeout while we stream."""
        return self._handler.timeout_watchdog.disarm()

    def _writer(self):  # type: ignore[no-untyped-def]
        transport = self._handler.transports.get(self._handler.client)
        return transport.writer if transport is not None else None

    async def _write(self, data: bytes) -> None:
        writer = self._writer()
        if writer is None or writer.is_closing():
            raise ClientGone("the client closed the connection")
        if self._ssl is not None:
            self._ssl.sendall(data)
            data = self._drain_tls()
        writer.write(data)
        try:
            await writer.drain()
        except (ConnectionError, OSError) as e:
            raise ClientGone(str(e)) from e

    def _drain_tls(self) -> bytes:
        assert self._ssl is not None
        out = []
        while True:
            try:
                out.append(self._ssl.bio_read(_BIO_READ_SIZE))
            except SSL.WantReadError:
                break
        return b"".join(out)
