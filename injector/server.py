"""The webhook's HTTP side: TLS that follows certificate rotation, /mutate, /healthz, /metrics.

HTTP only: status codes, body limits and metrics live here; what a review means is
`review.answer`'s business. A body that is not a review gets a 4xx; a review the
injector fails on is still answered (200, `allowed: false` with the reason).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import ssl
import time
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from injector import review
from injector.decide import INJECTED
from injector.settings import InjectorSettings

logger = logging.getLogger(__name__)

# The API server stores objects of at most ~1.5 MiB; a review carries the object (and,
# for updates, the old one) plus an envelope.
MAX_BODY = 4 * 2**20


class CertificateFiles:
    """A TLS server context that picks up a rotated certificate/key pair on the next handshake.

    cert-manager and kubelet secret volumes replace the files in place (an atomic symlink
    swap); each handshake compares the files' identity and reloads them when they changed.
    A half-written pair (new certificate, old key) fails to load and the old pair stays in
    use until both files match.
    """

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert = cert
        self.key = key
        self._stamp = self._read_stamp()
        self._current = self._load()

    def _read_stamp(self) -> tuple[tuple[int, int, int], ...]:
        stats = [path.stat() for path in (self.cert, self.key)]
        return tuple((s.st_ino, s.st_size, s.st_mtime_ns) for s in stats)

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        context.sni_callback = self._select
        return context

    def context(self) -> ssl.SSLContext:
        """The context to listen with; it switches each connection to the newest pair."""
        return self._current

    def _refresh(self) -> ssl.SSLContext:
        try:
            stamp = self._read_stamp()
            if stamp != self._stamp:
                self._current = self._load()
                self._stamp = stamp
                logger.info("TLS certificate reloaded from %s", self.cert)
        except (OSError, ssl.SSLError) as e:
            logger.warning("TLS certificate not reloaded (keeping the previous one): %s", e)
        return self._current

    def _select(self, connection: ssl.SSLObject, server_name: str | None, _: object) -> None:
        # Called for every ClientHello, with or without SNI.
        connection.context = self._refresh()


class Metrics:
    """The injector's Prometheus metrics, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reviews = Counter(
            "burstbuffer_injector_reviews_total",
            "AdmissionReviews answered (any outcome).",
            registry=self.registry,
        )
        self.injected = Counter(
            "burstbuffer_injector_injected_total",
            "Pods that got the sidecar.",
            registry=self.registry,
        )
        self.skipped = Counter(
            "burstbuffer_injector_skipped_total",
            "Pods left unchanged, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.malformed = Counter(
            "burstbuffer_injector_malformed_total",
            "Pods refused because a field the injector reads has the wrong type or is missing.",
            registry=self.registry,
        )
        self.failed = Counter(
            "burstbuffer_injector_failed_total",
            "Pods refused because the injection failed.",
            registry=self.registry,
        )
        self.bad_requests = Counter(
            "burstbuffer_injector_bad_requests_total",
            "Requests refused before reaching the injector, by HTTP status.",
            ["code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "burstbuffer_injector_review_seconds",
            "Time to answer one AdmissionReview.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=self.registry,
        )

    def count(self, outcome: str) -> None:
        self.reviews.inc()
        if outcome == INJECTED.code:
            self.injected.inc()
        elif outcome == review.MALFORMED:
            self.malformed.inc()
        elif outcome == review.FAILED:
            self.failed.inc()
        elif outcome != review.IGNORED:
            self.skipped.labels(reason=outcome).inc()


def make_app(settings: InjectorSettings) -> web.Application:
    """The webhook application: POST /mutate, GET /healthz, GET /metrics."""
    metrics = Metrics()

    def refuse(status: int, message: str) -> web.Response:
        metrics.bad_requests.labels(code=str(status)).inc()
        return web.json_response({"error": message}, status=status)

    async def mutate(request: web.Request) -> web.Response:
        if request.content_type != "application/json":
            return refuse(415, "expected Content-Type: application/json")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return refuse(413, f"the body exceeds {MAX_BODY} bytes")
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):
            return refuse(400, "the body is not valid JSON")
        started = time.perf_counter()
        try:
            answer = review.answer(document, settings)
        except review.BadReview as e:
            return refuse(400, str(e))
        metrics.latency.observe(time.perf_counter() - started)
        metrics.count(answer.outcome)
        return web.json_response(answer.review)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def prometheus(_: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(metrics.registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post("/mutate", mutate)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", prometheus)
    return app


async def serve(
    settings: InjectorSettings, host: str | None, port: int, tls: CertificateFiles
) -> None:
    """Serve until SIGTERM or SIGINT; logs the bound addresses once listening."""
    runner = web.AppRunner(make_app(settings), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls.context())
    await site.start()
    for address in runner.addresses:
        logger.info("serving https on %s port %s", address[0], address[1])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    logger.info("stopping")
    await runner.cleanup()
