"""The front end before the lean server owns a connection, on real sockets: the
deadlines (in this process, with the worker's `Front` and the core's `Arrival`), and
a client whose CONNECT and ClientHello come in pieces (through a real sidecar).

What happens inside the tunnel until the TLS handshake is done (the client's first
byte, its ClientHello, the handshake) shares one deadline, so a client that keeps
just inside a limit for each step still cannot hold a connection for their sum. A
client that never sends a request is closed too. What the lean server does not take
(neither a CONNECT nor a request with an absolute-form target) reaches mitmproxy
unread, however it was cut.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trustme
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bench.harness import OriginServer, Sidecar
from sidecar.core import native
from sidecar.proxy import front, listeners
from sidecar.shared import Shared
from sidecar.wire.rejections import Rejections
from tests.sidecar.test_hello import client_hello
from tests.sidecar.test_strict import E2E

# Shortened for the tests; the sidecar's are 30 s and 60 s.
DEADLINE = 1.0  # seconds
HEAD = b"CONNECT origin.test:443 HTTP/1.1\r\nHost: origin.test:443\r\n\r\n"
ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"


def leaf_config(host: str) -> native.TlsConfig:
    leaf = trustme.CA().issue_cert(host)
    return native.TlsConfig(
        b"".join(pem.bytes() for pem in leaf.cert_chain_pems), leaf.private_key_pem.bytes()
    )


def serve(
    client: Callable[[socket.socket], Awaitable[object]],
    handed_off: list[bytes] | None = None,
    tls_config: Callable[[str], native.TlsConfig] = leaf_config,
) -> list[int]:
    """Accept one connection with a worker's front end intercepting origin.test, and
    run `client` on the other end; `handed_off`: what reached mitmproxy, unread. The
    worker's count of open connections after it."""
    counts = [0]

    async def to_mitmproxy(listener: int, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        data = b""
        while not data.endswith(b"\r\n\r\n"):
            data += await loop.sock_recv(sock, 4096)
        assert handed_off is not None
        handed_off.append(data)
        sock.close()

    # Only the paths before a request are taken: the router and the tunnels are never
    # asked.
    serving = front.Front(
        router=None,  # type: ignore[arg-type]
        intercept=["origin.test"],
        tls_config=tls_config,
        to_mitmproxy=to_mitmproxy,
        balance=front.Balance(counts, 0),
        tunnels=None,  # type: ignore[arg-type]
        rejections=Rejections(Shared.create(1), 60, None),
        answers=None,
    )

    async def main() -> None:
        loop = asyncio.get_running_loop()
        with socket.create_server(("127.0.0.1", 0)) as listener:
            listener.setblocking(False)
            accepting = loop.create_task(serving.accept(0, listener, "forward"))
            near = socket.create_connection(listener.getsockname())
            near.setblocking(False)
            try:
                await client(near)
            finally:
                near.close()
                accepting.cancel()
                await serving.close()

    asyncio.run(asyncio.wait_for(main(), 10 * DEADLINE))
    return counts


async def closed_after(sock: socket.socket) -> float:
    """Seconds until the other end closes `sock` (reading what it sends). A close
    with bytes of ours unread there is a reset."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        while await loop.sock_recv(sock, 4096):
            pass
    except ConnectionResetError:
        pass
    return loop.time() - started


def test_first_byte_hello_and_handshake_share_one_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(front, "TLS_HANDSHAKE_TIMEOUT", DEADLINE)

    async def client(sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(sock, HEAD)
        assert await loop.sock_recv(sock, 4096) == ESTABLISHED

        async def trickle() -> None:
            # The first byte just inside the deadline, then a ClientHello's record
            # header announcing 512 bytes, a byte at a time.
            await asyncio.sleep(0.8 * DEADLINE)
            for byte in b"\x16\x03\x01\x02\x00\x01\x00":
                sock.send(bytes([byte]))
                await asyncio.sleep(0.2 * DEADLINE)

        trickling = loop.create_task(trickle())
        try:
            elapsed = await closed_after(sock)
        finally:
            trickling.cancel()
        assert DEADLINE * 0.9 < elapsed < DEADLINE * 1.4

    serve(client)


def test_a_client_that_sends_no_request_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(front, "FIRST_BYTES_TIMEOUT", DEADLINE)

    async def client(sock: socket.socket) -> None:
        sock.send(HEAD[:10])  # a request head that never ends
        assert DEADLINE * 0.9 < await closed_after(sock) < DEADLINE * 1.4

    serve(client)


@pytest.mark.parametrize(
    "sent",
    [HEAD[:10], HEAD + b"\x16\x03\x01\x02\x00\x01\x00"],
    ids=["a request head cut short", "a ClientHello cut short"],
)
def test_a_client_that_shuts_its_side_mid_way_is_closed_at_once(
    monkeypatch: pytest.MonkeyPatch, sent: bytes
) -> None:
    # A peek sees the same bytes until they are read, end of stream or not: only the
    # client's FIN says that the rest will never come.
    monkeypatch.setattr(front, "FIRST_BYTES_TIMEOUT", DEADLINE)
    monkeypatch.setattr(front, "TLS_HANDSHAKE_TIMEOUT", DEADLINE)

    async def client(sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        head, _, hello = sent.partition(b"\r\n\r\n")
        if hello:
            await loop.sock_sendall(sock, HEAD)
            assert await loop.sock_recv(sock, 4096) == ESTABLISHED
        await loop.sock_sendall(sock, hello or head)
        await asyncio.sleep(0.1 * DEADLINE)  # it waits for the rest
        sock.shutdown(socket.SHUT_WR)
        assert await closed_after(sock) < 0.3 * DEADLINE

    assert serve(client) == [0]


@pytest.mark.parametrize(
    "head",
    [
        b"GET /files/small.bin HTTP/1.1\r\nHost: origin.test\r\n\r\n",
        b"OPTIONS * HTTP/1.1\r\nHost: origin.test\r\n\r\n",
    ],
    ids=["origin-form-get", "asterisk-form"],
)
def test_what_is_not_ours_reaches_mitmproxy_unread_however_it_was_cut(head: bytes) -> None:
    handed_off: list[bytes] = []

    async def client(sock: socket.socket) -> None:
        for start in range(0, len(head), 9):
            sock.send(head[start : start + 9])
            await asyncio.sleep(0.01)
        while not handed_off:
            await asyncio.sleep(0.01)

    serve(client, handed_off)
    assert handed_off == [head]


def test_a_decision_that_fails_closes_its_connection_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def no_leaf(host: str) -> native.TlsConfig:
        raise ValueError(f"no certificate for {host}")

    async def client(sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(sock, HEAD)
        assert await loop.sock_recv(sock, 4096) == ESTABLISHED
        context = ssl.create_default_context()
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = context.wrap_bio(incoming, outgoing, server_hostname="origin.test")
        with pytest.raises(ssl.SSLWantReadError):
            tls.do_handshake()
        await loop.sock_sendall(sock, outgoing.read())
        assert await closed_after(sock) < DEADLINE

    assert serve(client, tls_config=no_leaf) == [0]
    assert "no certificate for origin.test" in caplog.text


def tls_in_pieces(sidecar: Sidecar, origin: OriginServer, pause: float) -> bytes:
    """GET small.bin through the sidecar with the CONNECT head and the ClientHello each
    sent in pieces, `pause` seconds apart; the response's bytes."""
    context = ssl.create_default_context(cafile=str(sidecar.bundle))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="origin.test")
    authority = f"origin.test:{origin.port}"
    head = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", sidecar.proxy_port), timeout=10) as sock:
        for piece in (head[:3], head[3:20], head[20:-2], head[-2:]):
            sock.sendall(piece)
            time.sleep(pause)
        assert sock.recv(4096) == ESTABLISHED
        with pytest.raises(ssl.SSLWantReadError):
            tls.do_handshake()
        hello = outgoing.read()
        for piece in (hello[:1], hello[1:9], hello[9:100], hello[100:]):
            sock.sendall(piece)
            time.sleep(pause)
        while True:
            incoming.write(sock.recv(65536))
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                sock.sendall(outgoing.read())
        request = f"GET /files/small.bin?pieces={pause} HTTP/1.1\r\nHost: {authority}\r\n"
        tls.write(f"{request}Connection: close\r\n\r\n".encode())
        # The client's Finished and its request in one write: the request is in the
        # server's TLS session before the lean server starts, not in the socket.
        sock.sendall(outgoing.read())
        response = b""
        while data := sock.recv(65536):
            incoming.write(data)
            try:
                while chunk := tls.read(65536):
                    response += chunk
            except ssl.SSLWantReadError:
                continue
            except ssl.SSLZeroReturnError:
                break
        return response


