"""HTTP/1.1 as RFC 9112 and RFC 9110 have it, on both sides of the real sidecar.

One row per rule, with its section. Requests go through both ways a client asks the
forward proxy, both read by the core's parser for the lean server (`sidecar.wire.server`):
plain HTTP inside a CONNECT tunnel, and an absolute-form request to the proxy itself.
Responses come from a scripted raw origin on loopback, so that the bytes are exactly
the row's. Every client is a raw socket: real
clients would refuse to send most of these bytes.
"""

from __future__ import annotations

import concurrent.futures
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httptools
import pytest
import trustme
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.harness import Sidecar
from tests.sidecar.conftest import curl

pytestmark = pytest.mark.e2e

FRONTS = ("lean", "forwarded")
# How long a row waits for an answer or a close; the sidecar's own timeouts are longer.
BOUND = 5.0  # seconds
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
# Property tests through the real sidecar: a request takes what it takes, and the
# sidecar is a fixture the examples share.
E2E = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@dataclass
class Seen:
    """One connection as the origin saw it."""

    raw: bytearray = field(default_factory=bytearray)
    targets: list[bytes] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    complete: int = 0  # requests that arrived whole
    closed: threading.Event = field(default_factory=threading.Event)  # by the sidecar


class RawOrigin:
    """A plain-HTTP origin on loopback: answers a request for `/r/<name>` with the bytes
    of `responses[name]` (others with OK) once the request arrived whole, and closes the
    connection after it if `name` is in `closing`. With `pauses[name]`, the response
    goes in pieces: before each, the pause (seconds) of its pair, then its bytes up to
    the offset of the pair. With a TLS `context` it speaks HTTPS, and ends that close
    with TLS's closure alert if `name` is in `notifying`."""

    def __init__(self, context: ssl.SSLContext | None = None) -> None:
        self.responses: dict[str, bytes] = {}
        self.pauses: dict[str, list[tuple[float, int]]] = {}
        self.closing: set[str] = set()
        self.notifying: set[str] = set()
        self._context = context
        self.connections: list[Seen] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def seen(self, name: str) -> Seen:
        """The connection that carried the request for `name`."""
        wanted = f"/r/{name}".encode()
        for _ in range(int(BOUND / 0.05)):
            for seen in list(self.connections):
                if any(target.endswith(wanted) for target in seen.targets):
                    return seen
            time.sleep(0.05)
        raise AssertionError(f"the origin never saw a request for {name}")

    def count(self, name: str) -> int:
        """How many requests for `name` arrived."""
        wanted = f"/r/{name}".encode()
        return sum(t.endswith(wanted) for seen in self.connections for t in seen.targets)

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        if self._context is not None:
            try:
                connection = self._context.wrap_socket(connection, server_side=True)
            except (OSError, ssl.SSLError):
                connection.close()
                return
        seen = Seen()
        self.connections.append(seen)
        origin = self

        class Requests:
            def on_url(self, url: bytes) -> None:
                seen.targets.append(url)
                seen.bodies.append(b"")

            def on_body(self, body: bytes) -> None:
                seen.bodies[-1] += body

            def on_message_complete(self) -> None:
                seen.complete += 1
                name = seen.targets[-1].rpartition(b"/r/")[2].decode()
                response, sent = origin.responses.get(name, OK), 0
                for pause, offset in origin.pauses.get(name, []):
                    time.sleep(pause)
                    connection.sendall(response[sent:offset])
                    sent = max(sent, offset)
                connection.sendall(response[sent:])
                if isinstance(connection, ssl.SSLSocket) and name in origin.notifying:
                    connection.unwrap().shutdown(socket.SHUT_WR)  # close_notify, then FIN
                elif name in origin.closing:
                    connection.shutdown(socket.SHUT_WR)  # of TLS's too: no closure alert

        parser = httptools.HttpRequestParser(Requests())
        with connection:
            connection.settimeout(30)
            try:
                while data := connection.recv(65536):
                    seen.raw += data
                    parser.feed_data(data)
            except (OSError, ssl.SSLError, httptools.HttpParserError, httptools.HttpParserUpgrade):
                return
            seen.closed.set()


@dataclass
class Reply:
    statuses: list[int]
    bodies: list[bytes]
    closed: bool  # the sidecar closed the connection after its answers
    heads: list[dict[str, str]] = field(default_factory=list)  # fields, names in lower case
    complete: int = 0  # responses that arrived whole


class Client:
    """A raw client of the sidecar, through one front end."""

    def __init__(self, sidecar: Sidecar, front: str, origin_port: int) -> None:
        self.authority = f"origin.test:{origin_port}"
        self.front = front
        self._parser = httptools.HttpResponseParser(self)
        self._statuses: list[int] = []
        self._bodies: list[bytes] = []
        self._heads: list[dict[str, str]] = []
        self._fields: dict[str, str] = {}
        self._done = 0  # responses that arrived whole
        self._closed = False
        self.sock = socket.create_connection(("127.0.0.1", sidecar.proxy_port), timeout=BOUND)
        if front == "lean":
            self.sock.sendall(
                f"CONNECT {self.authority} HTTP/1.1\r\nHost: {self.authority}\r\n\r\n".encode()
            )
            established = b""
            while not established.endswith(b"\r\n\r\n"):
                established += self.sock.recv(1)
            assert established.startswith(b"HTTP/1.1 200"), established

    def target(self, name: str) -> str:
        path = f"/r/{name}"
        return path if self.front == "lean" else f"http://{self.authority}{path}"

    def send(self, raw: bytes) -> None:
        self.sock.sendall(raw)

    def replies(self, count: int = 1, linger: float = 3.0) -> Reply:
        """Read until `count` responses (1xx included) have come in all, or the sidecar
        closes, or `BOUND` passes; then, for up to `linger`, whether it closes."""
        deadline = time.monotonic() + BOUND
        while not self._closed and self._done < count and time.monotonic() < deadline:
            self._receive(deadline - time.monotonic())
        if not self._closed and linger:
            self._receive(linger)
        return Reply(
            list(self._statuses), list(self._bodies), self._closed, list(self._heads), self._done
        )

    def _receive(self, timeout: float) -> None:
        self.sock.settimeout(max(0.01, timeout))
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return
        except ConnectionResetError:
            data = b""
        if not data:
            self._closed = True
            return
        self._parser.feed_data(data)

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields[name.decode().lower()] = value.decode()

    def on_headers_complete(self) -> None:
        self._statuses.append(self._parser.get_status_code())
        self._bodies.append(b"")
        self._heads.append(self._fields)
        self._fields = {}

    def on_body(self, body: bytes) -> None:
        self._bodies[-1] += body

    def on_message_complete(self) -> None:
        self._done += 1

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def raw_origin() -> Iterator[RawOrigin]:
    origin = RawOrigin()
    yield origin
    origin.close()


@pytest.fixture(scope="module")
def strict_sidecar(
    needs_root: None, hosts_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Sidecar]:
    sidecar = Sidecar(tmp_path_factory.mktemp("strict"), hosts_file, ["--intercept", "origin.test"])
    sidecar.start()
    yield sidecar
    sidecar.stop()


@pytest.fixture(params=FRONTS)
def client(
    request: pytest.FixtureRequest, strict_sidecar: Sidecar, raw_origin: RawOrigin
) -> Iterator[Client]:
    client = Client(strict_sidecar, request.param, raw_origin.port)
    yield client
    client.close()


# -- requests ------------------------------------------------------------------------------

