"""Load: 100 concurrent clients sending AdmissionReviews to `burstbuffer-injector serve` over TLS.

As the API server does when a Deployment scales out: many pod creations at once. Half the
clients keep their connection, half open a new TLS connection per review. The pods are
the golden cases (Jobs, Deployments, StatefulSets, training-operator pods, skipped ones,
every capture mode by annotation). Loopback only, bounded in time. It asserts zero errors
(every review answered 200, for its own uid, allowed, with a patch that applies and is
the one `review.answer` gives in-process) and that no review came near the webhook's
default timeout, and prints p50/p99 latency and reviews/s, beside the latency of the same
reviews sent one at a time (the cost of a review without queueing).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import ssl
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
import yaml
from podcheck import admission_review, decoded_patch
from webhook import Webhook, start_webhook, write_pair

from injector import names, review
from injector.settings import InjectorSettings

pytestmark = pytest.mark.e2e

CLIENTS = 100
REVIEWS_PER_CLIENT = 20
SERIAL_REVIEWS = 200
BOUND = 120.0  # seconds for the whole run
# The chart's webhook.timeoutSeconds: a review slower than this is a failed injection.
WEBHOOK_TIMEOUT = 10.0

TESTDATA = Path(__file__).parent / "testdata"


def sample_pods() -> list[dict[str, Any]]:
    """The golden cases' pods, plus each of them asking for every capture mode."""
    pods = [yaml.safe_load(p.read_text()) for p in sorted(TESTDATA.glob("*.pod.yaml"))]
    variants = []
    for pod, mode in itertools.product(pods, ("hostAliases", "transparent")):
        variant = json.loads(json.dumps(pod))
        annotations = variant["metadata"].setdefault("annotations", {})
        annotations[names.CAPTURE] = mode
        variants.append(variant)
    return pods + variants


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def webhook(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    directory = tmp_path_factory.mktemp("load-webhook")
    write_pair(ca, directory)
    server = start_webhook(directory)
    yield server
    assert server.stop() == 0


def percentiles(latencies: list[float]) -> tuple[float, float]:
    """(p50, p99) of the latencies, in seconds."""
    if len(latencies) < 2:
        return (latencies or [0.0])[0], (latencies or [0.0])[0]
    quantiles = statistics.quantiles(latencies, n=100)
    return quantiles[49], quantiles[98]


async def _client(
    number: int,
    url: str,
    context: ssl.SSLContext,
    bodies: list[tuple[dict[str, Any], bytes]],
    latencies: list[float],
    errors: list[str],
) -> None:
    # Even clients keep their connection (as the API server does); odd ones pay a TLS
    # handshake per review.
    connector = aiohttp.TCPConnector(ssl=context, limit=1, force_close=bool(number % 2))
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for sequence in range(REVIEWS_PER_CLIENT):
            expected, body = bodies[(number * REVIEWS_PER_CLIENT + sequence) % len(bodies)]
            started = time.perf_counter()
            try:
                async with session.post(
                    url, data=body, headers={"Content-Type": "application/json"}
                ) as response:
                    status, payload = response.status, await response.read()
            except (aiohttp.ClientError, TimeoutError) as e:
                errors.append(f"client {number}: {type(e).__name__}: {e}")
                continue
            latencies.append(time.perf_counter() - started)
            if status != 200:
                errors.append(f"client {number}: HTTP {status}: {payload[:200]!r}")
                continue
            answer = json.loads(payload)["response"]
            if answer != expected:
                errors.append(f"client {number}: unexpected answer {str(answer)[:300]}")


def test_100_concurrent_reviews_over_tls(webhook: Webhook, ca: trustme.CA) -> None:
    settings = InjectorSettings()
    bodies = []
    for pod in sample_pods():
        request = admission_review(pod, namespace="ml")
        expected = review.answer(request, settings).review["response"]
        assert expected["allowed"] is True
        decoded_patch(expected)  # a patch that decodes (or none, for skipped pods)
        bodies.append((expected, json.dumps(request).encode()))
    context = webhook.context(ca)
    url = f"https://127.0.0.1:{webhook.port}/mutate"
    latencies: list[float] = []
    errors: list[str] = []

    serial: list[float] = []

    async def run() -> float:
        # First one at a time, on kept connections (even client numbers).
        for n in range(0, 2 * SERIAL_REVIEWS // REVIEWS_PER_CLIENT, 2):
            await _client(n, url, context, bodies, serial, errors)
        started = time.monotonic()
        clients = [_client(n, url, context, bodies, latencies, errors) for n in range(CLIENTS)]
        await asyncio.wait_for(asyncio.gather(*clients), BOUND)
        elapsed = time.monotonic() - started
        # Closed TLS connections finish their shutdown in the background: let them, so that
        # none is left to the garbage collector (aiohttp's advice for a graceful shutdown).
        await asyncio.sleep(0.25)
        return elapsed

    elapsed = asyncio.run(run())

    total = CLIENTS * REVIEWS_PER_CLIENT
    p50, p99 = percentiles(latencies)
    alone, _ = percentiles(serial)
    print(
        f"\ninjector load: {CLIENTS} concurrent clients, {len(latencies)} reviews "
        f"({len(bodies)} distinct pods) in {elapsed:.1f} s = {len(latencies) / elapsed:.0f} "
        f"reviews/s; latency p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
        f"max {max(latencies, default=0) * 1000:.1f} ms; errors {len(errors)}; "
        f"one at a time: p50 {alone * 1000:.1f} ms"
    )
    assert errors == [], errors[:5]
    assert len(latencies) == total
    assert max(latencies) < WEBHOOK_TIMEOUT
    # The server counted every review, and failed none.
    status, metrics = webhook.request(ca, "GET", "/metrics")
    assert status == 200
    text = metrics.decode()
    assert f"burstbuffer_injector_reviews_total {float(total + SERIAL_REVIEWS)}" in text
    assert "burstbuffer_injector_failed_total 0.0" in text
