"""The mitmproxy addon: the router's front end for connections mitmproxy terminates.

Intercepted CONNECT tunnels are served by the lean front end (`sidecar.http1`);
mitmproxy terminates the rest: plain-HTTP proxy requests and the hostAliases and
transparent listeners (TLS with the pod CA's leaf certificates, request parsing,
tunnels for hosts that are not intercepted). For a GET or HEAD to an intercepted host
this addon hands the request to the router in the `request` hook itself; everything
else (other methods, hosts that are not intercepted) is left to mitmproxy,
which streams it through without buffering bodies, and is counted here as a pass with
its reason. Connections mitmproxy tunnels untouched (hosts that are not intercepted)
are counted with their bytes, and each such host is named once in the log, so that a
forgotten `--intercept` shows where the bytes went.
"""

from __future__ import annotations

import logging

from mitmproxy import http, tls
from mitmproxy.connection import Client
from mitmproxy.proxy.layer import NextLayer
from mitmproxy.proxy.layers import TCPLayer

from sidecar import policy
from sidecar.exchange import ClientGone, Request
from sidecar.respond import Connections
from sidecar.router import Router
from sidecar.settings import Settings, host_matches

logger = logging.getLogger(__name__)

# Hosts named in the log as not intercepted, at most (a client may tunnel to thousands).
MAX_NAMED_HOSTS = 1000
# The pass reason of a plain-HTTP request to a host that is not intercepted.
NOT_INTERCEPTED = "not-intercepted"


class BurstBuffer:
    """The addon. Built once by the entry point with the program's Settings."""

    def __init__(self, settings: Settings, router: Router, connections: Connections) -> None:
        self.settings = settings
        self.router = router
        self.connections = connections
        self._named_hosts: set[str] = set()

    def tls_established_client(self, data: tls.TlsData) -> None:
        self.connections.tls_established(data.conn.id, data.ssl_conn)

    def client_disconnected(self, client: Client) -> None:
        self.connections.forget(client.id)

    def next_layer(self, data: NextLayer) -> None:
        # Runs after mitmproxy's own next_layer addon: an ignored connection (its host
        # is not intercepted) becomes a TCP layer without a flow, a tunnel.
        layer = data.layer
        if not isinstance(layer, TCPLayer) or layer.flow is not None:
            return
        context = data.context
        counters = self.router.metrics.counters
        counters.tunnelled_connections += 1
        self.connections.tunnelled(context.client.id, counters)
        address = context.server.address
        host = context.client.sni or (str(address[0]) if address else "unknown")
        if host not in self._named_hosts and len(self._named_hosts) < MAX_NAMED_HOSTS:
            self._named_hosts.add(host)
            logger.info("not intercepted: %s; add it to --intercept to cache it", host)

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
