"""The Rust core's stream (`sidecar.core.native.Stream`) through Python, on real sockets.

A stored body goes from its file to a TLS client whatever pace the client reads at, with
the protocol told to pause and resume; a file shorter than the range it was sent for
cuts the connection, so the client never takes a part for the whole; TLS 1.3's session
tickets go with the first response, TLS 1.2's last flight at once; a plain stream
half-closes; the digest stored bodies are checked against is BLAKE3's.
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path

import blake3
import pytest
import trustme

from sidecar.core import native
from tests.sidecar.conftest import Terminator, open_tunnel

HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n"
SIZE = 32 * 1024 * 1024 + 123  # bytes: more than loopback sockets hold (some MiB)


class Recorder(asyncio.Protocol):
    """A protocol that answers its first bytes with `answer(stream)` and notes the rest."""

    def __init__(self, answer: Callable[[native.Stream], None]) -> None:
        self.answer = answer
        self.events: list[str] = []
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        self.stream: native.Stream | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.stream = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.events.append("data")
        assert self.stream is not None
        if self.events.count("data") == 1:
            self.answer(self.stream)

    def eof_received(self) -> bool:
        self.events.append("eof")
        return False

    def pause_writing(self) -> None:
        self.events.append("pause")

    def resume_writing(self) -> None:
        self.events.append("resume")

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set_result(exc)


@pytest.fixture(scope="module")
def issuer() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def leaf(issuer: trustme.CA) -> trustme.LeafCert:
    return issuer.issue_cert("origin.test")


def _body(tmp_path: Path, size: int) -> tuple[bytes, Path]:
    content = os.urandom(size)
    path = tmp_path / "body"
    path.write_bytes(content)
    return content, path


def _serve(
    leaf: trustme.LeafCert | None, answer: Callable[[native.Stream], None]
) -> tuple[socket.socket, Callable[[], asyncio.Future[Recorder]]]:
    """A listening socket, and how to serve its first connection with a stream: plain,
    or inside an intercepted tunnel with `leaf`'s TLS."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)

    async def accept() -> Recorder:
        loop = asyncio.get_running_loop()
        client, _ = await loop.sock_accept(listener)
        client.setblocking(False)
        protocol = Recorder(answer)
        if leaf is None:
            native.Stream(client.detach(), loop).start(protocol)
        else:
            chain = b"".join(pem.bytes() for pem in leaf.cert_chain_pems)
            config = native.TlsConfig(chain, leaf.private_key_pem.bytes())
            await Terminator(client.detach(), config, protocol).stream
        return protocol

    return listener, lambda: asyncio.ensure_future(accept())


def _tls_client(
    port: int,
    issuer: trustme.CA,
    read: Callable[[ssl.SSLSocket], bytes],
    before: Callable[[ssl.SSLSocket], None] = lambda client: None,
) -> tuple[threading.Thread, list[bytes | BaseException]]:
    """A client thread that calls `before` once its handshake is done, then sends a
    request and reads with `read`; what it got, or its error."""
    context = ssl.create_default_context()
    issuer.configure_trust(context)
    context.set_alpn_protocols(["h2", "http/1.1"])
    got: list[bytes | BaseException] = []

    def run() -> None:
        try:
            with socket.create_connection(("127.0.0.1", port)) as raw:
                open_tunnel(raw, "origin.test:443")
                # A TCP end without TLS's closure alert is an error, as it is to curl.
                with context.wrap_socket(
                    raw, server_hostname="origin.test", suppress_ragged_eofs=False
                ) as client:
                    assert client.selected_alpn_protocol() == "http/1.1"
                    # OpenSSL lists AES-256 first; the core's order wins: the cheaper
                    # AES-128 (ten rounds, a key schedule on SHA-256).
                    assert client.cipher()[0] == "TLS_AES_128_GCM_SHA256", client.cipher()
                    before(client)
                    client.sendall(b"GET / HTTP/1.1\r\nHost: origin.test\r\n\r\n")
                    got.append(read(client))
        except BaseException as e:  # handed to the test
            got.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, got


