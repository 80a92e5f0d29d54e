"""HTTP/1.1 protocol upgrades (a WebSocket) to intercepted hosts, on the lean front end.

An upgrade request (RFC 9110 §7.8) asks the origin to switch the connection to another
protocol; nothing in it or after it can be stored. The request is sent to the origin as
the client sent it (its `Upgrade` and `Connection` fields included) on a connection of
its own, and the origin's answer is relayed byte for byte as it arrives. After a `101
Switching Protocols` both connections become one byte tunnel (`sidecar.wire.tunnel`); any
other answer (a refusal) is relayed as it is, and the connection then closes. Each
upgrade is a pass with reason `upgrade`. mitmproxy does the same for the connections
it terminates (`sidecar.mitm.addon`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httptools

from sidecar.metrics import Metrics
from sidecar.origins.upstream import Upstream, loggable_url
from sidecar.wire import tunnel
from sidecar.wire.client import UpstreamError, request_head
from sidecar.wire.exchange import Request

logger = logging.getLogger(__name__)

# The pass reason of a protocol upgrade.
UPGRADE = "upgrade"
# The origin's answer to an upgrade request must begin within this long.
ANSWER_TIMEOUT = 60.0  # seconds
# Client fields not forwarded: those for the sidecar alone (RFC 9110 §7.6.1, §11.7.2),
# and Host, which `request_head` writes from the URL.
_NOT_FORWARDED = frozenset(("proxy-connection", "proxy-authorization", "host"))


async def relay(
    request: Request,
    client: Any,
    early: bytes,
    upstream: Upstream,
    metrics: Metrics,
    on_close: Callable[[], None],
) -> None:
    """Relay an upgrade request from `client` (a transport whose reading is paused) and
    what follows; `early`: what the client sent after the request head; `on_close`:
    called once the client connection is closed, if the relay took it over."""
    metrics.count_pass(UPGRADE)
    try:
        origin = await upstream.connect(request.url)
    except UpstreamError as e:
        _failed(request, client, metrics, e, relayed=False)
        return
    answer = _Answer(client)
    origin.set_protocol(answer)
    fields = [(k, v) for k, v in request.headers if k.lower() not in _NOT_FORWARDED]
    head = request_head(
        upstream.route(request.url), request.method, urlsplit(request.url), fields, False
    )
    origin.write(head)
    try:
        async with asyncio.timeout(ANSWER_TIMEOUT):
            rest = await answer.switched
    except TimeoutError:
        origin.abort()
        _failed(request, client, metrics, UpstreamError("no answer in time"), answer.relayed)
        return
    except UpstreamError as e:
        origin.abort()
        _failed(request, client, metrics, e, answer.relayed)
        return
    logger.info("pass (%s) %s %s -> %d", UPGRADE, request.method, loggable_url(request.url),
                answer.status)  # fmt: skip
    if rest is None:
        # Refused: its answer went out as it was, and nothing follows it.
        origin.close()
        client.close()
        return
    client_side, origin_side = tunnel.pair(metrics.counters, on_close)
    origin.set_protocol(origin_side)
    origin_side.connection_made(origin)
    client.set_protocol(client_side)
    client_side.connection_made(client)
    if rest:
        client_side.data_received(rest)  # counted and relayed like what follows
    if early:
        origin_side.data_received(early)
    client.resume_reading()


def _failed(
    request: Request, client: Any, metrics: Metrics, error: UpstreamError, relayed: bool
) -> None:
    """The origin could not be reached or broke off: a 502, or a cut connection once
    part of its answer went out."""
    metrics.counters.upstream_errors += 1
    logger.warning("upgrade %s: %s", loggable_url(request.url), error)
    if relayed:
        client.abort()
        return
    body = f"burstbuffer: upgrade failed: {error}\n".encode()
    client.write(
        b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
    )
    client.close()


class _Answer(asyncio.Protocol):
    """The origin's answer to an upgrade request, relayed to the client byte for byte
    as it arrives, until it switches protocols or ends."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._parser = httptools.HttpResponseParser(self)
        self.status = 0
        self._ended = False  # the final answer (a refusal) is complete
        self.relayed = False  # bytes of the answer went to the client
        # What the origin sent after its 101 (the new protocol's first bytes); None
        # when the answer was a refusal, relayed whole.
        self.switched: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        if self.switched.done():
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as e:
            head = int(e.args[0])
            self._relay(data[:head])
            self.switched.set_result(data[head:])
            return
        except httptools.HttpParserError as e:
            self.switched.set_exception(UpstreamError(f"malformed answer from the origin: {e}"))
            return
        self._relay(data)
        if self._ended:
            self.switched.set_result(None)

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()

    def on_message_complete(self) -> None:
        self._ended = self.status >= 200

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.switched.done():
            return
        if self.status >= 200:
            self.switched.set_result(None)  # a refusal whose body ended with the connection
        else:
            self.switched.set_exception(UpstreamError("the origin closed the connection"))

    def _relay(self, data: bytes) -> None:
        if data:
            self.relayed = True
            self._client.write(data)
