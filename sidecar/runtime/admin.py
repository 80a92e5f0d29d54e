"""The admin endpoints: read-only /healthz, /metrics, /stats, and POST /quitquitquit.

They may listen on the pod IP (kubelet probes, Prometheus scrapes), so they expose
counters only: never URLs, headers, keys or cache keys. `/quitquitquit` stops the
sidecar as SIGTERM does (Istio's pilot-agent and Linkerd's admin server have the same
endpoint), so that a Job's app can end a classic sidecar, which the kubelet never ends;
it answers loopback peers only, which is why the endpoints also listen on 127.0.0.1
when `--admin-host` is the pod IP.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
QUIT_PATH = "/quitquitquit"


def listen_hosts(host: str) -> tuple[str, ...]:
    """The addresses the admin endpoints listen on: `host`, and loopback besides unless
    `host` already covers it (a loopback address, or every address)."""
    if host == "localhost":
        return (host,)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a host name: loopback is not one of its addresses
        return (host, LOOPBACK)
    if address.is_loopback or address.is_unspecified:
        return (host,)
    return (host, LOOPBACK)


def is_loopback_peer(peername: object) -> bool:
    """Whether a connection's peer address (`transport.get_extra_info("peername")`) is on
    loopback: the same network namespace, so the pod's own containers."""
    if not isinstance(peername, tuple) or not peername:
        return False  # a Unix socket or an unknown transport: not an address to trust
    try:
        address = ipaddress.ip_address(str(peername[0]).partition("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # a peer of a dual-stack `::` socket
    return address.is_loopback


def make_app(
    ready: Callable[[], str | None],
    stats: Callable[[], Awaitable[dict[str, object]]],
    prometheus_text: Callable[[], Awaitable[bytes]],
    quit: Callable[[], None],
) -> web.Application:
    """The admin application.

    `ready()` returns None when the sidecar is ready, else what it is waiting for;
    `quit()` starts the sidecar's graceful stop (the one SIGTERM starts).
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

    async def quitquitquit(request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if not is_loopback_peer(peer):
            # Anyone who reaches the pod IP could stop the pod's downloads otherwise.
            refusal = f"{QUIT_PATH} answers the pod's own containers only, on 127.0.0.1\n"
            return web.Response(status=403, text=refusal)
        logger.info("stopping: asked by POST %s", QUIT_PATH)
        response = web.Response(text="stopping\n")
        response.force_close()
        # The answer is written before the stop starts, which closes the endpoints.
        await response.prepare(request)
        await response.write_eof()
        quit()
        return response

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/stats", stats_json)
    app.router.add_post(QUIT_PATH, quitquitquit)
    return app


async def start(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Listen on port at host's addresses (`listen_hosts`); the caller keeps the runner
    and cleans it up at exit."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    for address in listen_hosts(host):
        try:
            await web.TCPSite(runner, address, port, reuse_address=True).start()
        except OSError as e:
            await runner.cleanup()
            message = f"cannot listen on {address}:{port} (admin endpoints): {e.strerror}"
            raise OSError(e.errno, message) from None
    logger.info(
        "admin endpoints on %s (/healthz /metrics /stats; POST %s from loopback)",
        ", ".join(f"http://{a}:{port}" for a in listen_hosts(host)),
        QUIT_PATH,
    )
    return runner
