"""The read-only admin endpoints: /healthz, /metrics, /stats.

They may listen on the pod IP (kubelet probes, Prometheus scrapes), so they expose
counters only: never URLs, headers, keys or cache keys.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

logger = logging.getLogger(__name__)


def make_app(
    ready: Callable[[], str | None],
    stats: Callable[[], Awaitable[dict[str, object]]],
    prometheus_text: Callable[[], Awaitable[bytes]],
) -> web.Application:
    """The admin application.

    `ready()` returns None when the sidecar is ready, else what it is waiting for.
    """

    async def healthz(_: web.Request) -> web.Response:
        waiting_for = ready()
        if waiting_for is None:
            return web.Response(text="ok\n")
        return web.Response(status=503, text=f"not ready: {waiting_for}\n")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=await prometheus_text(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def stats_json(_: web.Request) -> web.Response:
        return web.Response(
            text=json.dumps(await stats(), indent=2, sort_keys=True) + "\n",
            content_type="application/json",
        )

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/stats", stats_json)
    return app


async def start(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Listen on host:port; the caller keeps the runner and cleans it up at exit."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, reuse_address=True).start()
    except OSError as e:
        await runner.cleanup()
        message = f"cannot listen on {host}:{port} (admin endpoints): {e.strerror}"
        raise OSError(e.errno, message) from None
    logger.info("admin endpoints on http://%s:%d (/healthz /metrics /stats)", host, port)
    return runner
