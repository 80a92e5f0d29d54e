"""The front end: accepts every client connection and decides who terminates it.

- A plain-HTTP client whose request is there when it is accepted (the listeners hand a
  connection over once its first bytes are in) and is the lean server's, as below: the
  listener's door (`sidecar.core.native.Door`) serves it from its accept on, the core's
  table first, and the lean server's protocol is made only when a request needs it. A
  new connection per file that the table answers costs no Python object.
- A CONNECT to an intercepted host on the proxy port: the Rust core peeks at it,
  answers it and does the TLS handshake with the host's leaf certificate
  (`sidecar.core.native.Arrival`), asking this module at each decision; then its stream
  (`sidecar.core.native.Stream`, TLS or the plain HTTP a client may tunnel) moves every
  byte for the lean HTTP/1.1 server (`sidecar.wire.server`). This is the
  path of every dataset download through the proxy variables, kept free of mitmproxy's
  per-request machinery.
  A TLS client whose ALPN list offers no HTTP/1.x (gRPC, HTTP/2 only) could not
  speak to that server: its ClientHello, peeked, says so (`sidecar.wire.hello`), and it is
  tunnelled to the origin untouched (`sidecar.wire.tunnel`). So is a client that refused
  the pod CA's certificate for that host not long ago (`sidecar.wire.rejections`): the
  handshake it ends with a certificate alert, or a close, is remembered by its hello.
- A CONNECT to any other host: answered, and tunnelled to it untouched.
- A plain-HTTP request to the proxy itself (absolute-form, `GET http://host/path`):
  its connection's stream serves it and every request after it for the lean server
  (`sidecar.wire.server.Forwarded`), whatever host each names; the router passes those
  to hosts that are not intercepted untouched.
- A captured connection (the hostAliases listeners, :443 and :80, and the transparent
  listener): no CONNECT names its origin, so its first bytes do. A ClientHello's server
  name (on the port the capture says) is the tunnel's host, and it goes on as inside a
  CONNECT; plain HTTP is the lean server's, each request named by its Host
  (`sidecar.wire.server.Hosted`). A TLS client that names no server is relayed
  untouched to where it was sent (transparent: `SO_ORIGINAL_DST`), or closed.
- Anything else on the proxy port (an origin-form request to the proxy itself, bytes
  that are not HTTP): handed to mitmproxy exactly as it arrived. The first bytes are
  only peeked (MSG_PEEK), never read, before that decision.

The listening sockets are made once by the parent process and shared by every
worker; `Balance` keeps each worker's share of the open connections even.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass

from sidecar.core import native
from sidecar.proxy.listeners import HOSTALIASES_HTTP_PORT, HOSTALIASES_TLS_PORT, Entrance
from sidecar.proxy.router import Router
from sidecar.settings import host_matches
from sidecar.shared import NOT_ACCEPTING
from sidecar.wire import hello, tunnel
from sidecar.wire.client import UpstreamError
from sidecar.wire.rejections import CLIENT_REJECTED_CA, Rejections, handshake_refusal
from sidecar.wire.server import Forwarded, Hosted, Http1Connection, Idleness, Tunnel
from sidecar.wire.sweep import Sweep
from sidecar.wire.tunnel import NOT_INTERCEPTED, Tunnels

logger = logging.getLogger(__name__)

# A client that connects and sends no complete request line within this long is closed.
FIRST_BYTES_TIMEOUT = 60.0  # seconds
# Between two peeks of an incomplete head or hello (the socket stays readable meanwhile).
_PEEK_INTERVAL = 0.002  # seconds
# From the answer to a CONNECT until the TLS handshake inside is done (first byte and
# ClientHello included).
TLS_HANDSHAKE_TIMEOUT = 30.0  # seconds
# A worker busier than another waits this long before accepting a new connection, so
# that the least busy worker takes it (unless that one is too busy to get there first).
ACCEPT_DELAY = 0.002  # seconds
# After an accept failed for want of descriptors or memory, before the next try.
ACCEPT_BACKOFF = 0.1  # seconds


def sweep_interval() -> float:
    """How often arrivals are checked against their deadlines: each is closed within a
    tenth of the shorter timeout after its own."""
    return min(FIRST_BYTES_TIMEOUT, TLS_HANDSHAKE_TIMEOUT) / 10


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
    # A port has five digits at most, after any leading zeros: int() of thousands of
    # digits raises (a head may hold 8 KiB of them).
    digits = port_text.lstrip("0")
    if not sep or not host or not port_text.isdigit() or len(digits) > 5:
        return None
    port = int(digits or "0")
    if not 0 < port < 65536 or host.startswith("[") != host.endswith("]"):
        return None
    return Connect(Tunnel(host.lower(), port), end + 4)


class Balance:
    """Open connections per worker, in memory the workers share.

    Every worker is woken for a new connection; one with more open connections than
    another lets it go first, so that kept-alive connections (one per data-loader
    worker) spread evenly instead of landing where the kernel happens to wake a
    process first. A worker letting one go is not accepting for a moment: each says so
    in its slot, and no worker waits for one that is not accepting. Without that,
    short-lived connections (a new one per file) found every worker waiting out its
    delay in turn, and waited for the delay themselves.

    Each worker's slot holds its open connections times two, plus NOT_ACCEPTING while
    it is not accepting on one of its listeners at least: one word, written only by its
    worker (and by the supervisor while the worker is gone).
    """

    def __init__(self, counts: memoryview | list[int], index: int) -> None:
        """`counts`: a shared array with one slot per worker; `index`: ours."""
        self._counts = counts
        self._index = index
        self._paused = 0  # listeners of this worker's not accepting at the moment

    def eligible(self) -> bool:
        """Whether to accept at once: no worker that is accepting has fewer open
        connections than this one."""
        mine = self._counts[self._index] & ~NOT_ACCEPTING
        if min(self._counts) >= mine:
            return True  # the common case, without a loop of Python's
        return all(slot >= mine or slot & NOT_ACCEPTING for slot in self._counts)

    def started(self) -> None:
        """This worker accepts from the loop's next turn on: said before the supervisor
        hears it is ready, so that no other worker takes a first client meant for it
        while its listeners' loops are about to begin."""
        self._mark()

    def paused(self) -> None:
        """A listener of this worker accepts nothing for a moment."""
        self._paused += 1
        self._mark()

    def resumed(self) -> None:
        self._paused -= 1
        self._mark()

    def _mark(self) -> None:
        slot = self._counts[self._index] & ~NOT_ACCEPTING
        self._counts[self._index] = slot | NOT_ACCEPTING if self._paused else slot

    def opened(self) -> None:
        self._counts[self._index] += 2

    def closed(self) -> None:
        self._counts[self._index] -= 2


