"""One worker process: the proxy itself, on listening sockets its parent made.

The parent (`sidecar.runtime.supervisor`) starts these from its fork server; nobody else should.
A worker parses the same flags as its parent, so both hold the same Settings, and
inherits from it: the listening sockets (shared by every worker), one end of its
channel to the keeper, and the shared memory (`sidecar.shared`). It serves until
SIGTERM, or until its parent is gone.

It is ready as soon as the lean path serves (`sidecar.proxy.front`: every CONNECT to an
intercepted host); mitmproxy, which serves the rest, is loaded right after
(`sidecar.mitm.embedded`), and what is handed to it meanwhile waits for it.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import importlib
import logging
import os
import signal
import socket
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import uvloop

from certs import bundle
from certs.ca import load_or_create_ca
from certs.leaf import ServerContexts
from sidecar import ipc, logs
from sidecar.buffer.claims import Claims
from sidecar.buffer.fill import Fills
from sidecar.buffer.keeper import TOUCH_INTERVAL, Buffer
from sidecar.buffer.stagein import StageIn, StageInCounts, StageInError
from sidecar.buffer.store import Index, StoreError, bodies_dir
from sidecar.cache import policy
from sidecar.core import native
from sidecar.ipc import Message
from sidecar.metrics import Metrics
from sidecar.origins.parent import News, Parents
from sidecar.origins.resolve import dns_resolver, lookup
from sidecar.origins.upstream import Upstream
from sidecar.proxy.front import Balance, Front
from sidecar.proxy.listeners import listeners
from sidecar.proxy.router import Router
from sidecar.runtime.supervisor import Inherited
from sidecar.settings import Settings, parse
from sidecar.shared import Shared
from sidecar.wire.client import Pool
from sidecar.wire.rejections import Rejections
from sidecar.wire.tunnel import Tunnels

if TYPE_CHECKING:
    from sidecar.mitm.embedded import Embedded

logger = logging.getLogger("sidecar.runtime.worker")

# Allocations between two collections of the youngest generation (Python's default: 2000).
# A repeated hit leaves nothing behind, but a first hit leaves what the worker remembers of
# its object: with 50,000, each collection went through tens of thousands of such objects
# no longer in the CPU's caches (20–50 ms), and distinct hits spent 40% more time
# collecting than with 5,000, where what a collection goes through was just made.
GC_THRESHOLD = 5_000
# Seconds between two full collections: the reference cycles mitmproxy's connections
# leave would otherwise wait for a rare full collection, and memory would creep up.
GC_INTERVAL = 5.0


async def run(settings: Settings, inherited: Inherited) -> None:
    started = asyncio.Event()
    metrics = Metrics()
    stage_in: StageIn | None = None
    parents: Parents | None = None
    answers: native.Answers | None = None

    async def from_parent(message: Message) -> Message | None:
        if message["op"] == "start":
            started.set()
            return None
        if message["op"] == "parent":
            if parents is not None:
                parents.learn(message)
            return None
        if message["op"] != "stats":
            raise ValueError(f"unknown operation {message['op']!r}")
        progress = stage_in.progress if stage_in is not None else StageInCounts()
        return {"counters": _counters(metrics, answers), "gauges": progress.gauges()}

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
    resolver = dns_resolver(settings)
    resolve = functools.partial(lookup, resolver) if resolver else None
    pool = Pool(settings.upstream_timeout, resolve)
    parents = _parents(settings, metrics, pool, lambda news: keeper.notify("parent", **news))
    upstream = Upstream(
        settings.ca_dir / bundle.UPSTREAM_TRUST_FILE, settings.upstream_proxy, pool, parents
    )
    await upstream.open()
    shared = Shared(inherited.shared.fd)
    claims = Claims(shared)
    buffer = Buffer(
        index,
        keeper,
        shared,
        claims,
        inherited.index,
        track_recency=settings.eviction == "lru",
        uniform=policy.Uniform(settings.http_freshness),
    )
    fills = Fills(buffer, upstream, metrics, settings.parallel_fetch, settings.access_log)
    answers = shared.answers_table(
        settings.index_capacity,
        bodies_dir(settings.buffer_dir),
        policy.HIT_FIELDS,
        policy.KEYS,
        track_touches=settings.eviction == "lru",
    )
    router = Router(settings, buffer, fills, upstream, metrics, answers)
    if settings.stage_in and inherited.index == 0:
        stage_in = StageIn(
            settings.stage_in,
            settings.intercept,
            settings.stage_in_parallel,
            buffer,
            fills,
            upstream,
        )

    found = listeners(settings)
    mitmproxy_serving: asyncio.Future[Embedded] = asyncio.get_running_loop().create_future()

    async def to_mitmproxy(listener: int, sock: socket.socket) -> None:
        await (await asyncio.shield(mitmproxy_serving)).handle(listener, sock)

    balance = Balance(shared.connections, inherited.index)
    tunnels = Tunnels(metrics)
    rejections = Rejections(shared, settings.remember_ca_rejections, settings.trust_dir)
    front = Front(
        router,
        settings.intercept,
        ServerContexts(ca, native.TlsConfig).get,
        to_mitmproxy,
        balance,
        tunnels,
        rejections,
        router.answers,
    )
    tasks = [
        asyncio.create_task(front.accept(number, sock, listener.entrance))
        for number, (listener, sock) in enumerate(zip(found, inherited.listeners, strict=True))
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    tasks.append(asyncio.create_task(_stop_when_parent_gone(keeper, stop)))
    balance.started()
    keeper.notify("ready")
    if stage_in is not None:
        tasks.append(asyncio.create_task(_stage(stage_in)))
    if settings.eviction == "lru":
        tasks.append(asyncio.create_task(_report_uses(buffer, answers)))

    # mitmproxy is loaded now, in a thread: the lean path serves meanwhile.
    embedded_module = await asyncio.to_thread(_load_mitmproxy)
    embedded = embedded_module.Embedded(settings, router, resolver, found, tunnels, rejections)
    try:
        await embedded.start()
        mitmproxy_serving.set_result(embedded)
        # What was built so far lives as long as the process: keep the garbage collector
        # from scanning it again and again, and let it run less often (a hit allocates a
        # few dozen objects and creates no reference cycles).
        gc.freeze()
        gc.set_threshold(GC_THRESHOLD)
        tasks.append(asyncio.create_task(_collect_garbage()))
        await stop.wait()
    finally:
        for task in tasks:
            task.cancel()
        await embedded.stop()
        await front.close()
        await fills.close()
        await upstream.close()
        channel_task.cancel()
        index.close()


def _counters(metrics: Metrics, answers: native.Answers | None) -> dict[str, object]:
    """This worker's counters, with the hits the core's table sent on its own and the
    bytes its streams relayed to one another."""
    counters = metrics.snapshot()
    counters["tunnelled_bytes"] = cast(int, counters["tunnelled_bytes"]) + native.relayed_bytes()
    if answers is not None:
        counters["hits"] = cast(int, counters["hits"]) + answers.hits
        counters["hits_answered_by_core"] = answers.hits
        counters["answers_displaced"] = answers.displaced
        counters["bytes_from_buffer"] = cast(int, counters["bytes_from_buffer"]) + answers.bytes
    return counters


async def _report_uses(buffer: Buffer, answers: native.Answers) -> None:
    """Under `--eviction lru`, the objects the core's table answered are used too: their
    keys go to the keeper with the router's, at the same pace."""
    while True:
        await asyncio.sleep(TOUCH_INTERVAL)
        buffer.touch(answers.touched())


