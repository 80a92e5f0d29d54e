"""The sidecar's HTTP/1.1 client against origins that misbehave on purpose.

Each origin is a real TLS server on loopback (a trustme certificate) that writes the
bytes a test scripts, so framing, reuse and failure are exercised on real sockets.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import pytest
import trustme

from sidecar.core import native
from sidecar.wire.client import (
    BODY_BUFFER,
    Pool,
    Response,
    Route,
    UpstreamError,
    direct_route,
    proxied_route,
)

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
HOST = "origin.test"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


class Origin:
    """A TLS server on loopback whose every connection runs `script`."""

    def __init__(self, ca: trustme.CA, script: Script) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert(HOST).configure_cert(self.context)
        self.script = script
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Origin:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.context)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.script(reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def url(self, path: str = "/f") -> str:
        return f"https://{HOST}:{self.port}{path}"


def client_context(ca: trustme.CA) -> native.ClientTls:
    return native.ClientTls(ca.cert_pem.bytes())


async def loopback(host: str) -> list[str]:
    return ["127.0.0.1"]  # every test name is this machine


def route(origin: Origin, context: native.ClientTls) -> Route:
    return direct_route(urlsplit(origin.url()), context)


async def request_head(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


async def body(response: Response) -> bytes:
    try:
        return b"".join([chunk async for chunk in response.chunks()])
    finally:
        response.release()


Test = Callable[[Origin, Pool, Route], Awaitable[None]]


def run(ca: trustme.CA, script: Script, test: Test) -> Origin:
    """Run `test` against an origin running `script`; the origin, for its counts."""

    async def main() -> Origin:
        async with Origin(ca, script) as origin:
            pool = Pool(read_timeout=2.0, resolve=loopback)
            try:
                await test(origin, pool, route(origin, client_context(ca)))
            finally:
                await pool.close()
            return origin

    return asyncio.run(asyncio.wait_for(main(), 20))


def answer(*responses: bytes) -> Script:
    """Answer each request with the next of `responses`, on whatever connection it
    comes; keep each connection open until the client closes it."""
    left = list(responses)

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while left:
            await request_head(reader)
            writer.write(left.pop(0))
            await writer.drain()
        await reader.read()

    return script


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
FORGED = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged"


def test_a_kept_alive_connection_carries_the_next_request(ca: trustme.CA) -> None:
    async def test(origin: Origin, pool: Pool, route: Route) -> None:
        for _ in range(3):
            assert await body(await pool.request(route, "GET", origin.url(), [])) == b"hello"

    assert run(ca, answer(OK, OK, OK), test).connections == 1


def test_connection_close_followed_by_a_tab_is_read_as_close(ca: trustme.CA) -> None:
    # RFC 9110 §5.6.3: whitespace around a field value is not part of it. The llhttp of
    # httptools 0.8 misses this close and would send the next request on the connection.
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\t\r\nContent-Length: 5\r\n\r\nhello"

    async def test(origin: Origin, pool: Pool, route: Route) -> None:
        for _ in range(2):
            assert await body(await pool.request(route, "GET", origin.url(), [])) == b"hello"

    assert run(ca, answer(closing, OK), test).connections == 2


def test_bytes_after_the_content_length_are_cut_and_the_connection_is_not_reused(
    ca: trustme.CA,
) -> None:
    async def test(origin: Origin, pool: Pool, route: Route) -> None:
        response = await pool.request(route, "GET", origin.url(), [])
        assert await body(response) == b"hello"
        assert response.overlong
        # The forgery is not the answer to the next request: a new connection is.
        second = await pool.request(route, "GET", origin.url(), [])
        assert await body(second) == b"hello" and not second.overlong

    assert run(ca, answer(OK + FORGED, OK), test).connections == 2


def run_threaded(
    ca: trustme.CA,
    serve: Callable[[ssl.SSLSocket], None],
    test: Callable[[Response], Awaitable[None]],
) -> None:
    """Run `test` on the response to one request, from an origin whose one connection
    `serve` writes from a thread of its own: what it writes can then be in the client's
    socket while the client's event loop is held and has not read it."""
    origin = Origin(ca, answer())
    listener = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        connection, _ = listener.accept()
        with origin.context.wrap_socket(connection, server_side=True) as tls:
            while not tls.recv(4096).endswith(b"\r\n\r\n"):
                pass
            serve(tls)
            tls.recv(1)  # until the client closes

    async def main() -> None:
        url = f"https://{HOST}:{listener.getsockname()[1]}/f"
        pool = Pool(read_timeout=2.0, resolve=loopback)
        route = direct_route(urlsplit(url), client_context(ca))
        try:
            await test(await pool.request(route, "GET", url, []))
        finally:
            await pool.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        asyncio.run(asyncio.wait_for(main(), 20))
    finally:
        listener.close()
        thread.join(5)