# (rule, request with {target} and {host}, status, closed after)
REQUESTS = [
    ("§3 request line without a version (HTTP/0.9)", "GET {target}\r\n\r\n", 400),
    (
        "§2.3 a major version other than 1",
        "GET {target} HTTP/2.0\r\nHost: {host}\r\n\r\n",
        505,
    ),
    ("§3.2 an HTTP/1.1 request without Host", "GET {target} HTTP/1.1\r\n\r\n", 400),
    (
        "§3.2 two Host lines",
        "GET {target} HTTP/1.1\r\nHost: {host}\r\nHost: {host}\r\n\r\n",
        400,
    ),
    (
        "§3.2.2 a Host that differs from the absolute-form target",
        "GET http://{host}{path} HTTP/1.1\r\nHost: elsewhere.test\r\n\r\n",
        400,
    ),
    (
        "§6.1 a transfer coding before chunked",
        "POST {target} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
        "5\r\nhello\r\n0\r\n\r\n",
        501,
    ),
    (
        "§2.2 a bare LF ending a chunk-size line",
        "POST {target} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n"
        "5\nhello\r\n0\r\n\r\n",
        400,
    ),
    (
        "§6.1 chunked twice in one field line",
        "POST {target} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked, chunked\r\n\r\n"
        "5\r\nhello\r\n0\r\n\r\n",
        400,
    ),
    (
        "§6.1 chunked twice in two field lines",
        "POST {target} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n"
        "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        400,
    ),
    (
        "§6.3 chunked not the last coding of a request",
        "POST {target} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"
        "5\r\nhello\r\n0\r\n\r\n",
        400,
    ),
    (
        "§6.3 a Transfer-Encoding without chunked in a request",
        "POST {target} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: gzip\r\n\r\nhello",
        400,
    ),
    (
        "§6.1 both Content-Length and Transfer-Encoding",
        "POST {target} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 5\r\n"
        "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        400,
    ),
    (
        "§6.3 two Content-Length lines",
        "POST {target} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 5\r\nContent-Length: 5\r\n"
        "\r\nhello",
        400,
    ),
    (
        "§7.1 a chunk size with a sign",
        "POST {target} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n"
        "+5\r\nhello\r\n0\r\n\r\n",
        400,
    ),
    (
        "§7.1.2 a trailer line that is no field line",
        "POST {target} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n"
        "5\r\nhello\r\n0\r\nno colon\r\n\r\n",
        400,
    ),
]
# Refused by the core's parser, which reads every request of either way in (mitmproxy's
# reading of an absolute-form request, which let them by, reads none now): a bare LF as a
# line's end, a bare CR inside a line, words split by other whitespace, an obs-fold, and
# chunk lines outside RFC 9112's grammar. See docs/reliability.md.
CORE_REQUESTS = [
    (
        "§2.2 lines ended by a bare LF",
        "GET {target} HTTP/1.1\nHost: {host}\n\n",
        400,
    ),
    (
        "§2.2 a bare CR in a field line",
        "GET {target} HTTP/1.1\r\nHost: {host}\r\nX: a\rb\r\n\r\n",
        400,
    ),
    (
        "§2.2 a bare CR in a chunk-size line",
        "POST {target} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n"
        "5;a\rb\r\nhello\r\n0\r\n\r\n",
        400,
    ),
    (
        "§3 two spaces in the request line",
        "GET  {target} HTTP/1.1\r\nHost: {host}\r\n\r\n",
        400,
    ),
    (
        "§5.2 an obsolete line folding",
        "GET {target} HTTP/1.1\r\nHost: {host}\r\nX: a\r\n b\r\n\r\n",
        400,
    ),
    (
        "§7.1 a chunk size over 64 bits",
        "POST {target} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n"
        "10000000000000005\r\nhello\r\n0\r\n\r\n",
        400,
    ),
    (
        "§7.1.1 whitespace in a chunk extension",
        "POST {target} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n"
        "5; a=b\r\nhello\r\n0\r\n\r\n",
        400,
    ),
]


@pytest.mark.parametrize(
    ("raw", "status"),
    [row[1:] for row in REQUESTS + CORE_REQUESTS],
    ids=[row[0] for row in REQUESTS + CORE_REQUESTS],
)
def test_a_request_the_rfc_refuses_is_refused_and_never_forwarded(
    client: Client, raw_origin: RawOrigin, raw: str, status: int
) -> None:
    name = f"refused-{time.monotonic_ns()}"
    path = f"/r/{name}"
    # A valid request pipelined after it, in the same write: nothing after a refused
    # message is read, so it never reaches the origin either.
    after = f"/r/after-{name}"
    request = raw.format(target=client.target(name), host=client.authority, path=path)
    request += f"GET {client.target(after[3:])} HTTP/1.1\r\nHost: {client.authority}\r\n\r\n"
    client.send(request.encode())
    reply = client.replies(count=2)
    assert reply.statuses == [status] and reply.closed, reply
    # A head refused never leaves; one whose body is refused on its way (a chunk line)
    # may have gone ahead of it, streamed, and then its upload ends unfinished: the
    # origin never takes a part for the whole.
    for seen in raw_origin.connections:
        assert not any(path.encode() in target for target in seen.targets[: seen.complete])
        assert after.encode() not in seen.raw


def test_chunked_followed_by_a_tab_frames_a_request_as_chunked(
    client: Client, raw_origin: RawOrigin
) -> None:
    # RFC 9112 §7.1 and RFC 9110 §5.6.3: the tab is optional whitespace after the field
    # value's last coding, `chunked` (llhttp refuses it unless told to be lenient). The
    # request after the body, pipelined, is read as one.
    name, after = f"tab-{time.monotonic_ns()}", f"after-tab-{time.monotonic_ns()}"
    client.send(
        f"POST {client.target(name)} HTTP/1.1\r\nHost: {client.authority}\r\n"
        "Transfer-Encoding: chunked\t\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        f"GET {client.target(after)} HTTP/1.1\r\nHost: {client.authority}\r\n\r\n".encode()
    )
    reply = client.replies(count=2, linger=0.5)
    assert reply.statuses == [200, 200] and not reply.closed, reply
    seen = raw_origin.seen(name)
    assert seen.bodies[[t.endswith(name.encode()) for t in seen.targets].index(True)] == b"hello"
    raw_origin.seen(after)


def test_the_body_of_a_get_is_not_forwarded_and_neither_is_its_length(
    client: Client, raw_origin: RawOrigin
) -> None:
    # RFC 9110 §9.3.1: content in a GET "has no generally defined semantics"; the front
    # ends drop it, and the origin must not be told to wait for it.
    name = f"get-body-{time.monotonic_ns()}"
    client.send(
        f"GET {client.target(name)} HTTP/1.1\r\nHost: {client.authority}\r\n"
        "Content-Length: 5\r\n\r\nhello".encode()
    )
    reply = client.replies()
    assert reply.statuses == [200] and reply.bodies == [b"hello"], reply
    assert b"content-length" not in raw_origin.seen(name).raw.lower()


def test_transfer_encoding_in_an_http_1_0_request_closes_the_connection_after_it(
    client: Client, raw_origin: RawOrigin
) -> None:
    # RFC 9112 §6.1: "... MUST treat the message as if the framing is faulty, even if a
    # Content-Length is present, and close the connection after processing the message."
    name = f"te-1.0-{time.monotonic_ns()}"
    client.send(
        f"POST {client.target(name)} HTTP/1.0\r\nHost: {client.authority}\r\n"
        "Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
        "5\r\nhello\r\n0\r\n\r\n".encode()
    )
    reply = client.replies()
    assert reply.closed, reply
    assert reply.statuses == [200] and reply.bodies == [b"hello"], reply
    assert raw_origin.seen(name).bodies == [b"hello"]


