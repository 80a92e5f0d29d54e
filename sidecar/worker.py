"""One worker process: the proxy itself, on listening sockets its parent made.

    python -m sidecar.worker --index N --listeners FD,... --keeper FD --shared FD \\
        -- <the sidecar's own flags>

The parent (`sidecar.__main__`) starts these; nobody else should. A worker parses the
same flags as its parent, so both hold the same Settings, and inherits from it: the
listening sockets (shared by every worker), one end of its channel to the keeper,
and the shared memory (`sidecar.shared`). It serves until SIGTERM, or
until its parent is gone.

mitmproxy runs embedded with only the addons a cache needs (its default set costs
about half of the CPU per small request in event dispatch), and two defaults changed
on purpose:

- `connection_strategy=lazy`: with the default `eager`, every CONNECT opens an
  origin connection, so a hit would cost one and would fail when the origin is down.
- `http2=false` towards clients: the fast response path speaks HTTP/1.1, the
  dataset clients that matter (wget, curl, urllib, requests) all do.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from collections.abc import Sequence

from mitmproxy.addons import core, errorcheck, next_layer, proxyserver, tlsconfig
from mitmproxy.master import Master

from certs import bundle
from certs.ca import load_or_create_ca
from certs.leaf import ServerContexts
from sidecar import capture, ipc, logs, respond
from sidecar.addon import BurstBuffer
from sidecar.fill import Fills
from sidecar.front import Balance, Front
from sidecar.ipc import Message
from sidecar.keeper import Buffer
from sidecar.listeners import listeners
from sidecar.metrics import Metrics
from sidecar.router import Router
from sidecar.settings import Settings, host_glob_regex, parse
from sidecar.shared import Shared
from sidecar.stagein import Progress as StageProgress
from sidecar.stagein import StageIn, StageInError
from sidecar.store import Index, StoreError
from sidecar.upstream import Upstream
from sidecar.workers import Inherited

logger = logging.getLogger("sidecar.worker")

# Allocations between two collections of the youngest generation (Python's default: 2000).
GC_THRESHOLD = 50_000


def allow_hosts(globs: Sequence[str]) -> list[str]:
    """mitmproxy `allow_hosts` patterns (matched against `host:port`) for host globs."""
    return [rf"^(?:{host_glob_regex(glob)}):\d+$" for glob in globs]


async def run(settings: Settings, inherited: Inherited) -> None:
    started = asyncio.Event()
    metrics = Metrics()
    stage_in: StageIn | None = None

    async def from_parent(message: Message) -> Message | None:
        if message["op"] == "start":
            started.set()
            return None
        if message["op"] != "stats":
            raise ValueError(f"unknown operation {message['op']!r}")
        progress = stage_in.progress if stage_in is not None else StageProgress()
        return {"counters": metrics.snapshot(), "gauges": progress.gauges()}

    keeper = ipc.Channel(inherited.keeper, from_parent)
    channel_task = asyncio.create_task(keeper.run())
    # The main process says when the CA, the trust files and the buffer are ready.
    waits = [asyncio.create_task(started.wait()), asyncio.create_task(keeper.wait_closed())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for wait in waits:
        wait.cancel()
    if not started.is_set():
        return
    ca = load_or_create_ca(settings.ca_dir)
    index = Index(settings.buffer_dir)
    try:
        index.open()
    except StoreError as e:
        logger.error("%s; serving everything from upstream", e)
    resolver = capture.dns_resolver(settings)
    upstream = Upstream(
        settings.ca_dir / bundle.UPSTREAM_TRUST_FILE,
        settings.upstream_proxy,
        settings.upstream_timeout,
        capture.HostsFileBypass(resolver) if resolver else None,
    )
    await upstream.open()
    shared = Shared(inherited.shared.fd)
    buffer = Buffer(index, keeper, shared, track_recency=settings.eviction == "lru")
    fills = Fills(buffer, upstream, metrics, settings.parallel_fetch)
    router = Router(settings, buffer, fills, upstream, metrics)
    if settings.stage_in and inherited.index == 0:
        stage_in = StageIn(
            settings.stage_in,
            settings.intercept,
            settings.stage_in_parallel,
            buffer,
            fills,
            upstream,
        )

    master = Master(None)
    ps = proxyserver.Proxyserver()
    master.addons.add(
        core.Core(),
        ps,
        next_layer.NextLayer(),
        tlsconfig.TlsConfig(),
        errorcheck.ErrorCheck(),
        capture.HostRouting(settings, resolver),
        BurstBuffer(settings, router, respond.Connections(ps)),
    )
    found = listeners(settings)
    master.options.update(
        confdir=str(settings.ca_dir),
        connection_strategy="lazy",
        http2=False,
        allow_hosts=allow_hosts(settings.intercept),
        ssl_verify_upstream_trusted_ca=str(settings.ca_dir / bundle.UPSTREAM_TRUST_FILE),
        mode=[listener.mode for listener in found],
        # The front end accepts every connection and hands mitmproxy its share.
        server=False,
        # What mitmproxy relays itself (non-GET, HEAD misses) streams past 1 MiB.
        stream_large_bodies="1m",
    )
    handoff = respond.Handoff(ps, [listener.mode for listener in found])
    balance = Balance(shared.connections, inherited.index)
    front = Front(router, settings.intercept, ServerContexts(ca).get, handoff.handle, balance)
    sockets = inherited.listeners
    tasks = [
        asyncio.create_task(front.accept(number, sock, listener.lean))
        for number, (listener, sock) in enumerate(zip(found, sockets, strict=True))
    ]
    tasks.append(asyncio.create_task(_report_ready(ps, keeper)))
    tasks.append(asyncio.create_task(_stop_when_parent_gone(keeper, master)))
    if stage_in is not None:
        tasks.append(asyncio.create_task(_stage(stage_in)))
    # What was built so far lives as long as the process: keep the garbage collector
    # from scanning it again and again, and let it run less often (a hit allocates a
    # few dozen objects and creates no reference cycles).
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, master.shutdown)
    try:
        await master.run()
    finally:
        for task in tasks:
            task.cancel()
        await front.close()
        await fills.close()
        await upstream.close()
        channel_task.cancel()
        index.close()


async def _report_ready(ps: proxyserver.Proxyserver, keeper: ipc.Channel) -> None:
    while not ps.is_running:
        await asyncio.sleep(0.005)
    keeper.notify("ready")


async def _stop_when_parent_gone(keeper: ipc.Channel, master: Master) -> None:
    await keeper.wait_closed()
    logger.warning("the sidecar's main process is gone; stopping")
    master.shutdown()


async def _stage(stage_in: StageIn) -> None:
    try:
        await stage_in.run()
    except StageInError as e:
        logger.error("stage-in: %s", e)


def main(inherited: Inherited) -> None:
    """Run one worker with what the main process handed it (`sidecar.workers`)."""
    settings = parse(inherited.argv, os.environ)
    logs.configure(f"w{inherited.index}")
    try:
        asyncio.run(run(settings, inherited))
    except KeyboardInterrupt:
        pass