def test_a_stray_write_right_after_the_body_is_found_before_the_body_is_trusted(
    ca: trustme.CA,
) -> None:
    body_read, stray_sent = threading.Event(), threading.Event()

    def serve(tls: ssl.SSLSocket) -> None:
        tls.sendall(OK)
        body_read.wait(5)
        tls.sendall(FORGED)  # a TLS record of its own, after the body was read
        stray_sent.set()

    async def test(response: Response) -> None:
        assert b"".join([chunk async for chunk in response.chunks()]) == b"hello"
        body_read.set()
        assert stray_sent.wait(5)
        time.sleep(0.1)  # in this socket's buffer now, and not read: the loop is held
        assert not response.overlong
        assert await response.settle()
        response.release()

    run_threaded(ca, serve, test)


def test_a_fed_body_tells_of_its_end_once_settled(ca: trustme.CA) -> None:
    # As above, for a body that goes into a tee with no task waiting: its end is told
    # only after the stray write that followed it was read.
    rest, stray = threading.Event(), threading.Event()

    def serve(tls: ssl.SSLSocket) -> None:
        tls.sendall(OK[:-2])
        rest.wait(5)
        tls.sendall(b"lo")
        stray.wait(5)
        tls.sendall(FORGED)

    async def test(response: Response) -> None:
        tee = native.Tee(5)
        ended = asyncio.get_running_loop().create_future()
        response.feed(tee, lambda: ended.set_result(response.overlong))
        await asyncio.sleep(0.1)
        assert not ended.done() and tee.received == 3
        rest.set()
        while tee.received < 5:
            await asyncio.sleep(0)
        # The body is whole: the stray write reaches the socket while the loop is held.
        stray.set()
        time.sleep(0.1)
        assert await ended, "told of the end before the stray write was read"
        assert response.complete and tee.body() == b"hello"
        response.release()

    run_threaded(ca, serve, test)


def test_a_fed_body_that_stalls_ends_after_the_read_timeout(ca: trustme.CA) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request_head(reader)
        writer.write(OK[:-2])
        await asyncio.sleep(5)

    async def test(origin: Origin, pool: Pool, route: Route) -> None:
        response = await pool.request(route, "GET", origin.url(), [])
        tee = native.Tee(5)
        ended = asyncio.get_running_loop().create_future()
        fed = time.monotonic()
        response.feed(tee, lambda: ended.set_result(None))
        await ended
        assert 1.9 < time.monotonic() - fed < 4
        with pytest.raises(UpstreamError, match="sent nothing for 2s"):
            await response.into(tee)
        assert tee.received == 3 and tee.body() is None
        response.close()

    run(ca, script, test)


def test_bytes_on_an_idle_connection_close_it(ca: trustme.CA) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request_head(reader)
        writer.write(OK)
        await asyncio.sleep(0.2)
        writer.write(FORGED)  # while the connection idles in the pool
        await reader.read()

    async def test(origin: Origin, pool: Pool, route: Route) -> None:
        assert await body(await pool.request(route, "GET", origin.url(), [])) == b"hello"
        await asyncio.sleep(0.5)
        assert await body(await pool.request(route, "GET", origin.url(), [])) == b"hello"

    assert run(ca, script, test).connections == 2


def test_a_kept_alive_connection_the_origin_closed_is_retried_once_on_a_new_one(
    ca: trustme.CA,
) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request_head(reader)
        writer.write(OK)
        await request_head(reader)  # the next request: closed without an answer

    async def test(origin: Origin, pool: Pool, route: Route) -> None:
        for _ in range(2):
            assert await body(await pool.request(route, "GET", origin.url(), [])) == b"hello"

        # A request that could not be sent twice gets a new connection of its own.
        async def upload() -> object:
            yield b"data"

        await body(await pool.request(route, "PUT", origin.url(), [], body=upload()))

    assert run(ca, script, test).connections == 3


