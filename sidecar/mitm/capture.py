"""Where mitmproxy connects under the `hostAliases` capture.

The injector maps each dataset host to 127.0.0.1 in the pod's /etc/hosts, which the
sidecar shares. Every captured connection is the core's (`sidecar.proxy.front`), whose
origin pool resolves names through DNS itself (`sidecar.origins.resolve`); what the
front end hands mitmproxy (on the forward proxy) must not follow the hosts file either,
or a request it forwards would come back to the sidecar.
"""

from __future__ import annotations

from mitmproxy.proxy import server_hooks
from mitmproxy_rs.dns import DnsResolver

from sidecar.origins.resolve import lookup
from sidecar.wire.client import is_ip


class Resolution:
    """The mitmproxy addon that resolves the origins it connects to through DNS."""

    def __init__(self, resolver: DnsResolver | None) -> None:
        self._resolver = resolver

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