@pytest.mark.e2e
def test_a_connect_and_a_client_hello_in_pieces_are_served(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    expected = (dataset / "small.bin").read_bytes()
    for pause in (0.0, 0.05):
        response = tls_in_pieces(sidecar, origin, pause)
        head, _, body = response.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head
        assert body == expected


# What a client sends first, changed at random from a CONNECT head.
CONNECTS = [
    HEAD,
    b"CONNECT [::1]:8443 HTTP/1.0\r\n\r\n",
    b"CONNECT origin.test:0443 HTTP/1.1\r\n\r\n",
]


@settings(max_examples=2000, deadline=None)
# More digits than int() reads (it raised): zeros before 443, and nines.
@example(head=HEAD, at=20, inserted=b"0" * 5000, removed=0)
@example(head=HEAD, at=20, inserted=b"9" * 5000, removed=3)
@given(
    head=st.sampled_from(CONNECTS),
    at=st.integers(0, 64),
    inserted=st.binary(max_size=8) | st.sampled_from([b"0" * 5000, b"9" * 6, b"\xff", b" "]),
    removed=st.integers(0, 4),
)
def test_any_head_is_a_connect_to_a_port_or_not_a_connect(
    head: bytes, at: int, inserted: bytes, removed: int
) -> None:
    changed = head[:at] + inserted + head[at + removed :]
    connect = front.parse_connect(changed)
    if connect is not None:
        assert 0 < connect.tunnel.port < 65536 and connect.tunnel.host
        assert changed[: connect.head_length].endswith(b"\r\n\r\n")


@pytest.mark.e2e
@settings(E2E, max_examples=60)
@given(data=st.data())
def test_a_client_hello_changed_at_random_ends_its_connection_at_once_and_nothing_else(
    sidecar: Sidecar, origin: OriginServer, data: st.DataObject
) -> None:
    hello = bytearray(client_hello(None, "origin.test"))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(hello) - 1))
        if data.draw(st.booleans()):
            hello[at] = data.draw(st.integers(0, 255))
        else:
            del hello[at : at + data.draw(st.integers(1, 8))]
    authority = f"origin.test:{origin.port}"
    with socket.create_connection(("127.0.0.1", sidecar.proxy_port), timeout=5) as sock:
        sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        assert sock.recv(4096) == ESTABLISHED
        sock.sendall(bytes(hello))
        sock.shutdown(socket.SHUT_WR)
        started = time.monotonic()
        while sock.recv(65536):  # an alert, a tunnelled origin's answer: then the end
            pass
        assert time.monotonic() - started < 5
    log = sidecar.log()
    assert "Traceback" not in log and "unexpected" not in log, log[-3000:]


