"""Leaf certificates for intercepted hosts, signed by the pod CA.

Like mitmproxy's own leaves, a leaf carries the CA's public key: the pod CA key is
already the one secret of the sidecar, a second key per host would add nothing but
key generation on the first connection to each host. The CA key is EC P-256, so each
handshake costs one cheap P-256 signature.

`server_context()` gives the stdlib `ssl` context that serves one host. `ssl` loads
certificates only from files, so key and chain go through an anonymous memory file
that is closed once loaded: the key never touches a file system.
"""

from __future__ import annotations

import collections
import datetime
import ipaddress
import os
import ssl

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


def server_context(ca: PodCA, host: str) -> ssl.SSLContext:
    """A TLS server context presenting a leaf for `host`, HTTP/1.1 only."""
    key_pem = ca.key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    chain_pem = leaf_certificate(ca, host).public_bytes(serialization.Encoding.PEM) + ca.cert_pem
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # The fast path speaks HTTP/1.1; a client offering h2 falls back to it.
    context.set_alpn_protocols(["http/1.1"])
    memory_file = os.memfd_create("burstbuffer-leaf", os.MFD_CLOEXEC)
    try:
        os.write(memory_file, key_pem + chain_pem)
        path = f"/proc/self/fd/{memory_file}"
        context.load_cert_chain(certfile=path, keyfile=path)
    finally:
        os.close(memory_file)
    return context


class ServerContexts:
    """`server_context()` per host, made on first use and kept (most recent first)."""

    def __init__(self, ca: PodCA) -> None:
        self._ca = ca
        self._contexts: collections.OrderedDict[str, ssl.SSLContext] = collections.OrderedDict()

    def get(self, host: str) -> ssl.SSLContext:
        context = self._contexts.get(host)
        if context is None:
            context = self._contexts[host] = server_context(self._ca, host)
            if len(self._contexts) > MAX_CONTEXTS:
                self._contexts.popitem(last=False)
        else:
            self._contexts.move_to_end(host)
        return context
