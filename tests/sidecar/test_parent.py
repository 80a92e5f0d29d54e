"""The shared parent tier with a real Squid: sharing, privacy, failing open, hashing."""

from __future__ import annotations

import asyncio
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import certifi
import pytest
import trustme

from bench.harness import OriginServer, Sidecar, wait_until
from bench.squid import Squid, SquidMissing, start_squid
from sidecar.cache import policy
from sidecar.metrics import Metrics, add_snapshots
from sidecar.origins import rendezvous
from sidecar.origins.parent import (
    BACKOFF_MAX,
    BACKOFF_MIN,
    Health,
    News,
    Parents,
    bypass_reason,
    expand,
    shared_may_store,
)
from sidecar.wire.client import Pool
from tests.sidecar.conftest import curl

# -- decisions (pure) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "headers", "url", "reason"),
    [
        ("GET", [], "https://h/f.bin?versionId=3", None),
        ("HEAD", [("Range", "bytes=0-9"), ("If-Range", '"e"')], "https://h/f", None),
        ("POST", [], "https://h/f", "method"),
        ("GET", [("authorization", "Bearer t")], "https://h/f", "credentials"),
        ("GET", [("Cookie", "s=1")], "https://h/f", "credentials"),
        ("GET", [], "https://b.s3.amazonaws.com/f?X-Amz-Signature=ab&X-Amz-Date=1", "signed-url"),
        ("GET", [], "https://minio.local/f?X-Amz-Credential=k%2F1", "signed-url"),
        ("GET", [], "https://storage.googleapis.com/b?GoogleAccessId=a&Signature=s", "signed-url"),
        ("GET", [], "https://a.blob.core.windows.net/c/f?se=2030&sig=abc", "signed-url"),
        ("GET", [], "https://cdn.hf.co/f?Expires=1&Key-Pair-Id=K", "signed-url"),
        ("GET", [], "https://h/f?expires=1&se=2", None),
        ("GET", [("If-None-Match", '"e"')], "https://h/f", "conditional"),
    ],
)
def test_what_may_go_to_a_shared_parent(
    method: str, headers: list[tuple[str, str]], url: str, reason: str | None
) -> None:
    assert bypass_reason(method, headers, url) == reason


def test_a_shared_cache_stores_neither_private_nor_no_store() -> None:
    assert shared_may_store({"Cache-Control": "public, max-age=60"})
    assert shared_may_store({})
    assert not shared_may_store({"Cache-Control": "private"})
    assert not shared_may_store({"cache-control": 'max-age=5, private="Set-Cookie"'})
    assert not shared_may_store({"Cache-Control": "no-store"})


def test_backoff_doubles_up_to_its_cap_and_a_success_resets_it() -> None:
    health = Health()
    assert health.usable(0) and health.failed(100.0)  # a state change: up -> down
    assert not health.usable(100 + BACKOFF_MIN - 0.1) and health.usable(100 + BACKOFF_MIN)
    assert not health.failed(200.0) and health.backoff == 2 * BACKOFF_MIN
    for _ in range(20):
        health.failed(300.0)
    assert health.backoff == BACKOFF_MAX
    assert health.succeeded() and health.usable(300.0) and not health.succeeded()


def test_what_another_worker_learned_decides_here_too() -> None:
    metrics = Metrics()
    told: list[News] = []
    parent = "http://127.0.0.1:9"

    async def main() -> None:
        parents = Parents([parent], Path(certifi.where()), 1.0, Pool(5.0), metrics, told.append)
        await parents.open()
        try:
            assert parents.route("https://h.test/a", "GET", []) is not None
            parents.learn({"private": policy.cache_key("https://h.test/a")})
            assert parents.route("https://h.test/a", "GET", []) is None
            assert metrics.counters.parent_bypasses == {"private-response": 1}
            down = {"up": False, "skip_until": time.monotonic() + 60, "backoff": 60.0}
            parents.learn({"parent": parent, **down})
            assert parents.route("https://h.test/b", "GET", []) is None
            assert metrics.counters.parent_state == {parent: 0}
            assert told == []  # what it was told, it does not tell again
        finally:
            await parents.close()

    asyncio.run(main())


