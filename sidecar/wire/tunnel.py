"""Connections relayed byte for byte: tunnels, and HTTP/1.1 connections after an upgrade.

Some of a client's traffic is nothing a cache can read: TLS for a host that is not
intercepted, a client whose ALPN list lacks HTTP/1.x (`sidecar.wire.hello`) or that
refused the pod CA's certificate (`sidecar.wire.rejections`), a WebSocket after its
`101`. Each is relayed untouched both ways, with flow control (a side that cannot keep
up stops the other from being read), and its bytes counted. Both sides are streams of
the Rust core, and each forwards what it reads to the other (`Stream.forward_to`): no
byte of a relayed connection reaches Python, which hears only when a side is full and
when one ends; the core counts the bytes (`native.relayed_bytes`). `Tunnels` counts the
connections by reason and names each host once per reason in the log, whichever front end
(`sidecar.proxy.front`, or mitmproxy's `sidecar.mitm.addon`) found it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from sidecar.metrics import Counters, Metrics
from sidecar.wire.hello import ALPN_WITHOUT_HTTP_1
from sidecar.wire.rejections import CLIENT_REJECTED_CA

logger = logging.getLogger(__name__)

# Hosts named in the log per reason, at most (a client may tunnel to thousands).
MAX_NAMED_HOSTS = 1000
# The tunnel reason of a host that is not intercepted.
NOT_INTERCEPTED = "not-intercepted"

_WHY = {
    NOT_INTERCEPTED: "not intercepted: %s; add it to --intercept to cache it",
    ALPN_WITHOUT_HTTP_1: (
        "tunnelled untouched: %s, for a client whose ALPN offers no HTTP/1.x"
        " (gRPC, HTTP/2 only): nothing it sends could be cached"
    ),
    CLIENT_REJECTED_CA: (
        "tunnelled untouched: %s, for a client that refused the pod CA's certificate"
        " (uncached until it trusts the pod CA)"
    ),
}


class Tunnels:
    """One worker's tunnels: counted by reason, each host named once per reason."""

    def __init__(self, metrics: Metrics) -> None:
        self.counters = metrics.counters
        self._named: dict[str, set[str]] = {}

    def opened(self, host: str, reason: str) -> Counters:
        """Count a new tunnel to `host`; the counters its bytes go to."""
        counters = self.counters
        counters.tunnelled_connections += 1
        counters.tunnel_reasons[reason] += 1
        named = self._named.setdefault(reason, set())
        if host not in named and len(named) < MAX_NAMED_HOSTS:
            named.add(host)
            logger.info(_WHY[reason], host)
        return counters


class Relay(asyncio.Protocol):
    """One side of a relayed connection: what it reads is written to the other side.

    Made in pairs (`pair()`); the origin side gets its transport first, and the client
    side's is read only then, so that nothing read has nowhere to go. Once both have
    their stream, each stream forwards what it reads to the other.
    """

    def __init__(self, counters: Counters, on_close: Callable[[], None] | None) -> None:
        self._counters = counters
        self._on_close = on_close
        self.transport: Any = None
        self.peer: Relay | None = None
        self._eof = False
        self._closed = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        peer = self.peer
        if peer is not None and peer.transport is not None:
            transport.forward_to(peer.transport)
            peer.transport.forward_to(transport)

    def data_received(self, data: bytes) -> None:
        # Only what was read before the streams forward to each other (a 101's first
        # bytes of the new protocol): the core forwards and counts the rest.
        self._counters.tunnelled_bytes += len(data)
        peer = self.peer
        if peer is not None and not peer.transport.is_closing():
            peer.transport.write(data)

    def eof_received(self) -> bool:
        """Pass the half-close on where the other side can take one (TCP); TLS cannot
        stay half-open, so there both sides close."""
        self._eof = True
        peer = self.peer
        if peer is None or peer.transport is None or peer.transport.is_closing():
            return False
        if peer._eof or not _can_write_eof(peer.transport):
            peer.transport.close()
            return False
        peer.transport.write_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closed = True
        peer = self.peer
        if peer is not None and peer.transport is not None and not peer.transport.is_closing():
            if exc is None:
                peer.transport.close()
            else:
                peer.transport.abort()
        # The pair, their streams and the streams' buffers refer to one another: a cycle
        # that only the garbage collector, which the workers run seldom, would free.
        self.peer = None
        self.transport = None
        if self._on_close is not None:
            self._on_close()

    # Our transport's buffer is full: stop reading the side that fills it.
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


def pair(counters: Counters, on_client_close: Callable[[], None]) -> tuple[Relay, Relay]:
    """(client side, origin side) of one relayed connection; `on_client_close` runs
    once the client's connection is closed."""
    client, origin = Relay(counters, on_client_close), Relay(counters, None)
    client.peer, origin.peer = origin, client
    return client, origin


def _can_write_eof(transport: Any) -> bool:
    try:
        return bool(transport.can_write_eof())
    except (AttributeError, NotImplementedError):
        return False