def test_a_busier_worker_waits_only_for_a_worker_that_is_accepting() -> None:
    """Kept-alive connections spread: a worker with more open connections lets a new
    one go to a less busy worker, but never to one that accepts nothing at the moment
    (letting a connection go itself, on any of its listeners, or not running), or no
    worker accepts: a new connection per file then waited out every worker's delay in
    turn."""
    shared = Shared.create(3)
    slots = shared.connections
    busy, idle, third = (front.Balance(slots, index) for index in range(3))
    # Not running yet: nobody waits for them.
    busy.started()
    busy.opened()
    assert busy.eligible()
    for balance in (idle, third):
        balance.started()
    busy.opened()
    idle.opened()
    third.opened()
    assert idle.eligible() and third.eligible()
    assert not busy.eligible()
    idle.paused()
    assert not busy.eligible()  # the third still accepts, with fewer open
    third.paused()
    assert busy.eligible()
    # Two listeners of one worker let connections go at once: it accepts again only
    # when both do.
    third.paused()
    third.resumed()
    assert busy.eligible()
    third.resumed()
    assert not busy.eligible()
    third.closed()
    shared.worker_gone(2)  # exited: its slot accepts nothing until it runs again
    idle.resumed()
    assert not busy.eligible()
    idle.paused()
    assert busy.eligible()


def test_a_listener_hands_a_connection_over_once_its_first_bytes_are_in() -> None:
    """The sidecar's listening sockets defer each accept until the client has sent
    something (TCP_DEFER_ACCEPT), so that the core's door finds a request there and not
    an empty socket; a client that sends nothing is accepted all the same, later. What
    is accepted has Nagle's delay off already."""
    with listeners.listen("127.0.0.1", 0) as sock:
        quiet = socket.create_connection(sock.getsockname())
        speaking = socket.create_connection(sock.getsockname())
        try:
            time.sleep(0.2)  # both handshakes are done
            with pytest.raises(BlockingIOError):
                sock.accept()
            speaking.sendall(b"GET")
            time.sleep(0.05)
            accepted, _ = sock.accept()
            with accepted:
                assert accepted.recv(3, socket.MSG_PEEK) == b"GET"
                # Nagle's delay is off from the listener on: no system call per client.
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            started = time.monotonic()
            while time.monotonic() - started < 5 * listeners.DEFER_ACCEPT:
                try:
                    sock.accept()[0].close()
                    break
                except BlockingIOError:
                    time.sleep(0.05)
            else:
                pytest.fail("a client that sent nothing was never accepted")
            assert time.monotonic() - started >= 0.5 * listeners.DEFER_ACCEPT
        finally:
            quiet.close()
            speaking.close()