async def _collect_garbage() -> None:
    while True:
        await asyncio.sleep(GC_INTERVAL)
        gc.collect()


def _load_mitmproxy() -> types.ModuleType:
    """`sidecar.mitm.embedded`, loaded by name: a worker loads mitmproxy only once it
    serves, never in the fork server."""
    return importlib.import_module("sidecar.mitm.embedded")


def _parents(
    settings: Settings, metrics: Metrics, pool: Pool, tell: Callable[[News], None]
) -> Parents | None:
    if not settings.parent:
        return None
    return Parents(
        settings.parent,
        settings.parent_ca or settings.ca_dir / bundle.UPSTREAM_TRUST_FILE,
        settings.parent_timeout,
        pool,
        metrics,
        tell,
    )


async def _stop_when_parent_gone(keeper: ipc.Channel, stop: asyncio.Event) -> None:
    await keeper.wait_closed()
    logger.warning("the sidecar's main process is gone; stopping")
    stop.set()


async def _stage(stage_in: StageIn) -> None:
    try:
        await stage_in.run()
    except StageInError as e:
        logger.error("stage-in: %s", e)


def main(inherited: Inherited) -> None:
    """Run one worker with what the main process handed it (`sidecar.runtime.supervisor`)."""
    settings = parse(inherited.argv, os.environ)
    logs.configure(f"w{inherited.index}")
    try:
        # On libuv's loop: a miss or a new connection's hit takes several of its turns,
        # callbacks and timers, each cheaper than asyncio's own (docs/performance.md).
        asyncio.run(run(settings, inherited), loop_factory=uvloop.new_event_loop)
    except KeyboardInterrupt:
        pass
