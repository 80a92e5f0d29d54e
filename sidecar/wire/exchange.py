"""One request, the channel its response is written to, and the handler that answers it,
whoever parsed it.

Two front ends hand requests to the router (`sidecar.proxy.router`): the lean HTTP/1.1
server for intercepted CONNECT tunnels (`sidecar.wire.server`), and the mitmproxy addon for
everything else mitmproxy terminates (plain HTTP, the hostAliases and transparent
listeners). Both describe a request with `Request` and answer through a `Channel`, so
hits, fills and passes are decided and written by one piece of code. The server knows
the router only as a `Handler`, as Go's `http.Server` knows a `Handler`: the wire is
read and tested without the cache above it.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sidecar.core import native
from sidecar.wire.fields import Fields, Headers, header

if TYPE_CHECKING:
    from sidecar.wire.client import Response


class ClientGone(Exception):
    """The client closed its connection while a response was being written."""


@dataclass(frozen=True)
class Request:
    """A client's request: absolute URL, field lines in order (names as sent)."""

    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    http_version: str = "HTTP/1.1"

    @functools.cached_property
    def fields(self) -> Fields:
        """The fields by lower-case name, for the decisions of `sidecar.cache.policy`."""
        return Fields.of(self.headers)

    def header(self, name: str) -> str | None:
        """Field `name`, several lines joined (see `header`)."""
        return self.fields.get(name.lower())


def asks_upgrade(headers: Headers) -> bool:
    """Does a request ask to switch protocols (a WebSocket)? RFC 9110 §7.8: an `Upgrade`
    field, named in `Connection` (it is hop-by-hop), as the core's parser decides for
    the lean front end. Connection options are tokens: never quoted, so a plain split
    reads them."""
    if header(headers, "Upgrade") is None:
        return False
    options = header(headers, "Connection") or ""
    return any(option.strip().lower() == "upgrade" for option in options.split(","))


class Channel(Protocol):
    """Where one response goes: status and headers, then body bytes, then the end."""

    @property
    def started(self) -> bool:
        """True once the status line went out: from then on, errors must abort."""
        ...

    @property
    def body_bytes(self) -> int:
        """Body bytes written so far."""
        ...

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        """Write the status line and headers (framing set by the caller)."""
        ...

    async def interim(self, status: int, headers: list[tuple[str, str]]) -> None:
        """Write a 1xx interim response (before `start()`, to HTTP/1.1 clients only)."""
        ...

    async def write(self, data: bytes) -> None:
        """Write body bytes, waiting while the client is slow; ClientGone if it left."""
        ...

    async def send_file(self, file: BodyFile) -> None:
        """Write body bytes from a file, which the channel takes over (it closes the file,
        whatever happens), waiting while the client is slow; ClientGone if it left."""
        ...

    async def follow(
        self, tee: native.Tee, start: int, end: int, whole: Callable[[], Awaitable[None]]
    ) -> bool:
        """Have the core send bytes [start, end) of the body `tee` keeps, as they arrive;
        return once `whole()` says the body is complete and the client has taken them
        (`whole()`'s error if it fails, ClientGone if the client left). False, having
        sent nothing, where the core does not hold the client's connection: the caller
        writes the bytes itself."""
        ...

    async def relay(self, response: Response, chunked: bool) -> int | None:
        """Have the core send `response`'s body as it arrives from the origin, framed in
        chunks if `chunked`; return its bytes once it ended and the client has taken
        them (UpstreamError if the origin breaks off, ClientGone if the client left).
        None, having sent nothing, where the core does not hold the client's connection:
        the caller writes the bytes itself."""
        ...

    def finish(self) -> None:
        """The response is complete; the connection may carry the next request."""
        ...

    def abort(self) -> None:
        """Cut the connection, so the client sees an error, never a short success."""
        ...

    def keep_alive(self) -> AbstractContextManager[object]:
        """Hold off the front end's idle timeout while the response is produced."""
        ...


# A request body to relay upstream, as it arrives from the client.
Body = AsyncIterator[bytes]


@dataclass(frozen=True)
class BodyFile:
    """Bytes [start, end) of an open body file: whoever is handed one closes `fd`."""

    fd: int
    start: int
    end: int


@dataclass(frozen=True)
class Immediate:
    """A whole response, decided at once (a hit): its body from a file, or none."""

    status: int
    headers: list[tuple[str, str]]
    body: BodyFile | None


class Handler(Protocol):
    """What answers the requests a server parses (`sidecar.proxy.router.Router`)."""

    def hit_now(self, request: Request) -> Immediate | None:
        """The whole response when it can be decided at once (a hit), else None."""
        ...

    async def handle(self, request: Request, channel: Channel, body: Body | None = None) -> None:
        """Answer `request` through `channel`; `body`: the request's body, if it has one."""
        ...

    async def upgrade(
        self, request: Request, client: Any, early: bytearray, on_close: Callable[[], None]
    ) -> None:
        """Relay a protocol upgrade and what follows it; from then on the connection is the
        relay's. `client`: the transport, reading paused; `early`: the bytes the client
        sent after the request head, which may still grow until the relay takes the
        connection (they came with the head, and reach the protocol after it);
        `on_close`: called once the relay has closed it."""
        ...
