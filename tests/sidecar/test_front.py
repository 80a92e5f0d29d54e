"""The front end's answer to a CONNECT, on real sockets in this process.

What happens inside the tunnel until the TLS handshake is done (the client's first
byte, its ClientHello, the handshake) shares one deadline, so a client that keeps
just inside a limit for each step still cannot hold a connection for their sum.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
import trustme

from sidecar.core import native
from sidecar.proxy import front

# Shortened for the test; the sidecar's is 30 s.
DEADLINE = 1.0  # seconds


def test_first_byte_hello_and_handshake_share_one_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    leaf = trustme.CA().issue_cert("origin.test")
    config = native.TlsConfig(
        b"".join(pem.bytes() for pem in leaf.cert_chain_pems), leaf.private_key_pem.bytes()
    )
    monkeypatch.setattr(front, "TLS_HANDSHAKE_TIMEOUT", DEADLINE)
    head = b"CONNECT origin.test:443 HTTP/1.1\r\nHost: origin.test:443\r\n\r\n"
    connect = front.parse_connect(head)
    assert connect is not None
    # Only the TLS path is taken: the router, mitmproxy, the tunnels and the memory of
    # refusing clients are never asked.
    serving = front.Front(
        router=None,  # type: ignore[arg-type]
        intercept=["origin.test"],
        tls_config=lambda host: config,
        to_mitmproxy=lambda listener, sock: None,
        balance=front.Balance([0], 0),
        tunnels=None,  # type: ignore[arg-type]
        rejections=None,  # type: ignore[arg-type]
    )

    async def main() -> float:
        loop = asyncio.get_running_loop()
        with socket.create_server(("127.0.0.1", 0)) as listener:
            client = socket.create_connection(listener.getsockname())
            accepted, _ = listener.accept()
        accepted.setblocking(False)
        client.sendall(head)

        async def trickle() -> None:
            # The first byte just inside the deadline, then a ClientHello's record
            # header announcing 512 bytes, a byte at a time.
            await asyncio.sleep(0.8 * DEADLINE)
            for byte in b"\x16\x03\x01\x02\x00\x01\x00":
                client.send(bytes([byte]))
                await asyncio.sleep(0.2 * DEADLINE)

        trickling = loop.create_task(trickle())
        started = loop.time()
        try:
            with pytest.raises(TimeoutError):
                await serving._serve_tunnel(accepted, connect)
            return loop.time() - started
        finally:
            trickling.cancel()
            accepted.close()
            client.close()

    elapsed = asyncio.run(asyncio.wait_for(main(), 10 * DEADLINE))
    assert DEADLINE * 0.9 < elapsed < DEADLINE * 1.4
