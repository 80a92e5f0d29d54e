"""mitmproxy inside a worker: what the lean front end hands over, served by an embedded
`Master` with only the addons a cache needs.

The lean path (`sidecar.proxy.front`, `sidecar.wire.server`) serves every entrance: the
forward proxy's CONNECTs and absolute-form requests, the hostAliases and transparent
listeners. mitmproxy answers what the forward proxy's front end cannot read as either
(an origin-form request sent to the proxy itself, bytes that are not HTTP), as a proxy
does. A worker reports ready before it loads this module (mitmproxy takes about a third
of a second to import), so connections handed over meanwhile wait for
`Embedded.start()`.

Two of mitmproxy's defaults are changed on purpose:

- `connection_strategy=lazy`: with the default `eager`, every CONNECT opens an
  origin connection, so a hit would cost one and would fail when the origin is down.
- `http2=false` towards clients: the fast response path speaks HTTP/1.1, the
  dataset clients that matter (wget, curl, urllib, requests) all do.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Sequence

from mitmproxy import log
from mitmproxy.addons import core, errorcheck, next_layer, proxyserver, tlsconfig
from mitmproxy.master import Master
from mitmproxy_rs.dns import DnsResolver

from certs import bundle
from sidecar.mitm import capture, respond
from sidecar.mitm.addon import BurstBuffer
from sidecar.mitm.handoff import Handoff
from sidecar.proxy.listeners import Listener
from sidecar.proxy.router import Router
from sidecar.settings import Settings, host_glob_regex
from sidecar.wire.rejections import Rejections
from sidecar.wire.tunnel import Tunnels


def allow_hosts(globs: Sequence[str]) -> list[str]:
    """mitmproxy `allow_hosts` patterns (matched against `host:port`) for host globs."""
    return [rf"^(?:{host_glob_regex(glob)}):\d+$" for glob in globs]


def forgo_log_hook() -> None:
    """Take mitmproxy's `LegacyLogEvents` handler off the root logger. A `Master` installs
    it to hand every log record to its addons' deprecated `add_log` hook: a record
    formatted once more, a wakeup of the event loop and a turn over every addon, for each
    line the worker logs (a pass logs one: this was a third of the Python calls of its
    answer). No addon here has that hook; they log through `logging`."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, log.LegacyLogEvents):
            handler.uninstall()


class Embedded:
    """One worker's mitmproxy, serving the connections the front end hands it."""

    def __init__(
        self,
        settings: Settings,
        router: Router,
        resolver: DnsResolver | None,
        listeners: Sequence[Listener],
        tunnels: Tunnels,
        rejections: Rejections,
    ) -> None:
        self._master = Master(None)
        forgo_log_hook()
        # By listener number: those that hand mitmproxy anything (the forward proxy).
        modes = {n: listener.mode for n, listener in enumerate(listeners) if listener.mode}
        ps = proxyserver.Proxyserver()
        self._master.addons.add(
            core.Core(),
            ps,
            next_layer.NextLayer(),
            tlsconfig.TlsConfig(),
            errorcheck.ErrorCheck(),
            capture.Resolution(resolver),
            BurstBuffer(settings, router, respond.Connections(ps), tunnels, rejections),
        )
        self._master.options.update(
            confdir=str(settings.ca_dir),
            connection_strategy="lazy",
            http2=False,
            allow_hosts=allow_hosts(settings.intercept),
            ssl_verify_upstream_trusted_ca=str(settings.ca_dir / bundle.UPSTREAM_TRUST_FILE),
            mode=list(modes.values()),
            # The front end accepts every connection and hands mitmproxy its share.
            server=False,
            # What mitmproxy relays itself (non-GET, HEAD misses) streams past 1 MiB.
            stream_large_bodies="1m",
        )
        self._proxyserver = ps
        self._handoff = Handoff(ps, modes)
        self._running: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Run the master until `stop()`; return once it serves."""
        self._running = asyncio.create_task(self._master.run())
        while not self._proxyserver.is_running:
            if self._running.done():
                self._running.result()  # raises what stopped it
                raise RuntimeError("mitmproxy stopped while starting")
            await asyncio.sleep(0.005)

    async def handle(self, listener: int, sock: socket.socket) -> None:
        """Serve one connection the front end accepted on listener number `listener`."""
        await self._handoff.handle(listener, sock)

    async def stop(self) -> None:
        if self._running is not None:
            self._master.shutdown()
            await self._running
