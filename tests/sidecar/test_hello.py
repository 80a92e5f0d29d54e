"""`sidecar.wire.hello`: ALPN and fingerprints from real ClientHellos (made by OpenSSL),
from hand-made ones, and from broken ones."""

from __future__ import annotations

import hashlib
import re
import ssl

import pytest
import trustme
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.wire.hello import (
    ALPN_WITHOUT_HTTP_1,
    Incomplete,
    client_hello_alpn,
    client_hello_fingerprint,
    client_hello_server_name,
    tunnel_reason,
)


def client_hello(
    alpn: list[str] | None,
    server_name: str | None = "datasets.test",
    context: ssl.SSLContext | None = None,
    session: ssl.SSLSession | None = None,
) -> bytes:
    """The first flight of a real TLS client (Python's ssl, OpenSSL) offering `alpn`."""
    context = context or ssl.create_default_context()
    if alpn is not None:
        context.set_alpn_protocols(alpn)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name, session=session)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def split_records(hello: bytes, size: int) -> bytes:
    """The same handshake message, re-framed into records of at most `size` bytes."""
    message = hello[5:]
    records = b""
    for start in range(0, len(message), size):
        part = message[start : start + size]
        records += hello[:3] + len(part).to_bytes(2) + part
    return records


@pytest.mark.parametrize(
    "alpn",
    [["h2"], ["grpc-exp", "h2"], ["h2", "http/1.1"], ["http/1.1"], ["x" * 255, "acme-tls/1"]],
)
def test_alpn_of_a_real_client_hello(alpn: list[str]) -> None:
    assert client_hello_alpn(client_hello(alpn)) == [name.encode() for name in alpn]


def test_no_alpn_extension_is_none() -> None:
    assert client_hello_alpn(client_hello(None)) is None


@pytest.mark.parametrize("name", ["datasets.test", "CAS-Bridge.XetHub.hf.co", "a.b-c_d.example"])
def test_the_server_name_of_a_real_client_hello(name: str) -> None:
    """What a captured connection, which sends no CONNECT, says of its origin."""
    assert client_hello_server_name(client_hello(["http/1.1"], name)) == name.lower()
    assert client_hello_server_name(split_records(client_hello(None, name), 64)) == name.lower()


def test_a_hello_without_a_server_name_names_none() -> None:
    # Python's ssl, like OpenSSL, sends no SNI for an IP address (RFC 6066 §3).
    assert client_hello_server_name(client_hello(["http/1.1"], "127.0.0.1")) is None
    with pytest.raises(Incomplete):
        client_hello_server_name(client_hello(None)[:40])


def test_a_hello_split_across_records() -> None:
    hello = client_hello(["h2"])
    assert client_hello_alpn(split_records(hello, 100)) == [b"h2"]


def test_bytes_after_the_hello_are_not_read() -> None:
    # What the client sends after its first flight waits in the socket behind it.
    assert client_hello_alpn(client_hello(["h2"]) + b"\x17\x03\x03") == [b"h2"]


@pytest.mark.parametrize("split", [None, 64])
def test_every_truncation_is_incomplete(split: int | None) -> None:
    hello = client_hello(["h2", "http/1.1"])
    if split is not None:
        hello = split_records(hello, split)
    for end in range(len(hello)):
        with pytest.raises(Incomplete):
            client_hello_alpn(hello[:end])


def test_decisions() -> None:
    assert tunnel_reason([b"h2"]) == ALPN_WITHOUT_HTTP_1
    assert tunnel_reason([b"grpc-exp", b"h2"]) == ALPN_WITHOUT_HTTP_1
    assert tunnel_reason([b"h2", b"http/1.1"]) is None
    assert tunnel_reason([b"http/1.1"]) is None
    assert tunnel_reason([b"http/1.0"]) is None  # curl --http1.0: HTTP/1.1 serves it
    assert tunnel_reason(None) is None
    assert tunnel_reason([]) is None  # mitmproxy's spelling of "no ALPN"


def with_alpn_extension(extension_data: bytes) -> bytes:
    """A hand-made ClientHello (one record) whose only extension is ALPN with this data."""
    extensions = (16).to_bytes(2) + len(extension_data).to_bytes(2) + extension_data
    body = (
        b"\x03\x03"
        + bytes(32)
        + b"\x00"  # no session id
        + b"\x00\x02\x13\x01"  # one cipher suite
        + b"\x01\x00"  # null compression
        + len(extensions).to_bytes(2)
        + extensions
    )
    message = b"\x01" + len(body).to_bytes(3) + body
    return b"\x16\x03\x01" + len(message).to_bytes(2) + message


def names(*protocols: bytes) -> bytes:
    listed = b"".join(len(p).to_bytes(1) + p for p in protocols)
    return len(listed).to_bytes(2) + listed


