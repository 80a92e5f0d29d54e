"""How the sidecar's requests reach origins.

Fills, coalescing and resume need upstream fetches that belong to no single client
connection, so the sidecar talks to origins with its own pooled HTTP/1.1 client
(`sidecar.wire.client`) rather than through mitmproxy's per-connection server side.
Origin certificates are always verified against the public roots plus
`--upstream-ca`; `--upstream-proxy` is honoured with HTTP CONNECT. With `--parent`,
what may be shared goes through the parent tier first (`sidecar.origins.parent`), and
straight to the origin whenever the parent fails. Bodies are never decompressed: a
cache stores bytes as sent.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from sidecar.core import native
from sidecar.origins.parent import Parents
from sidecar.wire import ranges, tls
from sidecar.wire.client import (
    Interim,
    Pool,
    Response,
    Route,
    UpstreamError,
    direct_route,
    proxied_route,
)
from sidecar.wire.fields import HOP_BY_HOP

logger = logging.getLogger(__name__)

# Origins whose routes are remembered (`Upstream.route`).
ROUTES = 4096
# Request fields that make a response partial or conditional: dropped for the full,
# unconditional fetch that fills the buffer.
_PARTIAL_OR_CONDITIONAL = frozenset(
    {"range", "if-range", "if-match", "if-none-match", "if-modified-since", "if-unmodified-since"}
)


# Where the interim (1xx) responses an origin sends before its answer to the request
# being handled go, if anywhere (set by the router for the request it handles).
interim_sink: contextvars.ContextVar[Interim | None] = contextvars.ContextVar(
    "interim_sink", default=None
)


class CannotResume(UpstreamError):
    """The origin cannot continue a body from an offset (no validators, no ranges, changed)."""


def loggable_url(url: str) -> str:
    """A URL without its query, for logs: signed query strings are credentials."""
    return url.split("?", 1)[0]


def forwarded_headers(
    headers: Iterable[tuple[str, str]], *, for_fill: bool
) -> list[tuple[str, str]]:
    """The client's request headers as sent upstream.

    Hop-by-hop fields and Host (the client library sets it) are dropped. A fill asks for
    the whole, unencoded representation: one object, one representation, so a gzip body
    is never stored for clients that did not ask for it.
    """
    out = []
    for name, value in headers:
        lowered = name.lower()
        if lowered in HOP_BY_HOP or lowered == "host":
            continue
        if for_fill and (lowered in _PARTIAL_OR_CONDITIONAL or lowered == "accept-encoding"):
            continue
        out.append((name, value))
    if for_fill:
        out.append(("Accept-Encoding", "identity"))
    return out


def response_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """An upstream response's headers as relayed to a client (hop-by-hop fields dropped)."""
    return [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP]


@dataclass(frozen=True)
class Validators:
    """What proves that a resumed body belongs to the same representation (RFC 9110 §13.1.5)."""

    etag: str | None
    last_modified: str | None

    @property
    def if_range(self) -> str | None:
        # A weak ETag cannot validate a range; a date is the weaker, allowed fallback.
        if self.etag and not self.etag.startswith("W/"):
            return self.etag
        return self.last_modified


def check_resumed(status: int, headers: Mapping[str, str], start: int, end: int, size: int) -> None:
    """Raise CannotResume unless a response carries exactly bytes [start, end) of `size`.

    A 200 means If-Range failed (the object changed) or the origin ignores ranges.
    """
    if status != 206:
        raise CannotResume(f"origin answered {status} to a resume request")
    content_range = headers.get("Content-Range")
    part = ranges.parse_content_range(content_range)
    if (
        part is None
        or (part.first, part.last + 1) != (start, end)
        or part.complete not in (size, None)
    ):
        raise CannotResume(f"origin sent Content-Range {content_range!r}, not {start}-{end - 1}")