def _read_slowly_then_all(client: ssl.SSLSocket) -> bytes:
    received = bytearray(client.recv(1024))
    threading.Event().wait(0.3)  # the server's buffers fill meanwhile
    while chunk := client.recv(1 << 20):
        received += chunk
    return bytes(received)


async def _exchange(
    leaf: trustme.LeafCert,
    issuer: trustme.CA,
    answer: Callable[[native.Stream], None],
    read: Callable[[ssl.SSLSocket], bytes] = _read_slowly_then_all,
    before: Callable[[ssl.SSLSocket], None] = lambda client: None,
) -> tuple[Recorder, bytes | BaseException]:
    listener, accept = _serve(leaf, answer)
    with listener:
        serving = accept()
        thread, got = _tls_client(listener.getsockname()[1], issuer, read, before)
        protocol = await asyncio.wait_for(serving, 10)
        await asyncio.wait_for(asyncio.shield(protocol.lost), 20)
        await asyncio.to_thread(thread.join, 10)
    return protocol, got[0]


def test_a_stored_body_reaches_a_slow_tls_client_whole_and_the_protocol_is_paused(
    tmp_path: Path, leaf: trustme.LeafCert, issuer: trustme.CA
) -> None:
    content, path = _body(tmp_path, SIZE)
    start, end = 77, SIZE

    def answer(stream: native.Stream) -> None:
        stream.send_file(HEAD % (end - start), os.open(path, os.O_RDONLY), start, end)
        stream.close()  # once everything went out

    protocol, received = asyncio.run(_exchange(leaf, issuer, answer))
    assert isinstance(received, bytes), received
    head = HEAD % (end - start)
    assert received[: len(head)] == head
    assert received[len(head) :] == content[start:end]
    assert protocol.events[:3] == ["data", "pause", "resume"], protocol.events
    assert protocol.lost.result() is None


def test_a_body_file_shorter_than_its_range_cuts_the_connection(
    tmp_path: Path, leaf: trustme.LeafCert, issuer: trustme.CA
) -> None:
    content, path = _body(tmp_path, SIZE)

    def answer(stream: native.Stream) -> None:
        stream.send_file(HEAD % (SIZE + 1000), os.open(path, os.O_RDONLY), 0, SIZE + 1000)
        stream.close()

    protocol, received = asyncio.run(_exchange(leaf, issuer, answer))
    # No closure alert: the client sees the end as an error, never as the body's end.
    assert isinstance(received, ssl.SSLEOFError), received
    assert isinstance(protocol.lost.result(), OSError)
    assert "shorter than recorded" in str(protocol.lost.result())


def _ok(stream: native.Stream) -> None:
    stream.write(HEAD % 2 + b"ok")
    stream.close()


def test_session_tickets_leave_with_the_first_response_not_on_their_own(
    leaf: trustme.LeafCert, issuer: trustme.CA
) -> None:
    """TLS 1.3's tickets are not something a client waits for: they go in the response's
    system call, and still reach the client."""
    arrived_alone: list[bool] = []
    ticketed: list[bool] = []

    def before(client: ssl.SSLSocket) -> None:
        # The client's Finished is sent: tickets sent at once would be here by now.
        arrived_alone.append(bool(select.select([client], [], [], 0.3)[0]))

    def read(client: ssl.SSLSocket) -> bytes:
        received = b""
        while chunk := client.recv(1024):
            received += chunk
        ticketed.append(client.session is not None and client.session.has_ticket)
        return received

    protocol, received = asyncio.run(_exchange(leaf, issuer, _ok, read, before))
    assert received == HEAD % 2 + b"ok"
    assert arrived_alone == [False]
    assert ticketed == [True]
    assert protocol.lost.result() is None


def test_a_tls_1_2_client_gets_the_handshakes_last_flight_at_once(
    leaf: trustme.LeafCert, issuer: trustme.CA
) -> None:
    """TLS 1.2's handshake ends with the server's flight, which the client waits for
    before it asks anything: only TLS 1.3's tickets wait for the response."""

    def talk(port: int) -> bytes:
        context = ssl.create_default_context()
        issuer.configure_trust(context)
        context.maximum_version = ssl.TLSVersion.TLSv1_2
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            open_tunnel(raw, "origin.test:443")
            with context.wrap_socket(raw, server_hostname="origin.test") as client:
                assert client.version() == "TLSv1.2"
                client.sendall(b"GET / HTTP/1.1\r\nHost: origin.test\r\n\r\n")
                received = b""
                while chunk := client.recv(1024):
                    received += chunk
                return received

    async def main() -> bytes:
        listener, accept = _serve(leaf, _ok)
        with listener:
            serving = accept()
            received = await asyncio.to_thread(talk, listener.getsockname()[1])
            await asyncio.wait_for(serving, 10)
        return received

    assert asyncio.run(main()) == HEAD % 2 + b"ok"


