"""The `hostAliases` capture: dataset hosts mapped to the sidecar in the pod's /etc/hosts.

Nezha's mode. The kubelet writes `spec.hostAliases` into every container's /etc/hosts, so
a client that resolves a dataset host gets 127.0.0.1, where the sidecar listens on 443
(TLS, routed by SNI) and 80 (routed by Host). The sidecar resolves origins through DNS
only, never through that shared hosts file.

A hosts file holds names, not patterns: only the exact names among the intercepted
globs can be mapped, plus the known CDN names that downloads of those hosts are
redirected to (when a glob covers them). Every other glob is skipped, and said so. A
name the pod maps itself keeps the pod's address: the sidecar could not follow it there
(it ignores /etc/hosts), so it is left alone, with a warning.

Binding 80 and 443 as the sidecar's non-root user needs the pod-scoped safe sysctl
`net.ipv4.ip_unprivileged_port_start`, which keeps the sidecar's capabilities dropped
(NET_BIND_SERVICE would add one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from injector.settings import HOSTALIASES_PORTS
from sidecar.settings import host_matches

LOOPBACK = "127.0.0.1"
UNPRIVILEGED_PORT_START = "net.ipv4.ip_unprivileged_port_start"
LOWEST_PORT = min(HOSTALIASES_PORTS)

# Hosts that downloads from the default dataset hosts are redirected to (Hugging Face's
# LFS and Xet CDNs), which their globs cover but a hosts file cannot.
KNOWN_REDIRECT_HOSTS = (
    "cdn-lfs.huggingface.co",
    "cdn-lfs-us-1.huggingface.co",
    "cdn-lfs.hf.co",
    "cdn-lfs-us-1.hf.co",
    "cas-bridge.xethub.hf.co",
)


@dataclass(frozen=True)
class HostMapping:
    """The pod's new hostAliases, and what could not be mapped."""

    host_aliases: list[dict[str, Any]]
    # The names mapped to the sidecar.
    mapped: tuple[str, ...]
    # Globs (and names the pod maps itself) that stay outside this capture.
    skipped: tuple[str, ...]
    warnings: tuple[str, ...]


def exact_names(patterns: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(names a hosts file can hold, globs it cannot) of the intercepted patterns."""
    patterns = tuple(patterns)
    names = [p for p in patterns if "*" not in p]
    globs = tuple(p for p in patterns if "*" in p)
    names += [h for h in KNOWN_REDIRECT_HOSTS if host_matches(h, globs)]
    return tuple(dict.fromkeys(names)), globs


def _is_ours(entry: Mapping[str, Any], names: Iterable[str]) -> bool:
    # An earlier pass's entry: the sidecar's address, and only names this capture maps.
    hostnames = entry.get("hostnames")
    return (
        entry.get("ip") == LOOPBACK and isinstance(hostnames, list) and set(hostnames) <= set(names)
    )


def map_hosts(existing: object, patterns: Iterable[str]) -> HostMapping:
    """The pod's hostAliases with the dataset names mapped to the sidecar, appended last."""
    names, globs = exact_names(patterns)
    entries = [e for e in existing if isinstance(e, Mapping)] if isinstance(existing, list) else []
    own = [dict(e) for e in entries if not _is_ours(e, names)]
    pods = {str(h) for e in own for h in e.get("hostnames") or []}
    mapped = tuple(n for n in names if n not in pods)
    kept = tuple(n for n in names if n in pods)
    warnings = [
        f"hostAliases: the pod maps {name} itself; its downloads bypass the sidecar"
        for name in kept
    ]
    if mapped:
        own.append({"ip": LOOPBACK, "hostnames": list(mapped)})
    return HostMapping(own, mapped, (*globs, *kept), tuple(warnings))


def with_port_sysctl(security_context: object) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The pod securityContext with unprivileged ports starting at 80 or lower."""
    context = dict(security_context) if isinstance(security_context, Mapping) else {}
    sysctls = [dict(s) for s in context.get("sysctls") or [] if isinstance(s, Mapping)]
    ours = {"name": UNPRIVILEGED_PORT_START, "value": str(LOWEST_PORT)}
    warnings: tuple[str, ...] = ()
    for i, sysctl in enumerate(sysctls):
        if sysctl.get("name") != UNPRIVILEGED_PORT_START:
            continue
        value = str(sysctl.get("value", ""))
        if value.isdigit() and int(value) <= LOWEST_PORT:
            break
        warnings = (
            f"securityContext.sysctls: {UNPRIVILEGED_PORT_START}={value} is lowered to "
            f"{LOWEST_PORT}, so that the sidecar can listen on ports 80 and 443",
        )
        sysctls[i] = ours
        break
    else:
        sysctls.append(ours)
    context["sysctls"] = sysctls
    return context, warnings
