"""Faults: a killed sidecar, a damaged or vanished buffer, lying origins, hostile clients."""

from __future__ import annotations

import random
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import diskcache
import pytest

from bench.harness import OriginServer, Sidecar, wait_until
from tests.sidecar.conftest import FILES, curl

pytestmark = pytest.mark.e2e


def body_of(dataset: Path, name: str) -> bytes:
    return (dataset / name).read_bytes()


def start_failure(sidecar: Sidecar) -> tuple[int, str]:
    """Launch a sidecar that is expected not to start: its exit status and its output."""
    sidecar.launch()
    assert sidecar.process is not None
    sidecar.process.popen.wait(timeout=30)
    return sidecar.process.popen.returncode, sidecar.log()


@pytest.mark.parametrize("taken", ["proxy", "admin"])
def test_a_port_in_use_stops_the_sidecar_with_one_clear_line(
    needs_root: None, hosts_file: Path, pod_dir: Path, taken: str
) -> None:
    sidecar = Sidecar(pod_dir, hosts_file, ["--intercept", "origin.test"])
    port = sidecar.proxy_port if taken == "proxy" else sidecar.admin_port
    with socket.create_server(("127.0.0.1", port)):
        status, log = start_failure(sidecar)
    assert status == 1
    assert "Traceback" not in log
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "cannot start" in errors[0] and str(port) in errors[0], log
    assert "in use" in errors[0]


def test_a_buffer_dir_that_can_never_work_is_a_configuration_error(
    needs_root: None, hosts_file: Path, pod_dir: Path
) -> None:
    not_a_directory = Sidecar(pod_dir, hosts_file, ["--buffer-dir", "/etc/passwd"])
    status, log = start_failure(not_a_directory)
    assert status == 2 and "Traceback" not in log
    assert "error: --buffer-dir: /etc/passwd exists and is not a directory" in log
    readonly = pod_dir / "readonly"
    readonly.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(readonly)], check=True)
    try:
        unwritable = Sidecar(pod_dir / "ro-sidecar", hosts_file, ["--buffer-dir", str(readonly)])
        unwritable.directory.mkdir()
        status, log = start_failure(unwritable)
    finally:
        subprocess.run(["umount", "-l", str(readonly)], check=False)
    assert status == 2 and "Traceback" not in log
    assert f"error: --buffer-dir: cannot write into {readonly}: " in log
    assert "Read-only file system" in log


def index_is_consistent(buffer_dir: Path) -> bool:
    with diskcache.Cache(str(buffer_dir / "index")) as index:
        return not index.check()


@pytest.fixture
def pod_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "pod"
    directory.mkdir()
    return directory


def test_kill_9_during_a_fill_leaves_no_partial_object(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path, pod_dir: Path
) -> None:
    sidecar = start_sidecar(directory=pod_dir)
    url = origin.url("big.bin", case="kill-fill", rate=4_000_000)
    client = threading.Thread(target=curl, args=(sidecar, url))
    client.start()
    wait_until(lambda: sidecar.stats()["bytes_from_upstream"] > 1_000_000, "a fill under way")
    sidecar.stop(signal.SIGKILL)
    client.join(30)
    assert any((sidecar.buffer_dir / "partial").iterdir())  # the kill left a partial body

    again = start_sidecar(directory=pod_dir)
    assert not any((again.buffer_dir / "partial").iterdir())
    stats = again.stats()
    assert stats["entries"] == 0 and stats["buffer_bytes"] == 0
    assert curl(again, origin.url("big.bin", case="kill-fill")).body == body_of(dataset, "big.bin")
    again.stop()
    assert index_is_consistent(again.buffer_dir)