class Front:
    """Accepts on the listening sockets of one worker."""

    def __init__(
        self,
        router: Router,
        intercept: Sequence[str],
        tls_config: Callable[[str], native.TlsConfig],
        to_mitmproxy: Callable[[int, socket.socket], Awaitable[object]],
        balance: Balance,
        tunnels: Tunnels,
        rejections: Rejections,
        answers: native.Answers | None,
    ) -> None:
        """`tls_config(host)`: the TLS server side of an intercepted host;
        `to_mitmproxy(listener, sock)`: hands a connection of listener number
        `listener` to mitmproxy (a coroutine); `tunnels`: where tunnels are counted;
        `rejections`: the clients that refused the certificate, tunnelled; `answers`:
        the core's table of answers (the router's), which answers plain-HTTP clients
        from their accept on (`native.Door`), and every lean server's requests first."""
        self._router = router
        self._answers = answers
        self._tunnels = tunnels
        self._rejections = rejections
        self._intercept = intercept
        self._tls_config = tls_config
        self._to_mitmproxy = to_mitmproxy
        self._balance = balance
        self._tasks: set[asyncio.Task[None]] = set()
        self._arrivals: Sweep[_Arrival] = Sweep(sweep_interval(), _Arrival.expire_by)
        self._idleness = Idleness()

    async def accept(self, listener: int, sock: socket.socket, entrance: Entrance) -> None:
        """Accept on `sock` until cancelled; `entrance`: how its clients name their
        origin. The loop calls back for each connection: no task or future per accept. A
        plain-HTTP client is served at the door when its request is there at once; any
        other goes through an arrival."""
        loop = asyncio.get_running_loop()
        fd = sock.fileno()
        door = self._door(entrance)
        accepting = loop.create_future()  # never set: cancelled when the worker stops

        def take() -> None:
            try:
                client = native.accept(fd)
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return  # another worker took it, or its client is gone already
            except OSError as e:
                # Out of descriptors, most likely: retry once connections have closed,
                # rather than spin on a socket that stays readable.
                logger.warning("cannot accept a connection: %s", e)
                pause(ACCEPT_BACKOFF, False)
                return
            self._balance.opened()
            if door is None or not door.serve(client):
                _Arrival(self, listener, client, entrance)

        def acceptable() -> None:
            if self._balance.eligible():
                take()
                return
            # Every worker is woken; the least busy one should take the connection.
            pause(ACCEPT_DELAY, True)

        def pause(seconds: float, then_take: bool) -> None:
            loop.remove_reader(fd)
            self._balance.paused()
            loop.call_later(seconds, resume, then_take)

        def resume(now: bool) -> None:
            if accepting.done():
                return
            self._balance.resumed()
            if now:
                take()
            loop.add_reader(fd, acceptable)

        loop.add_reader(fd, acceptable)
        try:
            await accepting
        finally:
            loop.remove_reader(fd)

    def _hand_off(self, listener: int, client: socket.socket) -> None:
        """Hand a connection, unread, to mitmproxy."""

        async def hand_off() -> None:
            try:
                await self._to_mitmproxy(listener, client)
            except OSError as e:
                logger.debug("client connection ended early: %s", e)
                client.close()
            finally:
                self._balance.closed()

        self._spawn(hand_off())

    def _door(self, entrance: Entrance) -> native.Door | None:
        """Where the core serves the plain-HTTP clients of `entrance` from their accept
        on; None without a table of answers."""
        if self._answers is None:
            return None
        served = FORWARDED if entrance == "forward" else HOSTED
        return native.Door(
            asyncio.get_running_loop(),
            entrance != "forward",
            self._answers,
            served.scope.encode(),
            _Reception(self, served),
        )

    def _lean_server(self, served: Tunnel | Forwarded | Hosted) -> Http1Connection:
        """The lean server's protocol for one connection, the core's table of answers
        first where it can."""
        return Http1Connection(
            served, self._router, self._balance.closed, self._idleness, self._answers
        )

    def _serve_requests(self, arrival: native.Arrival, served: Tunnel | Forwarded | Hosted) -> None:
        """The lean server answers the requests inside the tunnel, or those sent to the
        proxy itself."""
        arrival.take_stream(self._lean_server(served), requests=True)

    async def _tunnel(self, client: int, to: Tunnel, reason: str) -> None:
        """Relay the client's own TLS (the socket `client`, taken over) to the origin
        untouched."""
        counters = self._tunnels.opened(to.host, reason)
        try:
            origin = await self._router.upstream.tunnel(to.url("/"))
        except UpstreamError as e:
            counters.upstream_errors += 1
            logger.warning("tunnel to %s:%d: %s", to.host, to.port, e)
            os.close(client)
            self._balance.closed()
            return
        client_side, origin_side = tunnel.pair(counters, self._balance.closed)
        origin.set_protocol(origin_side)
        origin_side.connection_made(origin)
        try:
            native.Stream(client, asyncio.get_running_loop()).start(client_side)
        except OSError as e:
            # The stream has closed the client's socket; the relay never began.
            logger.debug("client connection ended early: %s", e)
            origin.close()
            self._balance.closed()

    def _spawn(self, work: Coroutine[None, None, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        self._arrivals.close()
        self._idleness.close()
        for arrival in self._arrivals.watched():
            arrival.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class _Reception:
    """What the streams of a listener's door (`native.Door`) call in Python: the lean
    server's protocol once a stream needs one, the end of a connection that never did,
    and the idle watch of one the table answered while it stays open."""

    __slots__ = ("_front", "_served")

    def __init__(self, front: Front, served: Forwarded | Hosted) -> None:
        self._front = front
        self._served = served

    def protocol(self) -> Http1Connection:
        return self._front._lean_server(self._served)

    def closed(self) -> None:
        self._front._balance.closed()

    def watch_stream(self, stream: native.Stream) -> None:
        self._front._idleness.watch_stream(stream)

    def forget_stream(self, stream: native.Stream) -> None:
        self._front._idleness.forget_stream(stream)


class _Arrival:
    """One client of the lean front end until the lean server, a tunnel or mitmproxy
    owns its connection: the decisions the core's `native.Arrival` asks for, and the
    deadlines.

    On the forward proxy, the core peeks at the request head: a CONNECT is answered
    (to a host that is not intercepted, the tunnel is relayed untouched), a request
    with an absolute-form target is the lean server's, anything else goes to
    mitmproxy, unread. Inside the tunnel, or from the first byte of a captured
    connection (hostAliases, transparent), what the client sends first tells plain HTTP
    from TLS (every TLS connection starts with a handshake record). A captured TLS
    client names its host in its ClientHello (SNI); one that names none is relayed
    untouched to where it was sent (transparent), or closed (hostAliases: nothing says
    where). A ClientHello whose ALPN list offers no HTTP/1.x, or from a client that
    refused the pod CA's certificate for that host not long ago, is tunnelled to the
    origin; any other gets the host's leaf certificate and the core's handshake. A
    captured plain-HTTP client names its origin in each request's Host.
    """

    __slots__ = (
        "_arrival",
        "_deadline",
        "_destination",
        "_front",
        "_hello",
        "_late",
        "_listener",
        "_port",
        "_tunnel",
    )

    def __init__(self, front: Front, listener: int, client: int, entrance: Entrance) -> None:
        """`client`: the accepted socket's descriptor, which the arrival takes."""
        loop = asyncio.get_running_loop()
        self._front = front
        self._listener = listener
        self._tunnel: Tunnel | None = None
        self._hello = b""  # the ClientHello the handshake answers
        # Where a captured connection was sent (transparent), and the port its origin
        # listens on.
        self._destination = original_destination(client) if entrance == "transparent" else None
        self._port = _CAPTURED_PORTS.get(entrance, 0)
        if self._destination is not None:
            self._port = self._destination[1]
        # When it is closed if it has not settled by then (`time.monotonic`), and why.
        self._deadline = time.monotonic() + FIRST_BYTES_TIMEOUT
        self._late = "no request within the first-bytes timeout"
        self._arrival = native.Arrival(client, loop, self, captured=entrance != "forward")
        # Kept until it settles, and closed if its deadline passes first.
        front._arrivals.watch(self)
        self._arrival.start()

    def request(self, head: bytes) -> None:
        """The bytes waiting, the request head among them if it is whole."""
        incomplete = b"\r\n\r\n" not in head and len(head) < native.REQUEST_PEEK
        if incomplete and head.startswith(b"CONNECT"[: len(head)]):
            # The socket stays readable while the rest is on its way: wait, then peek.
            self._arrival.peek_later(_PEEK_INTERVAL)
            return
        connect = parse_connect(head)
        if connect is None:
            forwarded = native.forwarded_request(head)
            if forwarded is None:
                self._arrival.peek_later(_PEEK_INTERVAL)
                return
            if forwarded:
                self._settle()
                self._front._serve_requests(self._arrival, FORWARDED)
                return
        if connect is None:
            self._settle()
            self._front._hand_off(self._listener, _socket(self._arrival.detach()))
            return
        self._arrival.answer_connect(connect.head_length)
        if not host_matches(connect.tunnel.host, self._front._intercept):
            self._settle()
            self._front._spawn(
                self._front._tunnel(self._arrival.detach(), connect.tunnel, NOT_INTERCEPTED)
            )
            return
        self._tunnel = connect.tunnel
        # One deadline for the first byte, the ClientHello and the handshake: a limit for
        # each would let a client that keeps to every one of them hold the connection
        # for their sum.
        self._deadline = time.monotonic() + TLS_HANDSHAKE_TIMEOUT
        self._late = "no TLS handshake within its timeout"

    def tunnelled(self, first: bytes) -> None:
        """What came first inside the tunnel, or on a captured connection: plain HTTP,
        or a ClientHello (whole, or its start)."""
        if first[:1] != native.TLS_HANDSHAKE_RECORD:
            self._settle()
            if self._tunnel is None:
                self._front._serve_requests(self._arrival, HOSTED)
            else:
                plain = dataclasses.replace(self._tunnel, tls=False)
                self._front._serve_requests(self._arrival, plain)
            return
        if self._tunnel is None and not self._name_captured(first):
            return
        assert self._tunnel is not None
        try:
            alpn = hello.client_hello_alpn(first)
        except hello.Incomplete:
            if len(first) < native.HELLO_PEEK:
                self._arrival.peek_later(_PEEK_INTERVAL)
                return
            first, alpn = b"", None  # left to the handshake, which refuses it
        except ValueError:
            first, alpn = b"", None
        host = self._tunnel.host
        reason = hello.tunnel_reason(alpn)
        if reason is None and first and self._front._rejections.remembers(host, first):
            reason = CLIENT_REJECTED_CA
        if reason is not None:
            self._settle()
            self._front._spawn(self._front._tunnel(self._arrival.detach(), self._tunnel, reason))
            return
        self._hello = first
        self._arrival.secure(self._front._tls_config(host))

    def _name_captured(self, first: bytes) -> bool:
        """Name a captured TLS connection's origin by the server name of its hello
        (`first`), on the port the capture says; False when the arrival waits for more
        of it, or is no longer this one's (relayed untouched, or closed)."""
        try:
            name = hello.client_hello_server_name(first)
        except hello.Incomplete:
            if len(first) < native.HELLO_PEEK:
                self._arrival.peek_later(_PEEK_INTERVAL)
                return False
            name = None
        except ValueError:
            name = None
        if name is None:
            self._settle()
            if self._destination is None:
                logger.warning("captured TLS connection without a server name: closed")
                self._arrival.abort()
                self._front._balance.closed()
                return False
            to = Tunnel(*self._destination)
            self._front._spawn(self._front._tunnel(self._arrival.detach(), to, NOT_INTERCEPTED))
            return False
        self._tunnel = Tunnel(name, self._port)
        if not host_matches(name, self._front._intercept):
            self._settle()
            self._front._spawn(
                self._front._tunnel(self._arrival.detach(), self._tunnel, NOT_INTERCEPTED)
            )
            return False
        return True

    def secured(self) -> None:
        assert self._tunnel is not None
        self._settle()
        self._front._serve_requests(self._arrival, self._tunnel)

    def ended(self, error: BaseException) -> None:
        """The client left, or the handshake failed (a client that refused the
        certificate is remembered), or a decision here raised (a bug: logged)."""
        self._settle()
        if not isinstance(error, OSError):
            logger.error("a client connection failed: %s", error, exc_info=error)
        else:
            refusal = handshake_refusal(error)
            if refusal is not None and self._hello and self._tunnel is not None:
                self._front._rejections.remember(self._tunnel.host, self._hello, refusal)
            logger.debug("client connection ended early: %s", error)
        self._front._balance.closed()

    def abort(self) -> None:
        self._settle()
        self._arrival.abort()

    def expire_by(self, now: float) -> None:
        """Close the connection if its deadline has passed by `now` (`time.monotonic`)."""
        if now < self._deadline:
            return
        self.abort()
        logger.debug("client connection ended early: %s", self._late)
        self._front._balance.closed()

    def _settle(self) -> None:
        """Someone else owns the connection from now on, or nobody."""
        self._front._arrivals.forget(self)


FORWARDED = Forwarded()
HOSTED = Hosted()
# The port a captured connection's origin listens on, by entrance (transparent: where
# it was sent).
_CAPTURED_PORTS: dict[str, int] = {
    "hostAliases-tls": HOSTALIASES_TLS_PORT,
    "hostAliases-http": HOSTALIASES_HTTP_PORT,
}
# getsockopt(2)'s option for a redirected connection's original destination
# (netfilter's, <linux/netfilter_ipv4.h>), which Python's socket module lacks.
_SO_ORIGINAL_DST = 80


def original_destination(fd: int) -> tuple[str, int] | None:
    """Where the connection `fd` was sent before a redirect (iptables' REDIRECT, the
    transparent capture's rule): IPv4 address and port; None if it was not redirected
    (it was sent to the listener itself), or the kernel cannot say."""
    sock = socket.socket(fileno=fd)
    try:
        raw = sock.getsockopt(socket.SOL_IP, _SO_ORIGINAL_DST, 16)
        local = sock.getsockname()
    except OSError:
        return None
    finally:
        sock.detach()
    port = int.from_bytes(raw[2:4])
    address = socket.inet_ntoa(raw[4:8])
    return None if (address, port) == local[:2] else (address, port)


def _socket(fd: int) -> socket.socket:
    """A socket object for descriptor `fd`, for asyncio's socket calls (non-blocking)."""
    client = socket.socket(fileno=fd)
    client.setblocking(False)
    return client