class Upstream:
    """The connections of this worker to origins, and the parent tier in front of them."""

    def __init__(
        self,
        trust_file: Path,
        proxy: str | None,
        pool: Pool,
        parents: Parents | None = None,
    ) -> None:
        """`trust_file`: what origin certificates are verified against; `proxy`: the
        `--upstream-proxy`; `pool`: the connections (shared with the parent tier);
        `parents`: the shared tier misses go through, if any."""
        self._ssl = tls.client_config(trust_file, [b"http/1.1"])
        self._proxy = proxy
        self._pool = pool
        self._parents = parents
        self._routes: dict[str, Route] = {}  # by `scheme://authority`

    async def open(self) -> None:
        if self._parents is not None:
            await self._parents.open()

    async def close(self) -> None:
        await self._pool.close()
        if self._parents is not None:
            await self._parents.close()

    async def get(
        self,
        url: str,
        headers: list[tuple[str, str]],
        method: str = "GET",
        body: AsyncIterator[bytes] | None = None,
        direct: bool = False,
    ) -> Response:
        """Send a request (with `body` streamed as it arrives, if any), through the
        parent tier unless `direct` or not shareable; the caller reads the response's
        body and must `release()` it, or `broke_off()` it when the body stops short."""
        if self._parents is not None and body is None and not direct:
            parent = self._parents.route(url, method, headers)
            if parent is not None:
                response = await self._parents.fetch(parent, url, headers, method)
                if response is not None:
                    return response
        route = self.route(url)
        return await self._pool.request(route, method, url, headers, body, interim_sink.get())

    def route(self, url: str) -> Route:
        """How a request for `url` reaches its origin (never through a parent).

        Remembered by the URL's text up to its path (`scheme://authority`, which alone
        decides the route): a miss asks once per request."""
        origin = "/".join(url.split("/", 3)[:3])
        known = self._routes.get(origin)
        if known is None:
            if len(self._routes) >= ROUTES:
                self._routes.clear()
            parts = urlsplit(url)
            if self._proxy is not None:
                known = proxied_route(parts, self._proxy, self._ssl)
            else:
                known = direct_route(parts, self._ssl)
            self._routes[origin] = known
        return known

    async def tunnel(self, url: str) -> native.Stream:
        """A connection of the caller's own to the origin of `url`, never through a
        parent: the bare TCP connection that a client's own TLS goes through (through
        the upstream proxy's CONNECT, if any). UpstreamError if it fails."""
        return await self._pool.open(self.route(url)._replace(context=None))

    async def upgrade(self, method: str, url: str, headers: list[tuple[str, str]]) -> Response:
        """Ask the origin of `url` to switch protocols (RFC 9110 §7.8), on a connection
        of the request's own, never through a parent; its answer's head: a 101, whose
        connection the caller takes (`Response.detach`), or a refusal to relay."""
        route = self.route(url)
        return await self._pool.request(route, method, url, headers, upgrade=True)

    async def resume(
        self,
        url: str,
        headers: list[tuple[str, str]],
        start: int,
        end: int,
        size: int,
        validators: Validators,
    ) -> Response:
        """Ask for bytes [start, end) of a body, only if it is still the same object."""
        if_range = validators.if_range
        if if_range is None:
            raise CannotResume("the origin gave no validator (ETag or Last-Modified)")
        ranged = [*headers, ("Range", f"bytes={start}-{end - 1}"), ("If-Range", if_range)]
        response = await self.get(url, ranged)
        try:
            check_resumed(response.status, response.headers, start, end, size)
        except CannotResume:
            response.release()
            if not self.came_through_parent(response):
                raise
            # The parent may hold another version of the object: ask the origin.
            response = await self.get(url, ranged, direct=True)
            try:
                check_resumed(response.status, response.headers, start, end, size)
            except CannotResume:
                response.release()
                raise
        return response

    def came_through_parent(self, response: Response) -> bool:
        return self._parents is not None and self._parents.came_through_parent(response)

    def broke_off(self, response: Response) -> None:
        """Say that a response's body stopped short (a parent that did it is skipped)."""
        if self._parents is not None:
            self._parents.broke_off(response)
