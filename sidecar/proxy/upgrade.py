"""HTTP/1.1 protocol upgrades (a WebSocket) to intercepted hosts, on the lean front end.

An upgrade request (RFC 9110 §7.8) asks the origin to switch the connection to another
protocol; nothing in it or after it can be stored. The request is sent to the origin as
the client sent it (its `Upgrade` and `Connection` fields included) on a connection of
its own (`Upstream.upgrade`), whose answer the core parses like any response. After a
`101 Switching Protocols` its head goes to the client and both connections become one
byte tunnel (`sidecar.wire.tunnel`), the origin's first bytes of the new protocol
included; any other answer (a refusal) is relayed with its body, and the connection then
closes. Each upgrade is a pass with reason `upgrade`. mitmproxy does the same for the
connections it terminates (`sidecar.mitm.addon`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from sidecar.metrics import Metrics
from sidecar.origins.upstream import Upstream, loggable_url, response_headers
from sidecar.wire import tunnel
from sidecar.wire.client import Response, UpstreamError
from sidecar.wire.exchange import Request
from sidecar.wire.server import response_head

logger = logging.getLogger(__name__)

# The pass reason of a protocol upgrade.
UPGRADE = "upgrade"
# The origin's answer to an upgrade request must begin within this long.
ANSWER_TIMEOUT = 60.0  # seconds
# Client fields not forwarded: those for the sidecar alone (RFC 9110 §7.6.1, §11.7.2),
# and Host, which the request's head gets from the URL.
_NOT_FORWARDED = frozenset(("proxy-connection", "proxy-authorization", "host"))


async def relay(
    request: Request,
    client: Any,
    early: bytearray,
    upstream: Upstream,
    metrics: Metrics,
    on_close: Callable[[], None],
) -> None:
    """Relay an upgrade request from `client` (a transport whose reading is paused) and
    what follows; `early`: what the client sent after the request head (read once the
    origin answers: the bytes that came with the head reach the front end after it);
    `on_close`: called once the client connection is closed, if the relay took it over."""
    metrics.count_pass(UPGRADE)
    fields = [(k, v) for k, v in request.headers if k.lower() not in _NOT_FORWARDED]
    try:
        async with asyncio.timeout(ANSWER_TIMEOUT):
            answer = await upstream.upgrade(request.method, request.url, fields)
    except TimeoutError:
        _failed(request, client, metrics, UpstreamError("no answer in time"))
        return
    except UpstreamError as e:
        _failed(request, client, metrics, e)
        return
    logger.info("pass (%s) %s %s -> %d", UPGRADE, request.method, loggable_url(request.url),
                answer.status)  # fmt: skip
    if answer.status != 101:
        await _refused(request, client, metrics, answer)
        return
    origin, switched = answer.detach()
    client.write(response_head(101, list(answer.headers.items()), close=False))
    client_side, origin_side = tunnel.pair(metrics.counters, on_close)
    origin.set_protocol(origin_side)
    origin_side.connection_made(origin)
    client.set_protocol(client_side)
    client_side.connection_made(client)
    # What each side sent before the streams forwarded to each other, counted and
    # relayed like what follows: the origin's with its 101 to the client, the client's
    # after its request to the origin.
    if switched:
        origin_side.data_received(switched)
    if early:
        client_side.data_received(bytes(early))
    client.resume_reading()


async def _refused(request: Request, client: Any, metrics: Metrics, answer: Response) -> None:
    """The origin's refusal, relayed with its body; the client's connection closes after
    it (or is cut, if the origin breaks off the body)."""
    # Hop-by-hop fields dropped: its body goes out decoded and ends with the connection.
    fields = response_headers(answer.headers.items())
    try:
        await answer.forward(client, False, response_head(answer.status, fields, close=True))
    except UpstreamError as e:
        metrics.counters.upstream_errors += 1
        logger.warning("upgrade %s: %s", loggable_url(request.url), e)
        client.abort()
        return
    finally:
        answer.close()
    client.close()


def _failed(request: Request, client: Any, metrics: Metrics, error: UpstreamError) -> None:
    """The origin could not be reached or did not answer: a 502."""
    metrics.counters.upstream_errors += 1
    logger.warning("upgrade %s: %s", loggable_url(request.url), error)
    body = f"burstbuffer: upgrade failed: {error}\n".encode()
    client.write(
        b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
    )
    client.close()
