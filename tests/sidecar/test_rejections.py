"""`sidecar.wire.rejections`: which failed handshakes are a client refusing the certificate
(real TLS handshakes on real sockets), and the memory of those clients, shared by real
processes, bounded in time and in size."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trustme
from test_hello import client_hello

from sidecar.core import native
from sidecar.runtime.supervisor import InheritedFd
from sidecar.shared import Shared
from sidecar.wire.rejections import (
    CAPACITY,
    CLOSED_IN_HANDSHAKE,
    Rejections,
    alert_refusal,
    choose_slot,
    handshake_refusal,
)
from tests.sidecar.conftest import Terminator, open_tunnel

HOST = "datasets.test"
_context = multiprocessing.get_context("forkserver")


@pytest.mark.parametrize(
    ("error", "refusal"),
    [
        ("TLSV1_ALERT_UNKNOWN_CA", "alert unknown ca"),  # Python's SSLError.reason
        ("SSLV3_ALERT_BAD_CERTIFICATE", "alert bad certificate"),
        ("SSLV3_ALERT_CERTIFICATE_UNKNOWN", "alert certificate unknown"),  # Java
        ("SSLV3_ALERT_CERTIFICATE_EXPIRED", "alert certificate expired"),
        ("SSLV3_ALERT_UNSUPPORTED_CERTIFICATE", "alert unsupported certificate"),
        ("SSLV3_ALERT_CERTIFICATE_REVOKED", "alert certificate revoked"),
        # mitmproxy's words around OpenSSL's (3.2 and later spell sslv3 ssl/tls).
        (
            "The client does not trust the proxy's certificate for x (ssl/tls alert bad"
            " certificate)",
            "alert bad certificate",
        ),
        (
            "The client may not trust the proxy's certificate for x (OpenSSL Error([('SSL"
            " routines', '', 'sslv3 alert certificate unknown')]))",
            "alert certificate unknown",
        ),
        ("TLSV1_ALERT_PROTOCOL_VERSION", None),
        ("SSLV3_ALERT_HANDSHAKE_FAILURE", None),
        ("NO_SHARED_CIPHER", None),
        ("TLSV1_ALERT_DECRYPT_ERROR", None),
    ],
)
def test_certificate_alerts_in_every_spelling(error: str, refusal: str | None) -> None:
    assert alert_refusal(error) == refusal


# -- real handshakes ----------------------------------------------------------------------


def server_handshake(
    ca: trustme.CA, client: Callable[[socket.socket], None]
) -> BaseException | None:
    """What the sidecar's handshake (the core's server side inside a CONNECT tunnel, a
    certificate from `ca`) raises against `client`, run in a thread on the other end of
    a real TCP connection."""
    leaf = ca.issue_cert(HOST)
    config = native.TlsConfig(
        b"".join(pem.bytes() for pem in leaf.cert_chain_pems), leaf.private_key_pem.bytes()
    )

    def through_a_tunnel(sock: socket.socket) -> None:
        open_tunnel(sock, f"{HOST}:443")
        client(sock)

    async def main() -> BaseException | None:
        with socket.create_server(("127.0.0.1", 0)) as listener:
            near = socket.create_connection(listener.getsockname())
            far, _ = listener.accept()
        far.setblocking(False)
        thread = threading.Thread(target=through_a_tunnel, args=(near,))
        thread.start()
        try:
            async with asyncio.timeout(5):
                stream = await Terminator(far.detach(), config, asyncio.Protocol()).stream
            stream.abort()
        except BaseException as e:
            return e
        finally:
            await asyncio.to_thread(thread.join, 10)
            near.close()
        return None

    return asyncio.run(main())


def trusting(ca: trustme.CA) -> Callable[[socket.socket], None]:
    """A client that trusts `ca` only, and gives up quietly when it may not."""

    def client(sock: socket.socket) -> None:
        context = ssl.create_default_context()
        ca.configure_trust(context)
        try:
            context.wrap_socket(sock, server_hostname=HOST).close()
        except ssl.SSLCertVerificationError:
            pass

    return client


def closing_after_the_certificate(sock: socket.socket) -> None:
    """A client that reads the server's flight and closes without a word (as some
    clients that pin a certificate do)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls_client = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=HOST)
    with pytest.raises(ssl.SSLWantReadError):
        tls_client.do_handshake()
    sock.sendall(outgoing.read())
    assert sock.recv(65536)[:1] == b"\x16"  # the ServerHello's record, and more
    sock.close()


def test_a_client_that_trusts_another_ca_sends_an_alert(origin_ca: trustme.CA) -> None:
    error = server_handshake(origin_ca, trusting(trustme.CA()))
    assert error is not None and handshake_refusal(error) == "alert unknown ca"


def test_a_client_that_closes_after_the_certificate(origin_ca: trustme.CA) -> None:
    error = server_handshake(origin_ca, closing_after_the_certificate)
    assert error is not None and handshake_refusal(error) == CLOSED_IN_HANDSHAKE


