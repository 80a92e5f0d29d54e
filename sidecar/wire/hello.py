"""What a TLS ClientHello says about the protocol its client will speak inside.

The front end peeks at the first bytes of a client's TLS connection before it decides
who terminates it. A client whose ALPN list (RFC 7301) offers no HTTP/1.x (gRPC,
an HTTP/2-only client, any other protocol) could not talk to the lean HTTP/1.1 server:
it is tunnelled to the origin untouched instead. Nothing such a client sends could be
cached anyway. A client that offers `http/1.0` only (`curl --http1.0`) is served: an
HTTP/1.1 server answers HTTP/1.0 requests. A client that sends no ALPN at all is taken
to speak HTTP/1.1, as every HTTP/1.1 client without ALPN (wget, Python's urllib) does.

The same hello also names the client, as far as any TLS server can tell clients apart:
its fingerprint (`client_hello_fingerprint`) is what a client that refused the pod CA's
certificate is remembered by (`sidecar.wire.rejections`).

Everything here is pure: bytes in, a list of protocols, a reason or a fingerprint out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence

# TLS record and handshake types (RFC 8446 §5.1, §4).
_HANDSHAKE_RECORD = 0x16
_CLIENT_HELLO = 0x01
_RECORD_HEADER = 5  # type, legacy version (2), length (2)
_MAX_RECORD = 2**14 + 256  # the largest TLSCiphertext fragment a peer may send (§5.2)
# Extension types: server_name (RFC 6066 §3), signature_algorithms (RFC 8446 §4.2.3),
# ALPN (RFC 7301 §3.1), supported_versions (RFC 8446 §4.2.1).
_SERVER_NAME = 0
_SIGNATURE_ALGORITHMS = 13
_ALPN_EXTENSION = 16
_SUPPORTED_VERSIONS = 43
# Extensions that one client sends on some connections and not on others: padding
# (RFC 7685, added or not by the hello's length), pre_shared_key and early_data (RFC 8446
# §4.2.11, §4.2.10: only when it resumes a session). Left out of the fingerprint, so
# that a client's retry, which may resume the session its tunnel gave it, matches.
_UNSTABLE_EXTENSIONS = frozenset((21, 41, 42))
# The fingerprint's spelling of a protocol version (JA4's).
_VERSION_NAMES = {0x0304: "13", 0x0303: "12", 0x0302: "11", 0x0301: "10", 0x0300: "s3"}
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


def client_hello_server_name(data: bytes) -> str | None:
    """The host name the ClientHello at the start of `data` names (its server_name
    extension, RFC 6066 §3), lower-cased; None when it names none. What a captured
    connection (no CONNECT) says of its origin. `Incomplete` and `ValueError` as
    `client_hello_alpn`."""
    _, _, extensions = _read_hello(_client_hello_body(data))
    for kind, extension in extensions:
        if kind == _SERVER_NAME:
            return _host_name(extension)
    return None


def tunnel_reason(alpn: Sequence[bytes] | None) -> str | None:
    """Why a TLS client offering `alpn` must be tunnelled untouched, or None when the
    HTTP/1.1 server may terminate it (no ALPN, or a list with `http/1.1` or `http/1.0`)."""
    if not alpn or not HTTP_1.isdisjoint(alpn):
        return None
    return ALPN_WITHOUT_HTTP_1


def client_hello_fingerprint(data: bytes) -> str:
    """A name for the client that sent the ClientHello at the start of `data`: the same
    for every connection of one client (one TLS library with one configuration), most
    often different between clients. Raises as `client_hello_alpn` does.

    JA4's layout (FoxIO's TLS client fingerprint), `t13d1516h2_8daaf6152771_e5627efa2ab1`:
    the highest version offered, whether it names a server, how many cipher suites and
    extensions, the first ALPN name's first and last characters; a hash of the cipher
    suites, sorted; a hash of the extension types, sorted, with the signature algorithms
    in order and the ALPN list. GREASE values (RFC 8701) are left out, and so are what
    changes between one client's connections: random values, session ids, key shares,
    and the extensions some of its hellos carry and others do not
    (`_UNSTABLE_EXTENSIONS`). So the fingerprint is JA4-like, not JA4 itself.
    """
    legacy_version, cipher_data, extensions = _read_hello(_client_hello_body(data))
    ciphers = [c for c in _numbers(cipher_data) if not _grease(c)]
    versions = [legacy_version]
    kinds: list[int] = []
    signatures: list[int] = []
    alpn: list[bytes] = []
    for kind, value in extensions:
        if _grease(kind) or kind in _UNSTABLE_EXTENSIONS:
            continue
        kinds.append(kind)
        if kind == _SUPPORTED_VERSIONS:
            versions = [v for v in _numbers(_Reader(value).vector(1)) if not _grease(v)]
        elif kind == _SIGNATURE_ALGORITHMS:
            signatures = [s for s in _numbers(_Reader(value).vector(2)) if not _grease(s)]
        elif kind == _ALPN_EXTENSION:
            alpn = _protocol_names(value)
    version = _VERSION_NAMES.get(max(versions, default=0), "00")
    server_name = "d" if _SERVER_NAME in kinds else "i"
    summary = (
        f"t{version}{server_name}{min(len(ciphers), 99):02d}{min(len(kinds), 99):02d}"
        f"{_alpn_ends(alpn[0]) if alpn else '00'}"
    )
    hashed_kinds = sorted(k for k in kinds if k not in (_SERVER_NAME, _ALPN_EXTENSION))
    extension_text = "_".join(
        (
            _hex_list(hashed_kinds),
            _hex_list(signatures),
            ",".join(name.hex() for name in alpn),
        )
    )
    return f"{summary}_{_hash(_hex_list(sorted(ciphers)))}_{_hash(extension_text)}"


def _grease(value: int) -> bool:
    """RFC 8701 §2: 0x0A0A, 0x1A1A, ... 0xFAFA, reserved so that servers meet values they
    do not know; a client picks new ones on every connection."""
    return value & 0x0F0F == 0x0A0A and value >> 8 == value & 0xFF


def _numbers(data: memoryview) -> list[int]:
    """A list of 16-bit numbers (cipher suites, versions, signature schemes)."""
    if len(data) % 2:
        raise ValueError("a list of 16-bit values of an odd length")
    return [int.from_bytes(data[i : i + 2]) for i in range(0, len(data), 2)]


def _hex_list(values: Sequence[int]) -> str:
    return ",".join(f"{value:04x}" for value in values)


def _hash(text: str) -> str:
    """JA4's: the first 12 hex digits of SHA-256, or zeros for nothing."""
    return hashlib.sha256(text.encode()).hexdigest()[:12] if text.strip("_") else "0" * 12


