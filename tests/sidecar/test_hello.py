"""`sidecar.wire.hello`: ALPN from real ClientHellos (made by OpenSSL), and from broken ones."""

from __future__ import annotations

import ssl

import pytest

from sidecar.wire.hello import (
    ALPN_WITHOUT_HTTP_1,
    Incomplete,
    client_hello_alpn,
    tunnel_reason,
)


def client_hello(alpn: list[str] | None, server_name: str = "datasets.test") -> bytes:
    """The first flight of a real TLS client (Python's ssl, OpenSSL) offering `alpn`."""
    context = ssl.create_default_context()
    if alpn is not None:
        context.set_alpn_protocols(alpn)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
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
