"""Name resolution for origins when the pod's /etc/hosts points them at the sidecar.

With the `hostAliases` capture the injector maps each dataset host to 127.0.0.1 in the
pod's hosts file, which the sidecar shares: it must resolve origins through DNS
itself, never through /etc/hosts (which would send it back to itself until it runs
out of file descriptors).
"""

from __future__ import annotations

from mitmproxy_rs.dns import DnsResolver

from sidecar.settings import Settings


def dns_resolver(settings: Settings) -> DnsResolver | None:
    """A hosts-file-free resolver when the capture needs one (hostAliases), else None."""
    if settings.capture != "hostAliases":
        return None
    return DnsResolver(use_hosts_file=False)


async def lookup(resolver: DnsResolver, host: str) -> list[str]:
    addresses: list[str] = await resolver.lookup_ip(host)
    # Prefer IPv4: pods are IPv4 first, and the test namespaces only have IPv4.
    return sorted(addresses, key=lambda address: ":" in address)