def test_a_trusting_client_and_other_failures_are_no_refusal(origin_ca: trustme.CA) -> None:
    assert server_handshake(origin_ca, trusting(origin_ca)) is None

    def old_client(sock: socket.socket) -> None:
        context = ssl.create_default_context()
        context.maximum_version = ssl.TLSVersion.TLSv1_2
        context.set_ciphers("AES128-SHA")  # CBC: no suite of ours
        with pytest.raises(ssl.SSLError):
            context.wrap_socket(sock, server_hostname=HOST)

    # No cipher suite in common: the client's offer is refused, not our certificate.
    error = server_handshake(origin_ca, old_client)
    assert isinstance(error, OSError) and "peer is incompatible" in str(error)
    assert handshake_refusal(error) is None
    assert handshake_refusal(TimeoutError()) is None


# -- the bounds, pure -------------------------------------------------------------------


def test_a_free_or_expired_slot_is_taken_first() -> None:
    now = 1000
    assert choose_slot([2000, 0, 3000], now) == 1  # free
    assert choose_slot([2000, 999, 3000], now) == 1  # expired
    assert choose_slot([2000, 1000, 3000], now) == 1  # expires now
    assert choose_slot([5000, 900, 800], now) == 2  # the older of two expired ones


def test_a_full_table_forgets_the_client_it_would_forget_first() -> None:
    assert choose_slot([3000, 2000, 4000], 1000) == 1
    assert choose_slot([1001] * 5 + [1002], 1000) == 0


# -- the memory, shared ---------------------------------------------------------------------


def _remember(inherited: InheritedFd, host: str, hello: bytes) -> None:
    Rejections(Shared(inherited.fd), 60, None).remember(host, hello, "alert unknown ca")


def test_a_client_remembered_by_one_process_is_known_to_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    shared = Shared.create(2)
    rejections = Rejections(shared, 60, Path("/var/lib/burstbuffer/trust"))
    hello, other_client = client_hello(None), client_hello(["h2", "http/1.1"])
    assert not rejections.remembers(HOST, hello)
    process = _context.Process(target=_remember, args=(InheritedFd(shared.fd), HOST, hello))
    process.start()
    process.join(30)
    assert process.exitcode == 0
    assert rejections.remembers(HOST, hello)
    assert rejections.remembers(HOST, client_hello(None))  # its next connection
    assert not rejections.remembers("other.test", hello)
    assert not rejections.remembers(HOST, other_client)
    # Told once per client and host, by the process that remembered it first.
    with caplog.at_level(logging.WARNING, "sidecar.wire.rejections"):
        rejections.remember(HOST, client_hello(None), CLOSED_IN_HANDSHAKE)
        assert caplog.records == []
        rejections.remember(HOST, other_client, CLOSED_IN_HANDSHAKE)
    [record] = caplog.records
    message = record.getMessage()
    assert HOST in message and "/var/lib/burstbuffer/trust" in message
    for trust in ("ca.crt", "ca-bundle.crt", "ca-bundle.p12", "SSL_CERT_FILE"):
        assert trust in message
    assert rejections.remembers(HOST, other_client)


def test_a_client_is_forgotten_after_its_time() -> None:
    rejections = Rejections(Shared.create(1), 0.2, None)
    hello = client_hello(None)
    remembered = time.monotonic()
    rejections.remember(HOST, hello, CLOSED_IN_HANDSHAKE)
    assert rejections.remembers(HOST, hello)
    while rejections.remembers(HOST, hello):
        assert time.monotonic() - remembered < 5
    assert time.monotonic() - remembered >= 0.2
    # Told again once it refuses again: the memory is renewed.
    rejections.remember(HOST, hello, CLOSED_IN_HANDSHAKE)
    assert rejections.remembers(HOST, hello)


def test_a_full_memory_forgets_its_oldest_client() -> None:
    rejections = Rejections(Shared.create(1), 60, None)
    hello = client_hello(None)
    hosts = [f"host{n}.test" for n in range(CAPACITY + 1)]
    logging.getLogger("sidecar.wire.rejections").disabled = True
    try:
        for host in hosts:
            rejections.remember(host, hello, CLOSED_IN_HANDSHAKE)
    finally:
        logging.getLogger("sidecar.wire.rejections").disabled = False
    assert [host for host in hosts if not rejections.remembers(host, hello)] == [hosts[0]]


@pytest.mark.parametrize("hello", [b"\x16\x03\x01\x00\x01\x01", b"\x16\x03\x01\x00\x01\x02"])
def test_an_unreadable_hello_is_never_remembered(hello: bytes) -> None:
    rejections = Rejections(Shared.create(1), 60, None)
    rejections.remember(HOST, client_hello(None), CLOSED_IN_HANDSHAKE)  # something is
    rejections.remember(HOST, hello, CLOSED_IN_HANDSHAKE)
    assert not rejections.remembers(HOST, hello)
