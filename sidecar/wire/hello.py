"""What a TLS ClientHello says about the protocol its client will speak inside.

The front end peeks at the first bytes of a client's TLS connection before it decides
who terminates it. A client whose ALPN list (RFC 7301) offers no HTTP/1.x (gRPC,
an HTTP/2-only client, any other protocol) could not talk to the lean HTTP/1.1 server:
it is tunnelled to the origin untouched instead. Nothing such a client sends could be
cached anyway. A client that offers `http/1.0` only (`curl --http1.0`) is served: an
HTTP/1.1 server answers HTTP/1.0 requests. A client that sends no ALPN at all is taken
to speak HTTP/1.1, as every HTTP/1.1 client without ALPN (wget, Python's urllib) does.

Everything here is pure: bytes in, a list of protocols (or a reason) out.
"""

from __future__ import annotations

from collections.abc import Sequence

# TLS record and handshake types (RFC 8446 §5.1, §4).
_HANDSHAKE_RECORD = 0x16
_CLIENT_HELLO = 0x01
_RECORD_HEADER = 5  # type, legacy version (2), length (2)
_MAX_RECORD = 2**14 + 256  # the largest TLSCiphertext fragment a peer may send (§5.2)
# RFC 7301 §3.1: the ALPN extension.
_ALPN_EXTENSION = 16
# The ALPN names of HTTP/1.x (RFC 7301 §6), which the lean HTTP/1.1 server speaks.
HTTP_1 = frozenset((b"http/1.1", b"http/1.0"))

# Why a TLS client is tunnelled untouched although its host is intercepted.
ALPN_WITHOUT_HTTP_1 = "alpn-without-http/1.x"


class Incomplete(Exception):
    """The bytes end before the ClientHello does: peek again once more have arrived."""


def client_hello_alpn(data: bytes) -> list[bytes] | None:
    """The ALPN protocol names the ClientHello at the start of `data` offers, in order;
    None when it offers none (no ALPN extension).

    `data` is what the client sent first: one or more TLS handshake records (a
    ClientHello may be split across records). Raises `Incomplete` when more bytes are
    needed, and `ValueError` for anything that is not a well-formed ClientHello.
    """
    return _alpn(_client_hello_body(data))


def tunnel_reason(alpn: Sequence[bytes] | None) -> str | None:
    """Why a TLS client offering `alpn` must be tunnelled untouched, or None when the
    HTTP/1.1 server may terminate it (no ALPN, or a list with `http/1.1` or `http/1.0`)."""
    if not alpn or not HTTP_1.isdisjoint(alpn):
        return None
    return ALPN_WITHOUT_HTTP_1


def _client_hello_body(data: bytes) -> memoryview:
    """The ClientHello message's body, reassembled from its handshake records."""
    message = bytearray()
    offset = 0
    needed: int | None = None  # the whole handshake message's length, once known
    while needed is None or len(message) < needed:
        if len(data) < offset + _RECORD_HEADER:
            raise Incomplete()
        if data[offset] != _HANDSHAKE_RECORD:
            raise ValueError(f"not a TLS handshake record (type {data[offset]:#x})")
        if data[offset + 1] != 0x03:
            raise ValueError("not a TLS record (legacy version is not 3.x)")
        length = int.from_bytes(data[offset + 3 : offset + 5])
        if not 0 < length <= _MAX_RECORD:
            raise ValueError(f"a TLS record of {length} bytes")
        start = offset + _RECORD_HEADER
        if len(data) < start + length:
            raise Incomplete()
        message += data[start : start + length]
        offset = start + length
        if needed is None and len(message) >= 4:
            if message[0] != _CLIENT_HELLO:
                raise ValueError(f"the first handshake message is not a ClientHello ({message[0]})")
            needed = 4 + int.from_bytes(message[1:4])
    assert needed is not None
    if len(message) > needed:
        raise ValueError("bytes after the ClientHello in its records")
    return memoryview(message)[4:needed]


class _Reader:
    """Reads length-prefixed fields from a ClientHello body; short input is malformed
    (the body's length is known: nothing is incomplete any more)."""

    def __init__(self, data: memoryview) -> None:
        self._data = data
        self._offset = 0

    def take(self, size: int) -> memoryview:
        if self._offset + size > len(self._data):
            raise ValueError("a ClientHello field runs past its end")
        field = self._data[self._offset : self._offset + size]
        self._offset += size
        return field

    def number(self, size: int) -> int:
        return int.from_bytes(self.take(size))

    def vector(self, length_size: int) -> memoryview:
        return self.take(self.number(length_size))

    @property
    def done(self) -> bool:
        return self._offset == len(self._data)


def _alpn(body: memoryview) -> list[bytes] | None:
    """RFC 8446 §4.1.2: legacy_version, random, legacy_session_id, cipher_suites,
    legacy_compression_methods, extensions (absent in an old TLS 1.0-1.2 hello)."""
    hello = _Reader(body)
    hello.take(2 + 32)
    hello.vector(1)
    hello.vector(2)
    hello.vector(1)
    if hello.done:
        return None
    extensions = _Reader(hello.vector(2))
    if not hello.done:
        raise ValueError("bytes after the ClientHello's extensions")
    while not extensions.done:
        kind = extensions.number(2)
        data = extensions.vector(2)
        if kind == _ALPN_EXTENSION:
            return _protocol_names(data)
    return None


def _protocol_names(data: memoryview) -> list[bytes]:
    """RFC 7301 §3.1: a non-empty ProtocolNameList of non-empty names."""
    extension = _Reader(data)
    names = _Reader(extension.vector(2))
    if not extension.done:
        raise ValueError("bytes after the ALPN protocol list")
    found = []
    while not names.done:
        name = names.vector(1)
        if not name:
            raise ValueError("an empty ALPN protocol name")
        found.append(bytes(name))
    if not found:
        raise ValueError("an empty ALPN protocol list")
    return found
