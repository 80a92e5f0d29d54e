"""A listener's door (`native.Door`): a plain-HTTP client served by the core from its
accept on, on real sockets, a real table of answers and the lean server's idle sweep
(its timeout shortened).

What the table holds is answered before Python makes anything for the connection; a
connection that stays open after is closed once idle; the first request the table
cannot answer makes the protocol, which hears it and every request after it; and what
is not plain HTTP for the lean server is left in the socket, unread, for the arrival.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from sidecar.buffer.store import key_digest
from sidecar.cache import policy
from sidecar.core import native
from sidecar.shared import Shared
from sidecar.wire import server

TIMEOUT = 0.5  # seconds: the lean server's idle timeout, for the test
STORED = "http://origin.test/stored"
BODY = b"stored body"
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"


def request(url: str, *fields: str) -> bytes:
    lines = [f"GET {url} HTTP/1.1", "Host: origin.test", *fields]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class Requests(asyncio.Protocol):
    """The lean server's place: notes the requests it hears, answers none."""

    def __init__(self) -> None:
        self.targets: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        pass

    def request_received(self, method: str, target: bytes, *_: object) -> None:
        self.targets.append(target)

    def message_complete(self) -> None:
        pass

    def request_refused(self, status: int, reason: str) -> None:
        self.targets.append(f"refused {status}".encode())


class Visitors:
    """The door's reception: notes the protocols it made and the connections that
    closed without one; the lean server's own idle sweep watches the rest."""

    def __init__(self) -> None:
        self.protocols: list[Requests] = []
        self.closed_without = 0
        self.idleness = server.Idleness()

    def protocol(self) -> Requests:
        self.protocols.append(Requests())
        return self.protocols[-1]

    def closed(self) -> None:
        self.closed_without += 1

    def watch_stream(self, stream: native.Stream) -> None:
        self.idleness.watch_stream(stream)

    def forget_stream(self, stream: native.Stream) -> None:
        self.idleness.forget_stream(stream)


@pytest.fixture
def answers(tmp_path: Path) -> native.Answers:
    """A table of answers holding one: STORED, whose body is in a file."""
    shared = Shared.create(1, answers=256 * 1024)
    table = shared.answers_table(64, tmp_path, policy.HIT_FIELDS, policy.KEYS)
    (tmp_path / "body").write_bytes(BODY)
    digest = key_digest(policy.cache_key(STORED))
    assert table.record(digest, HEAD, b"body", len(BODY), None, 0)
    return table


class Lobby:
    """A listener on loopback, its door and what the door called, on the running loop."""

    def __init__(self, answers: native.Answers, captured: bool) -> None:
        self.visitors = Visitors()
        scope = b"http://" if captured else b""
        self.door = native.Door(asyncio.get_running_loop(), captured, answers, scope, self.visitors)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._clients: list[socket.socket] = []

    async def arrive(self, sent: bytes) -> tuple[socket.socket, int]:
        """A client that connected and sent `sent`, and its accepted descriptor."""
        client = socket.create_connection(self._listener.getsockname())
        self._clients.append(client)
        client.sendall(sent)
        client.setblocking(False)
        await asyncio.sleep(0.01)  # on loopback, the bytes are there by then
        return client, native.accept(self._listener.fileno())

    def close(self) -> None:
        self.visitors.idleness.close()
        for client in self._clients:
            client.close()
        self._listener.close()


def in_lobby(
    answers: native.Answers, captured: bool, visit: Callable[[Lobby], Awaitable[None]]
) -> None:
    async def main() -> None:
        lobby = Lobby(answers, captured)
        try:
            await visit(lobby)
        finally:
            lobby.close()

    asyncio.run(asyncio.wait_for(main(), 20 * TIMEOUT))


async def received(client: socket.socket, until: bytes | None = None) -> tuple[bytes, bool]:
    """What the client receives until it ends with `until`, or the door closes (True)."""
    loop = asyncio.get_running_loop()
    data = b""
    while until is None or not data.endswith(until):
        chunk = await asyncio.wait_for(loop.sock_recv(client, 65536), 4 * TIMEOUT)
        if not chunk:
            return data, True
        data += chunk
    return data, False


def test_a_request_the_table_holds_is_answered_and_closed_with_no_protocol(
    answers: native.Answers,
) -> None:
    async def visit(lobby: Lobby) -> None:
        client, fd = await lobby.arrive(request(STORED, "Connection: close"))
        assert lobby.door.serve(fd)
        answer, closed = await received(client)
        assert closed and answer.startswith(b"HTTP/1.1 200 OK\r\n")
        assert answer.endswith(b"\r\n\r\n" + BODY)
        assert b"\r\nConnection: close\r\n" in answer
        assert (lobby.visitors.protocols, lobby.visitors.closed_without) == ([], 1)

    in_lobby(answers, False, visit)


