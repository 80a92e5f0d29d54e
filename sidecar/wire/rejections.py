"""Clients that refuse the pod CA's certificate: remembered per host, then tunnelled.

The injector puts the pod CA into every trust bundle and variable that clients read, but
some clients bring their own roots: a Go or Rust binary with compiled-in roots, a JVM
app with its own SSLContext, a pinned certificate. Such a client ends every handshake
with the sidecar (an alert against the certificate, or a close straight after the
server's certificate flight, before its own Finished), retries, and fails again, on
every connection to an intercepted host.

So a client that refused the certificate is remembered, by its ClientHello's fingerprint
(`sidecar.wire.hello.client_hello_fingerprint`) and the host, for
`--remember-ca-rejections` seconds, and its later connections to that host are tunnelled
to the origin untouched (`sidecar.wire.tunnel`): its retry sees the origin's own
certificate and works, uncached. Other clients of that host are still intercepted. The
first refusal of each client and host is logged once, with what to add to the pod's
trust to have that client cached.

Clients that send the same ClientHello (one TLS library with one configuration: two
Python programs, one given a `cafile` of its own) cannot be told apart: while one of them
is remembered, the others are tunnelled to that host too, uncached but working. A client
killed in the middle of a handshake closes like a refusing one, and is remembered alike.
A retry that reaches a worker before the refusal has been read (sent at once, on a
machine too busy to run the worker that read it) is intercepted and refused again; the
next one is tunnelled.

A client's retry may land on another worker, so the memory lives in the shared memory
file (`sidecar.shared`): a table of slots, each the digest of a host and a fingerprint
and the time it is forgotten at (CLOCK_MONOTONIC, one clock for every process), changed
and searched under the file's lock. A header word holds the latest of those times, read
without the lock (an aligned 8-byte word, written under it): while nothing is remembered,
as in every pod whose clients trust the pod CA, a connection costs that one read.
"""

from __future__ import annotations

import hashlib
import logging
import re
import ssl
import struct
import time
from collections.abc import Sequence
from pathlib import Path

from sidecar.shared import CLIENTS_TABLE, Shared
from sidecar.wire.hello import Incomplete, client_hello_fingerprint

logger = logging.getLogger(__name__)

# Why a TLS client is tunnelled untouched although its host is intercepted.
CLIENT_REJECTED_CA = "client-rejected-ca"
# What a client did that counts as refusing the certificate, besides an alert.
CLOSED_IN_HANDSHAKE = "closed the connection after the certificate"

_HEADER = struct.Struct("<q24x")  # the latest expiry (ns), and room to spare
_SLOT = struct.Struct("<16sq8x")  # digest of host and fingerprint, expiry (ns)
# Clients remembered at once, at most: a pod runs a handful of TLS stacks, against a
# handful of hosts. When all are taken, the one to be forgotten first makes room.
CAPACITY = (CLIENTS_TABLE - _HEADER.size) // _SLOT.size

# RFC 8446 §6.2: the alerts a client sends about the server's certificate. OpenSSL's
# reasons name them `tlsv1 alert unknown ca`, `sslv3 alert bad certificate` (3.2: `ssl/tls
# alert bad certificate`); Python's SSLError.reason `TLSV1_ALERT_UNKNOWN_CA`.
_CERTIFICATE_ALERT = re.compile(
    r"alert[ _](bad[ _]certificate|unsupported[ _]certificate|certificate[ _]revoked"
    r"|certificate[ _]expired|certificate[ _]unknown|unknown[ _]ca)",
    re.IGNORECASE,
)
# What a server-side handshake raises when the client closed in the middle of it.
_CLOSED = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionResetError, BrokenPipeError)


def alert_refusal(error: str) -> str | None:
    """The certificate alert (`alert unknown ca`) that the TLS error `error` names, or
    None when it names none."""
    match = _CERTIFICATE_ALERT.search(error)
    if match is None:
        return None
    return "alert " + match.group(1).replace("_", " ").lower()


def handshake_refusal(error: BaseException) -> str | None:
    """How the client refused our certificate, when a server-side handshake that had
    its whole ClientHello (so our certificate went out) raised `error`; None for any
    other failure (a timeout, a protocol version or cipher nobody shares)."""
    if isinstance(error, _CLOSED):
        return CLOSED_IN_HANDSHAKE
    if isinstance(error, ssl.SSLError):
        return alert_refusal(error.reason or "")
    if isinstance(error, OSError):  # the core's (rustls) handshake names the alert it got
        return alert_refusal(str(error))
    return None


