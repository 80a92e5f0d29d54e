"""The mitmproxy addon: the router's front end for connections mitmproxy terminates.

Every entrance is served by the lean front end (`sidecar.proxy.front`,
`sidecar.wire.server`); mitmproxy is handed only what the forward proxy cannot take as a
request to forward (a target in origin or asterisk form), and whatever of it mitmproxy
reads as a request comes here. For a GET or HEAD to an intercepted host
this addon hands the request to the router in the `request` hook itself; everything
else (other methods, hosts that are not intercepted) is left to mitmproxy,
which streams it through without buffering bodies, and is counted here as a pass with
its reason. An HTTP/1.1 upgrade (a WebSocket) is one of those: mitmproxy relays it,
and after the origin's `101` it relays the new protocol. Connections mitmproxy tunnels
untouched (hosts that are not intercepted; TLS clients whose ALPN lacks HTTP/1.x,
`sidecar.wire.hello`) are counted by reason with their bytes (`sidecar.wire.tunnel`), and each
such host is named once in the log, so that a forgotten `--intercept` shows where the
bytes went. A TLS client that refuses the pod CA's certificate is remembered by its
ClientHello, as on the lean path, and tunnelled from its next connection on
(`sidecar.wire.rejections`).
"""

from __future__ import annotations

import logging

from mitmproxy import http, tls
from mitmproxy.connection import Client
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layer import NextLayer
from mitmproxy.proxy.layers import TCPLayer
from mitmproxy.proxy.mode_specs import RegularMode

from sidecar.cache import policy
from sidecar.mitm.respond import Connections
from sidecar.proxy.router import Router
from sidecar.proxy.upgrade import UPGRADE
from sidecar.settings import Settings, host_matches
from sidecar.wire import hello
from sidecar.wire.exchange import ClientGone, Request, asks_upgrade
from sidecar.wire.framing import request_head_error
from sidecar.wire.rejections import (
    CLIENT_REJECTED_CA,
    CLOSED_IN_HANDSHAKE,
    Rejections,
    alert_refusal,
)
from sidecar.wire.tunnel import NOT_INTERCEPTED, Tunnels

logger = logging.getLogger(__name__)

# How mitmproxy's client TLS layer words a client that closed the connection during its
# handshake, after its ClientHello (`ClientTLSLayer.on_handshake_error`, in the pinned
# release); a certificate alert keeps OpenSSL's reason in its words.
_CLOSED_IN_HANDSHAKE = "The client disconnected during the handshake."


def handshake_refusal(error: str) -> str | None:
    """How the client refused our certificate, for a client handshake that mitmproxy
    failed with `error` (its `Connection.error`); None for any other failure."""
    if error.startswith(_CLOSED_IN_HANDSHAKE):
        return CLOSED_IN_HANDSHAKE
    return alert_refusal(error)