# More than mitmproxy holds before it streams a request body (its stream_large_bodies), so
# that behind both front ends the origin has the upload under way when the error comes.
FIRST_CHUNK = 1024 * 1024 + 1  # bytes


@pytest.mark.parametrize(
    "broken",
    [b"zz\r\nhello\r\n", b"5\rhello\r\n", b"5\r\nhello, and more\r\n"],
    ids=["§7.1 a chunk size that is not hex", "§7.1 a bare CR", "§7.1 data past the size"],
)
def test_a_chunked_body_with_a_framing_error_is_refused_at_once_and_the_upload_aborted(
    client: Client, raw_origin: RawOrigin, broken: bytes
) -> None:
    name = f"upload-{time.monotonic_ns()}"
    client.send(
        f"POST {client.target(name)} HTTP/1.1\r\nHost: {client.authority}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n".encode()
        + b"%x\r\n%s\r\n" % (FIRST_CHUNK, b"x" * FIRST_CHUNK)
    )
    seen = raw_origin.seen(name)  # the upload is under way
    client.send(broken)
    reply = client.replies()
    assert reply.statuses == [400] and reply.closed, reply
    # RFC 9112 §8: cut off, never completed as if whole.
    assert seen.closed.wait(BOUND)
    assert seen.complete == 0 and not seen.raw.endswith(b"0\r\n\r\n")


def test_inside_a_tunnel_the_tunnel_names_the_origin(
    strict_sidecar: Sidecar, raw_origin: RawOrigin
) -> None:
    client = Client(strict_sidecar, "lean", raw_origin.port)
    name = f"tunnel-{time.monotonic_ns()}"
    try:
        client.send(
            f"GET http://elsewhere.test/r/{name} HTTP/1.1\r\nHost: elsewhere.test\r\n\r\n".encode()
        )
        reply = client.replies()
    finally:
        client.close()
    assert reply.statuses == [200] and reply.bodies == [b"hello"], reply
    seen = raw_origin.seen(name)
    assert f"GET /r/{name} HTTP/1.1\r\nHost: {client.authority}\r\n".encode() in seen.raw


# -- responses -----------------------------------------------------------------------------

# (rule, response, status to the client, its body (None: the sidecar's own), whether the
# sidecar closes the origin's connection after it, whether it is stored)
RESPONSES = [
    (
        "RFC 9112 §7.1 a chunked response, relayed chunked",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        200,
        b"hello",
        False,
        True,
    ),
    (
        "RFC 9112 §7.1, RFC 9110 §5.6.3 chunked followed by a tab, chunked all the same",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\t\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        200,
        b"hello",
        False,
        True,
    ),
    (
        "RFC 9110 §15 a status above 599",
        b"HTTP/1.1 600 Beyond\r\nContent-Length: 5\r\n\r\nhello",
        502,
        None,
        True,
        False,
    ),
    (
        "RFC 9110 §15 a status below 100",
        b"HTTP/1.1 099 Below\r\nContent-Length: 5\r\n\r\nhello",
        502,
        None,
        True,
        False,
    ),
    (
        "RFC 9110 §15.2 a 1xx with a body",
        b"HTTP/1.1 103 Early Hints\r\nContent-Length: 43\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged" + OK,
        502,
        None,
        True,
        False,
    ),
    (
        "RFC 9112 §2.2 lines ended by a bare LF",
        b"HTTP/1.1 200 OK\nContent-Length: 5\n\nhello",
        502,
        None,
        True,
        False,
    ),
    (
        "RFC 9112 §2.2 a bare CR in a field line",
        b"HTTP/1.1 200 OK\r\nX: a\rb\r\nContent-Length: 5\r\n\r\nhello",
        502,
        None,
        True,
        False,
    ),
    (
        "RFC 9112 §6.1 chunked twice",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        502,
        None,
        True,
        False,
    ),
    (
        "RFC 9112 §6.1 an empty Transfer-Encoding",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding:\r\n\r\nhello",
        502,
        None,
        True,
        False,
    ),
    (
        # "... MUST treat the message as if the framing is faulty": decoded and relayed,
        # the connection closed after it, and never kept.
        "RFC 9112 §6.1 Transfer-Encoding in an HTTP/1.0 response",
        b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n",
        200,
        b"hello",
        True,
        False,
    ),
]


@pytest.mark.parametrize(
    ("response", "status", "body", "closes", "stored"),
    [row[1:] for row in RESPONSES],
    ids=[row[0] for row in RESPONSES],
)
def test_a_response_is_framed_by_the_rfc_and_an_invalid_one_is_a_502(
    client: Client,
    raw_origin: RawOrigin,
    strict_sidecar: Sidecar,
    response: bytes,
    status: int,
    body: bytes | None,
    closes: bool,
    stored: bool,
) -> None:
    name = f"response-{time.monotonic_ns()}"
    raw_origin.responses[name] = response
    entries = strict_sidecar.stats()["entries"]
    request = f"GET {client.target(name)} HTTP/1.1\r\nHost: {client.authority}\r\n\r\n"
    client.send(request.encode())
    # Read past the response: a byte after it (a second last chunk) is a parser error.
    reply = client.replies(linger=0.5)
    assert reply.statuses == [status] and not reply.closed, reply
    if body is not None:
        assert reply.bodies == [body], reply
    else:
        assert reply.bodies[0].startswith(b"burstbuffer: upstream request failed"), reply
    # After an invalid response nothing on that connection can be trusted to be in step.
    assert raw_origin.seen(name).closed.wait(BOUND if closes else 0.5) == closes
    assert strict_sidecar.stats()["entries"] == entries + stored
    # Asked again: a hit if it was stored, else the origin's to answer again.
    client.send(request.encode())
    again = client.replies(count=2, linger=0)
    assert again.statuses == [status, status] and again.bodies[1] == reply.bodies[0], again
    assert raw_origin.count(name) == (1 if stored else 2)


@pytest.mark.parametrize(
    "broken",
    [
        b"5;a\rb\r\nhello\r\n0\r\n\r\n",
        b"5\nhello\r\n0\r\n\r\n",
        b"5; a=b\r\nhello\r\n0\r\n\r\n",
        b"10000000000000005\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhello\r\n0\r\nno colon\r\n\r\n",
    ],
    ids=[
        "§2.2 a bare CR in a chunk-size line",
        "§2.2 a bare LF ending a chunk-size line",
        "§7.1.1 whitespace in a chunk extension",
        "§7.1 a chunk size over 64 bits",
        "§7.1.2 a trailer line that is no field line",
    ],
)
def test_a_chunked_response_with_a_framing_error_never_reaches_a_client_whole_nor_the_buffer(
    front: str, strict_sidecar: Sidecar, raw_origin: RawOrigin, broken: bytes
) -> None:
    name = f"broken-chunks-{time.monotonic_ns()}"
    raw_origin.responses[name] = CHUNKED + broken + OK  # and a forged response after it
    for attempt in (1, 2):
        reply = _get(strict_sidecar, front, raw_origin, name)
        # A 502 if the refusal came before the head was relayed; else the relayed 200 cut
        # off: never a whole 200, nor the forged response.
        assert reply.statuses == [502] or (reply.complete == 0 and reply.closed), reply
        assert b"hello" not in b"".join(reply.bodies[1:]), reply
        assert raw_origin.seen(name).closed.wait(BOUND)
        assert raw_origin.count(name) == attempt  # never stored


