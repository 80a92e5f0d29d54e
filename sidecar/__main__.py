"""`burstbuffer-sidecar`: flags and environment -> Settings -> the pod CA -> the workers.

The main process prepares what every worker shares and then only keeps it:

1. the pod CA and the trust files (written once, before /healthz turns 200);
2. the buffer (`store.Store`: its index, cap and policy; the keeper of `sidecar.keeper`);
3. the listening sockets, bound here once and inherited by every worker;
4. the admin endpoints (/healthz, /metrics, /stats), which add up every worker;
5. `--workers` worker processes (`sidecar.worker`, the proxy itself), replaced when
   one dies, stopped on SIGTERM.

It never touches client traffic, and does not load mitmproxy.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from certs import bundle
from certs.bundle import TrustError
from certs.ca import CAError, load_or_create_ca
from sidecar import admin, capture, logs, metrics
from sidecar.front import listen
from sidecar.keeper import Keeper
from sidecar.settings import Settings, SettingsError, parse
from sidecar.shared import Shared
from sidecar.store import Store, StoreError
from sidecar.workers import Workers, available_cpus

logger = logging.getLogger("sidecar")


async def run(settings: Settings, argv: Sequence[str]) -> None:
    ca = load_or_create_ca(settings.ca_dir)
    extra_ca = bundle.read_upstream_ca(settings.upstream_ca) if settings.upstream_ca else None
    bundle.write_private(
        settings.ca_dir / bundle.UPSTREAM_TRUST_FILE, bundle.upstream_trust_pem(extra_ca)
    )
    if settings.trust_dir is not None:
        bundle.write_trust_files(settings.trust_dir, ca.cert_pem, extra_ca)

    shared = Shared.create(settings.workers or available_cpus())
    # Workers remember stored objects; a removal tells them to look again.
    store = Store(
        settings.buffer_dir, settings.buffer_size, settings.eviction, shared.bump_generation
    )
    try:
        store.open()
    except StoreError as e:
        # A broken buffer must not break downloads: run as a pass-through proxy.
        logger.error("%s; serving everything from upstream", e)
    keeper = Keeper(store)
    listeners = capture.listeners(settings)
    sockets = [listen(listener.host, listener.port) for listener in listeners]
    workers = Workers(shared, argv, sockets, keeper)

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
        return metrics.stats(*await snapshot())

    async def prometheus_text() -> bytes:
        return metrics.prometheus_text(*await snapshot())

    runner = await admin.start(
        admin.make_app(ready, stats, prometheus_text), settings.admin_host, settings.admin_port
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    workers.start()
    verify = asyncio.create_task(store.verify_existing())
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
    try:
        await stop.wait()
    finally:
        verify.cancel()
        await workers.stop()
        await runner.cleanup()
        for sock in sockets:
            sock.close()
        store.close()


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        settings = parse(args, os.environ)
    except SettingsError as e:
        print(f"burstbuffer-sidecar: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    logs.configure("main")
    try:
        asyncio.run(run(settings, args))
    except KeyboardInterrupt:
        pass
    except (CAError, TrustError, OSError) as e:
        # The CA, the trust files or a listening port cannot be set up: nothing to
        # serve safely; say why.
        logger.error("cannot start: %s", e)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