def test_kill_9_during_a_hit_keeps_the_object(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path, pod_dir: Path
) -> None:
    sidecar = start_sidecar(directory=pod_dir)
    url = origin.url("big.bin", case="kill-hit")
    assert curl(sidecar, url).body == body_of(dataset, "big.bin")
    sidecar.wait_for_entries(1)
    slow = threading.Thread(target=curl, args=(sidecar, url, "--limit-rate", "2M"))
    slow.start()
    wait_until(lambda: sidecar.stats()["bytes_from_buffer"] > 1_000_000, "a hit under way")
    sidecar.stop(signal.SIGKILL)
    slow.join(30)

    again = start_sidecar(directory=pod_dir)
    wait_until(lambda: again.stats()["unverified_entries"] == 0, "verification")
    assert curl(again, url).body == body_of(dataset, "big.bin")
    assert again.stats()["hits"] == 1
    assert origin.full_fetches("big.bin", case="kill-hit") == 1


def test_kill_9_at_moments_drawn_at_random_loses_nothing_across_restarts(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path, pod_dir: Path
) -> None:
    """Three times: a sidecar of two workers on the same buffer, two clients at a time
    reading objects of every size, and `kill -9` of the whole sidecar at a moment drawn
    at random. Every download is exact or fails; the fourth start serves every object
    whole and from the buffer once fetched, with a consistent index."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    plan = [("small.bin", 200_000)] * 6 + [("medium.bin", 6_000_000)] * 3
    plan += [("big.bin", 48_000_000)]
    urls = {
        origin.url(name, case=f"kill-random-{seed}-{index}", rate=rate): name
        for index, (name, rate) in enumerate(plan)
    }
    expected = {name: body_of(dataset, name) for name in FILES}
    for _ in range(3):
        sidecar = start_sidecar("--workers", "2", directory=pod_dir)
        requests = list(urls) * 2
        rng.shuffle(requests)
        with ThreadPoolExecutor(5) as pool:
            downloads = [(url, pool.submit(curl, sidecar, url)) for url in requests]
            time.sleep(rng.uniform(0.1, 1.5))
            sidecar.stop(signal.SIGKILL)
            for url, download in downloads:
                result = download.result()
                assert result.returncode != 0 or result.body == expected[urls[url]], (seed, url)
    again = start_sidecar("--workers", "2", directory=pod_dir)
    wait_until(lambda: again.stats()["unverified_entries"] == 0, "verification")
    assert not any((again.buffer_dir / "partial").iterdir()), seed
    stored = again.stats()["entries"]
    for url, name in urls.items():
        assert curl(again, url).body == expected[name], (seed, url)
    again.wait_for_entries(len(urls))
    hits = again.stats()["hits"]
    for url, name in urls.items():
        assert curl(again, url).body == expected[name], (seed, url)
    assert again.stats()["hits"] == hits + len(urls), seed
    assert stored <= len(urls), seed
    again.stop()
    assert index_is_consistent(again.buffer_dir), seed


def test_a_corrupted_body_is_never_served_after_a_restart(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path, pod_dir: Path
) -> None:
    sidecar = start_sidecar(directory=pod_dir)
    url = origin.url("medium.bin", case="corrupt")
    assert curl(sidecar, url).body == body_of(dataset, "medium.bin")
    sidecar.wait_for_entries(1)
    sidecar.stop()
    (body,) = (sidecar.buffer_dir / "objects").iterdir()
    data = bytearray(body.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one bit pattern flipped
    body.write_bytes(bytes(data))

    again = start_sidecar(directory=pod_dir)
    wait_until(lambda: again.stats()["unverified_entries"] == 0, "verification")
    assert again.stats()["entries"] == 0
    assert curl(again, url).body == body_of(dataset, "medium.bin")
    assert origin.count("medium.bin", case="corrupt") == 2


def test_a_buffer_emptied_at_run_time_never_fails_a_download(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    url = origin.url("medium.bin", case="emptied")
    assert curl(sidecar, url).body == body_of(dataset, "medium.bin")
    subprocess.run(["rm", "-rf", str(sidecar.buffer_dir / "objects")], check=True)
    subprocess.run(["rm", "-rf", str(sidecar.buffer_dir / "partial")], check=True)
    for case in ("emptied", "emptied-new"):
        download = curl(sidecar, origin.url("medium.bin", case=case))
        assert download.returncode == 0, download.stderr
        assert download.body == body_of(dataset, "medium.bin")
    # The buffer rebuilt its directories and fills again.
    assert curl(sidecar, url).body == body_of(dataset, "medium.bin")


def test_a_buffer_made_read_only_at_run_time_never_fails_a_download(
    start_sidecar: Callable[..., Sidecar],
    origin: OriginServer,
    dataset: Path,
    pod_dir: Path,
) -> None:
    buffer_dir = pod_dir / "buffer"
    buffer_dir.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(buffer_dir)], check=True)
    try:
        sidecar = start_sidecar(directory=pod_dir)
        assert sidecar.process is not None
        stored = origin.url("small.bin", case="ro-stored")
        assert curl(sidecar, stored).body == body_of(dataset, "small.bin")
        sidecar.wait_for_entries(1)  # a commit may follow the last byte
        # Inside the sidecar's own mount namespace, where its buffer lives, lay a
        # read-only view over the buffer (a plain remount is refused while files are open).
        enter = ["nsenter", "-t", str(sidecar.process.popen.pid), "-m"]
        subprocess.run([*enter, "mount", "--bind", str(buffer_dir), str(buffer_dir)], check=True)
        readonly = ["mount", "-o", "remount,bind,ro", str(buffer_dir)]
        subprocess.run([*enter, *readonly], check=True)
        assert curl(sidecar, stored).body == body_of(dataset, "small.bin")  # still a hit
        for _ in range(2):
            download = curl(sidecar, origin.url("medium.bin", case="ro-new"))
            assert download.returncode == 0, download.stderr
            assert download.body == body_of(dataset, "medium.bin")
        stats = sidecar.stats()
        assert stats["buffer_errors"] >= 1 and stats["hits"] == 1
        assert sidecar.log().count("failed, serving from upstream instead") == 1  # once a minute
        # It says so everywhere: /stats, /metrics, the passes' reason.
        assert stats["buffer"].startswith("unavailable: ") and "Read-only" in stats["buffer"]
        assert stats["buffer_available"] == 0
        assert stats["pass_reasons"] == {"buffer-unavailable": 2}
        assert "burstbuffer_buffer_available 0.0" in sidecar.metrics()
    finally:
        subprocess.run(["umount", "-l", str(buffer_dir)], check=False)


@pytest.mark.parametrize(
    ("query", "expect_ok"),
    [
        ({"status": 302}, True),  # redirects are the client's to follow, never stored
        ({"status": 404}, False),
        ({"wrong206": 1}, True),  # a 206 for a plain GET is passed through as sent
        ({"drop": 500_000, "badrange": 1}, False),  # a resume with the wrong bytes
    ],
)
def test_origins_that_misbehave_are_passed_or_refused_and_never_stored(
    sidecar: Sidecar, origin: OriginServer, query: dict[str, int], expect_ok: bool
) -> None:
    url = origin.url("medium.bin", **query)
    download = curl(sidecar, url)
    assert (download.returncode == 0) is expect_ok, download.stderr
    if "drop" in query:
        assert len(download.body) < FILES["medium.bin"]
    stats = sidecar.stats()
    assert stats["entries"] == 0 and stats["reserved_bytes"] == 0


def test_a_redirect_loop_ends_in_the_client_and_stores_nothing(
    sidecar: Sidecar, origin: OriginServer
) -> None:
    url = origin.url("small.bin", loop=1)
    download = curl(sidecar, url, "-L", "--max-redirs", "5")
    assert download.returncode == 47  # curl: maximum redirects followed
    stats = sidecar.stats()
    assert stats["entries"] == 0 and stats["passes"] == 6


def _tls_through_proxy(sidecar: Sidecar, origin: OriginServer) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", sidecar.proxy_port), timeout=10)
    raw.sendall(f"CONNECT origin.test:{origin.port} HTTP/1.1\r\n\r\n".encode())
    assert raw.recv(4096).startswith(b"HTTP/1.1 200")
    context = ssl.create_default_context(cafile=str(sidecar.bundle))
    return context.wrap_socket(raw, server_hostname="origin.test")


def _read_response(conn: ssl.SSLSocket, buffered: bytearray) -> tuple[bytes, bytes]:
    while b"\r\n\r\n" not in buffered:
        chunk = conn.recv(65536)
        assert chunk, "connection closed before a response head"
        buffered += chunk
    head, _, rest = bytes(buffered).partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    body = bytearray(rest)
    while len(body) < length:
        chunk = conn.recv(65536)
        assert chunk, "connection closed mid-body"
        body += chunk
    buffered[:] = body[length:]
    return head, bytes(body[:length])


def test_pipelined_requests_get_their_own_responses_in_order(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    path = "/files/small.bin?case=pipeline"
    curl(sidecar, origin.url("small.bin", case="pipeline"))  # stored
    request = f"GET {path} HTTP/1.1\r\nHost: origin.test:{origin.port}\r\n\r\n"
    ranged = f"GET {path} HTTP/1.1\r\nHost: origin.test:{origin.port}\r\nRange: bytes=0-9\r\n\r\n"
    with _tls_through_proxy(sidecar, origin) as conn:
        conn.sendall((request + ranged + request).encode())
        buffered = bytearray()
        responses = [_read_response(conn, buffered) for _ in range(3)]
    expected = body_of(dataset, "small.bin")
    assert [body for _, body in responses] == [expected, expected[:10], expected]
    assert responses[1][0].startswith(b"HTTP/1.1 206")


@pytest.mark.parametrize(
    ("extra", "status"),
    [
        ("Range: bytes=99999999999999999999999999999-\r\n", b"416"),
        ("Range: bytes=-99999999999999999999999999999\r\n", b"206"),  # all of it
        ("Range: bytes=5-1\r\n", b"200"),
        ("X-Huge: " + "a" * 60_000 + "\r\n", b"200"),
    ],
)
def test_hostile_requests_get_a_clear_answer_and_the_proxy_survives(
    sidecar: Sidecar, origin: OriginServer, dataset: Path, extra: str, status: bytes
) -> None:
    path = "/files/small.bin?case=hostile"
    curl(sidecar, origin.url("small.bin", case="hostile"))
    with _tls_through_proxy(sidecar, origin) as conn:
        conn.sendall(f"GET {path} HTTP/1.1\r\nHost: origin.test\r\n{extra}\r\n".encode())
        head, _ = _read_response(conn, bytearray())
    assert head.split(b" ")[1] == status
    assert curl(sidecar, origin.url("small.bin", case="hostile")).body == body_of(
        dataset, "small.bin"
    )


def test_a_locked_index_never_fails_a_download(
    sidecar: Sidecar, origin: OriginServer, dataset: Path
) -> None:
    stored = origin.url("small.bin", case="locked-stored")
    assert curl(sidecar, stored).body == body_of(dataset, "small.bin")
    # Another process holds SQLite's write lock: every index operation times out.
    holder = subprocess.Popen(
        [
            "python3",
            "-c",
            "import sqlite3, sys, time\n"
            "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "db.execute('BEGIN EXCLUSIVE')\n"
            "print('locked', flush=True)\n"
            "time.sleep(float(sys.argv[2]))\n",
            str(sidecar.buffer_dir / "index" / "cache.db"),
            "20",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        fresh = curl(sidecar, origin.url("small.bin", case="locked-new"))
        assert fresh.returncode == 0, fresh.stderr
        assert fresh.body == body_of(dataset, "small.bin")
        again = curl(sidecar, stored)
        assert again.returncode == 0 and again.body == body_of(dataset, "small.bin")
        # The failed commit is counted once the index lock times out, after the download.
        wait_until(lambda: sidecar.stats()["buffer_errors"] >= 1, "the failed commit counted")
    finally:
        holder.kill()
        holder.communicate()