# -- malformed requests, generated -----------------------------------------------------------

HOSTS = [["Host: {host}"], [], ["Host: {host}", "Host: {host}"], ["Host: elsewhere.test"]]
FRAMINGS = [
    [],
    ["Content-Length: 5"],
    ["Content-Length: 1, 2"],
    ["Content-Length: -1"],
    ["Transfer-Encoding: chunked"],
    ["Transfer-Encoding: gzip, chunked"],
    ["Transfer-Encoding: chunked, gzip"],
    ["Transfer-Encoding: chunked\t"],
    ["Transfer-Encoding: chunked", "Content-Length: 5"],
]
LINES = [
    "Transfer-Encoding : chunked",
    " folded: line",
    "Connection: close",
    "Connection: keep-alive",
    "Expect: 100-continue",
    "Upgrade: websocket\r\nConnection: Upgrade",
    "X: a\rb",
    "X: \x00",
    "no colon",
    "X" * 300 + ": long",
]
BODIES = [
    b"",
    b"hello",
    b"5\r\nhello\r\n0\r\n\r\n",
    b"zz\r\nhello\r\n0\r\n\r\n",
    b"5\rhello\r\n0\r\n\r\n",
    b"5\r\nhello, more\r\n0\r\n\r\n",
    b"5;ext=1\r\nhello\r\n0\r\nTrailer: x\r\n\r\n",
    b"ffffffffffffffffff\r\n",
    b"\r\n\r\n",
]


@st.composite
def malformed_requests(draw: st.DrawFn) -> tuple[str, list[str], bytes, bytes]:
    """A request line, field lines, a body, and stray bytes, each perhaps wrong."""
    # No HEAD: its answer's framing depends on the request, which a response parser
    # cannot be told.
    method = draw(st.sampled_from(["GET", "POST", "PUT", "CONNECT", "G\x00T", ""]))
    version = draw(
        st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/0.9", "", "HTTP/1.1 x"])
    )
    line = f"{method} {{target}} {version}".rstrip() if version else f"{method} {{target}}"
    lines = draw(st.sampled_from(HOSTS)) + draw(st.sampled_from(FRAMINGS))
    lines += draw(st.lists(st.sampled_from(LINES), max_size=3))
    body = draw(st.sampled_from(BODIES))
    stray = draw(st.binary(max_size=24))
    return line, lines, body, stray


@settings(E2E, max_examples=100)
@given(request=malformed_requests(), crlf=st.sampled_from(["\r\n", "\n"]))
# A chunk size that is not hex, in the body of an upload already under way.
@example(
    request=(
        "POST {target} HTTP/1.1",
        ["Host: {host}", "Transfer-Encoding: chunked"],
        b"zz\r\nhello\r\n0\r\n\r\n",
        b"",
    ),
    crlf="\r\n",
)
def test_the_lean_server_answers_or_closes_any_request_and_forwards_nothing_after_a_refusal(
    strict_sidecar: Sidecar,
    raw_origin: RawOrigin,
    request: tuple[str, list[str], bytes, bytes],
    crlf: str,
) -> None:
    line, lines, body, stray = request
    client = Client(strict_sidecar, "lean", raw_origin.port)
    canary = f"canary-{time.monotonic_ns()}"
    try:
        head = crlf.join([line, *lines]) + crlf + crlf
        sent = head.format(target=client.target("fuzz"), host=client.authority).encode("latin-1")
        # A request that is whole and correct follows: it must never reach the origin
        # once the sidecar has refused what came before it.
        after = f"GET /r/{canary} HTTP/1.1\r\nHost: {client.authority}\r\n\r\n".encode()
        client.send(sent + body + stray + after)
        # An answer or a close comes at once, whatever was sent.
        first = client.replies(linger=0)
        assert first.statuses or first.closed, first
        # Then, when the client sends no more, the connection ends.
        client.sock.shutdown(socket.SHUT_WR)
        reply = client.replies(count=99)
    finally:
        client.close()
    assert reply.closed, reply
    refused = any(b.startswith(b"burstbuffer:") for b in reply.bodies)
    if refused:
        assert not any(canary.encode() in seen.raw for seen in raw_origin.connections), reply
    log = strict_sidecar.log()
    assert "Traceback" not in log and "unexpected error" not in log, log[-3000:]


# -- malformed responses, generated ----------------------------------------------------------

# Status lines an origin may send: (line, interim responses before the final one, whether
# its answer is the origin's exactly when the rest of the response is valid too).
STATUS_LINES = [
    ("HTTP/1.1 200 OK", 0, True),
    ("HTTP/1.1 404 Not Found", 0, True),
    ("HTTP/1.0 200 OK", 0, True),
    ("HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK", 1, True),
    ("HTTP/1.1 204 No Content", 0, False),
    ("HTTP/1.1 304 Not Modified", 0, False),
    ("HTTP/1.1 103 Early Hints\r\nContent-Length: 2\r\n\r\nhi\r\nHTTP/1.1 200 OK", 0, False),
    ("HTTP/1.1 2000 OK", 0, False),
    ("HTTP/1.1 20 OK", 0, False),
    ("HTTP/2.0 200 OK", 0, False),
    ("ICY 200 OK", 0, False),
    ("HTTP/1.1 200 OK\x00", 0, False),
]
# Field lines beside the framing: (line, whether it is valid).
RESPONSE_LINES = [
    ("Cache-Control: no-store", True),
    ("Cache-Control: max-age=60", True),
    ("Content-Encoding: gzip", True),
    ("Vary: *", True),
    ("Set-Cookie: a=b", True),
    ("Connection: close", True),
    ('ETag: "v1"', True),
    ("Date: not a date", True),
    ("X" * 300 + ": a long name", True),
    (" folded: line", False),
    ("X: a\rb", False),
    ("X: \x00", False),
    ("no colon", False),
    ("Content-Length : 5", False),
    ("Transfer-Encoding : chunked", False),
]
# How the body is framed: names, for `_framed`.
RESPONSE_FRAMINGS = [
    "length",
    "length, announced shorter",
    "length, announced longer",
    "length, listed twice",
    "two lengths",
    "length, negative",
    "chunked",
    "chunked, extensions and a trailer",
    "chunked, cut before its last chunk",
    "chunked, a size that is not hex",
    "chunked, and a length",
    "gzip, chunked",
    "chunked, gzip",
    "none",
]
# The framings whose body a client gets exactly (the others are the sidecar's to judge).
EXACT_FRAMINGS = frozenset(
    ("length", "length, announced shorter", "chunked", "chunked, extensions and a trailer", "none")
)


def _chunks(body: bytes) -> bytes:
    """`body` in chunks of up to 7 bytes, without the last chunk."""
    return b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 7]), body[i : i + 7]) for i in range(0, len(body), 7)
    )


