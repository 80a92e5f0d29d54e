"""Connections that end are closed: after every burst of clients that each open a new
connection and close it (urllib sends `Connection: close`), the sidecar holds no socket
in CLOSE-WAIT and as many descriptors as before, within 2 seconds. HTTPS through
CONNECT tunnels (the lean front end, every data loader's path) and plain HTTP
(mitmproxy's path)."""

from __future__ import annotations

import ssl
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bench.harness import OriginServer, Sidecar, wait_until
from bench.procs import open_fds, settled

pytestmark = pytest.mark.e2e

SETTLE = 2.0  # seconds the sidecar has to close what its clients closed
BURST = 20


def fetch(
    sidecar: Sidecar, url: str, headers: dict[str, str] | None = None, method: str = "GET"
) -> bytes:
    """One urllib request on a new connection (urllib closes it after the response)."""
    proxies = {"https": sidecar.proxy, "http": sidecar.proxy}
    context = ssl.create_default_context(cafile=str(sidecar.bundle))
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler(proxies), urllib.request.HTTPSHandler(context=context)
    )
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    with opener.open(request, timeout=30) as response:
        return bytes(response.read())


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_every_closed_connection_is_closed_by_the_sidecar_too(
    scheme: str,
    start_sidecar: Callable[..., Sidecar],
    origin: OriginServer,
    plain_origin: int,
    dataset: Path,
) -> None:
    """https: CONNECT tunnels, served by the lean front end; http: absolute-form
    requests, which mitmproxy terminates and the fast response path answers."""
    sidecar = start_sidecar()
    port = origin.port if scheme == "https" else plain_origin

    def url(case: str) -> str:
        return f"{scheme}://origin.test:{port}/files/medium.bin?case={case}"

    def settles() -> None:
        wait_until(
            lambda: settled(sidecar.pid, sidecar.proxy_port, port, baseline),
            "client connections closed, descriptors as before",
            SETTLE,
        )

    body = (dataset / "medium.bin").read_bytes()
    baseline = open_fds(sidecar.pid)
    # Sequential ranged hits, each on its own connection.
    assert fetch(sidecar, url("stored")) == body
    for _ in range(BURST):
        assert fetch(sidecar, url("stored"), {"Range": "bytes=1000-50999"}) == body[1000:51000]
    settles()
    with ThreadPoolExecutor(BURST) as pool:
        # Concurrent full hits, then concurrent cold requests for one object, then HEADs.
        for case, method in (("stored", "GET"), ("cold", "GET"), ("stored", "HEAD")):
            requests = [pool.submit(fetch, sidecar, url(case), None, method) for _ in range(BURST)]
            results = [r.result() for r in requests]
            assert all(result == (body if method == "GET" else b"") for result in results)
            settles()
    stats = sidecar.stats()
    assert stats["misses"] == 2 and stats["hits"] >= 2 * BURST

