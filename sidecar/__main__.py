"""`burstbuffer-sidecar`: flags and environment -> Settings -> the pod CA -> the proxy.

mitmproxy runs embedded, with only the addons a cache needs (its default set costs
about half of the CPU per small request in event dispatch), and two defaults
changed on purpose:

- `connection_strategy=lazy`: with the default `eager`, every CONNECT opens an
  origin connection, so a hit would cost one and would fail when the origin is down.
- `http2=false` towards clients: the fast response path speaks HTTP/1.1, the
  dataset clients that matter (wget, curl, urllib, requests) all do.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from mitmproxy.addons import core, errorcheck, next_layer, proxyserver, tlsconfig
from mitmproxy.master import Master

from certs import bundle
from certs.bundle import TrustError
from certs.ca import CAError, load_or_create_ca
from certs.leaf import ServerContexts
from sidecar import admin, capture, respond
from sidecar.addon import BurstBuffer
from sidecar.fill import Fills
from sidecar.front import Balance, Front, listen
from sidecar.metrics import Metrics
from sidecar.router import Router
from sidecar.settings import Settings, SettingsError, host_glob_regex, parse
from sidecar.stagein import StageIn, StageInError
from sidecar.store import Store, StoreError
from sidecar.upstream import Upstream

logger = logging.getLogger("sidecar")

# Name of the origin trust file (public roots + --upstream-ca) in the private CA dir.
UPSTREAM_TRUST_FILE = "upstream-trust.pem"


def allow_hosts(globs: Sequence[str]) -> list[str]:
    """mitmproxy `allow_hosts` patterns (matched against `host:port`) for host globs."""
    return [rf"^(?:{host_glob_regex(glob)}):\d+$" for glob in globs]


async def run(settings: Settings) -> None:
    ca = load_or_create_ca(settings.ca_dir)
    extra_ca = bundle.read_upstream_ca(settings.upstream_ca) if settings.upstream_ca else None
    upstream_trust = settings.ca_dir / UPSTREAM_TRUST_FILE
    bundle.write_private(upstream_trust, bundle.upstream_trust_pem(extra_ca))
    if settings.trust_dir is not None:
        bundle.write_trust_files(settings.trust_dir, ca.cert_pem, extra_ca)

    store = Store(settings.buffer_dir, settings.buffer_size, settings.eviction)
    try:
        store.open()
    except StoreError as e:
        # A broken buffer must not break downloads: run as a pass-through proxy.
        logger.error("%s; serving everything from upstream", e)

    resolver = capture.dns_resolver(settings)
    upstream = Upstream(
        upstream_trust,
        settings.upstream_proxy,
        settings.upstream_timeout,
        capture.HostsFileBypass(resolver) if resolver else None,
    )
    await upstream.open()
    master = Master(None)
    ps = proxyserver.Proxyserver()
    # The gauges read `fills` and `stage_in` at scrape time (they are bound just below).
    metrics = Metrics(
        lambda: {
            "entries": store.entries,
            "unverified_entries": store.unverified,
            "buffer_bytes": store.used,
            "reserved_bytes": store.reserved,
            "capacity_bytes": store.capacity,
            "fills_in_progress": len(fills),
            "stage_in_objects": stage_in.progress.objects,
            "stage_in_done": stage_in.progress.done,
            "stage_in_failed": stage_in.progress.failed,
            "stage_in_bytes": stage_in.progress.bytes,
        }
    )
    fills = Fills(store, upstream, metrics, settings.parallel_fetch)
    stage_in = StageIn(
        settings.stage_in, settings.intercept, settings.stage_in_parallel, store, fills, upstream
    )
    router = Router(settings, store, fills, upstream, metrics)
    master.addons.add(
        core.Core(),
        ps,
        next_layer.NextLayer(),
        tlsconfig.TlsConfig(),
        errorcheck.ErrorCheck(),
        capture.HostRouting(settings, resolver),
        BurstBuffer(settings, router, respond.Connections(ps)),
    )
    listeners = capture.listeners(settings)
    master.options.update(
        confdir=str(settings.ca_dir),
        connection_strategy="lazy",
        http2=False,
        allow_hosts=allow_hosts(settings.intercept),
        ssl_verify_upstream_trusted_ca=str(upstream_trust),
        mode=[listener.mode for listener in listeners],
        # The front end accepts every connection and hands mitmproxy its share.
        server=False,
        # What mitmproxy relays itself (non-GET, HEAD misses) streams past 1 MiB.
        stream_large_bodies="1m",
    )
    sockets = [listen(listener.host, listener.port) for listener in listeners]
    handoff = respond.Handoff(ps, [listener.mode for listener in listeners])
    balance = Balance([0], 0)
    front = Front(router, settings.intercept, ServerContexts(ca).get, handoff.handle, balance)
    accepting = [
        asyncio.create_task(front.accept(index, sock, listener.lean))
        for index, (listener, sock) in enumerate(zip(listeners, sockets, strict=True))
    ]

    def ready() -> str | None:
        if not ps.is_running:
            return "the proxy is not running yet"
        if settings.trust_dir is not None and not all(
            (settings.trust_dir / name).is_file() for name in bundle.TRUST_FILES
        ):
            return "the trust files are not written yet"
        return None

    runner = await admin.start(
        admin.make_app(ready, metrics.stats, metrics.prometheus_text),
        settings.admin_host,
        settings.admin_port,
    )
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, master.shutdown)
    background = [asyncio.create_task(store.verify_existing())]
    if settings.stage_in:
        background.append(asyncio.create_task(_stage(stage_in)))
    logger.info(
        "proxy on %s:%d (capture %s), buffer %s (%d bytes, eviction %s), intercepting %d hosts",
        settings.listen_host,
        settings.listen_port,
        settings.capture,
        settings.buffer_dir,
        settings.buffer_size,
        settings.eviction,
        len(settings.intercept),
    )
    try:
        await master.run()
    finally:
        for task in [*background, *accepting]:
            task.cancel()
        await front.close()
        await fills.close()
        await upstream.close()
        await runner.cleanup()
        store.close()


async def _stage(stage_in: StageIn) -> None:
    try:
        await stage_in.run()
    except StageInError as e:
        logger.error("stage-in: %s", e)


def _configure_logging() -> None:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # mitmproxy logs every client connect and disconnect at INFO: too chatty for a sidecar.
    logging.getLogger("mitmproxy").setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> None:
    try:
        settings = parse(sys.argv[1:] if argv is None else argv, os.environ)
    except SettingsError as e:
        print(f"burstbuffer-sidecar: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    _configure_logging()
    try:
        asyncio.run(run(settings))
    except KeyboardInterrupt:
        pass
    except (CAError, TrustError, OSError) as e:
        # The CA or trust files cannot be set up: nothing to serve safely; say why.
        logger.error("cannot start: %s", e)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