def _framed(framing: str, body: bytes) -> tuple[list[str], bytes, bytes | None, bool]:
    """Field lines and the bytes after the head for `body` framed so; the body a client
    gets when the rest of the response is valid (None: the sidecar's to judge); whether
    the origin must close after it (a body that ends only so)."""
    n = len(body)
    if framing == "length":
        return [f"Content-Length: {n}"], body, body, False
    if framing == "length, announced shorter":
        # The rest is more than the origin announced: relayed as announced, not kept.
        return [f"Content-Length: {n - 1}"], body, body[:-1], False
    if framing == "length, announced longer":
        return [f"Content-Length: {n + 7}"], body, None, True
    if framing == "length, listed twice":
        return [f"Content-Length: {n}, {n}"], body, None, False
    if framing == "two lengths":
        return [f"Content-Length: {n}", f"Content-Length: {n + 1}"], body, None, True
    if framing == "length, negative":
        return [f"Content-Length: -{n}"], body, None, True
    if framing == "chunked":
        return ["Transfer-Encoding: chunked"], _chunks(body) + b"0\r\n\r\n", body, False
    if framing == "chunked, extensions and a trailer":
        chunked = _chunks(body).replace(b"\r\n", b";x=1\r\n", 1) + b"0\r\nX-Trailer: t\r\n\r\n"
        return ["Transfer-Encoding: chunked"], chunked, body, False
    if framing == "chunked, cut before its last chunk":
        return ["Transfer-Encoding: chunked"], _chunks(body), None, True
    if framing == "chunked, a size that is not hex":
        return ["Transfer-Encoding: chunked"], b"zz\r\n" + body + b"\r\n0\r\n\r\n", None, True
    if framing == "chunked, and a length":
        lines = ["Transfer-Encoding: chunked", f"Content-Length: {n + 3}"]
        return lines, _chunks(body) + b"0\r\n\r\n", None, False
    if framing == "gzip, chunked":
        return ["Transfer-Encoding: gzip, chunked"], _chunks(body) + b"0\r\n\r\n", None, False
    if framing == "chunked, gzip":
        return ["Transfer-Encoding: chunked, gzip"], body, None, True
    assert framing == "none"
    return [], body, body, True


@st.composite
def malformed_responses(draw: st.DrawFn) -> tuple[bytes, int, bytes | None, int, bool]:
    """A response with at most one part wrong (its status line, a field line, or its
    framing), perhaps followed by stray bytes: its bytes, the interim responses before
    its final one, the final status and body a client gets when nothing is wrong (None:
    the sidecar's to judge), and whether the origin closes after it."""
    wrong = draw(st.sampled_from(["nothing", "status line", "field line", "framing"]))
    statuses = [s for s in STATUS_LINES if s[2] != (wrong == "status line")]
    line, interims, _ = draw(st.sampled_from(statuses))
    extra = draw(st.lists(st.sampled_from([t for t, ok in RESPONSE_LINES if ok]), max_size=3))
    if wrong == "field line":
        invalid = draw(st.sampled_from([t for t, ok in RESPONSE_LINES if not ok]))
        extra.insert(draw(st.integers(0, len(extra))), invalid)
    framings = [f for f in RESPONSE_FRAMINGS if (f in EXACT_FRAMINGS) != (wrong == "framing")]
    framing = draw(st.sampled_from(framings))
    body = draw(st.binary(min_size=1, max_size=40))
    lines, after, expected, must_close = _framed(framing, body)
    stray = draw(st.binary(max_size=12))
    closes = must_close or draw(st.booleans())
    if framing == "none":
        expected = body + stray  # the body is whatever comes before the close
    head = "\r\n".join([line, *extra, *lines]) + "\r\n\r\n"
    status = int(line.rpartition("\r\n")[2].split()[1]) if wrong == "nothing" else 0
    if wrong != "nothing":
        expected = None
    return head.encode("latin-1") + after + stray, interims, expected, status, closes


@settings(E2E, max_examples=100)
@given(response=malformed_responses(), front=st.sampled_from(FRONTS))
# A pass whose body ends with the origin's connection: its client must get the last
# chunk once the origin has closed (a lost stream once let go of where it forwarded).
@example(
    response=(
        b"HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nTransfer-Encoding: chunked, gzip"
        b"\r\n\r\n\x00",
        0,
        None,
        0,
        True,
    ),
    front="lean",
)
def test_any_response_is_relayed_exactly_or_refused_at_once_and_only_a_whole_one_is_kept(
    strict_sidecar: Sidecar,
    raw_origin: RawOrigin,
    response: tuple[bytes, int, bytes | None, int, bool],
    front: str,
) -> None:
    raw, interims, expected, status, closes = response
    name = f"fuzz-response-{time.monotonic_ns()}"
    raw_origin.responses[name] = raw
    if closes:
        raw_origin.closing.add(name)
    first = _get(strict_sidecar, front, raw_origin, name, count=1 + interims)
    # An answer, or a close, at once: never a client left waiting on a broken origin.
    assert first.complete or first.closed, first
    if expected is not None:
        assert first.complete == 1 + interims, first
        assert first.statuses[-1] == status and first.bodies[-1] == expected, first
    again = _get(strict_sidecar, front, raw_origin, name, count=1 + interims)
    if raw_origin.count(name) == 1:
        # Answered from the buffer: only a whole 200 is kept, and it is what was relayed.
        assert first.complete and first.statuses[-1] == 200, first
        assert again.statuses[-1] == 200 and again.bodies[-1] == first.bodies[-1], again
    log = strict_sidecar.log()
    assert "Traceback" not in log and "unexpected error" not in log, log[-3000:]


# -- ranges, generated ----------------------------------------------------------------------

RANGE_SIZES = [1, 10, 1000, 70_000, 300_000]  # bytes: kept in memory while filled, all of them
ETAG = '"v1"'


@st.composite
def range_requests(draw: st.DrawFn) -> tuple[int, str, str | None, tuple[int, int] | None | bool]:
    """An object's size, a Range field, perhaps an If-Range, and what they must get:
    (first, last) for a 206, True for the whole object, False for a 416, None when the
    sidecar may choose (several ranges: coalesced into one, or the whole object)."""
    size = draw(st.sampled_from(RANGE_SIZES))
    position = st.sampled_from([0, 1, size - 1, size, size + 1, 10**25]) | st.integers(0, size + 2)
    form = draw(st.sampled_from(["first-last", "first-", "-suffix", "two", "invalid"]))
    expected: tuple[int, int] | None | bool
    if form == "first-last":
        first, last = draw(position), draw(position)
        spec = f"{first}-{last}"
        if last < first:
            expected = True  # invalid: ignored
        else:
            expected = (first, min(last, size - 1)) if first < size else False
    elif form == "first-":
        first = draw(position)
        spec = f"{first}-"
        expected = (first, size - 1) if first < size else False
    elif form == "-suffix":
        suffix = draw(position)
        spec = f"-{suffix}"
        expected = (max(size - suffix, 0), size - 1) if suffix > 0 else False
    elif form == "two":
        spec = f"{draw(position)}-{draw(position)}, -{draw(position)}"
        expected = None
    else:
        spec = draw(st.sampled_from(["", "-", "--1", "1-2-3", "a-b", "0x10-", "1 - 2"]))
        expected = True
    unit = draw(st.sampled_from(["bytes", "Bytes", "BYTES"]))
    if form == "invalid" or draw(st.booleans()):
        value = f"{unit}={spec}"
    else:
        value = f"{unit}= {spec} "  # whitespace around a range-spec (RFC 9110 §5.6.1)
    if_range = draw(st.sampled_from([None, ETAG, '"v0"', f"W/{ETAG}"]))
    if if_range is not None and if_range != ETAG:
        # Only the current representation's strong validator lets a range through.
        expected = True
    return size, value, if_range, expected


def _pattern(size: int, seed: int) -> bytes:
    """`size` bytes in which every short slice says where it was cut from."""
    return bytes((i + seed) % 251 for i in range(size))