def test_a_name_with_several_addresses_is_one_parent_per_address() -> None:
    urls = ["http://squid:3128", "https://one:3129"]
    found = {"http://squid:3128": ["10.0.0.1", "10.0.0.2"], "https://one:3129": ["10.0.1.1"]}
    assert expand(urls, found) == [
        ("http://10.0.0.1:3128", "http://squid:3128", "10.0.0.1"),
        ("http://10.0.0.2:3128", "http://squid:3128", "10.0.0.2"),
        ("https://one:3129", "https://one:3129", "10.0.1.1"),
    ]
    assert expand(["http://gone:3128"], {}) == [("http://gone:3128", "http://gone:3128", None)]


def test_a_parent_counts_as_used_only_if_every_worker_uses_it() -> None:
    total = add_snapshots(
        [
            {"parent_requests": 2, "parent_failures": {"timeout": 1}, "parent_state": {"p": 1}},
            {"parent_requests": 3, "parent_failures": {"timeout": 2}, "parent_state": {"p": 0}},
        ]
    )
    assert total["parent_requests"] == 5 and total["parent_failures"] == {"timeout": 3}
    assert total["parent_state"] == {"p": 0}


# -- with a real Squid ------------------------------------------------------------------


@pytest.fixture
def start_parent(origin: OriginServer) -> Iterator[Callable[..., Squid]]:
    """Start a Squid on loopback that verifies the origin against `ca` (the origin's)."""
    started: list[Squid] = []

    def start(ca_pem: Path | None = None, tls: trustme.LeafCert | None = None) -> Squid:
        try:
            squid = start_squid(ca_pem or origin.ca_pem, ["origin.test"], tls)
        except SquidMissing as e:
            pytest.skip(str(e))
        started.append(squid)
        return squid

    yield start
    for squid in started:
        squid.remove()


def body_of(dataset: Path, name: str) -> bytes:
    return (dataset / name).read_bytes()


def test_two_pods_share_one_origin_fetch(
    start_sidecar: Callable[..., Sidecar],
    start_parent: Callable[..., Squid],
    origin: OriginServer,
    dataset: Path,
) -> None:
    squid = start_parent()
    pods = [start_sidecar("--parent", squid.url) for _ in range(2)]
    for name in ("small.bin", "medium.bin"):
        for pod in pods:
            download = curl(pod, origin.url(name, case="two-pods"))
            assert download.body == body_of(dataset, name), download.stderr
        assert origin.count(name, case="two-pods") == 1
    # A slow large object read by both at once: each sidecar splits it over ranged
    # requests to the parent, which joins them to its one fetch from the origin.
    query = {"case": "two-pods", "rate": 12_000_000}
    with ThreadPoolExecutor(2) as pool:
        downloads = list(pool.map(lambda pod: curl(pod, origin.url("big.bin", **query)), pods))
    for download in downloads:
        assert download.body == body_of(dataset, "big.bin"), download.stderr
    assert origin.count("big.bin", **query) == 1
    codes = [code for code, _, url in squid.access_log() if "big.bin" in url]
    assert any(code.endswith("/206") for code in codes), codes  # the parent got ranges
    for pod in pods:
        stats = pod.stats()
        assert stats["parent_requests"] >= 3 and stats["parent_failures"] == {}
        assert stats["parent_state"] == {squid.url: 1}


