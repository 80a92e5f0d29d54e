"""`sidecar.wire.tunnel.Relay` between two real TCP connections: bytes, half-closes, resets."""

from __future__ import annotations

import asyncio
import socket

from sidecar.metrics import Metrics
from sidecar.wire.tunnel import pair


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Both ends of one loopback TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        near = socket.create_connection(server.getsockname())
        far, _ = server.accept()
    return near, far


async def relayed() -> tuple[socket.socket, socket.socket, Metrics, list[str]]:
    """(the client's end, the origin's end) of a relay, and its counters."""
    loop = asyncio.get_running_loop()
    client, client_inner = tcp_pair()
    origin, origin_inner = tcp_pair()
    for sock in (client, origin):
        sock.setblocking(False)
    metrics, closed = Metrics(), []
    client_side, origin_side = pair(metrics.counters, lambda: closed.append("client"))
    await loop.connect_accepted_socket(lambda: origin_side, origin_inner)
    await loop.connect_accepted_socket(lambda: client_side, client_inner)
    return client, origin, metrics, closed


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
        client, origin, metrics, closed = await relayed()
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
        assert metrics.counters.tunnelled_bytes == len(payload) + len(b"answer")
        assert closed == ["client"]
        client.close()

    asyncio.run(main())


def test_a_reset_on_one_side_closes_the_other() -> None:
    async def main() -> None:
        client, origin, _, closed = await relayed()
        origin.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        origin.close()  # with linger 0: a reset
        assert await asyncio.wait_for(read_until_eof(client), 5) == b""
        await asyncio.sleep(0.05)
        assert closed == ["client"]
        client.close()

    asyncio.run(main())