@settings(E2E, max_examples=100)
@given(
    request=range_requests(),
    stored=st.booleans(),
    front=st.sampled_from(FRONTS),
    seed=st.integers(0, 250),
)
def test_any_range_gets_its_bytes_the_whole_object_or_a_416_from_the_buffer_and_from_a_fill(
    strict_sidecar: Sidecar,
    raw_origin: RawOrigin,
    request: tuple[int, str, str | None, tuple[int, int] | None | bool],
    stored: bool,
    front: str,
    seed: int,
) -> None:
    size, value, if_range, expected = request
    body = _pattern(size, seed)
    name = f"fuzz-range-{time.monotonic_ns()}"
    raw_origin.responses[name] = (
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nETag: %s\r\nCache-Control: max-age=3600\r\n"
        b"\r\n%s" % (size, ETAG.encode(), body)
    )
    if stored:
        assert _get(strict_sidecar, front, raw_origin, name).bodies == [body]
    client = Client(strict_sidecar, front, raw_origin.port)
    try:
        lines = [f"GET {client.target(name)} HTTP/1.1", f"Host: {client.authority}"]
        lines += [f"Range: {value}"] + ([f"If-Range: {if_range}"] if if_range else [])
        client.send(("\r\n".join(lines) + "\r\n\r\n").encode())
        reply = client.replies(linger=0)
    finally:
        client.close()
    assert reply.complete == 1, reply.statuses
    (status,), (got,), (head,) = reply.statuses, reply.bodies, reply.heads
    if status == 206:
        unit, _, span = head["content-range"].partition(" ")
        first, _, rest = span.partition("-")
        last, _, total = rest.partition("/")
        assert unit == "bytes" and total == str(size), head
        assert got == body[int(first) : int(last) + 1] and got, (head, len(got))
        answered: tuple[int, int] | bool = (int(first), int(last))
    elif status == 416:
        assert head["content-range"] == f"bytes */{size}", head
        answered = False
    else:
        assert status == 200 and got == body, (status, len(got))
        answered = True
    if expected is not None:
        assert answered == expected, (value, if_range, head)
    # One fetch of the object, whichever came first; then a whole hit.
    assert _get(strict_sidecar, front, raw_origin, name).bodies == [body]
    assert raw_origin.count(name) == 1


# -- conditional requests, generated -----------------------------------------------------------

LAST_MODIFIED = "Sun, 06 Nov 1994 08:49:37 GMT"
# Entity-tag lists, and whether they name the stored ETag by strong and by weak comparison
# (RFC 9110 §8.8.3.2).
TAG_LISTS = [
    ("*", True, True),
    (ETAG, True, True),
    ('"v0"', False, False),
    (f"W/{ETAG}", False, True),
    (f'"v0", {ETAG}', True, True),
    (f'"v0" , W/{ETAG}', False, True),
]
# HTTP-dates, and whether the stored Last-Modified is at or before them (None: not a
# valid HTTP-date, ignored).
DATES = [
    ("Sat, 05 Nov 1994 08:49:37 GMT", False),
    (LAST_MODIFIED, True),
    ("Sat, 01 Jan 2000 00:00:00 GMT", True),
    ("Sunday, 06-Nov-94 08:49:37 GMT", True),
    ("Sun Nov  6 08:49:37 1994", True),
    ("yesterday", None),
]


@st.composite
def conditional_fields(draw: st.DrawFn) -> tuple[list[str], int]:
    """Any of If-Match, If-None-Match, If-Modified-Since and If-Unmodified-Since, and the
    status RFC 9110 §13.2.2 gives a GET of the stored object with them."""
    if_match = draw(st.none() | st.sampled_from(TAG_LISTS))
    if_none_match = draw(st.none() | st.sampled_from(TAG_LISTS))
    modified_since = draw(st.none() | st.sampled_from(DATES))
    unmodified_since = draw(st.none() | st.sampled_from(DATES))
    lines = []
    for name, drawn in [
        ("If-Match", if_match),
        ("If-None-Match", if_none_match),
        ("If-Modified-Since", modified_since),
        ("If-Unmodified-Since", unmodified_since),
    ]:
        if drawn is not None:
            lines.append(f"{name}: {drawn[0]}")
    draw(st.randoms()).shuffle(lines)
    # Step 1, or step 2 without If-Match: false is a 412.
    if if_match is not None:
        if not if_match[1]:
            return lines, 412
    elif unmodified_since is not None and unmodified_since[1] is False:
        return lines, 412
    # Step 3, or step 4 without If-None-Match: false is a 304.
    if if_none_match is not None:
        return lines, 304 if if_none_match[2] else 200
    if modified_since is not None and modified_since[1]:
        return lines, 304
    return lines, 200


@settings(E2E, max_examples=100)
@given(request=conditional_fields(), stored=st.booleans(), front=st.sampled_from(FRONTS))
def test_any_conditional_get_of_a_stored_object_gets_the_status_the_rfc_gives_it(
    strict_sidecar: Sidecar,
    raw_origin: RawOrigin,
    request: tuple[list[str], int],
    stored: bool,
    front: str,
) -> None:
    lines, status = request
    name = f"fuzz-conditional-{time.monotonic_ns()}"
    body = name.encode()
    raw_origin.responses[name] = (
        f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nETag: {ETAG}\r\n"
        f"Last-Modified: {LAST_MODIFIED}\r\nCache-Control: max-age=3600\r\n\r\n"
    ).encode() + body
    if stored:
        assert _get(strict_sidecar, front, raw_origin, name).bodies == [body]
    client = Client(strict_sidecar, front, raw_origin.port)
    try:
        head = [f"GET {client.target(name)} HTTP/1.1", f"Host: {client.authority}", *lines]
        client.send(("\r\n".join(head) + "\r\n\r\n").encode())
        reply = client.replies(linger=0)
    finally:
        client.close()
    assert reply.complete == 1, reply.statuses
    answered = (reply.statuses[0], reply.bodies[0])
    wanted = (status, body if status == 200 else b"")
    if stored:
        assert answered == wanted, (lines, reply.heads)
        assert raw_origin.count(name) == 1
    else:
        # A miss with a precondition may ask the origin, whose whole 200 answers too.
        assert answered in (wanted, (200, body)), (lines, reply.heads)
    if reply.statuses[0] in (200, 304):
        assert reply.heads[0]["etag"] == ETAG, reply.heads


# -- responses in pieces, generated -----------------------------------------------------------


@st.composite
def paced_responses(draw: st.DrawFn) -> tuple[bytes, bytes, list[tuple[float, int]]]:
    """A valid, storable response (its length announced, or chunked) of 1 B to 3 MiB,
    its body, and where it is cut into pieces and how long the origin pauses before each
    (up to 30 ms): a head cut anywhere, a body that comes as a slow origin sends it."""
    size = draw(st.sampled_from([1, 1000, 70_000, 300_000, 3 << 20]))
    body = _pattern(size, draw(st.integers(0, 250)))
    head = b"HTTP/1.1 200 OK\r\nETag: %s\r\nCache-Control: max-age=3600\r\n" % ETAG.encode()
    if draw(st.booleans()):
        raw = head + b"Content-Length: %d\r\n\r\n%s" % (size, body)
    else:
        step = draw(st.sampled_from([1000, 65536, 1 << 20]))
        chunks = b"".join(
            b"%x\r\n%s\r\n" % (len(body[i : i + step]), body[i : i + step])
            for i in range(0, size, step)
        )
        raw = head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    offsets = draw(st.lists(st.integers(1, len(raw) - 1), max_size=8, unique=True))
    pauses = draw(
        st.lists(st.sampled_from([0.0, 0.005, 0.03]), min_size=len(offsets), max_size=len(offsets))
    )
    return raw, body, list(zip(pauses, sorted(offsets), strict=True))


