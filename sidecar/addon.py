"""The mitmproxy addon: the router's front end for connections mitmproxy terminates.

Intercepted CONNECT tunnels are served by the lean front end (`sidecar.http1`);
mitmproxy terminates the rest: plain-HTTP proxy requests and the hostAliases and
transparent listeners (TLS with the pod CA's leaf certificates, request parsing,
tunnels for hosts that are not intercepted). For a GET or HEAD to an intercepted host
this addon hands the request to the router in the `request` hook itself; everything
else (other methods, `If-Match`) is left to mitmproxy, which streams it through
without buffering bodies.
"""

from __future__ import annotations

from mitmproxy import http, tls
from mitmproxy.connection import Client

from sidecar import policy
from sidecar.exchange import ClientGone, Request
from sidecar.respond import Connections
from sidecar.router import Router
from sidecar.settings import Settings, host_matches


class BurstBuffer:
    """The addon. Built once by the entry point with the program's Settings."""

    def __init__(self, settings: Settings, router: Router, connections: Connections) -> None:
        self.settings = settings
        self.router = router
        self.connections = connections

    def tls_established_client(self, data: tls.TlsData) -> None:
        self.connections.tls_established(data.conn.id, data.ssl_conn)

    def client_disconnected(self, client: Client) -> None:
        self.connections.forget(client.id)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        # Whatever mitmproxy relays itself streams: no body is ever held whole.
        if flow.response is not None and not flow.response.stream:
            flow.response.stream = True

    async def request(self, flow: http.HTTPFlow) -> None:
        request = flow.request
        if flow.response is not None:
            return
        if not host_matches(request.pretty_host, self.settings.intercept):
            return
        if not policy.request_may_hit(request.method, request.headers).cacheable:
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
