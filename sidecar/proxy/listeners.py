"""The sidecar's listening addresses, by capture mode, and their sockets.

The main process binds them once, before anything else (a port in use is reported
at once), and every worker inherits them. Each says how its clients name their origin
(`Entrance`); the forward proxy's comes with the mitmproxy mode that serves what the
lean front end does not take.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Literal

from sidecar.settings import Settings

HOSTALIASES_TLS_PORT = 443
HOSTALIASES_HTTP_PORT = 80
# A new connection wakes a worker once its first bytes have come, or after this long
# without any (TCP_DEFER_ACCEPT, nginx's `deferred`). Every client of ours speaks first,
# and a worker woken by the handshake alone finds most requests not there yet: a
# plain-HTTP client then takes the arrival's path in Python instead of the core's door.
DEFER_ACCEPT = 1  # seconds


# How a listener's clients name the origin they want: a forward proxy's by CONNECT or
# an absolute-form target; hostAliases' by the TLS SNI (:443) or the Host (:80); the
# transparent listener's by the original destination, then the SNI or the Host.
Entrance = Literal["forward", "hostAliases-tls", "hostAliases-http", "transparent"]


@dataclass(frozen=True)
class Listener:
    """One listening address of the sidecar and the mitmproxy mode that serves what the
    lean front end hands it (None: it hands it nothing)."""

    mode: str | None  # a mitmproxy mode spec
    host: str
    port: int
    entrance: Entrance


def listeners(settings: Settings) -> list[Listener]:
    """The forward proxy, plus the capture's own listeners."""
    forward = f"upstream:{settings.upstream_proxy}" if settings.upstream_proxy else "regular"
    found = [
        Listener(
            f"{forward}@{settings.listen_host}:{settings.listen_port}",
            settings.listen_host,
            settings.listen_port,
            "forward",
        )
    ]
    # Every captured connection is the core's (`sidecar.proxy.front`): it names its
    # origin, or it is relayed untouched or closed.
    if settings.capture == "hostAliases":
        found.append(Listener(None, "127.0.0.1", HOSTALIASES_TLS_PORT, "hostAliases-tls"))
        found.append(Listener(None, "127.0.0.1", HOSTALIASES_HTTP_PORT, "hostAliases-http"))
    elif settings.capture == "transparent":
        found.append(Listener(None, "127.0.0.1", settings.transparent_port, "transparent"))
    return found


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket for host:port, to be shared by every worker."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, DEFER_ACCEPT)
        # Nagle's delay off, so that a response leaves as soon as it is written: set here,
        # every accepted socket has it from its listener, without a system call of its own.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