@settings(E2E, max_examples=60)
@given(
    response=paced_responses(),
    readers=st.integers(1, 3),
    front=st.sampled_from(FRONTS),
)
def test_a_response_in_pieces_reaches_every_reader_whole_and_is_stored(
    strict_sidecar: Sidecar,
    raw_origin: RawOrigin,
    response: tuple[bytes, bytes, list[tuple[float, int]]],
    readers: int,
    front: str,
) -> None:
    raw, body, pauses = response
    name = f"paced-{time.monotonic_ns()}"
    raw_origin.responses[name] = raw
    raw_origin.pauses[name] = pauses
    # Readers that ask at once: the first starts the fill, the others follow it, in this
    # worker or another, or find it stored.
    with concurrent.futures.ThreadPoolExecutor(readers) as pool:
        replies = list(
            pool.map(lambda _: _get(strict_sidecar, front, raw_origin, name), range(readers))
        )
    for reply in replies:
        assert reply.statuses == [200] and reply.complete == 1, reply.statuses
        assert reply.bodies[0] == body, (len(reply.bodies[0]), len(body))
    fetched = raw_origin.count(name)
    again = _get(strict_sidecar, front, raw_origin, name)
    assert again.statuses == [200] and again.bodies == [body]
    assert raw_origin.count(name) == fetched, "not stored"
    # A body of unknown length is followed by no one: a reader that comes while it is
    # fetched passes (see docs/architecture.md).
    assert fetched == 1 or (fetched <= readers and b"Content-Length" not in raw), fetched


# -- pipelined requests, generated -----------------------------------------------------------

# What a request of a pipeline asks for (RFC 9112 §9.3.2: "A server MUST send its
# responses to those requests in the same order that the requests were received").
PIPELINED = ["stored", "new", "again", "range", "not modified", "no-store", "not found"]