def test_interim_responses_reach_the_caller_before_the_final_one(ca: trustme.CA) -> None:
    seen: list[tuple[int, list[tuple[str, str]]]] = []

    async def interim(status: int, fields: list[tuple[str, str]]) -> None:
        seen.append((status, fields))

    async def test(origin: Origin, pool: Pool, route: Route) -> None:
        response = await pool.request(route, "GET", origin.url(), [], interim=interim)
        assert seen == [(103, [("Link", "</s.css>; rel=preload")])]
        assert response.status == 200 and await body(response) == b"hello"

    early = b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n"
    run(ca, answer(early + OK), test)


def test_chunked_close_delimited_and_head_responses_are_framed_by_the_book(
    ca: trustme.CA,
) -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"  # no body follows a HEAD

    async def test(origin: Origin, pool: Pool, route: Route) -> None:
        response = await pool.request(route, "GET", origin.url(), [])
        assert response.version == "1.1" and await body(response) == b"abcde"
        response = await pool.request(route, "HEAD", origin.url(), [])
        assert response.headers["Content-Length"] == "100" and await body(response) == b""
        assert await body(await pool.request(route, "GET", origin.url(), [])) == b"hello"

    assert run(ca, answer(chunked, head, OK), test).connections == 1

    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request_head(reader)
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nto the end")
        await writer.drain()

    async def read_to_close(origin: Origin, pool: Pool, route: Route) -> None:
        response = await pool.request(route, "GET", origin.url(), [])
        assert response.version == "1.0"  # for the cache rules (RFC 9112 §6.1)
        assert b"".join([chunk async for chunk in response.chunks()]) == b"to the end"
        assert response.whole  # closed with TLS's closure alert
        response.release()

    run(ca, until_close, read_to_close)


def test_a_body_delimited_by_a_close_without_the_closure_alert_is_relayed_but_not_whole(
    ca: trustme.CA,
) -> None:
    # RFC 9112 §9.8: "A response that has neither chunked transfer coding nor
    # Content-Length is complete only if a valid closure alert has been received."
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request_head(reader)
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nto the end")
        await writer.drain()
        writer.transport.abort()  # the TCP connection closes, TLS never says so

    async def read_to_close(origin: Origin, pool: Pool, route: Route) -> None:
        response = await pool.request(route, "GET", origin.url(), [])
        assert b"".join([chunk async for chunk in response.chunks()]) == b"to the end"
        assert response.complete and not response.whole
        response.release()

    run(ca, cut, read_to_close)


def test_chunked_followed_by_a_tab_is_decoded_across_reads(ca: trustme.CA) -> None:
    # llhttp leaves this body coded (nodejs/llhttp#876): the client decodes it itself.
    parts = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\t\r\n\r\n3",
        b"\r\nabc\r\n2;x=y\r\nde\r",
        b"\n0\r\nTrailer: t\r\n\r\n",
    )

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request_head(reader)
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.05)
        await reader.read()

    async def test(origin: Origin, pool: Pool, route: Route) -> None:
        response = await pool.request(route, "GET", origin.url(), [])
        assert await body(response) == b"abcde" and not response.overlong

    run(ca, script, test)


@pytest.mark.parametrize(
    ("sent", "error"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello", "broke off the body"),
        (b"SPDY/9 200 OK\r\n\r\n", "malformed response"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", "larger than"),
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", "switched protocols"),
        (b"", "closed the connection"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\t\r\n\r\nzz\r\nhello\r\n",
            "malformed response from the origin: invalid chunk size",
        ),
    ],
    ids=["short-body", "bad-status-line", "huge-head", "upgrade", "no-answer", "tab-bad-chunk"],
)
def test_a_broken_response_is_a_clear_upstream_error(
    ca: trustme.CA, sent: bytes, error: str
) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request_head(reader)
        writer.write(sent)
        await writer.drain()

    async def test(origin: Origin, pool: Pool, route: Route) -> None:
        with pytest.raises(UpstreamError, match=error):
            await body(await pool.request(route, "GET", origin.url(), []))

    run(ca, script, test)


async def into_tee(response: Response) -> bytes | None:
    tee = native.Tee(10)
    try:
        await response.into(tee)
        return tee.body()
    finally:
        response.release()


@pytest.mark.parametrize("read", [body, into_tee], ids=["chunks", "tee"])
def test_an_origin_that_stalls_fails_after_the_read_timeout(
    ca: trustme.CA, read: Callable[[Response], Awaitable[object]]
) -> None:
    async def silent_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello")
        await asyncio.sleep(5)

    async def test(origin: Origin, pool: Pool, route: Route) -> None:
        response = await pool.request(route, "GET", origin.url(), [])
        started = time.monotonic()
        with pytest.raises(UpstreamError, match="sent nothing for 2s"):
            await read(response)
        assert 1.9 < time.monotonic() - started < 4

    run(ca, silent_body, test)

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)

    async def no_head(origin: Origin, pool: Pool, route: Route) -> None:
        with pytest.raises(UpstreamError, match="no response within 2s"):
            await pool.request(route, "GET", origin.url(), [])

    run(ca, silent, no_head)