def test_a_kept_alive_connection_the_table_answered_is_closed_once_idle(
    answers: native.Answers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "IDLE_TIMEOUT", TIMEOUT)

    async def visit(lobby: Lobby) -> None:
        loop = asyncio.get_running_loop()
        client, fd = await lobby.arrive(request(STORED))
        assert lobby.door.serve(fd)
        answered = loop.time()
        answer, closed = await received(client, until=BODY)
        assert not closed
        client.sendall(request(STORED))  # a second one, on the same connection
        assert (await received(client, until=BODY))[0].endswith(BODY)
        assert lobby.visitors.closed_without == 0
        assert (await received(client)) == (b"", True)
        # Due TIMEOUT after its last answer, checked every tenth of it.
        assert TIMEOUT <= loop.time() - answered < 2 * TIMEOUT
        await asyncio.sleep(0.05)
        assert (lobby.visitors.protocols, lobby.visitors.closed_without) == ([], 1)

    in_lobby(answers, False, visit)


def test_the_first_request_the_table_lacks_makes_the_protocol_which_hears_the_rest(
    answers: native.Answers,
) -> None:
    async def visit(lobby: Lobby) -> None:
        other = "http://origin.test/other"
        pipelined = request(STORED) + request(other) + request(STORED)
        client, fd = await lobby.arrive(pipelined)
        assert lobby.door.serve(fd)
        answer, closed = await received(client, until=BODY)
        assert not closed and answer.count(b"HTTP/1.1 200") == 1
        # The table answered the first; the protocol, made for the second, hears it and
        # the one behind it, whose answer must follow the second's.
        [protocol] = lobby.visitors.protocols
        assert protocol.targets == [other.encode(), STORED.encode()]
        assert lobby.visitors.closed_without == 0

    in_lobby(answers, False, visit)


def test_a_request_the_parser_refuses_is_the_protocols_to_answer(
    answers: native.Answers,
) -> None:
    async def visit(lobby: Lobby) -> None:
        client, fd = await lobby.arrive(b"GET http://origin.test/f HTTP/1.1\r\nBad Field\r\n\r\n")
        assert lobby.door.serve(fd)
        [protocol] = lobby.visitors.protocols
        assert protocol.targets == [b"refused 400"]

    in_lobby(answers, False, visit)


@pytest.mark.parametrize(
    ("captured", "sent"),
    [
        (False, b"CONNECT origin.test:443 HTTP/1.1\r\nHost: origin.test:443\r\n\r\n"),
        (False, b"CONNE"),
        (False, b"GET /stored HTTP/1.1\r\nHost: origin.test\r\n\r\n"),
        (False, b"GET"),
        (False, b""),
        (True, b"\x16\x03\x01\x02\x00\x01\x00"),
        (True, b""),
    ],
    ids=[
        "a CONNECT",
        "the start of a CONNECT",
        "an origin-form request to the proxy",
        "a method alone",
        "nothing yet",
        "TLS on a captured listener",
        "nothing yet on a captured listener",
    ],
)
def test_what_is_not_plain_http_for_the_lean_server_is_left_unread(
    answers: native.Answers, captured: bool, sent: bytes
) -> None:
    async def visit(lobby: Lobby) -> None:
        client, fd = await lobby.arrive(sent)
        assert not lobby.door.serve(fd)
        with socket.socket(fileno=fd) as waiting:
            if sent:
                assert waiting.recv(65536, socket.MSG_PEEK) == sent
            else:
                with pytest.raises(BlockingIOError):
                    waiting.recv(65536, socket.MSG_PEEK)
        assert (lobby.visitors.protocols, lobby.visitors.closed_without) == ([], 0)

    in_lobby(answers, captured, visit)


def test_a_captured_plain_request_is_answered_by_its_host(answers: native.Answers) -> None:
    async def visit(lobby: Lobby) -> None:
        client, fd = await lobby.arrive(request("/stored", "Connection: close"))
        assert lobby.door.serve(fd)
        answer, closed = await received(client)
        assert closed and answer.endswith(BODY)
        assert (lobby.visitors.protocols, lobby.visitors.closed_without) == ([], 1)

    in_lobby(answers, True, visit)
