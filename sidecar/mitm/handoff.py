"""Connections the front end accepted, handed to mitmproxy: counted once tunnelled."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable, Mapping
from typing import SupportsIndex

from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.proxy.mode_servers import ServerInstance

from sidecar.metrics import Counters


class Handoff:
    """Hands connections the front end accepted to mitmproxy, one mode per listener.

    mitmproxy does not listen itself (`server=False`): the listening sockets are
    shared by every worker process, which mitmproxy's own servers cannot do. Each
    accepted connection goes to the same handler mitmproxy's server would call, with
    streams that can count its bytes once it turns out to be a tunnel
    (`sidecar.mitm.respond.Connections.tunnelled`).
    """

    def __init__(self, proxyserver: Proxyserver, modes: Mapping[int, str]) -> None:
        """`modes`: the mitmproxy mode of each listener that hands connections over, by
        its number."""
        self._instances: dict[int, ServerInstance] = {
            listener: ServerInstance.make(mode, proxyserver) for listener, mode in modes.items()
        }

    async def handle(self, listener: int, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        tally = _Tally()
        reader = _CountingReader(tally, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock=sock)
        writer = CountingWriter(tally, transport, protocol, reader, loop)
        try:
            await self._instances[listener].handle_stream(reader, writer)
        finally:
            # The connection is ours: closed when mitmproxy is done with it. mitmproxy
            # skips its own close when a client's FIN reaches a response still in
            # progress (its handler cancels itself while processing the close), which
            # every client that closes right after the response it got from the fast
            # path does: without this, each such connection stayed in CLOSE-WAIT.
            writer.close()


class _Tally:
    """Where a client connection's bytes are counted: nowhere until it is a tunnel."""

    __slots__ = ("counters",)

    def __init__(self) -> None:
        self.counters: Counters | None = None


class _CountingReader(asyncio.StreamReader):
    def __init__(self, tally: _Tally, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self.tally = tally

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        if self.tally.counters is not None:
            self.tally.counters.tunnelled_bytes += len(data)  # type: ignore[arg-type]
        super().feed_data(data)


class CountingWriter(asyncio.StreamWriter):
    def __init__(
        self,
        tally: _Tally,
        transport: asyncio.BaseTransport,
        protocol: asyncio.StreamReaderProtocol,
        reader: asyncio.StreamReader,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        super().__init__(transport, protocol, reader, loop)  # type: ignore[arg-type]
        self.tally = tally

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.tally.counters is not None:
            self.tally.counters.tunnelled_bytes += len(data)
        super().write(data)
