"""The front end: accepts every client connection and decides who terminates it.

- A CONNECT to an intercepted host on the proxy port: answered here, then the socket is
  handed to the Rust core's stream (`sidecar.core.native.Stream`), which does TLS with
  the host's leaf certificate (or plain HTTP, when that is what the client tunnels) and
  moves every byte for the lean HTTP/1.1 server (`sidecar.wire.server`). This is the
  path of every dataset download through the proxy variables, kept free of mitmproxy's
  per-request machinery.
  A TLS client whose ALPN list offers no HTTP/1.x (gRPC, HTTP/2 only) could not
  speak to that server: its ClientHello, peeked, says so (`sidecar.wire.hello`), and it is
  tunnelled to the origin untouched (`sidecar.wire.tunnel`). So is a client that refused
  the pod CA's certificate for that host not long ago (`sidecar.wire.rejections`): the
  handshake it ends with a certificate alert, or a close, is remembered by its hello.
- Everything else (CONNECT to other hosts, which are tunnelled untouched, plain-HTTP
  proxy requests, the hostAliases and transparent listeners): handed to mitmproxy
  exactly as it arrived. The first bytes are only peeked (MSG_PEEK), never read,
  before that decision.

The listening sockets are made once by the parent process and shared by every
worker; `Balance` keeps each worker's share of the open connections even.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sidecar.core import native
from sidecar.proxy.router import Router
from sidecar.settings import host_matches
from sidecar.wire import hello, tls, tunnel
from sidecar.wire.client import UpstreamError
from sidecar.wire.rejections import CLIENT_REJECTED_CA, Rejections, handshake_refusal
from sidecar.wire.server import Http1Connection, Tunnel
from sidecar.wire.tunnel import Tunnels

logger = logging.getLogger(__name__)

# Bytes peeked to find a CONNECT request's head; a longer head goes to mitmproxy.
PEEK_LIMIT = 8192
# A client that connects and sends no complete request line within this long is closed.
FIRST_BYTES_TIMEOUT = 60.0  # seconds
# Between two peeks of an incomplete head (the socket stays readable meanwhile).
_PEEK_INTERVAL = 0.002  # seconds
# From the answer to a CONNECT until the TLS handshake inside is done (first byte and
# ClientHello included).
TLS_HANDSHAKE_TIMEOUT = 30.0  # seconds
# A worker busier than another waits this long before accepting a new connection, so
# that the least busy worker takes it (unless that one is too busy to get there first).
ACCEPT_DELAY = 0.002  # seconds
_ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
# The first byte of every TLS connection: a handshake record (RFC 8446 §5.1).
_TLS_HANDSHAKE_RECORD = b"\x16"
# Bytes peeked to find a ClientHello's ALPN list. Hellos are well under 2 KiB (a
# post-quantum key share included); one that is not whole within this is left to the
# TLS handshake, as every hello was before ALPN was read.
HELLO_PEEK_LIMIT = 32 * 1024


@dataclass(frozen=True)
class Connect:
    """A CONNECT request head, complete within the peeked bytes."""

    tunnel: Tunnel
    head_length: int


def parse_connect(head: bytes) -> Connect | None:
    """The CONNECT request at the start of `head`, or None for anything else.

    RFC 9110 §9.3.6: the target is `host:port` (authority-form), IPv6 in brackets.
    """
    end = head.find(b"\r\n\r\n")
    if end < 0:
        return None
    line = head[: head.find(b"\r\n")]
    parts = line.split(b" ")
    if len(parts) != 3 or parts[0] != b"CONNECT" or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
        return None
    try:
        host, sep, port_text = parts[1].decode("ascii").rpartition(":")
    except UnicodeDecodeError:
        return None
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    if host.startswith("[") != host.endswith("]"):
        return None
    return Connect(Tunnel(host.lower(), int(port_text)), end + 4)


class Balance:
    """Open connections per worker, in memory the workers share.

    Every worker is woken for a new connection; those with more open connections
    than the least busy one let it go first, so that kept-alive connections (one per
    data-loader worker) spread evenly instead of landing where the kernel happens to
    wake a process first.
    """

    def __init__(self, counts: Sequence[int], index: int) -> None:
        """`counts`: a shared array with one slot per worker; `index`: ours."""
        self._counts = counts
        self._index = index

    def eligible(self) -> bool:
        mine = self._counts[self._index]
        return all(mine <= other for other in self._counts)

    def opened(self) -> None:
        self._counts[self._index] += 1  # type: ignore[index]

    def closed(self) -> None:
        self._counts[self._index] -= 1  # type: ignore[index]


class Front:
    """Accepts on the listening sockets of one worker."""

    def __init__(
        self,
        router: Router,
        intercept: Sequence[str],
        tls_config: Callable[[str], native.TlsConfig],
        to_mitmproxy: Callable[[int, socket.socket], asyncio.Future[None] | object],
        balance: Balance,
        tunnels: Tunnels,
        rejections: Rejections,
    ) -> None:
        """`tls_config(host)`: the TLS server side of an intercepted host;
        `to_mitmproxy(listener, sock)`: hands a connection of listener number
        `listener` to mitmproxy (a coroutine); `tunnels`: where tunnels are counted;
        `rejections`: the clients that refused the certificate, tunnelled."""
        self._router = router
        self._tunnels = tunnels
        self._rejections = rejections
        self._hello_buffer = bytearray(HELLO_PEEK_LIMIT)
        self._intercept = intercept
        self._tls_config = tls_config
        self._to_mitmproxy = to_mitmproxy
        self._balance = balance
        self._tasks: set[asyncio.Task[None]] = set()

    async def accept(self, listener: int, sock: socket.socket, lean: bool) -> None:
        """Accept forever on `sock`; `lean`: CONNECTs to intercepted hosts are ours."""
        loop = asyncio.get_running_loop()
        while True:
            await tls.ready(sock.fileno(), write=False)
            if not self._balance.eligible():
                # Every worker is woken; the least busy one should take the connection.
                await asyncio.sleep(ACCEPT_DELAY)
            try:
                client, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                continue  # another worker took it
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._balance.opened()
            task = loop.create_task(self._dispatch(listener, client, lean))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _dispatch(self, listener: int, client: socket.socket, lean: bool) -> None:
        lean_owns_it = False
        try:
            connect = await self._peek_connect(client) if lean else None
            if connect is not None and host_matches(connect.tunnel.host, self._intercept):
                lean_owns_it = await self._serve_tunnel(client, connect)
            else:
                await self._to_mitmproxy(listener, client)  # type: ignore[misc]
        except (ConnectionError, TimeoutError, OSError) as e:
            logger.debug("client connection ended early: %s", e)
            client.close()
        finally:
            if not lean_owns_it:
                self._balance.closed()

    async def _peek_connect(self, client: socket.socket) -> Connect | None:
        """Wait for the first request head; a CONNECT is parsed, anything else is None."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FIRST_BYTES_TIMEOUT
        while True:
            try:
                head = client.recv(PEEK_LIMIT, socket.MSG_PEEK)
            except BlockingIOError:
                head = None
            if head == b"":
                raise ConnectionResetError("closed before its first request")
            if head is not None and (b"\r\n\r\n" in head or len(head) >= PEEK_LIMIT):
                return parse_connect(head)
            if head is not None and not head.startswith(b"CONNECT"[: len(head)]):
                return None
            if loop.time() > deadline:
                raise TimeoutError("no request within the first-bytes timeout")
            if head is None:
                await tls.ready(client.fileno(), write=False)
            else:
                await asyncio.sleep(_PEEK_INTERVAL)

    async def _serve_tunnel(self, client: socket.socket, connect: Connect) -> bool:
        """Answer the CONNECT, then TLS and the lean server. True once it owns the
        connection (its close is counted by the protocol).

        A client may tunnel plain HTTP too (an http URL through a proxy that it always
        CONNECTs to, as Node's fetch and undici's ProxyAgent do): what it sends first
        tells, since every TLS connection starts with a handshake record.
        """
        client.recv(connect.head_length)  # exactly the head peeked; nothing follows yet
        client.send(_ESTABLISHED)
        loop = asyncio.get_running_loop()
        # One deadline for the first byte, the ClientHello and the handshake: a limit for
        # each would let a client that keeps to every one of them hold the connection
        # for their sum.
        deadline = loop.time() + TLS_HANDSHAKE_TIMEOUT
        async with asyncio.timeout_at(deadline):
            await tls.ready(client.fileno(), write=False)
            first = client.recv(1, socket.MSG_PEEK)
            if not first:
                raise ConnectionResetError("closed inside the tunnel before its first byte")
            if first != _TLS_HANDSHAKE_RECORD:
                tunnel = dataclasses.replace(connect.tunnel, tls=False)
                self._serve_requests(native.Stream(client.detach(), loop), tunnel)
                return True
            client_hello, alpn = await _peek_hello(client, self._hello_buffer)
        host = connect.tunnel.host
        reason = hello.tunnel_reason(alpn)
        if reason is None and client_hello and self._rejections.remembers(host, client_hello):
            reason = CLIENT_REJECTED_CA
        if reason is not None:
            return await self._tunnel(client, connect.tunnel, reason)
        config = self._tls_config(host)
        stream = native.Stream(client.detach(), loop, config)
        try:
            async with asyncio.timeout_at(deadline):
                await tls.handshake(stream)
        except BaseException as e:
            stream.abort()
            refusal = handshake_refusal(e)
            if refusal is not None and client_hello:
                self._rejections.remember(host, client_hello, refusal)
            raise
        self._serve_requests(stream, connect.tunnel)
        return True

    def _serve_requests(self, stream: native.Stream, tunnel: Tunnel) -> None:
        """The lean server answers the requests inside the tunnel, the core's table of
        answers first where it can."""
        protocol = Http1Connection(tunnel, self._router, self._balance.closed, self._router.answers)
        stream.start(protocol, requests=True)

    async def _tunnel(self, client: socket.socket, to: Tunnel, reason: str) -> bool:
        """Relay the client's own TLS to the origin untouched; True once a tunnel owns
        the connection."""
        counters = self._tunnels.opened(to.host, reason)
        try:
            origin = await self._router.upstream.tunnel(to.url("/"))
        except UpstreamError as e:
            counters.upstream_errors += 1
            logger.warning("tunnel to %s:%d: %s", to.host, to.port, e)
            client.close()
            return False
        client_side, origin_side = tunnel.pair(counters, self._balance.closed)
        origin.set_protocol(origin_side)
        origin_side.connection_made(origin)
        loop = asyncio.get_running_loop()
        await loop.connect_accepted_socket(lambda: client_side, client)
        return True

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _peek_hello(client: socket.socket, buffer: bytearray) -> tuple[bytes, list[bytes] | None]:
    """The ClientHello waiting in `client`'s socket, left unread, and its ALPN list (None
    for no ALPN); (b"", None) for a hello that cannot be read (the handshake refuses it).

    `buffer` (HELLO_PEEK_LIMIT bytes) is peeked into and read before any await, so one
    serves every connection of a worker. A buffer allocated per peek and shrunk to the
    hello's size churns the heap with every connection (with one, the soak test's RSS
    grew past its bound between rounds in two runs of three; with this, it did not).
    The caller bounds the wait.
    """
    while True:
        size = client.recv_into(buffer, HELLO_PEEK_LIMIT, socket.MSG_PEEK)
        if not size:
            raise ConnectionResetError("closed inside the tunnel during its ClientHello")
        data = bytes(memoryview(buffer)[:size])
        try:
            return data, hello.client_hello_alpn(data)
        except hello.Incomplete:
            if size >= HELLO_PEEK_LIMIT:
                return b"", None
        except ValueError:
            return b"", None
        # The socket stays readable while the rest is on its way: wait, then peek again.
        await asyncio.sleep(_PEEK_INTERVAL)