def _alpn_ends(name: bytes) -> str:
    """JA4's mark of the first ALPN name: its first and last characters, or the first
    and last hex digits of a name that does not start and end alphanumeric."""
    first, last = chr(name[0]), chr(name[-1])
    if first.isascii() and first.isalnum() and last.isascii() and last.isalnum():
        return first + last
    text = name.hex()
    return text[0] + text[-1]


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
    _, _, extensions = _read_hello(body)
    for kind, data in extensions:
        if kind == _ALPN_EXTENSION:
            return _protocol_names(data)
    return None


def _read_hello(body: memoryview) -> tuple[int, memoryview, Iterator[tuple[int, memoryview]]]:
    """RFC 8446 §4.1.2: legacy_version, random, legacy_session_id, cipher_suites,
    legacy_compression_methods, extensions (absent in an old TLS 1.0-1.2 hello).

    (legacy_version, the cipher suites' bytes, each extension as (type, data) in order,
    read as it is asked for).
    """
    hello = _Reader(body)
    legacy_version = hello.number(2)
    hello.take(32)
    hello.vector(1)
    ciphers = hello.vector(2)
    hello.vector(1)
    if hello.done:
        return legacy_version, ciphers, iter(())
    extensions = hello.vector(2)
    if not hello.done:
        raise ValueError("bytes after the ClientHello's extensions")
    return legacy_version, ciphers, _each_extension(extensions)


def _each_extension(extensions: memoryview) -> Iterator[tuple[int, memoryview]]:
    """Each extension's type and data. Read byte by byte rather than through `_Reader`:
    every intercepted connection's hello is read, and a hello has a dozen or more."""
    offset, end = 0, len(extensions)
    while offset < end:
        start = offset + 4
        if start > end:
            raise ValueError("a ClientHello field runs past its end")
        kind = extensions[offset] << 8 | extensions[offset + 1]
        offset = start + (extensions[offset + 2] << 8 | extensions[offset + 3])
        if offset > end:
            raise ValueError("a ClientHello field runs past its end")
        yield kind, extensions[start:offset]


def _host_name(data: memoryview) -> str | None:
    """RFC 6066 §3: a ServerNameList whose `host_name` entry (type 0) is the name, in
    ASCII, without a trailing dot (§3: "Literal IPv4 and IPv6 addresses are not
    permitted in HostName")."""
    extension = _Reader(data)
    names = _Reader(extension.vector(2))
    if not extension.done:
        raise ValueError("bytes after the server_name list")
    while not names.done:
        kind = names.number(1)
        name = bytes(names.vector(2))
        if kind != 0:
            continue
        try:
            text = name.decode("ascii")
        except UnicodeDecodeError:
            raise ValueError("a server name that is not ASCII") from None
        if not text or not all(c.isalnum() or c in "-._" for c in text):
            raise ValueError(f"an invalid server name {text[:80]!r}")
        return text.lower().rstrip(".")
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
