"""How app traffic reaches the proxy, besides the proxy variables (`proxy-env`).

- `hostAliases` (Nezha's mode): the injector maps each dataset host to 127.0.0.1 in the
  pod's /etc/hosts, and the sidecar also listens on 127.0.0.1:443 and :80, routing
  each connection by its TLS SNI or HTTP Host. The sidecar shares that hosts file, so
  it resolves origins through DNS itself, never through /etc/hosts (which would send
  it back to itself until it runs out of file descriptors).
- `transparent`: an init container redirects the pod's outbound 80/443 (every UID but
  the sidecar's) to a transparent listener; mitmproxy reads each connection's original
  destination, and the TLS SNI or HTTP Host names the host.

In both, a connection whose SNI is not an intercepted host is tunnelled untouched.
"""

from __future__ import annotations

import logging
import socket

from aiohttp.abc import AbstractResolver, ResolveResult
from mitmproxy import http, tls
from mitmproxy.proxy import server_hooks
from mitmproxy.proxy.mode_specs import ReverseMode, TransparentMode
from mitmproxy_rs.dns import DnsResolver

from sidecar.listeners import HOSTALIASES_TLS_PORT, PLACEHOLDER
from sidecar.settings import Settings, host_matches

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
        if _is_ip(host):
            return
        if data.server.sni is None:
            data.server.sni = host
        addresses = await _lookup(self._resolver, host)
        data.server.address = (addresses[0], port)


class HostsFileBypass(AbstractResolver):
    """aiohttp name resolution through DNS only, never /etc/hosts (see the module doc)."""

    def __init__(self, resolver: DnsResolver) -> None:
        self._resolver = resolver

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if _is_ip(host):
            addresses = [host]
        else:
            addresses = await _lookup(self._resolver, host)
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in addresses
        ]

    async def close(self) -> None:
        return None


def dns_resolver(settings: Settings) -> DnsResolver | None:
    """A hosts-file-free resolver when the capture needs one (hostAliases), else None."""
    if settings.capture != "hostAliases":
        return None
    return DnsResolver(use_hosts_file=False)


async def _lookup(resolver: DnsResolver, host: str) -> list[str]:
    addresses: list[str] = await resolver.lookup_ip(host)
    # Prefer IPv4: pods are IPv4 first, and the test namespaces only have IPv4.
    return sorted(addresses, key=lambda address: ":" in address)


def _is_ip(host: str) -> bool:
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
            return True
        except OSError:
            continue
    return False