@settings(E2E, max_examples=60)
@given(
    kinds=st.lists(st.sampled_from(PIPELINED), min_size=1, max_size=8),
    size=st.sampled_from([5, 70_000, 300_000]),
    front=st.sampled_from(FRONTS),
)
def test_pipelined_hits_misses_ranges_and_passes_are_answered_in_order_each_with_its_own(
    strict_sidecar: Sidecar, raw_origin: RawOrigin, kinds: list[str], size: int, front: str
) -> None:
    run = f"pipelined-{time.monotonic_ns()}"

    def serve(name: str, status: str, fields: str = "Cache-Control: max-age=3600\r\n") -> bytes:
        body = (name.encode() * (size // len(name) + 1))[:size]
        head = f"HTTP/1.1 {status}\r\nContent-Length: {size}\r\nETag: {ETAG}\r\n{fields}\r\n"
        raw_origin.responses[name] = head.encode() + body
        return body

    stored = serve(f"{run}-stored", "200 OK")
    assert _get(strict_sidecar, front, raw_origin, f"{run}-stored").bodies == [stored]
    client = Client(strict_sidecar, front, raw_origin.port)
    requests, expected = [], []
    fetches = {f"{run}-stored": 1}  # what the origin is asked for, how often
    latest: str | None = None  # the last new object, which "again" asks for once more
    for index, kind in enumerate(kinds):
        name, extra, answer = f"{run}-stored", "", (200, stored)
        if kind == "new" or (kind == "again" and latest is None):
            name = latest = f"{run}-new-{index}"
            answer = (200, serve(name, "200 OK"))
            fetches[name] = 1
        elif kind == "again":
            assert latest is not None
            name = latest
            answer = (200, raw_origin.responses[name][-size:])
        elif kind == "range":
            extra = f"Range: bytes=1-{size // 2}\r\n"
            answer = (206, stored[1 : size // 2 + 1])
        elif kind == "not modified":
            extra = f"If-None-Match: {ETAG}\r\n"
            answer = (304, b"")
        elif kind in ("no-store", "not found"):
            name = f"{run}-{kind.replace(' ', '-')}"
            status = "200 OK" if kind == "no-store" else "404 Not Found"
            answer = (int(status[:3]), serve(name, status, "Cache-Control: no-store\r\n"))
            fetches[name] = fetches.get(name, 0) + 1
        requests.append(
            f"GET {client.target(name)} HTTP/1.1\r\nHost: {client.authority}\r\n{extra}\r\n"
        )
        expected.append(answer)
    try:
        client.send("".join(requests).encode())
        reply = client.replies(len(requests), linger=0)
    finally:
        client.close()
    assert not reply.closed and reply.complete == len(requests), reply.statuses
    assert list(zip(reply.statuses, reply.bodies, strict=True)) == expected, (kinds, reply.statuses)
    assert {name: raw_origin.count(name) for name in fetches} == fetches


# -- bodies of unknown length, stored ---------------------------------------------------------

CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nCache-Control: max-age=3600\r\n\r\n"
# The cache-tests suite's `interim-not-cached`: a 103 before a fresh, chunked 200.
EARLY_HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </hint.css>; rel=preload\r\n\r\n"


def _get(sidecar: Sidecar, front: str, origin: RawOrigin, name: str, count: int = 1) -> Reply:
    """One GET for `name` on a new connection through `front`: its reply, read whole."""
    client = Client(sidecar, front, origin.port)
    try:
        client.send(
            f"GET {client.target(name)} HTTP/1.1\r\nHost: {client.authority}\r\n\r\n".encode()
        )
        return client.replies(count=count, linger=0)
    finally:
        client.close()


@pytest.mark.parametrize(
    ("response", "closes", "body"),
    [
        (EARLY_HINTS + CHUNKED + b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", False, b"hello world"),
        (
            b"HTTP/1.1 200 OK\r\nCache-Control: max-age=3600\r\n\r\nhello world",
            True,
            b"hello world",
        ),
        (CHUNKED + b"%x\r\n%s\r\n0\r\n\r\n" % (3 << 20, b"x" * (3 << 20)), False, b"x" * (3 << 20)),
    ],
    ids=[
        "RFC 9112 §7.1 a chunked 200 after a 103 (interim-not-cached)",
        "RFC 9112 §6.3 a body delimited by the origin's close",
        "a chunked body larger than the room a fill of unknown length starts with",
    ],
)
def test_a_body_of_unknown_length_is_stored_once_whole_and_served_with_its_length(
    front: str,
    strict_sidecar: Sidecar,
    raw_origin: RawOrigin,
    response: bytes,
    closes: bool,
    body: bytes,
) -> None:
    name = f"unsized-{time.monotonic_ns()}"
    raw_origin.responses[name] = response
    if closes:
        raw_origin.closing.add(name)
    first = _get(
        strict_sidecar, front, raw_origin, name, count=1 + response.startswith(b"HTTP/1.1 1")
    )
    assert first.statuses[-1] == 200 and first.bodies[-1] == body, first.statuses
    assert "content-length" not in first.heads[-1], first.heads
    second = _get(strict_sidecar, front, raw_origin, name)
    assert second.statuses == [200] and second.bodies == [body], second.statuses
    assert second.heads[0]["content-length"] == str(len(body))
    assert raw_origin.count(name) == 1


@pytest.mark.parametrize(
    ("response", "cut"),
    [
        (CHUNKED + b"5\r\nhello\r\n", True),
        (CHUNKED + b"5\r\nhello\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n", False),
    ],
    ids=["RFC 9112 §8 a chunked body cut before its last chunk", "bytes after the last chunk"],
)
def test_a_body_of_unknown_length_that_is_not_whole_is_never_stored(
    front: str, strict_sidecar: Sidecar, raw_origin: RawOrigin, response: bytes, cut: bool
) -> None:
    name = f"unsized-cut-{time.monotonic_ns()}"
    raw_origin.responses[name] = response
    raw_origin.closing.add(name)
    for attempt in (1, 2):
        reply = _get(strict_sidecar, front, raw_origin, name)
        assert reply.statuses == [200] and reply.bodies == [b"hello"], reply
        # Cut short, the client's response is too: never a whole 200.
        assert reply.complete == (not cut) and reply.closed == cut, reply
        assert raw_origin.count(name) == attempt


@pytest.mark.parametrize("stored", [True, False], ids=["a miss, stored", "a pass (no-store)"])
def test_a_body_of_unknown_length_reaches_an_http_1_0_client_unchunked_ended_by_the_close(
    client: Client, raw_origin: RawOrigin, stored: bool
) -> None:
    # RFC 9112 §7.1: chunked is HTTP/1.1's; a server "MUST NOT send a response
    # containing Transfer-Encoding unless the corresponding request indicates HTTP/1.1".
    # §6.3: without it or a Content-Length, the body ends with the connection.
    name = f"unsized-1.0-{time.monotonic_ns()}"
    directive = b"max-age=3600" if stored else b"no-store"
    raw_origin.responses[name] = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nCache-Control: %s\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n" % directive
    )
    client.send(
        f"GET {client.target(name)} HTTP/1.0\r\nHost: {client.authority}\r\n"
        "Connection: keep-alive\r\n\r\n".encode()
    )
    reply = client.replies(linger=0)
    assert reply.closed and reply.statuses == [200], reply
    assert "transfer-encoding" not in reply.heads[0] and reply.bodies == [b"hello world"], reply


@pytest.fixture(scope="module")
def small_sidecar(
    needs_root: None, hosts_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Sidecar]:
    sidecar = Sidecar(
        tmp_path_factory.mktemp("small"),
        hosts_file,
        ["--intercept", "origin.test", "--buffer-size", "2MiB", "--access-log"],
    )
    sidecar.start()
    yield sidecar
    sidecar.stop()


def test_a_body_of_unknown_length_that_outgrows_the_buffer_is_relayed_whole_and_not_stored(
    front: str, small_sidecar: Sidecar, raw_origin: RawOrigin
) -> None:
    name = f"unsized-large-{time.monotonic_ns()}"
    body = bytes(range(256)) * (12 << 10)  # 3 MiB
    raw_origin.responses[name] = (
        CHUNKED
        + b"".join(
            b"%x\r\n%s\r\n" % (1 << 16, body[i : i + (1 << 16)])
            for i in range(0, len(body), 1 << 16)
        )
        + b"0\r\n\r\n"
    )
    for attempt in (1, 2):
        reply = _get(small_sidecar, front, raw_origin, name)
        assert reply.statuses == [200] and reply.complete == 1, reply.statuses
        assert reply.bodies[0] == body
        assert raw_origin.count(name) == attempt
    assert "outgrew the room" in small_sidecar.log()
    # Its room is all given back: a small one is stored after it.
    small = f"unsized-small-{time.monotonic_ns()}"
    raw_origin.responses[small] = CHUNKED + b"5\r\nhello\r\n0\r\n\r\n"
    _get(small_sidecar, front, raw_origin, small)
    assert _get(small_sidecar, front, raw_origin, small).bodies == [b"hello"]
    assert raw_origin.count(small) == 1


@pytest.fixture(params=FRONTS)
def front(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def tls_origin(origin_ca: trustme.CA) -> Iterator[RawOrigin]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    origin_ca.issue_cert("origin.test").configure_cert(context)
    origin = RawOrigin(context)
    yield origin
    origin.close()


@pytest.fixture(scope="module")
def tls_sidecar(
    needs_root: None,
    hosts_file: Path,
    origin_ca: trustme.CA,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Sidecar]:
    base = tmp_path_factory.mktemp("tls")
    origin_ca.cert_pem.write_to_path(str(base / "origin-ca.pem"))
    argv = ["--intercept", "origin.test", "--upstream-ca", str(base / "origin-ca.pem")]
    sidecar = Sidecar(base, hosts_file, argv)
    sidecar.start()
    yield sidecar
    sidecar.stop()


@pytest.mark.parametrize("alert", [True, False], ids=["with the closure alert", "without it"])
def test_over_tls_a_body_ended_by_the_close_is_stored_only_after_the_closure_alert(
    tls_sidecar: Sidecar, tls_origin: RawOrigin, alert: bool
) -> None:
    # RFC 9112 §9.8: "A response that has neither chunked transfer coding nor
    # Content-Length is complete only if a valid closure alert has been received."
    name = f"tls-close-{time.monotonic_ns()}"
    tls_origin.responses[name] = b"HTTP/1.1 200 OK\r\nCache-Control: max-age=3600\r\n\r\nhello"
    (tls_origin.notifying if alert else tls_origin.closing).add(name)
    url = f"https://origin.test:{tls_origin.port}/r/{name}"
    for _ in range(2):
        download = curl(tls_sidecar, url)
        assert download.returncode == 0 and download.body == b"hello", download.stderr
    assert tls_origin.count(name) == (1 if alert else 2)
    # Without --access-log, no line per object: not its misses, nor why it is not stored.
    assert name not in tls_sidecar.log()


# -- upgrades ------------------------------------------------------------------------------


def test_after_a_101_what_each_side_sent_with_its_head_reaches_the_other(
    strict_sidecar: Sidecar,
) -> None:
    """§7.8: after the switch, the connection is the new protocol's both ways, from the
    first byte: the origin's bytes in the same write as its 101 reach the client, and
    the client's right after its request reach the origin; then each side's bytes reach
    the other."""
    listener = socket.create_server(("127.0.0.1", 0))
    from_client: list[bytes] = []

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.settimeout(BOUND)
            data = b""
            while b"\r\n\r\n" not in data:
                data += connection.recv(65536)
            early = data.partition(b"\r\n\r\n")[2]
            connection.sendall(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: test\r\n"
                b"Connection: Upgrade\r\n\r\ngreeting"
            )
            # Then the client's next bytes, which may come in the same read.
            while len(early) < len(b"earlyping"):
                early += connection.recv(65536)
            from_client.append(early)
            connection.sendall(b"echo:" + early[len(b"early") :])

    threading.Thread(target=serve, daemon=True).start()
    client = Client(strict_sidecar, "lean", listener.getsockname()[1])
    try:
        client.send(
            f"GET /ws HTTP/1.1\r\nHost: {client.authority}\r\nUpgrade: test\r\n"
            "Connection: Upgrade\r\n\r\nearly".encode()
        )
        client.sock.settimeout(BOUND)
        received = b""
        while not received.endswith(b"greeting"):
            chunk = client.sock.recv(65536)
            assert chunk, received
            received += chunk
        assert received.startswith(b"HTTP/1.1 101 "), received
        client.send(b"ping")
        assert client.sock.recv(65536) == b"echo:ping"
        assert from_client == [b"earlyping"]
    finally:
        client.close()
        listener.close()
