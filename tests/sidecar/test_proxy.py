"""The sidecar end to end: real origins, the real sidecar, real clients."""

from __future__ import annotations

import hashlib
import signal
import socket
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import blake3
import pytest

from bench.harness import (
    OriginServer,
    Sidecar,
    process_tree,
    wait_until,
)
from bench.memory import RssSampler
from sidecar.buffer.store import Index
from sidecar.cache import policy
from tests.sidecar.conftest import (
    FILES,
    Download,
    curl,
    pod_env,
    requests_get,
    urllib_get,
    wget,
)
from tests.sidecar.parent_proxy import ParentProxy

pytestmark = pytest.mark.e2e

CLIENTS: dict[str, Callable[..., Download]] = {
    "curl": curl,
    "wget": wget,
    "urllib": urllib_get,
    "requests": requests_get,
}


def body_of(dataset: Path, name: str) -> bytes:
    return (dataset / name).read_bytes()


@pytest.mark.parametrize("client", CLIENTS)
def test_cold_then_warm_download_is_identical_and_fetched_once(
    client: str, sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    url = origin.url("medium.bin", client=client)
    fetch = CLIENTS[client]
    cold = fetch(sidecar, url)
    assert cold.returncode == 0, cold.stderr
    warm = fetch(sidecar, url)
    assert warm.returncode == 0, warm.stderr
    expected = body_of(dataset, "medium.bin")
    assert cold.body == expected and warm.body == expected
    assert origin.count("medium.bin", client=client) == 1
    stats = sidecar.stats()
    assert (stats["misses"], stats["hits"], stats["entries"]) == (1, 1, 1)
    assert stats["bytes_from_buffer"] == len(expected)
    assert stats["buffer_bytes"] == len(expected)


def test_range_head_and_conditional_requests_are_answered_from_the_buffer(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    url = origin.url("small.bin", case="range")
    expected = body_of(dataset, "small.bin")
    assert curl(sidecar, url).body == expected

    assert curl(sidecar, url, "-r", "100-199").body == expected[100:200]
    assert curl(sidecar, url, "-H", "Range: bytes=-10").body == expected[-10:]
    assert curl(sidecar, url, "-H", "Range: bytes=1000-").body == expected[1000:]
    # Unparseable ranges are ignored (whole object), unsatisfiable ones get 416.
    assert curl(sidecar, url, "-H", "Range: pages=1-2").body == expected
    unsatisfiable = curl(sidecar, url, "-H", f"Range: bytes={len(expected)}-", "-w", "%{http_code}")
    assert unsatisfiable.returncode == 22  # --fail on 416

    head = curl(sidecar, url, "-I")
    assert head.returncode == 0
    etag = _header(head.body, "etag")
    assert etag is not None
    assert _header(head.body, "content-length") == str(len(expected))
    assert _header(head.body, "accept-ranges") == "bytes"

    not_modified = curl(sidecar, url, "-H", f"If-None-Match: {etag}", "-w", "%{http_code}")
    assert not_modified.stdout == "304"

    assert origin.count("small.bin", case="range") == 1
    assert sidecar.stats()["hits"] == 7


def test_keep_alive_survives_hits(sidecar: Sidecar, origin: OriginServer, dataset: Path) -> None:
    url = origin.url("small.bin", case="keepalive")
    expected = body_of(dataset, "small.bin")
    # One curl process, five transfers: the connection must be reused after each hit.
    argv = ["-v"] + [part for _ in range(5) for part in ("-o", "/dev/null", url)]
    result = curl(sidecar, url, *argv)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("Re-using existing") + result.stderr.count("Reusing existing") >= 4
    assert curl(sidecar, url).body == expected
    assert origin.count("small.bin", case="keepalive") == 1


def test_concurrent_cold_clients_share_one_upstream_fetch(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    url = origin.url("medium.bin", case="coalesce", rate=6_000_000)
    with ThreadPoolExecutor(8) as pool:
        downloads = list(pool.map(lambda _: curl(sidecar, url), range(8)))
    expected = body_of(dataset, "medium.bin")
    assert all(d.returncode == 0 and d.body == expected for d in downloads)
    assert origin.count("medium.bin", case="coalesce", rate=6_000_000) == 1
    stats = sidecar.stats()
    assert stats["misses"] + stats["coalesced"] + stats["hits"] == 8
    assert stats["misses"] == 1


def test_a_host_that_is_not_intercepted_is_tunnelled_with_its_own_certificate(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    url = origin.url("small.bin", host="tunnel.test")
    # Trusting only the origin's own CA works only if the sidecar did not intercept.
    direct_trust = curl(sidecar, url, "--cacert", str(origin.ca_pem))
    assert direct_trust.returncode == 0, direct_trust.stderr
    assert direct_trust.body == body_of(dataset, "small.bin")
    stats = sidecar.stats()
    assert stats["misses"] == stats["hits"] == stats["entries"] == 0
    # Where those bytes went is visible: counted, and the host named once in the log.
    size = len(body_of(dataset, "small.bin"))
    assert stats["tunnelled_connections"] == 1
    assert size < stats["tunnelled_bytes"] < size + 64 * 1024  # TLS records and handshake
    curl(sidecar, url, "--cacert", str(origin.ca_pem))
    stats = sidecar.stats()
    assert stats["tunnelled_connections"] == 2
    assert stats["tunnelled_bytes"] > 2 * size
    exported = f"burstbuffer_tunnelled_bytes_total {float(stats['tunnelled_bytes'])}"
    assert exported in sidecar.metrics()
    log = sidecar.log()
    assert log.count("not intercepted: tunnel.test; add it to --intercept to cache it") in (1, 2)


def test_a_bad_origin_certificate_is_an_error_never_a_download(
    start_sidecar: Callable[..., Sidecar], bad_origin: OriginServer
) -> None:
    sidecar = start_sidecar("--intercept", "origin.test,badcert.test")
    url = bad_origin.url("small.bin", host="badcert.test")
    result = curl(sidecar, url, "-w", "%{http_code}")
    assert result.returncode == 22
    assert result.stdout == "502"
    assert "certificate" in sidecar.log().lower()
    assert sidecar.stats()["entries"] == 0


def test_an_object_larger_than_the_buffer_passes_through(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    sidecar = start_sidecar("--buffer-size", "1MiB")
    url = origin.url("medium.bin", case="toobig")
    for _ in range(2):
        assert curl(sidecar, url).body == body_of(dataset, "medium.bin")
    assert origin.count("medium.bin", case="toobig") == 2
    stats = sidecar.stats()
    assert stats["entries"] == 0 and stats["admissions_refused"] == 2


@pytest.mark.parametrize(("eviction", "kept"), [("none", "first"), ("lru", "second")])
def test_a_full_buffer_keeps_or_evicts_by_policy(
    eviction: str,
    kept: str,
    start_sidecar: Callable[..., Sidecar],
    origin: OriginServer,
) -> None:
    # Room for one 3 MiB object only.
    sidecar = start_sidecar("--buffer-size", "4MiB", "--eviction", eviction)
    first, second = (origin.url("medium.bin", n=n, policy=eviction) for n in (1, 2))
    curl(sidecar, first)
    curl(sidecar, second)
    curl(sidecar, first)
    curl(sidecar, second)
    counts = tuple(origin.count("medium.bin", n=n, policy=eviction) for n in (1, 2))
    if kept == "first":
        # No replacement: the first object stays; the second always passes through.
        assert counts == (1, 2)
    else:
        # LRU: each object evicts the other.
        assert counts == (2, 2)
    stats = sidecar.stats()
    assert stats["entries"] == 1 and stats["eviction"] == eviction
    # The policy is a series of its own, for the alerts (one series: the policy in force).
    policies = [line for line in sidecar.metrics().splitlines() if "eviction_policy_info{" in line]
    assert policies == [f'burstbuffer_eviction_policy_info{{policy="{eviction}"}} 1.0']


def test_a_dropped_upstream_connection_is_resumed_transparently(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    url = origin.url("big.bin", drop=5_000_000)
    download = curl(sidecar, url)
    assert download.returncode == 0, download.stderr
    assert (
        hashlib.sha256(download.body).digest()
        == hashlib.sha256(body_of(dataset, "big.bin")).digest()
    )
    ranges = origin.requests()["ranges"]
    assert sum(ranges.values()) >= 1
    assert curl(sidecar, url).body == body_of(dataset, "big.bin")
    assert sidecar.stats()["hits"] == 1


def test_an_unresumable_drop_fails_the_client_and_stores_nothing(
    sidecar: Sidecar, origin: OriginServer
) -> None:
    url = origin.url("big.bin", dropalways=2_000_000, novalidators=1)
    download = curl(sidecar, url)
    assert download.returncode != 0  # curl: (18) transfer closed with bytes remaining
    assert len(download.body) < FILES["big.bin"]
    stats = sidecar.stats()
    assert stats["entries"] == 0 and stats["buffer_bytes"] == 0 and stats["reserved_bytes"] == 0


def test_a_chunked_object_is_stored_whole_and_a_client_that_comes_meanwhile_passes(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    # A body of unknown length is nobody's to join (sidecar.buffer.keeper says why).
    query = {"chunked": 1, "case": "chunked-join", "rate": 16_000_000}
    url = origin.url("big.bin", **query)
    expected = body_of(dataset, "big.bin")
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(curl, sidecar, url)
        wait_until(lambda: sidecar.stats()["fills_in_progress"] == 1, "the fill to start")
        meanwhile = curl(sidecar, url)
        assert first.result().body == expected and meanwhile.body == expected
    assert sidecar.stats()["pass_reasons"]["filling-unsized"] == 1
    hit = curl(sidecar, url, "-D", "-")
    assert hit.body == expected and f"content-length: {len(expected)}" in hit.stdout.lower()
    assert origin.count("big.bin", **query) == 2
    stats = sidecar.stats()
    assert (stats["misses"], stats["hits"], stats["entries"]) == (1, 1, 1)
    assert stats["buffer_bytes"] == len(expected) and stats["reserved_bytes"] == 0


def test_a_chunked_body_the_origin_drops_fails_the_client_and_stores_nothing(
    sidecar: Sidecar, origin: OriginServer
) -> None:
    # Without a length there is no resuming with a Range.
    url = origin.url("big.bin", chunked=1, dropalways=2_000_000)
    for _ in range(2):
        download = curl(sidecar, url)
        assert download.returncode != 0 and len(download.body) < FILES["big.bin"]
    assert origin.count("big.bin", chunked=1, dropalways=2_000_000) == 2
    stats = sidecar.stats()
    assert stats["entries"] == 0 and stats["buffer_bytes"] == 0 and stats["reserved_bytes"] == 0


def test_a_lying_content_length_is_an_error_and_is_not_stored(
    sidecar: Sidecar, origin: OriginServer
) -> None:
    url = origin.url("small.bin", lie=1000, novalidators=1)
    assert curl(sidecar, url).returncode != 0
    assert sidecar.stats()["entries"] == 0


@pytest.mark.parametrize(
    ("query", "reason"),
    [({"nostore": 1}, "response-no-store"), ({"gzip": 1}, "content-encoding")],
)
def test_uncacheable_responses_pass_and_are_not_stored(
    sidecar: Sidecar, origin: OriginServer, dataset: Path, query: dict[str, int], reason: str
) -> None:
    url = origin.url("small.bin", **query)
    for _ in range(2):
        assert curl(sidecar, url).body == body_of(dataset, "small.bin")
    assert origin.count("small.bin", **query) == 2
    stats = sidecar.stats()
    assert stats["entries"] == 0 and stats["pass_reasons"][reason] == 2


def test_a_full_tmpfs_never_fails_a_download(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path, tmp_path: Path
) -> None:
    # The buffer claims 64 MiB, the file system under it holds 1 MiB: ENOSPC mid-fill.
    directory = tmp_path / "tiny"
    (directory / "buffer").mkdir(parents=True)
    mount = ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(directory / "buffer")]
    subprocess.run(mount, check=True)
    try:
        sidecar = start_sidecar("--buffer-size", "64MiB", directory=directory)
        url = origin.url("medium.bin", case="enospc")
        for _ in range(2):
            download = curl(sidecar, url)
            assert download.returncode == 0, download.stderr
            assert download.body == body_of(dataset, "medium.bin")
        stats = sidecar.stats()
        assert stats["buffer_errors"] >= 1 and stats["entries"] == 0
    finally:
        subprocess.run(["umount", "-l", str(directory / "buffer")], check=False)


def test_a_restarted_sidecar_keeps_complete_objects_and_its_trust_files(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path, tmp_path: Path
) -> None:
    """Both ways a digest is taken (the core's, of a small body as it arrives; a thread's,
    of a larger one) record the one the check after the restart finds: no object is
    dropped and fetched again."""
    directory = tmp_path / "pod"
    directory.mkdir()
    sidecar = start_sidecar(directory=directory)
    names = ("small.bin", "medium.bin")
    for name in names:
        assert curl(sidecar, origin.url(name, case="restart")).body == body_of(dataset, name)
    sidecar.wait_for_entries(len(names))
    bundle_before = sidecar.bundle.stat()
    sidecar.stop(signal.SIGKILL)

    again = start_sidecar(directory=directory)
    bundle_after = again.bundle.stat()
    assert (bundle_after.st_ino, bundle_after.st_mtime_ns) == (
        bundle_before.st_ino,
        bundle_before.st_mtime_ns,
    )
    wait_until(lambda: again.stats()["unverified_entries"] == 0, "verification after restart")
    assert again.stats()["entries"] == len(names)
    for name in names:
        assert curl(again, origin.url(name, case="restart")).body == body_of(dataset, name)
        assert origin.count(name, case="restart") == 1
    assert again.stats()["hits"] == len(names)


def test_admin_endpoints(sidecar: Sidecar) -> None:
    text = sidecar.metrics()
    for name in ("burstbuffer_hits_total", "burstbuffer_misses_total", "burstbuffer_entries"):
        assert name in text
    stats = sidecar.stats()
    for key in (
        "hits",
        "misses",
        "bytes_from_buffer",
        "bytes_from_upstream",
        "upstream_requests",
        "entries",
        "buffer_bytes",
    ):
        assert isinstance(stats[key], int)


def _header(raw: bytes, name: str) -> str | None:
    for line in raw.decode("latin-1").splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def test_a_range_only_reader_is_answered_at_once_and_fills_the_buffer(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    url = origin.url("big.bin", case="range-only")
    expected = body_of(dataset, "big.bin")
    first = curl(sidecar, url, "-r", "0-65535")
    assert first.returncode == 0 and first.body == expected[:65536]
    far = curl(sidecar, url, "-r", f"{len(expected) - 1000}-")
    assert far.returncode == 0 and far.body == expected[-1000:]
    wait_until(lambda: sidecar.stats()["entries"] == 1, "the background fill to commit")
    hits = sidecar.stats()["hits"]
    assert curl(sidecar, url, "-r", "1000000-1999999").body == expected[1000000:2000000]
    assert sidecar.stats()["hits"] == hits + 1
    assert origin.full_fetches("big.bin", case="range-only") == 1


def test_secrets_never_reach_the_log(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer
) -> None:
    sidecar = start_sidecar("--access-log")  # every response logged: the strictest case
    url = origin.url("small.bin", **{"X-Amz-Signature": "s3cr3tsignature", "case": "secrets"})
    result = curl(
        sidecar,
        url,
        "-H",
        "Authorization: Bearer s3cr3ttoken",
        "-H",
        "Cookie: session=s3cr3tcookie",
    )
    assert result.returncode == 0
    curl(sidecar, url, "-H", "Authorization: Bearer s3cr3ttoken")
    log = sidecar.log()
    assert "hit GET" in log
    for secret in ("s3cr3tsignature", "s3cr3ttoken", "s3cr3tcookie"):
        assert secret not in log


def test_the_proxy_and_admin_listen_on_loopback_and_the_key_stays_private(
    start_sidecar: Callable[..., Sidecar],
) -> None:
    first, second = start_sidecar(), start_sidecar()
    listening = Path("/proc/net/tcp").read_text().splitlines()[1:]
    for port in (first.proxy_port, first.admin_port):
        local = [line.split()[1] for line in listening if line.split()[3] == "0A"]
        assert f"0100007F:{port:04X}" in local  # 127.0.0.1, in LISTEN state
        assert f"00000000:{port:04X}" not in local
    files = [p for p in first.ca_dir.iterdir() if p.is_file()]
    key_files = [p for p in files if b"PRIVATE KEY" in p.read_bytes()]
    assert key_files
    for key_file in key_files:
        assert key_file.stat().st_mode & 0o077 == 0
    assert first.ca_dir.stat().st_mode & 0o077 == 0
    for trust_file in first.trust_dir.iterdir():
        assert b"PRIVATE KEY" not in trust_file.read_bytes()
    # Every pod has its own CA.
    assert (first.trust_dir / "ca.crt").read_bytes() != (second.trust_dir / "ca.crt").read_bytes()


def test_an_upstream_proxy_carries_fills_and_tunnels(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    names = {host: "127.0.0.1" for host in ("origin.test", "tunnel.test")}
    with ParentProxy(names).running() as parent:
        sidecar = start_sidecar("--upstream-proxy", f"http://127.0.0.1:{parent.port}")
        cached = origin.url("small.bin", case="parent")
        for _ in range(2):
            assert curl(sidecar, cached).body == body_of(dataset, "small.bin")
        tunnelled = origin.url("small.bin", host="tunnel.test", case="parent")
        direct = curl(sidecar, tunnelled, "--cacert", str(origin.ca_pem))
        assert direct.body == body_of(dataset, "small.bin"), direct.stderr
        assert parent.connects[f"origin.test:{origin.port}"] == 1
        assert parent.connects[f"tunnel.test:{origin.port}"] == 1


# A small body is kept in memory as it arrives, a larger one written into its file.
@pytest.mark.parametrize("name", ["small.bin", "medium.bin"])
def test_a_stalled_origin_is_resumed_after_the_upstream_timeout(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path, name: str
) -> None:
    sidecar = start_sidecar("--upstream-timeout", "1")
    stall = FILES[name] // 2
    url = origin.url(name, stall=stall)
    download = curl(sidecar, url)
    assert download.returncode == 0, download.stderr
    assert download.body == body_of(dataset, name)
    assert origin.requests()["ranges"][origin.target(name, stall=stall)] == 1
    wait_until(lambda: sidecar.stats()["entries"] == 1, "the resumed fill to commit")
    assert sidecar.stats()["entries"] == 1


def test_a_small_miss_reaches_its_client_as_the_origin_sends_it(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    # The origin sends 40,000 of small.bin's 100 KiB, then goes silent until the
    # sidecar gives up on it (after 2 s) and asks for the rest with a Range request.
    sidecar = start_sidecar("--upstream-timeout", "2")
    query = {"stall": 40_000, "case": "streamed"}
    download = curl(sidecar, origin.url("small.bin", **query), "-w", "%{time_starttransfer}")
    assert download.returncode == 0, download.stderr
    assert download.body == body_of(dataset, "small.bin")
    # The core sent the first bytes as they came, not once the whole body was in.
    assert float(download.stdout) < 1.5
    assert origin.requests()["ranges"][origin.target("small.bin", **query)] == 1
    wait_until(lambda: sidecar.stats()["entries"] == 1, "the commit")
    assert curl(sidecar, origin.url("small.bin", **query)).body == body_of(dataset, "small.bin")
    assert sidecar.stats()["hits"] == 1


def test_a_cold_range_of_a_small_object_is_cut_from_its_fill_as_it_comes(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    # The range straddles the byte where the origin stalls: half of it comes with the
    # first response, the rest with the one that resumes it.
    sidecar = start_sidecar("--upstream-timeout", "1")
    url = origin.url("small.bin", stall=40_000, case="cold-range")
    download = curl(sidecar, url, "-r", "30000-49999")
    assert download.returncode == 0, download.stderr
    assert download.body == body_of(dataset, "small.bin")[30000:50000]
    wait_until(lambda: sidecar.stats()["entries"] == 1, "the commit")
    assert curl(sidecar, url).body == body_of(dataset, "small.bin")


@pytest.mark.parametrize("connections", ["4", "1"])
def test_a_large_cold_object_is_fetched_over_parallel_ranges(
    connections: str, start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    sidecar = start_sidecar("--parallel-fetch", connections)
    query = {"case": f"parallel-{connections}", "rate": 16_000_000}
    download = curl(sidecar, origin.url("big.bin", **query))
    assert download.returncode == 0, download.stderr
    assert download.body == body_of(dataset, "big.bin")
    assert origin.full_fetches("big.bin", **query) == 1
    ranged = origin.count("big.bin", **query) - 1
    assert ranged == (3 if connections == "4" else 0)  # 24 MiB = four 6 MiB segments
    wait_until(lambda: sidecar.stats()["entries"] == 1, "the commit")
    assert curl(sidecar, origin.url("big.bin", **query)).body == body_of(dataset, "big.bin")
    assert sidecar.stats()["hits"] == 1
    # Its digest: the core's of the first segment, which Python goes on with when split.
    index = Index(sidecar.buffer_dir)
    index.open()
    try:
        found = index.find(policy.cache_key(origin.url("big.bin", **query)))
    finally:
        index.close()
    assert found is not None
    assert found.entry.digest == blake3.blake3(body_of(dataset, "big.bin")).hexdigest()


def mitmproxy_serving(sidecar: Sidecar) -> None:
    """Wait until the worker's mitmproxy answers what it is handed (an origin-form
    request to the proxy itself): it loads after the worker is ready, and its modules
    would count as growth in a worker's RSS read while it loads."""
    with socket.create_connection(("127.0.0.1", sidecar.proxy_port), timeout=30) as sock:
        sock.sendall(b"GET /files/small.bin HTTP/1.1\r\nHost: origin.test\r\n\r\n")
        assert sock.recv(12).startswith(b"HTTP/1.1 ")


def test_a_client_slower_than_the_origin_costs_no_memory_for_the_body(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    """The core writes a large miss into its file and sends it on as it comes; what a
    client does not take at once it gets later from the file, so the fill ends at the
    origin's pace while the client still reads, and no worker holds the body."""
    sidecar = start_sidecar("--workers", "1")
    mitmproxy_serving(sidecar)  # the worker has loaded it before RSS is read
    stored = sidecar.stats()["entries"]
    workers = process_tree(sidecar.pid)
    with RssSampler(workers) as before:
        pass
    url = origin.url("big.bin", case="slow-client")
    with ThreadPoolExecutor(1) as pool, RssSampler(workers) as during:
        reading = pool.submit(curl, sidecar, url, "--limit-rate", "6M")  # ~4 s for 24 MiB
        committed = lambda: sidecar.stats()["entries"] == stored + 1  # noqa: E731
        wait_until(committed, "the commit", timeout=3)
        assert not reading.done()
        download = reading.result()
    assert download.body == body_of(dataset, "big.bin")
    grown = during.max_mb - before.max_mb
    assert grown < FILES["big.bin"] / 1e6 / 3, f"a worker grew by {grown:.1f} MB"


@pytest.mark.parametrize("framing", [{}, {"chunked": 1}], ids=["length", "chunked"])
def test_a_pass_to_a_slow_client_holds_little_of_its_body_in_a_worker(
    framing: dict[str, int],
    start_sidecar: Callable[..., Sidecar],
    origin: OriginServer,
    dataset: Path,
) -> None:
    """The core forwards a body that passes straight from the origin's connection to
    the client's, and stops reading the origin while the client is behind."""
    sidecar = start_sidecar("--workers", "1")
    mitmproxy_serving(sidecar)  # the worker has loaded it before RSS is read
    workers = process_tree(sidecar.pid)
    with RssSampler(workers) as before:
        pass
    url = origin.url("big.bin", case="slow-pass", nostore=1, **framing)
    with RssSampler(workers) as during:
        download = curl(sidecar, url, "--limit-rate", "6M")  # ~4 s for 24 MiB
    assert download.returncode == 0, download.stderr
    assert download.body == body_of(dataset, "big.bin")
    stats = sidecar.stats()
    assert stats["pass_reasons"] == {"response-no-store": 1}, stats
    assert stats["bytes_from_upstream"] >= FILES["big.bin"], stats
    grown = during.max_mb - before.max_mb
    assert grown < FILES["big.bin"] / 1e6 / 3, f"a worker grew by {grown:.1f} MB"


def test_a_pass_to_a_client_that_pauses_past_the_upstream_timeout_is_whole(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    """While the client takes nothing, the core stops reading the origin: that wait is
    the client's, not a stall of the origin's, however long it lasts."""
    sidecar = start_sidecar("--upstream-timeout", "1")
    script = (
        "import sys, time, urllib.request\n"
        "with urllib.request.urlopen(sys.argv[1], timeout=30) as r:\n"
        "    first = r.read(65536)\n"
        "    time.sleep(3)\n"
        "    sys.stdout.buffer.write(first + r.read())\n"
    )
    url = origin.url("big.bin", case="paused-pass", nostore=1)
    argv = ["python3", "-I", "-c", script, url]
    done = subprocess.run(argv, env=pod_env(sidecar), capture_output=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert done.stdout == body_of(dataset, "big.bin")
    assert sidecar.stats()["pass_reasons"] == {"response-no-store": 1}


def test_a_client_that_leaves_a_pass_ends_it_at_once(
    sidecar: Sidecar, origin: OriginServer
) -> None:
    aborts = sidecar.stats()["client_aborts"]
    url = origin.url("big.bin", case="left-pass", nostore=1)
    left = curl(sidecar, url, "--limit-rate", "1M", "--max-time", "1")
    assert left.returncode != 0
    # Its origin's connection is closed with it, not left paused behind a gone client.
    ended = lambda: sidecar.stats()["client_aborts"] == aborts + 1  # noqa: E731
    wait_until(ended, "the pass to end", timeout=5)


def test_plain_http_to_an_intercepted_host_is_cached_too(
    sidecar: Sidecar, plain_origin: int, dataset: Path
) -> None:
    url = f"http://origin.test:{plain_origin}/files/small.bin?case=plain"
    for _ in range(2):
        download = curl(sidecar, url)
        assert download.returncode == 0, download.stderr
        assert download.body == body_of(dataset, "small.bin")
        # The next is a hit once this object is committed (during the commit it joins).
        wait_until(lambda: sidecar.stats()["fills_in_progress"] == 0, "the commit")
    stats = sidecar.stats()
    assert (stats["misses"], stats["hits"]) == (1, 1)


def test_plain_http_tunnelled_through_connect_is_cached(
    sidecar: Sidecar, plain_origin: int, dataset: Path
) -> None:
    # Node's fetch and undici's ProxyAgent CONNECT even for http URLs, as `curl -p` does.
    url = f"http://origin.test:{plain_origin}/files/small.bin?case=tunnelled"
    for _ in range(2):
        download = curl(sidecar, url, "--proxytunnel")
        assert download.returncode == 0, download.stderr
        assert download.body == body_of(dataset, "small.bin")
        # The next is a hit once this object is committed (during the commit it joins).
        wait_until(lambda: sidecar.stats()["fills_in_progress"] == 0, "the commit")
    stats = sidecar.stats()
    assert (stats["misses"], stats["hits"]) == (1, 1)


def test_requests_mitmproxy_relays_itself_are_passes_with_their_reason(
    sidecar: Sidecar, plain_origin: int, dataset: Path
) -> None:
    size = len(body_of(dataset, "small.bin"))
    elsewhere = curl(sidecar, f"http://tunnel.test:{plain_origin}/files/small.bin")
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert elsewhere.body == body_of(dataset, "small.bin")
    intercepted = f"http://origin.test:{plain_origin}/files/small.bin?case=relayed"
    posted = curl(sidecar, intercepted, "--data", "x")  # only GET and HEAD are the router's
    assert posted.returncode == 0, posted.stderr
    stats = sidecar.stats()
    assert stats["pass_reasons"] == {"not-intercepted": 1, "method": 1}
    assert stats["passes"] == 2 and stats["misses"] == stats["entries"] == 0
    assert stats["bytes_from_upstream"] >= size
    assert 'burstbuffer_passes_by_reason_total{reason="not-intercepted"} 1.0' in sidecar.metrics()


def test_revalidation_serves_unchanged_objects_from_the_buffer_and_refills_changed_ones(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    sidecar = start_sidecar("--revalidate")
    changing = dataset / "changing.bin"
    changing.write_bytes(b"first version\n" * 1000)
    url = origin.url("changing.bin", case="revalidate")
    assert curl(sidecar, url).body == changing.read_bytes()
    sidecar.wait_for_entries(1)
    assert curl(sidecar, url).body == changing.read_bytes()  # 304 upstream, body from buffer
    assert sidecar.stats()["hits"] == 1
    changing.write_bytes(b"second version\n" * 1000)
    assert curl(sidecar, url).body == b"second version\n" * 1000
    assert origin.count("changing.bin", case="revalidate") == 3  # fill, 304, 200 (the refill)


def test_a_client_no_cache_request_revalidates_even_without_the_flag(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    url = origin.url("small.bin", case="no-cache")
    curl(sidecar, url)
    sidecar.wait_for_entries(1)
    assert curl(sidecar, url).body == body_of(dataset, "small.bin")
    assert origin.count("small.bin", case="no-cache") == 1
    revalidated = curl(sidecar, url, "-H", "Cache-Control: no-cache")
    assert revalidated.body == body_of(dataset, "small.bin")
    assert origin.count("small.bin", case="no-cache") == 2
    assert sidecar.stats()["hits"] == 2
