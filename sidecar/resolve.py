"""Name resolution for origins when the pod's /etc/hosts points them at the sidecar.

With the `hostAliases` capture the injector maps each dataset host to 127.0.0.1 in the
pod's hosts file, which the sidecar shares: it must resolve origins through DNS
itself, never through /etc/hosts (which would send it back to itself until it runs
out of file descriptors).
"""

from __future__ import annotations

import socket

from aiohttp.abc import AbstractResolver, ResolveResult
from mitmproxy_rs.dns import DnsResolver

from sidecar.settings import Settings


class HostsFileBypass(AbstractResolver):
    """aiohttp name resolution through DNS only, never /etc/hosts (see the module doc)."""

    def __init__(self, resolver: DnsResolver) -> None:
        self._resolver = resolver

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if is_ip(host):
            addresses = [host]
        else:
            addresses = await lookup(self._resolver, host)
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


async def lookup(resolver: DnsResolver, host: str) -> list[str]:
    addresses: list[str] = await resolver.lookup_ip(host)
    # Prefer IPv4: pods are IPv4 first, and the test namespaces only have IPv4.
    return sorted(addresses, key=lambda address: ":" in address)


def is_ip(host: str) -> bool:
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
            return True
        except OSError:
            continue
    return False
