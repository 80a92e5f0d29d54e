"""Connections that end are closed: after every burst of clients that each open a new
connection and close it (urllib sends `Connection: close`), the sidecar holds no socket
in CLOSE-WAIT and as many descriptors as before, within 2 seconds.

Both front ends are covered: HTTPS through a CONNECT tunnel (the lean server), and
plain HTTP (mitmproxy, answered by the router through `sidecar.respond`)."""

from __future__ import annotations

import ssl
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bench.harness import (
    PYTHON,
    OriginServer,
    Process,
    Sidecar,
    free_port,
    port_open,
    start_process,
    wait_until,
)
from tests.sidecar.procs import CLOSE_WAIT, open_fds, tree_sockets

pytestmark = pytest.mark.e2e

SETTLE = 2.0  # seconds the sidecar has to close what its clients closed
BURST = 20


@pytest.fixture(scope="module")
def plain_origin(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The dataset over plain HTTP (its port), for mitmproxy's side of the sidecar."""
    port = free_port()
    argv = [PYTHON, "-m", "bench.origin", "--dir", str(dataset), "--port", str(port)]
    process: Process = start_process(argv, tmp_path_factory.mktemp("plain") / "origin.log")
    wait_until(lambda: port_open(port), "the plain HTTP origin")
    yield port
    process.stop()


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


def settles(sidecar: Sidecar, baseline: int) -> None:
    wait_until(lambda: tree_sockets(sidecar.pid, CLOSE_WAIT) == 0, "no CLOSE-WAIT", SETTLE)
    wait_until(lambda: open_fds(sidecar.pid) <= baseline, "descriptors as before", SETTLE)


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_every_closed_connection_is_closed_by_the_sidecar_too(
    start_sidecar: Callable[..., Sidecar],
    origin: OriginServer,
    plain_origin: int,
    dataset: Path,
    scheme: str,
) -> None:
    sidecar = start_sidecar()
    port = origin.port if scheme == "https" else plain_origin

    def url(case: str) -> str:
        return f"{scheme}://origin.test:{port}/files/medium.bin?case={case}"

    body = (dataset / "medium.bin").read_bytes()
    baseline = open_fds(sidecar.pid)
    # Sequential ranged hits, each on its own connection.
    assert fetch(sidecar, url("stored")) == body
    for _ in range(BURST):
        assert fetch(sidecar, url("stored"), {"Range": "bytes=1000-50999"}) == body[1000:51000]
    settles(sidecar, baseline)
    with ThreadPoolExecutor(BURST) as pool:
        # Concurrent full hits, then concurrent cold requests for one object, then HEADs.
        for case, method in (("stored", "GET"), ("cold", "GET"), ("stored", "HEAD")):
            requests = [pool.submit(fetch, sidecar, url(case), None, method) for _ in range(BURST)]
            results = [r.result() for r in requests]
            assert all(result == (body if method == "GET" else b"") for result in results)
            settles(sidecar, baseline)
    stats = sidecar.stats()
    assert stats["misses"] == 2 and stats["hits"] >= 2 * BURST