def test_private_requests_never_reach_the_parent(
    start_sidecar: Callable[..., Sidecar],
    start_parent: Callable[..., Squid],
    origin: OriginServer,
    dataset: Path,
) -> None:
    squid = start_parent()
    # One worker: each worker learns by itself which objects are private.
    pod = start_sidecar("--parent", squid.url, "--workers", "1")
    expected = body_of(dataset, "small.bin")
    auth = curl(pod, origin.url("small.bin", case="auth"), "-H", "Authorization: Bearer t")
    assert auth.body == expected
    assert curl(pod, origin.url("small.bin", case="cookie"), "-H", "Cookie: s=1").body == expected
    signed = origin.url("small.bin", case="signed", **{"X-Amz-Signature": "ab"})
    assert curl(pod, signed).body == expected
    # A response that a shared cache must not store is learnt from the parent's first
    # answer: from then on that object goes to the origin directly.
    for _ in range(2):
        assert curl(pod, origin.url("small.bin", case="nostore", nostore=1)).body == expected
    urls = squid.urls()
    assert not [url for url in urls if "case=auth" in url or "case=cookie" in url]
    assert not [url for url in urls if "case=signed" in url]
    assert len([url for url in urls if "case=nostore" in url]) == 1
    assert origin.count("small.bin", case="nostore", nostore=1) == 2
    bypasses = pod.stats()["parent_bypasses"]
    assert bypasses == {"credentials": 2, "signed-url": 1, "private-response": 1}, bypasses


def test_a_tls_parent_is_used_only_when_its_certificate_verifies(
    start_sidecar: Callable[..., Sidecar],
    start_parent: Callable[..., Squid],
    origin: OriginServer,
    dataset: Path,
    tmp_path: Path,
) -> None:
    parent_ca = trustme.CA()
    squid = start_parent(tls=parent_ca.issue_cert("127.0.0.1"))
    ca_pem = tmp_path / "parent-ca.pem"
    parent_ca.cert_pem.write_to_path(str(ca_pem))
    trusting = start_sidecar("--parent", squid.tls_url, "--parent-ca", str(ca_pem))
    url = origin.url("small.bin", case="tls-parent")
    assert curl(trusting, url).body == body_of(dataset, "small.bin")
    assert trusting.stats()["parent_failures"] == {}
    assert squid.urls().count(url) == 1
    # Without the parent's CA its certificate is refused: the origin serves, never Squid.
    doubting = start_sidecar("--parent", squid.tls_url, "--workers", "1")
    other = origin.url("small.bin", case="tls-parent-doubted")
    assert curl(doubting, other).body == body_of(dataset, "small.bin")
    assert doubting.stats()["parent_failures"] == {"unreachable": 1}
    assert other not in squid.urls()


def test_a_parent_killed_mid_download_is_resumed_from_the_origin(
    start_sidecar: Callable[..., Sidecar],
    start_parent: Callable[..., Squid],
    origin: OriginServer,
    dataset: Path,
) -> None:
    squid = start_parent()
    pod = start_sidecar("--parent", squid.url, "--parallel-fetch", "1")
    query = {"case": "killed", "rate": 8_000_000}  # 24 MiB: about 3 s

    def kill_when_streaming() -> None:
        wait_until(lambda: pod.stats()["bytes_from_upstream"] > 2_000_000, "bytes via Squid")
        squid.stop(9)

    killer = threading.Thread(target=kill_when_streaming)
    killer.start()
    download = curl(pod, origin.url("big.bin", **query))
    killer.join()
    assert download.returncode == 0, download.stderr
    assert download.body == body_of(dataset, "big.bin")
    stats = pod.stats()
    assert stats["parent_failures"] == {"broke-off": 1} and stats["parent_state"] == {squid.url: 0}
    assert origin.requests()["ranges"][origin.target("big.bin", **query)] == 1  # the resume
    wait_until(lambda: pod.stats()["entries"] == 1, "the commit")