def test_the_hand_made_hello_is_read() -> None:
    assert client_hello_alpn(with_alpn_extension(names(b"h2"))) == [b"h2"]


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # plain HTTP in the tunnel
        b"\x16\x02\x00\x00\x04\x01\x00\x00\x00",  # not TLS 3.x
        b"\x16\x03\x01\x00\x00",  # an empty record
        b"\x16\x03\x01\x00\x04\x02\x00\x00\x00",  # a ServerHello, not a ClientHello
        b"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x03",  # a ClientHello of 1 byte
        with_alpn_extension(b""),  # ALPN without its list
        with_alpn_extension(names()),  # an empty list
        with_alpn_extension(names(b"")),  # an empty name
        with_alpn_extension(b"\x00\x05\x02h2"),  # a list longer than its extension
        with_alpn_extension(names(b"h2") + b"\x00"),  # bytes after the list
        with_alpn_extension(b"\x00\x03\x05h2"),  # a name longer than its list
    ],
)
def test_malformed_hellos_are_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        client_hello_alpn(data)


# -- the fingerprint ------------------------------------------------------------------------

FINGERPRINT = re.compile(r"t13d\d{4}[0-9a-z]{2}_[0-9a-f]{12}_[0-9a-f]{12}")


def test_one_client_has_one_fingerprint_and_others_another() -> None:
    first, second = client_hello(["http/1.1"]), client_hello(["http/1.1"])
    assert first != second  # random values, key shares
    assert client_hello_fingerprint(first) == client_hello_fingerprint(second)
    assert FINGERPRINT.fullmatch(client_hello_fingerprint(first))
    assert client_hello_fingerprint(first).startswith("t13d")
    assert client_hello_fingerprint(first)[8:10] == "h1"  # http/1.1: first and last chars
    others = {
        client_hello_fingerprint(client_hello(alpn)) for alpn in (None, ["h2"], ["h2", "http/1.1"])
    }
    assert len(others | {client_hello_fingerprint(first)}) == 4


def test_a_cipher_list_of_its_own_is_another_client() -> None:
    context = ssl.create_default_context()
    context.set_ciphers("ECDHE+AESGCM")
    assert client_hello_fingerprint(client_hello(None, context=context)) != (
        client_hello_fingerprint(client_hello(None))
    )


def test_a_hello_without_a_server_name() -> None:
    context = ssl.create_default_context()
    context.check_hostname = False
    fingerprint = client_hello_fingerprint(client_hello(None, None, context))
    assert fingerprint.startswith("t13i") and fingerprint[8:10] == "00"


def test_a_resumed_session_has_the_fingerprint_of_the_full_handshake(
    origin_ca: trustme.CA,
) -> None:
    # A retry through a tunnel may resume the origin's session: its hello then carries
    # pre_shared_key (and its length changes), which the fingerprint leaves out.
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    origin_ca.issue_cert("datasets.test").configure_cert(server_context)
    context = ssl.create_default_context()
    origin_ca.configure_trust(context)
    session = handshake(context, server_context)
    assert session is not None
    full, resumed = (
        client_hello(None, context=context),
        client_hello(None, context=context, session=session),
    )
    assert 41 in extension_types(resumed) and 41 not in extension_types(full)
    assert client_hello_fingerprint(resumed) == client_hello_fingerprint(full)


def extension_types(hello: bytes) -> list[int]:
    """The extension types of a ClientHello in one record, in order."""
    offset = 5 + 4 + 2 + 32
    offset += 1 + hello[offset]  # session id
    offset += 2 + int.from_bytes(hello[offset : offset + 2])  # cipher suites
    offset += 1 + hello[offset] + 2  # compression methods, the extensions' length
    types = []
    while offset < len(hello):
        types.append(int.from_bytes(hello[offset : offset + 2]))
        offset += 4 + int.from_bytes(hello[offset + 2 : offset + 4])
    return types


def handshake(context: ssl.SSLContext, server_context: ssl.SSLContext) -> ssl.SSLSession | None:
    """A whole handshake in memory, and a byte each way: the client's session (TLS 1.3
    sends its ticket after the handshake)."""
    client_in, client_out, server_in, server_out = (ssl.MemoryBIO() for _ in range(4))
    client = context.wrap_bio(client_in, client_out, server_hostname="datasets.test")
    server = server_context.wrap_bio(server_in, server_out, server_side=True)
    for _ in range(10):
        for side in (client, server):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
        server_in.write(client_out.read())
        client_in.write(server_out.read())
    server.write(b"x")
    client_in.write(server_out.read())
    assert client.read(1) == b"x"
    return client.session