class BurstBuffer:
    """The addon. Built once by the entry point with the program's Settings."""

    def __init__(
        self,
        settings: Settings,
        router: Router,
        connections: Connections,
        tunnels: Tunnels,
        rejections: Rejections,
    ) -> None:
        self.settings = settings
        self.router = router
        self.connections = connections
        self.tunnels = tunnels
        self.rejections = rejections
        # Client connections in their TLS handshake: (host, ClientHello records).
        self._hellos: dict[str, tuple[str, bytes]] = {}

    def tls_established_client(self, data: tls.TlsData) -> None:
        self._hellos.pop(data.conn.id, None)
        self.connections.tls_established(data.conn.id, data.ssl_conn)

    def tls_failed_client(self, data: tls.TlsData) -> None:
        seen = self._hellos.pop(data.conn.id, None)
        refusal = handshake_refusal(data.conn.error or "")
        if seen is not None and refusal is not None:
            self.rejections.remember(*seen, refusal)

    def client_disconnected(self, client: Client) -> None:
        self._hellos.pop(client.id, None)
        self.connections.forget(client.id)

    def next_layer(self, data: NextLayer) -> None:
        # Runs after mitmproxy's own next_layer addon: an ignored connection (its host
        # is not intercepted) becomes a TCP layer without a flow, a tunnel.
        layer = data.layer
        if not isinstance(layer, TCPLayer) or layer.flow is not None:
            return
        self._tunnelled(data.context, NOT_INTERCEPTED)

    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        if data.ignore_connection:
            return
        reason = hello.tunnel_reason(data.client_hello.alpn_protocols)
        if reason is None:
            host, records = _host(data.context), data.client_hello.raw_bytes()
            if not self.rejections.remembers(host, records):
                self._hellos[data.context.client.id] = (host, records)
                return
            reason = CLIENT_REJECTED_CA
        # mitmproxy relays it as a TCP layer of its own, without a next_layer event.
        data.ignore_connection = True
        self._tunnelled(data.context, reason)

    def _tunnelled(self, context: Context, reason: str) -> None:
        counters = self.tunnels.opened(_host(context), reason)
        self.connections.tunnelled(context.client.id, counters)

    async def responseheaders(self, flow: http.HTTPFlow) -> None:
        # Only what mitmproxy relays itself gets here. It streams, no body is ever
        # held whole, and its bytes are counted as they pass.
        response = flow.response
        if response is None:
            return
        response.stream = self._from_upstream
        request = flow.request
        if host_matches(request.pretty_host, self.settings.intercept):
            # A write: what it made stale is forgotten before the client sees the answer.
            await self.router.invalidate(
                request.method, request.url, response.status_code, response.headers
            )

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        # mitmproxy parses more than RFC 9112 allows; the lean front end refuses these
        # requests, and so does this one, before any byte of them goes anywhere.
        request = flow.request
        if request.authority:
            target = f"{request.scheme}://{request.authority}{request.path}"
        elif isinstance(flow.client_conn.proxy_mode, RegularMode) and not flow.client_conn.tls:
            # A plain proxy request: its target was absolute-form (mitmproxy has made it
            # origin-form already, keeping the host and port it named).
            target = f"{request.scheme}://{request.host}:{request.port}{request.path}"
        else:
            # Origin-form, inside a tunnel: the tunnel names the origin, whatever Host
            # says.
            target = request.path
        transfer_encoding = request.headers.get_all("Transfer-Encoding")
        refusal = request_head_error(
            request.http_version.removeprefix("HTTP/"),
            request.headers.get_all("Host"),
            target,
            ", ".join(transfer_encoding) if transfer_encoding else None,
        )
        if refusal is None:
            return
        status, reason = refusal
        logger.info("refused a request to %s: %s", request.pretty_host, reason)
        flow.response = http.Response.make(
            status,
            f"burstbuffer: {reason}\n",
            {"Content-Type": "text/plain; charset=utf-8", "Connection": "close"},
        )

    def _from_upstream(self, chunk: bytes) -> bytes:
        self.router.metrics.counters.bytes_from_upstream += len(chunk)
        return chunk

    def error(self, flow: http.HTTPFlow) -> None:
        if flow.metadata.get(_RELAYED):
            self.router.metrics.counters.upstream_errors += 1

    async def request(self, flow: http.HTTPFlow) -> None:
        request = flow.request
        if flow.response is not None:
            return
        if not host_matches(request.pretty_host, self.settings.intercept):
            self._relayed(flow, NOT_INTERCEPTED)
            return
        if asks_upgrade(request.headers):
            self._relayed(flow, UPGRADE)
            return
        verdict = policy.request_may_hit(request.method, request.headers)
        if not verdict.cacheable:
            self._relayed(flow, verdict.reason)
            return
        try:
            channel = self.connections.channel(flow)
        except ClientGone:
            return
        await self.router.handle(
            Request(
                request.method,
                request.url,
                tuple(request.headers.items(multi=True)),
                request.http_version,
            ),
            channel,
        )

    def _relayed(self, flow: http.HTTPFlow, reason: str) -> None:
        """mitmproxy relays this request itself: a pass, counted with its reason."""
        self.router.metrics.count_pass(reason)
        flow.metadata[_RELAYED] = True


_RELAYED = "burstbuffer.relayed"


def _host(context: Context) -> str:
    """The host a client connection is for: its SNI, else its origin's address."""
    address = context.server.address
    return context.client.sni or (str(address[0]) if address else "unknown")