def choose_slot(expiries: Sequence[int], now: int) -> int:
    """The slot a new client takes: a free or expired one (expiry at or before `now`;
    free slots are 0), else the one that would be forgotten first."""
    return min(range(len(expiries)), key=lambda i: (expiries[i] > now, expiries[i]))


def trust_advice(trust_dir: Path | None) -> str:
    """What to add to a client's trust so that the sidecar may cache its downloads."""
    where = f" ({trust_dir} in the sidecar)" if trust_dir is not None else ""
    return (
        f"to have it cached, make it trust the pod CA, from the pod's trust directory{where}:"
        " ca.crt (the pod CA, PEM) or ca-bundle.crt (public roots and the pod CA), which"
        " OpenSSL and Go clients read from SSL_CERT_FILE; ca-bundle.p12 (PKCS#12) for a JVM"
        " (javax.net.ssl.trustStore, or its own SSLContext's TrustManagerFactory); a"
        " client with roots or a pinned certificate of its own (Go's x509.CertPool, Rust's"
        " webpki-roots) must add ca.crt to them"
    )


def _digest(host: str, fingerprint: str) -> bytes:
    return hashlib.blake2b(f"{host}\n{fingerprint}".encode(), digest_size=16).digest()


class Rejections:
    """The clients that refused the certificate, as every process of the sidecar sees them."""

    def __init__(self, shared: Shared, memory: float, trust_dir: Path | None) -> None:
        """`memory`: seconds a refusal is remembered; `trust_dir`: named in the log."""
        self._shared = shared
        self._memory = shared.memory
        self._header = shared.clients
        self._start = shared.clients + _HEADER.size
        self._end = self._start + CAPACITY * _SLOT.size
        self._seconds = memory
        self._remember_for = int(memory * 1e9)
        self._advice = trust_advice(trust_dir)

    def remembers(self, host: str, hello: bytes) -> bool:
        """Whether the client that sent `hello` (its ClientHello's records) refused the
        certificate for `host` not long ago: its connections go to a tunnel."""
        now = time.monotonic_ns()
        if _HEADER.unpack_from(self._memory, self._header)[0] <= now:
            return False  # nothing remembered
        try:
            digest = _digest(host, client_hello_fingerprint(hello))
        except (Incomplete, ValueError):
            return False
        with self._shared.lock:
            found = self._find(digest)
            return found is not None and _SLOT.unpack_from(self._memory, found)[1] > now

    def remember(self, host: str, hello: bytes, why: str) -> None:
        """The client that sent `hello` refused the certificate for `host` (`why`): its
        next connections to `host` are tunnelled. Logged once per client and host."""
        try:
            fingerprint = client_hello_fingerprint(hello)
        except (Incomplete, ValueError):
            return
        digest = _digest(host, fingerprint)
        now = time.monotonic_ns()
        expiry = now + self._remember_for
        memory = self._memory
        with self._shared.lock:
            found = self._find(digest)
            if found is not None and _SLOT.unpack_from(memory, found)[1] > now:
                return  # a concurrent connection of the same client told us already
            if found is None:
                expiries = [e for _, e in _SLOT.iter_unpack(memory[self._start : self._end])]
                found = self._start + choose_slot(expiries, now) * _SLOT.size
            _SLOT.pack_into(memory, found, digest, expiry)
            latest = _HEADER.unpack_from(memory, self._header)[0]
            _HEADER.pack_into(memory, self._header, max(latest, expiry))
        logger.warning(
            "a client refused the pod CA's certificate for %s (%s; TLS fingerprint %s): its"
            " connections to %s are tunnelled untouched, uncached, for %g s; %s",
            host,
            why,
            fingerprint,
            host,
            self._seconds,
            self._advice,
        )

    def _find(self, digest: bytes) -> int | None:
        """The offset of the slot holding `digest`, or None (the lock is held)."""
        start = self._start
        while (found := self._memory.find(digest, start, self._end)) >= 0:
            if (found - self._start) % _SLOT.size == 0:
                return found
            start = found + 1  # the digest's bytes across other fields: search on
        return None