def test_a_plain_stream_half_closes_and_still_reads(tmp_path: Path) -> None:
    def answer(stream: native.Stream) -> None:
        if not stream.can_write_eof():
            return
        stream.write(b"bye")
        stream.write_eof()

    async def main() -> tuple[Recorder, bytes]:
        listener, accept = _serve(None, answer)
        with listener:
            serving = accept()
            client = socket.create_connection(listener.getsockname())
            protocol = await asyncio.wait_for(serving, 10)

            def talk() -> bytes:
                with client:
                    client.sendall(b"hello")
                    received = b""
                    while chunk := client.recv(1024):
                        received += chunk
                    client.sendall(b"more")  # the server's side only is closed
                    client.shutdown(socket.SHUT_WR)
                    client.recv(1)
                return received

            received = await asyncio.to_thread(talk)
            await asyncio.wait_for(asyncio.shield(protocol.lost), 10)
        return protocol, received

    protocol, received = asyncio.run(main())
    assert received == b"bye"
    assert protocol.events == ["data", "data", "eof"], protocol.events


def test_a_protocol_that_cannot_start_leaves_a_closed_connection_unwatched(
    leaf: trustme.LeafCert, issuer: trustme.CA
) -> None:
    class Failing(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            raise RuntimeError("cannot start")

    async def main() -> tuple[BaseException, bool, list[bytes | BaseException]]:
        loop = asyncio.get_running_loop()
        chain = b"".join(pem.bytes() for pem in leaf.cert_chain_pems)
        config = native.TlsConfig(chain, leaf.private_key_pem.bytes())
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        with listener:
            reading = _tls_client(listener.getsockname()[1], issuer, lambda c: c.recv(1024))
            client, _ = await loop.sock_accept(listener)
            client.setblocking(False)
            fd = client.detach()
            try:
                await asyncio.wait_for(Terminator(fd, config, Failing()).stream, 10)
            except RuntimeError as e:
                error: BaseException = e
            # The arrival handed its watch of the socket to the stream: the stream's
            # failed start must not leave it on (the loop would call it for ever).
            watched = loop.remove_reader(fd)
            thread, got = reading
            await asyncio.to_thread(thread.join, 10)
        return error, watched, got

    error, watched, got = asyncio.run(main())
    assert str(error) == "cannot start"
    assert not watched
    assert got, "the client was left waiting on a connection nobody serves"
    assert got[0] == b"" or isinstance(got[0], OSError), got


def test_the_digest_is_blake3_of_the_pieces_in_order_and_hashes_without_the_gil() -> None:
    """`native.Digest` against BLAKE3's own bindings, over pieces of every size; while it
    hashes a large one, another thread runs Python (with the GIL held through the call,
    it could not even come back from its sleeps)."""
    body = os.urandom(64 * 1024 * 1024 + 17)
    digest = native.Digest()
    offset = 0
    for size in (0, 1, 1023, 64 * 1024):
        digest.update(body[offset : offset + size])
        offset += size
    rest = body[offset:]
    woke = 0
    stop = threading.Event()

    def sleeper() -> None:
        nonlocal woke
        while not stop.is_set():
            time.sleep(0.0001)
            woke += 1

    thread = threading.Thread(target=sleeper)
    thread.start()
    try:
        time.sleep(0.01)
        before = woke
        digest.update(rest)
        woke_while_hashing = woke - before
    finally:
        stop.set()
        thread.join()
    assert digest.hexdigest() == blake3.blake3(body).hexdigest()
    assert native.Digest().hexdigest() == blake3.blake3(b"").hexdigest()
    assert woke_while_hashing > 5, woke_while_hashing
