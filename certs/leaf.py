"""Leaf certificates for intercepted hosts, signed by the pod CA.

Like mitmproxy's own leaves, a leaf carries the CA's public key: the pod CA key is
already the one secret of the sidecar, a second key per host would add nothing but
key generation on the first connection to each host. The CA key is EC P-256, so each
handshake costs one cheap P-256 signature.

`leaf_pem()` gives a host's chain and key in PEM, in memory only (the key never
touches a file system); `ServerContexts` makes whatever serves TLS from them (the
sidecar's Rust core takes PEM), once per host.
"""

from __future__ import annotations

import collections
import datetime
import ipaddress
from collections.abc import Callable
from typing import Generic, TypeVar

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs.ca import PodCA

# Server contexts kept per process; a glob such as `*.s3.amazonaws.com` can name
# thousands of buckets, so the least recently used are dropped beyond this.
MAX_CONTEXTS = 1024
# Backdated for clients with a slow clock. A year ahead: a leaf lives only as long as the
# sidecar process that made it, and clients reject leaves valid for longer than 398 days.
LEAF_BACKDATE = datetime.timedelta(days=1)
LEAF_VALIDITY = datetime.timedelta(days=365)

Context = TypeVar("Context")


def _subject_alternative_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return x509.DNSName(host)


def leaf_certificate(ca: PodCA, host: str) -> x509.Certificate:
    """A server certificate for `host` (a DNS name or an IP literal), signed by `ca`."""
    now = datetime.datetime.now(datetime.UTC)
    # A common name is limited to 64 characters; clients match the SAN anyway.
    common_name = host if len(host) <= 64 else host[:64]
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.cert.subject)
        .public_key(ca.key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - LEAF_BACKDATE)
        .not_valid_after(now + LEAF_VALIDITY)
        .add_extension(x509.SubjectAlternativeName([_subject_alternative_name(host)]), False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), False
        )
        .sign(ca.key, hashes.SHA256())
    )


def leaf_pem(ca: PodCA, host: str) -> tuple[bytes, bytes]:
    """The chain and the key that serve `host`, in PEM. The chain is the leaf alone: the
    pod CA is a trust anchor every client in the pod already holds, which a server may
    leave out (RFC 8446 §4.4.2), and a client sent it anyway spends about a third more
    CPU on the handshake (OpenSSL through Python's `ssl`: 1.9 ms against 1.4)."""
    return leaf_certificate(ca, host).public_bytes(serialization.Encoding.PEM), key_pem(ca)


def key_pem(ca: PodCA) -> bytes:
    """The CA's key in PEM (PKCS #8): every leaf's key."""
    return ca.key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class ServerContexts(Generic[Context]):
    """`make(chain_pem, key_pem)` per host, made on first use and kept (most recent first)."""

    def __init__(self, ca: PodCA, make: Callable[[bytes, bytes], Context]) -> None:
        self._ca = ca
        self._make = make
        self._contexts: collections.OrderedDict[str, Context] = collections.OrderedDict()

    def get(self, host: str) -> Context:
        context = self._contexts.get(host)
        if context is None:
            context = self._contexts[host] = self._make(*leaf_pem(self._ca, host))
            if len(self._contexts) > MAX_CONTEXTS:
                self._contexts.popitem(last=False)
        else:
            self._contexts.move_to_end(host)
        return context
