"""HTTP/1.1 as RFC 9112 and RFC 9110 have it, on both sides of the real sidecar.

One row per rule, with its section. Requests go through both front ends: plain HTTP
inside a CONNECT tunnel (the lean server, `sidecar.http1`) and an absolute-form proxy
request (mitmproxy and the addon). Responses come from a scripted raw origin on
loopback, so that the bytes are exactly the row's. Every client is a raw socket: real
clients would refuse to send most of these bytes.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httptools
import pytest

from bench.harness import Sidecar

pytestmark = pytest.mark.e2e

FRONTS = ("lean", "mitmproxy")
# How long a row waits for an answer or a close; the sidecar's own timeouts are longer.
BOUND = 5.0  # seconds
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"


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
    of `responses[name]` (others with OK) once the request arrived whole."""

    def __init__(self) -> None:
        self.responses: dict[str, bytes] = {}
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

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
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
                connection.sendall(origin.responses.get(name, OK))

        parser = httptools.HttpRequestParser(Requests())
        with connection:
            connection.settimeout(30)
            try:
                while data := connection.recv(65536):
                    seen.raw += data
                    parser.feed_data(data)
            except (OSError, httptools.HttpParserError):
                return
            seen.closed.set()


@dataclass
class Reply:
    statuses: list[int]
    bodies: list[bytes]
    closed: bool  # the sidecar closed the connection after its answers


class Client:
    """A raw client of the sidecar, through one front end."""

    def __init__(self, sidecar: Sidecar, front: str, origin_port: int) -> None:
        self.authority = f"origin.test:{origin_port}"
        self.front = front
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

    def replies(self, count: int = 1) -> Reply:
        """Read `count` responses (fewer if the sidecar closes first), then whether the
        connection is closed."""
        statuses: list[int] = []
        bodies: list[bytes] = []

        class Responses:
            def on_headers_complete(self) -> None:
                statuses.append(parser.get_status_code())
                bodies.append(b"")

            def on_body(self, body: bytes) -> None:
                bodies[-1] += body

            def on_message_complete(self) -> None:
                nonlocal done
                done += 1

        parser = httptools.HttpResponseParser(Responses())
        done = 0
        closed = False
        deadline = time.monotonic() + BOUND
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                closed = True
                break
            if not data:
                closed = True
                break
            parser.feed_data(data)
            if done >= count:
                # Answered; now closed, or kept for another request?
                self.sock.settimeout(3.0)
                try:
                    closed = self.sock.recv(1) == b""
                except TimeoutError:
                    closed = False
                except ConnectionResetError:
                    closed = True
                break
        return Reply(statuses, bodies, closed)

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
]


@pytest.mark.parametrize(
    ("raw", "status"), [row[1:] for row in REQUESTS], ids=[row[0] for row in REQUESTS]
)
def test_a_request_the_rfc_refuses_is_refused_and_never_forwarded(
    client: Client, raw_origin: RawOrigin, raw: str, status: int
) -> None:
    name = f"refused-{time.monotonic_ns()}"
    path = f"/r/{name}"
    client.send(raw.format(target=client.target(name), host=client.authority, path=path).encode())
    reply = client.replies()
    assert reply.statuses == [status] and reply.closed, reply
    assert not any(path.encode() in seen.raw for seen in raw_origin.connections)


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
    if client.front == "lean":
        assert reply.statuses == [200] and reply.bodies == [b"hello"], reply
        assert raw_origin.seen(name).bodies == [b"hello"]
    else:
        # mitmproxy refuses the faulty framing outright (its validate_inbound_headers).
        assert reply.statuses == [400], reply


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
        "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n".encode()
    )
    if client.front == "lean":
        # The lean server streams the body: the origin has the request under way.
        assert raw_origin.seen(name).bodies == [b"abc"] or raw_origin.seen(name).bodies
    client.send(broken)
    reply = client.replies()
    assert reply.statuses == [400] and reply.closed, reply
    # RFC 9112 §8: never completed as if whole.
    for seen in raw_origin.connections:
        if f"/r/{name}".encode() in seen.raw:
            assert seen.complete == 0 and b"0\r\n\r\n" not in seen.raw
            assert seen.closed.wait(BOUND)


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

# (rule, response, status to the client, body to the client)
RESPONSES = [
    (
        "RFC 9110 §15 a status above 599",
        b"HTTP/1.1 600 Beyond\r\nContent-Length: 5\r\n\r\nhello",
        502,
        None,
    ),
    (
        "RFC 9110 §15 a status below 100",
        b"HTTP/1.1 099 Below\r\nContent-Length: 5\r\n\r\nhello",
        502,
        None,
    ),
    (
        "RFC 9110 §15.2 a 1xx with a body",
        b"HTTP/1.1 103 Early Hints\r\nContent-Length: 43\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged" + OK,
        502,
        None,
    ),
    (
        "RFC 9112 §6.1 Transfer-Encoding in an HTTP/1.0 response",
        b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n",
        200,
        b"hello",
    ),
]


@pytest.mark.parametrize(
    ("response", "status", "body"),
    [row[1:] for row in RESPONSES],
    ids=[row[0] for row in RESPONSES],
)
def test_a_response_is_framed_by_the_rfc_and_an_invalid_one_is_a_502(
    client: Client, raw_origin: RawOrigin, response: bytes, status: int, body: bytes | None
) -> None:
    name = f"response-{time.monotonic_ns()}"
    raw_origin.responses[name] = response
    client.send(f"GET {client.target(name)} HTTP/1.1\r\nHost: {client.authority}\r\n\r\n".encode())
    reply = client.replies()
    assert reply.statuses == [status], reply
    if body is not None:
        assert reply.bodies == [body], reply
    # Nothing on that connection can be trusted to be in step: the sidecar closes it.
    assert raw_origin.seen(name).closed.wait(BOUND)
