"""Real TLS handshakes for the certificate tests: a server and a client on a socket pair.

The client is Python's `ssl` with hostname checking and X.509 strict mode (RFC 5280
checks such as key identifiers and critical basic constraints), trusting only what a
test gives it: the same checks wget, curl and requests make, or stricter.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from mitmproxy.certs import CertStore

HANDSHAKE_TIMEOUT = 10  # seconds
GREETING = b"hello from the server"


def _client_context(*, cafile: Path | None = None, cadata: bytes | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(
        cafile=str(cafile) if cafile else None, cadata=cadata.decode() if cadata else None
    )
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    return context


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, hostname: str) -> bytes:
    """Connect `client` to `server` over a real socket pair; what the client reads."""
    server_end, client_end = socket.socketpair()
    server_end.settimeout(HANDSHAKE_TIMEOUT)
    client_end.settimeout(HANDSHAKE_TIMEOUT)

    def serve() -> None:
        try:
            with server.wrap_socket(server_end, server_side=True) as tls:
                tls.sendall(GREETING)
        except (ssl.SSLError, OSError):
            pass  # the client refused the certificate: its error is the result

    with ThreadPoolExecutor(1) as pool, server_end, client_end:
        served = pool.submit(serve)
        try:
            with client.wrap_socket(client_end, server_hostname=hostname) as tls:
                return tls.recv(len(GREETING))
        finally:
            client_end.close()
            served.result(timeout=HANDSHAKE_TIMEOUT)


@pytest.fixture
def client_context() -> Callable[..., ssl.SSLContext]:
    """`client_context(cafile=... or cadata=...)`: a verifying client trusting only that."""
    return _client_context


@pytest.fixture
def handshake() -> Callable[[ssl.SSLContext, ssl.SSLContext, str], bytes]:
    """`handshake(server, client, hostname)`: what the client reads after a real handshake.

    Raises the client's ssl error when it refuses the server's certificate.
    """
    return _handshake


@pytest.fixture
def mitmproxy_leaf(tmp_path: Path) -> Callable[[Path, str], ssl.SSLContext]:
    """A server context holding the leaf certificate mitmproxy makes for `host` from `ca_dir`.

    mitmproxy loads the CA directory exactly as the sidecar's proxy does
    (`CertStore.from_store(confdir, "mitmproxy", key_size)`) and signs the leaf itself.
    """

    def make(ca_dir: Path, host: str) -> ssl.SSLContext:
        store = CertStore.from_store(ca_dir, "mitmproxy", 2048)
        entry = store.get_cert(host, [x509.DNSName(host)])
        cert_file, key_file = tmp_path / f"{host}.crt", tmp_path / f"{host}.key"
        cert_file.write_bytes(entry.cert.to_pem())
        key_file.write_bytes(
            entry.privatekey.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        return context

    return make
