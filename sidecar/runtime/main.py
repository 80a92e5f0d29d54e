"""The main process, once its workers are started: it prepares what they share, then
keeps it.

1. the pod CA and the trust files (written once, before /healthz turns 200);
2. the buffer (`store.Store`: its index, cap and policy; the keeper of `sidecar.buffer.keeper`);
3. the admin endpoints (/healthz, /metrics, /stats), which add up every worker;
4. the workers themselves (`sidecar.runtime.supervisor`): told to start once 1 and 2 are ready,
   replaced when one dies, stopped on SIGTERM or a loopback POST /quitquitquit.

It never touches client traffic, and does not load mitmproxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable

from certs import bundle
from certs.bundle import TrustError
from certs.ca import CAError, load_or_create_ca
from sidecar import metrics
from sidecar.buffer.claims import Claims
from sidecar.buffer.keeper import Keeper
from sidecar.buffer.store import (
    Store,
    StoreError,
    UnusableBufferDir,
    Verified,
    bodies_dir,
    check_buffer_dir,
)
from sidecar.cache import policy
from sidecar.core import native
from sidecar.proxy.router import record_answer, records_answers
from sidecar.runtime import admin, exposition
from sidecar.runtime.supervisor import Workers
from sidecar.settings import Settings
from sidecar.shared import Shared

logger = logging.getLogger("sidecar")

# How often the background check asks whether the sidecar is ready yet.
READY_POLL = 0.05  # seconds
# What stops the sidecar at start with one line: nothing could be served safely.
STARTUP_ERRORS = (CAError, TrustError, OSError)
# Flags that can never work: reported like any bad flag.
CONFIGURATION_ERRORS = (UnusableBufferDir,)


async def run(
    settings: Settings, workers: Workers, shared: Shared, spawning: threading.Thread
) -> None:
    """`spawning`: the thread starting the worker processes."""
    ca = load_or_create_ca(settings.ca_dir)
    extra_ca = bundle.read_upstream_ca(settings.upstream_ca) if settings.upstream_ca else None
    bundle.write_private(
        settings.ca_dir / bundle.UPSTREAM_TRUST_FILE, bundle.upstream_trust_pem(extra_ca)
    )
    if settings.trust_dir is not None:
        bundle.write_trust_files(settings.trust_dir, ca.cert_pem, extra_ca)

    check_buffer_dir(settings.buffer_dir)
    answers = shared.answers_table(
        settings.index_capacity, bodies_dir(settings.buffer_dir), policy.HIT_FIELDS, policy.KEYS
    )

    def changed(slot: bytes) -> None:
        # Workers remember stored objects: a removal or change tells them to look again,
        # and takes that object's answer, and only it, out of the core's table.
        shared.bump_generation()
        answers.forget(slot)

    verified = _answers_back(settings, shared, answers)
    store = Store(
        settings.buffer_dir,
        settings.buffer_size,
        settings.eviction,
        changed,
        shared.publish_checks,
        policy.Uniform(settings.http_freshness),
        verified,
    )
    try:
        store.open()
    except StoreError as e:
        # A broken buffer must not break downloads: run as a pass-through proxy.
        logger.error("%s; serving everything from upstream", e)
    keeper = Keeper(store, Claims(shared), shared.bump_invalidations)

    def ready() -> str | None:
        if settings.trust_dir is not None and not all(
            (settings.trust_dir / name).is_file() for name in bundle.TRUST_FILES
        ):
            return "the trust files are not written yet"
        return workers.ready()

    async def snapshot() -> tuple[dict[str, object], dict[str, int]]:
        counters, gauges = await workers.counters()
        return counters, {**keeper.gauges(), **gauges}

    async def stats() -> dict[str, object]:
        return metrics.stats(*await snapshot(), keeper.state(), settings.eviction)

    async def prometheus_text() -> bytes:
        return exposition.prometheus_text(*await snapshot(), settings.eviction)

    # Set by SIGTERM, SIGINT or POST /quitquitquit: the one graceful stop, exit status 0.
    stop = asyncio.Event()
    async with contextlib.AsyncExitStack() as cleanup:
        cleanup.callback(store.close)
        runner = await admin.start(
            admin.make_app(ready, stats, prometheus_text, stop.set),
            settings.admin_host,
            settings.admin_port,
        )
        cleanup.push_async_callback(runner.cleanup)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await asyncio.to_thread(spawning.join)
        workers.check_spawned()
        workers.serve(keeper)
        cleanup.push_async_callback(workers.stop)
        verify = asyncio.create_task(_verify_once_ready(store, ready))
        cleanup.callback(verify.cancel)
        logger.info(
            "proxy on %s:%d (capture %s, %d workers), buffer %s (%d bytes, eviction %s), "
            "intercepting %d hosts",
            settings.listen_host,
            settings.listen_port,
            settings.capture,
            len(workers),
            settings.buffer_dir,
            settings.buffer_size,
            settings.eviction,
            len(settings.intercept),
        )
        await stop.wait()


async def _verify_once_ready(store: Store, ready: Callable[[], str | None]) -> None:
    """Check what the buffer held at start once the sidecar is ready, not before: the
    check reads every stored body, and the workers starting meanwhile read their own
    files from the same disks."""
    while ready() is not None:
        await asyncio.sleep(READY_POLL)
    await store.verify_existing()


def _answers_back(
    settings: Settings, shared: Shared, answers: native.Answers
) -> Callable[[list[Verified]], None]:
    """What to do with the uniform objects the check verified after a restart: record
    their answers in the core's table (as a first hit through Python would), at most as
    many as it holds (`--index-objects`: more would only push out the first), and none
    when the table is not used (`router.records_answers`)."""
    room = settings.index_capacity if records_answers(settings) else 0

    def verified(found: list[Verified]) -> None:
        nonlocal room
        for slot, entry in found[:room]:
            # The generation of this moment: a removal since the row was read again
            # would have bumped it, and none can come before this loop ends.
            if record_answer(answers, slot, entry, shared.generation):
                room -= 1

    return verified