def test_a_reader_that_pauses_longer_than_the_read_timeout_is_no_stall(ca: trustme.CA) -> None:
    """The origin's reading pauses while the reader is behind (BODY_BUFFER): a wait the
    origin did not make."""
    size = 3 * BODY_BUFFER

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size)
        await writer.drain()
        await reader.read()

    async def test(origin: Origin, pool: Pool, route: Route) -> None:
        response = await pool.request(route, "GET", origin.url(), [])
        received = 0
        async for chunk in response.chunks():
            if not received:
                await asyncio.sleep(4.5)  # two read timeouts (2 s) and more
            received += len(chunk)
        response.release()
        assert received == size

    run(ca, script, test)


def test_a_request_body_of_unknown_length_is_sent_chunked(ca: trustme.CA) -> None:
    received: list[bytes] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await request_head(reader))
        received.append(await reader.readuntil(b"0\r\n\r\n"))
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await reader.read()

    async def test(origin: Origin, pool: Pool, route: Route) -> None:
        async def upload() -> object:
            yield b"abc"
            yield b"defgh"

        response = await pool.request(route, "PUT", origin.url("/up?x=1"), [], body=upload())
        assert response.status == 204 and await body(response) == b""

    run(ca, script, test)
    head, sent = received
    assert head.startswith(b"PUT /up?x=1 HTTP/1.1\r\nHost: origin.test:")
    assert b"Transfer-Encoding: chunked\r\n" in head
    assert sent == b"3\r\nabc\r\n5\r\ndefgh\r\n0\r\n\r\n"


def test_an_origin_certificate_for_another_name_is_refused(ca: trustme.CA) -> None:
    async def test(origin: Origin, pool: Pool, route: Route) -> None:
        other = Route("elsewhere.test", route.port, route.context)
        with pytest.raises(UpstreamError, match="origin certificate rejected"):
            await pool.request(other, "GET", origin.url(), [])

    run(ca, answer(OK), test)


def test_a_proxy_that_refuses_the_tunnel_is_named_in_the_error(ca: trustme.CA) -> None:
    async def main() -> bytes:
        heads: list[bytes] = []

        async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            heads.append(await request_head(reader))
            writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(proxy, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        proxy = f"http://u%40x:p@127.0.0.1:{port}"
        through = proxied_route(urlsplit("https://origin.test/f"), proxy, client_context(ca))
        pool = Pool(read_timeout=2.0, resolve=loopback)
        with pytest.raises(UpstreamError, match="refused CONNECT origin.test:443: 407"):
            await pool.request(through, "GET", "https://origin.test/f", [])
        await pool.close()
        server.close()
        return heads[0]

    head = asyncio.run(asyncio.wait_for(main(), 20))
    assert head.startswith(b"CONNECT origin.test:443 HTTP/1.1\r\n")
    assert b"Proxy-Authorization: Basic dUB4OnA=\r\n" in head  # "u@x:p"


def test_a_switch_of_protocols_hands_the_connection_over_with_what_followed_it(
    ca: trustme.CA,
) -> None:
    switch = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n"

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request_head(reader)
        writer.write(switch + b"first")  # the new protocol's bytes in the same write
        await writer.drain()
        writer.write(await reader.readexactly(4))  # then an echo

    async def test(origin: Origin, pool: Pool, route: Route) -> None:
        upgrade = [("Upgrade", "echo"), ("Connection", "Upgrade")]
        response = await pool.request(route, "GET", origin.url(), upgrade, upgrade=True)
        assert response.status == 101 and response.headers["Upgrade"] == "echo"
        stream, switched = response.detach()
        echoed: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        class Echo(asyncio.Protocol):
            def data_received(self, data: bytes) -> None:
                echoed.set_result(data)

        stream.set_protocol(Echo())
        stream.write(b"ping")
        assert (switched, await echoed) == (b"first", b"ping")
        stream.close()

    run(ca, script, test)
