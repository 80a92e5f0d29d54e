"""How app traffic reaches the proxy, besides the proxy variables (`proxy-env`).

- `hostAliases` (Nezha's mode): the injector maps each dataset host to 127.0.0.1 in the
  pod's /etc/hosts, and the sidecar also listens on 127.0.0.1:443 and :80, routing
  each connection by its TLS SNI or HTTP Host. The sidecar shares that hosts file, so
  it resolves origins through DNS itself (`sidecar.origins.resolve`).
- `transparent`: an init container redirects the pod's outbound 80/443 (every UID but
  the sidecar's) to a transparent listener; mitmproxy reads each connection's original
  destination, and the TLS SNI or HTTP Host names the host.

In both, a connection whose SNI is not an intercepted host is tunnelled untouched, and
so is one whose ALPN list lacks HTTP/1.x (`sidecar.mitm.addon`, after `HostRouting` named
its origin).
"""

from __future__ import annotations

import logging

from mitmproxy import http, tls
from mitmproxy.proxy import server_hooks
from mitmproxy.proxy.mode_specs import ReverseMode, TransparentMode
from mitmproxy_rs.dns import DnsResolver

from sidecar.origins.resolve import lookup
from sidecar.proxy.listeners import HOSTALIASES_TLS_PORT, PLACEHOLDER
from sidecar.settings import Settings, host_matches
from sidecar.wire.client import is_ip

logger = logging.getLogger(__name__)


def _captured(mode: object) -> bool:
    return isinstance(mode, TransparentMode) or (
        isinstance(mode, ReverseMode) and mode.address[0] == PLACEHOLDER
    )


class HostRouting:
    """The mitmproxy addon that gives captured connections their real destination."""

    def __init__(self, settings: Settings, resolver: DnsResolver | None) -> None:
        self._intercept = settings.intercept
        self._resolver = resolver

    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        context = data.context
        if not _captured(context.client.proxy_mode):
            return
        sni = data.client_hello.sni
        if not sni:
            logger.warning("captured TLS connection without SNI: tunnelled untouched")
            data.ignore_connection = True
            return
        port = context.server.address[1] if context.server.address else HOSTALIASES_TLS_PORT
        if isinstance(context.client.proxy_mode, ReverseMode):
            port = HOSTALIASES_TLS_PORT
        context.server.address = (sni, port)
        context.server.sni = sni
        if not host_matches(sni, self._intercept):
            data.ignore_connection = True

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if not _captured(flow.client_conn.proxy_mode):
            return
        # Name the request by its Host header (the address may be ours or an IP).
        host = flow.request.host_header
        if host:
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if name != flow.request.host:
                flow.request.host = name

    async def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        if self._resolver is None or data.server.address is None:
            return
        host, port = data.server.address[:2]
        if is_ip(host):
            return
        if data.server.sni is None:
            data.server.sni = host
        addresses = await lookup(self._resolver, host)
        data.server.address = (addresses[0], port)
