"""TLS on the Rust core's streams (`sidecar.core.native.Stream`), both sides.

Every TLS session of the sidecar's own connections is rustls, in the core: the server
side for the lean front end's clients (a leaf of the pod CA), the client side towards
origins, parents and through proxies' tunnels (`sidecar.wire.client`). This module holds
what Python does about them: the client configuration made from the worker's trust file,
and the client side's handshake, a step at a time as the event loop says the socket is
ready (the server side's runs inside the core, `native.Arrival`).

The client side verifies the origin's certificate against the trust file and nothing
else (the system's roots are in it, with `--upstream-ca`), for the name the request was
for; a certificate that fails is `native.CertificateRejected`. A TCP end without TLS's
closure alert reaches the protocol as `native.Truncated`: a body that only the
connection's end delimits may have been cut (RFC 9112 §9.8).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from sidecar.core import native


def client_config(trust_file: Path, alpn: Sequence[bytes] = ()) -> native.ClientTls:
    """The client side of TLS: certificates verified against `trust_file` (PEM), and
    `alpn` offered. ValueError if the file holds no certificate rustls can read."""
    return native.ClientTls(trust_file.read_bytes(), list(alpn))


async def handshake(stream: native.Stream) -> None:
    """Complete the stream's TLS handshake (the client side, after `secure`); OSError
    when it fails. The caller bounds it in time."""
    fd = stream.fileno()
    while (step := stream.handshake()) != native.HANDSHAKE_DONE:
        await ready(fd, write=step == native.WANTS_WRITE)


async def ready(fd: int, write: bool) -> None:
    """Wait until the socket `fd` is readable (or writable, with `write`)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not future.done():
            future.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fd, wake)
    try:
        await future
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)
