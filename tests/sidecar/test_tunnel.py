"""`sidecar.wire.tunnel.Relay` between two real TCP connections, each a stream of the core
that forwards what it reads to the other: bytes, flow control, half-closes, resets."""

from __future__ import annotations

import asyncio
import socket

from sidecar.core import native
from sidecar.metrics import Metrics
from sidecar.wire.tunnel import Relay, pair


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Both ends of one loopback TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        near = socket.create_connection(server.getsockname())
        far, _ = server.accept()
    return near, far


async def relayed() -> tuple[socket.socket, socket.socket, list[str], Relay]:
    """(the client's end, the origin's end) of a relay, what it said was closed, and
    its client side."""
    loop = asyncio.get_running_loop()
    client, client_inner = tcp_pair()
    origin, origin_inner = tcp_pair()
    for sock in (client, origin, client_inner, origin_inner):
        sock.setblocking(False)
    closed: list[str] = []
    client_side, origin_side = pair(Metrics().counters, lambda: closed.append("client"))
    native.Stream(origin_inner.detach(), loop).start(origin_side)
    native.Stream(client_inner.detach(), loop).start(client_side)
    return client, origin, closed, client_side


async def read_until_eof(sock: socket.socket) -> bytes:
    """What arrives until the end, or until a reset."""
    data = b""
    try:
        while chunk := await asyncio.get_running_loop().sock_recv(sock, 65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def test_bytes_both_ways_and_half_closes() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        before = native.relayed_bytes()
        client, origin, closed, _ = await relayed()
        payload = bytes(range(256)) * 8192  # 2 MiB: more than any socket buffer
        sending = loop.create_task(loop.sock_sendall(client, payload))
        received = b""
        while len(received) < len(payload):
            received += await loop.sock_recv(origin, 65536)
        await sending
        assert received == payload
        # The client is done sending; the origin still answers, then closes.
        client.shutdown(socket.SHUT_WR)
        assert await asyncio.wait_for(read_until_eof(origin), 5) == b""
        await loop.sock_sendall(origin, b"answer")
        origin.close()
        assert await asyncio.wait_for(read_until_eof(client), 5) == b"answer"
        await asyncio.sleep(0.05)
        assert native.relayed_bytes() - before == len(payload) + len(b"answer")
        assert closed == ["client"]
        client.close()

    asyncio.run(main())


def test_a_reset_on_one_side_closes_the_other() -> None:
    async def main() -> None:
        client, origin, closed, _ = await relayed()
        origin.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        origin.close()  # with linger 0: a reset
        assert await asyncio.wait_for(read_until_eof(client), 5) == b""
        await asyncio.sleep(0.05)
        assert closed == ["client"]
        client.close()

    asyncio.run(main())


def test_a_side_that_does_not_read_stops_the_other_from_being_read() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        client, origin, _, client_side = await relayed()
        payload = bytes(range(251)) * (128 * 1024)  # 31 MiB
        sending = loop.create_task(loop.sock_sendall(origin, payload))
        await asyncio.sleep(0.5)  # the client reads nothing meanwhile
        # What waits for the client is bounded by its stream's high-water mark and one
        # read of the origin, not by what the origin sent.
        assert client_side.transport.get_write_buffer_size() <= 1024 * 1024
        assert not sending.done()
        received = bytearray()
        while len(received) < len(payload):
            received += await loop.sock_recv(client, 1024 * 1024)
        await sending
        assert received == payload
        client.close()
        origin.close()

    asyncio.run(main())
