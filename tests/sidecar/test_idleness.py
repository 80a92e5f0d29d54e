"""The lean server closes a kept-alive connection that asks nothing for IDLE_TIMEOUT: one
timer of the loop's for all of them (`wire.server.Idleness`), on real sockets and the
core's streams, with the timeout shortened."""

from __future__ import annotations

import asyncio
import socket

import pytest

from sidecar.core import native
from sidecar.wire import server

TIMEOUT = 0.5  # seconds, for the test; the sidecar's is two minutes


def test_a_connection_that_asks_nothing_is_closed_once_it_is_due(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server, "IDLE_TIMEOUT", TIMEOUT)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        idleness = server.Idleness()
        closed: list[float] = []
        clients = []
        started = loop.time()
        for _ in range(3):
            ours, theirs = socket.socketpair()
            theirs.setblocking(False)
            clients.append(theirs)
            # No request ever comes, so the handler is never asked.
            protocol = server.Http1Connection(
                server.Hosted(),
                handler=None,  # type: ignore[arg-type]
                on_close=lambda: closed.append(loop.time() - started),
                idleness=idleness,
            )
            native.Stream(ours.detach(), loop).start(protocol, requests=True)
        try:
            await asyncio.sleep(0.6 * TIMEOUT)
            assert closed == [], "closed before it was due"
            for client in clients:
                assert await asyncio.wait_for(loop.sock_recv(client, 1), 2 * TIMEOUT) == b""
            # Due at TIMEOUT, checked every tenth of it.
            assert len(closed) == 3
            assert all(TIMEOUT <= at < 1.5 * TIMEOUT for at in closed), closed
        finally:
            idleness.close()
            for client in clients:
                client.close()

    asyncio.run(main())