@pytest.fixture
def silent_parent() -> Iterator[str]:
    """A parent that accepts connections and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


@pytest.fixture
def unavailable_parent() -> Iterator[str]:
    """A parent that answers every request 503 itself (a balancer without backends)."""

    class Unavailable(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            while self.rfile.readline() not in (b"\r\n", b""):
                pass
            self.wfile.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")

    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), Unavailable) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_address[1]}"
        server.shutdown()


@pytest.mark.parametrize("failure", ["unreachable", "status-5xx", "timeout"])
def test_a_failing_parent_falls_back_to_the_origin_and_is_skipped(
    failure: str,
    start_sidecar: Callable[..., Sidecar],
    silent_parent: str,
    unavailable_parent: str,
    origin: OriginServer,
    dataset: Path,
) -> None:
    if failure == "unreachable":
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            parent = f"http://127.0.0.1:{unused.getsockname()[1]}"
    elif failure == "status-5xx":
        parent = unavailable_parent
    else:
        parent = silent_parent
    pod = start_sidecar(
        "--parent", parent, "--parent-timeout", "1", "--workers", "2", "--access-log"
    )
    started = time.monotonic()
    # The first download holds its connection (a slow body) while the others come: they
    # go to the other worker (mostly: the balance is not strict), which must know of the
    # failure already.
    slow = origin.url("medium.bin", case=f"fail-{failure}", rate=1_500_000)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(curl, pod, slow)
        wait_until(lambda: pod.stats()["parent_failures"], "the parent's first failure")
        for attempt in range(5):
            other = curl(pod, origin.url("small.bin", case=f"fail-{failure}-{attempt}"))
            assert other.body == body_of(dataset, "small.bin"), other.stderr
            if len(download_workers(pod.log())) == 2:
                break
        assert first.result().body == body_of(dataset, "medium.bin"), first.result().stderr
    assert download_workers(pod.log()) == {"w0", "w1"}, pod.log()
    stats = pod.stats()
    assert stats["parent_requests"] == 1  # no object waited for it again, in any worker
    assert stats["parent_failures"] == {failure: 1} and stats["parent_state"] == {parent: 0}
    assert pod.log().count(f"parent {parent} failing") == 1
    assert time.monotonic() - started < 20


def download_workers(log: str) -> set[str]:
    """The workers (`w0`, ...) that logged a completed download."""
    return {line.split(" [")[1][:2] for line in log.splitlines() if " -> 200, " in line}


@pytest.mark.parametrize("why", ["acl", "unverified-origin"])
def test_a_request_the_parent_refuses_goes_to_the_origin_without_a_backoff(
    why: str,
    start_sidecar: Callable[..., Sidecar],
    start_parent: Callable[..., Squid],
    origin: OriginServer,
    dataset: Path,
    tmp_path: Path,
) -> None:
    if why == "acl":
        squid = start_parent()  # its ACL refuses URLs naming `refused-by-parent`
    else:
        # A parent that cannot verify the origin answers 503 with its own error page.
        stranger = tmp_path / "stranger.pem"
        trustme.CA().cert_pem.write_to_path(str(stranger))
        squid = start_parent(stranger)
    pod = start_sidecar("--parent", squid.url, "--workers", "1")
    refused = curl(pod, origin.url("small.bin", case=f"refused-by-parent-{why}"))
    assert refused.body == body_of(dataset, "small.bin"), refused.stderr
    assert origin.count("small.bin", case=f"refused-by-parent-{why}") == 1
    stats = pod.stats()
    assert stats["parent_failures"] == {"refused": 1}
    assert stats["parent_state"] == {squid.url: 1}  # no backoff: still in use
    assert curl(pod, origin.url("medium.bin", case="after-refusal")).returncode == 0
    assert pod.stats()["parent_requests"] == 2  # the next object asked the parent again
    if why == "acl":
        assert [code for code, _, url in squid.access_log() if "after-refusal" in url] == [
            "TCP_MISS/200"
        ]


def test_two_parents_split_objects_by_the_hash(
    start_sidecar: Callable[..., Sidecar],
    start_parent: Callable[..., Squid],
    origin: OriginServer,
) -> None:
    parents = [start_parent(), start_parent()]
    pod = start_sidecar(*[arg for squid in parents for arg in ("--parent", squid.url)])
    urls = [origin.url("small.bin", case="split", n=n) for n in range(16)]
    for url in urls:
        assert curl(pod, url).returncode == 0
    names = [squid.url for squid in parents]
    for url in urls:
        holders = [squid for squid in parents if url in squid.urls()]
        assert len(holders) == 1, url
        assert holders[0].url == rendezvous.choose(policy.cache_key(url), names)
    assert all(any(url in squid.urls() for url in urls) for squid in parents)