def hand_made_hello(ciphers: list[int], extensions: list[tuple[int, bytes]]) -> bytes:
    """A ClientHello (one record) with these cipher suites and extensions, in order."""
    listed = b"".join(kind.to_bytes(2) + len(data).to_bytes(2) + data for kind, data in extensions)
    cipher_list = b"".join(c.to_bytes(2) for c in ciphers)
    body = (
        b"\x03\x03"
        + bytes(32)
        + b"\x00"  # no session id
        + len(cipher_list).to_bytes(2)
        + cipher_list
        + b"\x01\x00"  # null compression
        + len(listed).to_bytes(2)
        + listed
    )
    message = b"\x01" + len(body).to_bytes(3) + body
    return b"\x16\x03\x01" + len(message).to_bytes(2) + message


SUPPORTED_VERSIONS = (43, b"\x04\x03\x04\x03\x03")  # TLS 1.3, 1.2
SIGNATURES = (13, b"\x00\x04\x04\x03\x08\x04")
ALPN = (16, names(b"http/1.1"))


def test_grease_order_and_the_extensions_of_some_hellos_are_left_out() -> None:
    plain = hand_made_hello([0x1301, 0x1302], [SUPPORTED_VERSIONS, SIGNATURES, ALPN])
    grease = hand_made_hello(
        [0x3A3A, 0x1301, 0x1302],
        [(0x5A5A, b""), SUPPORTED_VERSIONS, SIGNATURES, ALPN, (0xFAFA, b"\x00")],
    )
    reordered = hand_made_hello([0x1302, 0x1301], [ALPN, SIGNATURES, SUPPORTED_VERSIONS])
    padded = hand_made_hello(
        [0x1301, 0x1302], [SUPPORTED_VERSIONS, SIGNATURES, ALPN, (21, bytes(100)), (41, b"")]
    )
    expected = client_hello_fingerprint(plain)
    assert expected.startswith("t13i0203h1_")
    for other in (grease, reordered, padded):
        assert client_hello_fingerprint(other) == expected
    # The signature algorithms count in their order, and every other extension counts.
    swapped = (13, b"\x00\x04\x08\x04\x04\x03")
    assert (
        client_hello_fingerprint(
            hand_made_hello([0x1301, 0x1302], [SUPPORTED_VERSIONS, swapped, ALPN])
        )
        != expected
    )
    assert (
        client_hello_fingerprint(
            hand_made_hello([0x1301, 0x1302], [SUPPORTED_VERSIONS, SIGNATURES, ALPN, (23, b"")])
        )
        != expected
    )


def test_an_old_hello_without_extensions() -> None:
    body = b"\x03\x01" + bytes(32) + b"\x00" + b"\x00\x02\x00\x2f" + b"\x01\x00"
    message = b"\x01" + len(body).to_bytes(3) + body
    hello = b"\x16\x03\x01" + len(message).to_bytes(2) + message
    assert client_hello_fingerprint(hello) == "t10i010000_" + sha12("002f") + "_" + "0" * 12


def sha12(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@pytest.mark.parametrize(
    "data",
    [
        hand_made_hello([0x1301], [(43, b"\x03\x03\x04")]),  # versions of an odd length
        hand_made_hello([0x1301], [(13, b"\x00\x08\x04\x03")]),  # a list past its extension
        hand_made_hello([0x1301], [(16, names())]),  # an empty ALPN list
    ],
)
def test_malformed_extensions_have_no_fingerprint(data: bytes) -> None:
    with pytest.raises(ValueError):
        client_hello_fingerprint(data)


# -- any bytes ------------------------------------------------------------------------------

# A real hello and a hand-made one with every extension the fingerprint reads.
HELLOS = [
    client_hello(["h2", "http/1.1"]),
    split_records(client_hello(["http/1.1"]), 100),
    hand_made_hello([0x1301, 0x0A0A], [(0, b""), (43, b"\x02\x03\x04"), (16, names(b"h2"))]),
]


@st.composite
def mutated_hellos(draw: st.DrawFn) -> bytes:
    """A hello with bytes replaced, inserted or removed, or cut short: a client's first
    bytes are anyone's."""
    data = bytearray(draw(st.sampled_from(HELLOS)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        change = draw(st.sampled_from(["replace", "insert", "remove", "cut"]))
        if change == "replace" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif change == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif change == "remove":
            del data[at : at + draw(st.integers(1, 4))]
        elif change == "cut":
            del data[at:]
    return bytes(data)


@settings(max_examples=3000, deadline=None)
@given(data=mutated_hellos())
def test_any_first_bytes_have_an_alpn_and_a_fingerprint_or_are_refused_as_such(
    data: bytes,
) -> None:
    # What the front end catches: anything else would be a worker's bug on a client's
    # bytes (a traceback, the client's connection dropped without an answer).
    for read in (client_hello_alpn, client_hello_fingerprint):
        try:
            read(data)
        except (Incomplete, ValueError):
            pass
