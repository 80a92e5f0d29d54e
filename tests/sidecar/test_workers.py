"""Several worker processes behave as one sidecar: one upstream fetch per object, one
cap, one set of counters; a killed worker is replaced and nothing it half-wrote is
served; SIGTERM stops them all."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bench.harness import OriginServer, Sidecar, wait_until
from bench.procs import ESTABLISHED, sockets
from sidecar.buffer.fill import IN_MEMORY
from sidecar.runtime.supervisor import cpu_limit
from tests.sidecar.conftest import FILES, curl

pytestmark = pytest.mark.e2e

BIG = FILES["big.bin"]


def children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def workers_of(sidecar: Sidecar) -> list[int]:
    """The worker processes' pids: forked by the fork server, the main process's child."""
    return sorted(worker for child in children(sidecar.pid) for worker in children(child))


def fds_on(pid: int, needle: str) -> int:
    """How many of `pid`'s descriptors name a path containing `needle`."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += needle in os.readlink(fd)
        except OSError:
            continue
    return count


def test_clients_on_every_worker_share_one_upstream_fetch(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    """Six clients at once, some on each worker, make one upstream fetch of the whole
    object. What is tested is the sharing, which needs clients on both workers: where a
    loaded machine let one worker take every client (the other not woken in time), the
    clients read a fresh object again, up to three times."""
    sidecar = start_sidecar("--workers", "2", "--parallel-fetch", "1", "--access-log")
    expected = (dataset / "big.bin").read_bytes()
    ranges = [None, None, None, "0-99999", f"{BIG - 5000}-", "1000000-3999999"]
    served_by: set[str] = set()
    for attempt in range(3):
        case = f"workers-coalesce-{attempt}"
        url = origin.url("big.bin", case=case, rate=12_000_000)
        logged, before = len(sidecar.log()), sidecar.stats()
        with ThreadPoolExecutor(len(ranges)) as pool:
            downloads = list(
                pool.map(lambda r, u=url: curl(sidecar, u, *(("-r", r) if r else ())), ranges)
            )
        for wanted, download in zip(ranges, downloads, strict=True):
            assert download.returncode == 0, download.stderr
            if wanted is None:
                assert download.body == expected
            else:
                start, _, end = wanted.partition("-")
                assert download.body == expected[int(start) : int(end) + 1 if end else None]
        assert origin.full_fetches("big.bin", case=case, rate=12_000_000) == 1
        stats = sidecar.stats()
        # The tail range starts beyond what the fill will have soon: it is fetched apart
        # (when it arrives first, the fill it starts is joined by all the others).
        passes = stats["pass_reasons"].get("range-ahead-of-fill", 0)
        assert passes - before["pass_reasons"].get("range-ahead-of-fill", 0) == 1
        misses = stats["misses"] - before["misses"]
        assert misses + stats["coalesced"] - before["coalesced"] == len(ranges) - 1, stats
        assert misses <= 1
        assert stats["workers"] == 2
        served_by = {
            line.split("]")[0].rsplit("[", 1)[1]
            for line in sidecar.log()[logged:].splitlines()
            if "sidecar.proxy.router: coalesced GET" in line
            or "sidecar.proxy.router: miss GET" in line
        }
        if served_by == {"w0", "w1"}:
            break
    assert served_by == {"w0", "w1"}, "the clients should have landed on both workers"
    sidecar.wait_for_entries(attempt + 1)
    assert curl(sidecar, url).body == expected


def test_a_worker_keeps_at_most_in_memory_of_small_bodies_and_stores_the_rest_in_files(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    name, size = "mebibyte.bin", 1024 * 1024  # the largest small body
    if not (dataset / name).exists():
        (dataset / name).write_bytes(os.urandom(size))
    expected = (dataset / name).read_bytes()
    in_memory = IN_MEMORY // size
    fills = in_memory + 4
    sidecar = start_sidecar("--workers", "1", "--buffer-size", "64MiB")
    # Slow enough (10 s each) that every fill has started before any has ended.
    urls = [origin.url(name, case=f"in-memory-{n}", rate=100_000) for n in range(fills)]

    def in_files() -> int:
        """Fills through the keeper: each has a progress record beside its partial body
        (more than the four beyond IN_MEMORY while the worker's lease is short)."""
        return len(list((sidecar.buffer_dir / "partial").glob("*.progress")))

    with ThreadPoolExecutor(fills) as pool:
        downloads = []
        for url in urls:
            downloads.append(pool.submit(curl, sidecar, url))
            time.sleep(0.15)  # the worker's lease is lent again in between: not the limit
        wait_until(lambda: in_files() >= fills - in_memory, "the fills beyond IN_MEMORY")
        assert in_files() < fills  # the others are in memory
        assert all(download.result().body == expected for download in downloads)
    sidecar.wait_for_entries(fills)
    assert in_files() == 0


def test_kept_alive_connections_spread_evenly_over_the_workers(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer
) -> None:
    """Best effort by design: a busier worker lets a new connection wait ACCEPT_DELAY for
    the least busy one, then takes it itself (a worker starved of CPU must not hold up
    connections). On a machine busy enough to starve one for that long a spread may go
    uneven: three tries, of which one must spread evenly."""
    sidecar = start_sidecar("--workers", "2")

    def per_worker() -> list[int]:
        return [sockets(p, ESTABLISHED, sidecar.proxy_port) for p in workers_of(sidecar)]

    spreads = []
    for attempt in range(3):
        url = origin.url("small.bin", case=f"workers-spread-{attempt}", rate=40_000)  # ~2.5 s
        # curl keeps each connection until its transfer ends: four held for 2.5 s, started
        # one after another as a data loader starts its workers.
        with ThreadPoolExecutor(4) as pool:
            pending = []
            for _ in range(4):
                pending.append(pool.submit(curl, sidecar, url))
                time.sleep(0.1)
            wait_until(lambda: sum(per_worker()) == 4, "four client connections")
            spreads.append(per_worker())
            assert all(download.result().returncode == 0 for download in pending)
        if spreads[-1] == [2, 2]:
            return
    raise AssertionError(f"connections per worker in three tries: {spreads}")


def test_the_cap_holds_with_fills_in_two_workers(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    sidecar = start_sidecar(
        "--workers", "2", "--buffer-size", f"{2 * BIG + BIG // 2}", "--parallel-fetch", "1"
    )
    expected = (dataset / "big.bin").read_bytes()
    urls = [origin.url("big.bin", case=f"workers-cap-{i}", rate=12_000_000) for i in range(3)]
    with ThreadPoolExecutor(3) as pool:
        downloads = list(pool.map(lambda u: curl(sidecar, u), urls))
    assert all(d.returncode == 0 and d.body == expected for d in downloads)
    sidecar.wait_for_entries(2)
    stats = sidecar.stats()
    assert stats["admissions_refused"] == 1 and stats["pass_reasons"] == {"no-room": 1}
    assert stats["buffer_bytes"] == 2 * BIG and stats["reserved_bytes"] == 0
    assert len(list((sidecar.buffer_dir / "objects").iterdir())) == 2


@pytest.mark.parametrize("eviction", ["lru", "none"])
def test_small_objects_in_two_workers_fill_the_cap_exactly_whatever_the_policy(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path, eviction: str
) -> None:
    """Room lent to the workers for small objects is never more than was free, and is
    taken back before an object is refused: `lru` evicts one object per new one, never to
    make that room; `none` stores exactly as many as fit, whichever worker fetched them,
    and the rest pass."""
    small = FILES["small.bin"]
    sidecar = start_sidecar(
        "--workers", "2", "--buffer-size", f"{12 * small}", "--eviction", eviction
    )
    expected = (dataset / "small.bin").read_bytes()
    urls = [origin.url("small.bin", case=f"workers-{eviction}-{i}") for i in range(16)]
    with ThreadPoolExecutor(4) as pool:
        downloads = list(pool.map(lambda u: curl(sidecar, u), urls[:8]))
    assert all(d.returncode == 0 and d.body == expected for d in downloads)
    sidecar.wait_for_entries(8)
    for url in urls[8:]:  # one at a time: under lru, each evicts exactly one
        assert curl(sidecar, url).body == expected
    sidecar.wait_for_entries(12)
    stats = sidecar.stats()
    assert stats["buffer_bytes"] == 12 * small and stats["reserved_bytes"] == 0, stats
    assert len(list((sidecar.buffer_dir / "objects").iterdir())) == 12
    if eviction == "lru":
        assert stats["misses"] == 16 and stats["passes"] == 0, stats
        assert not list((sidecar.buffer_dir / "partial").iterdir())
        return
    assert stats["pass_reasons"] == {"no-room": 4} and stats["admissions_refused"] == 4, stats
    assert stats["leased_bytes"] == 0  # nothing left to lend
    for url in urls[:12]:  # the first twelve stay: "no replacement"
        assert curl(sidecar, url).body == expected
    assert sidecar.stats()["hits"] == 12


def test_a_killed_worker_is_replaced_and_nothing_it_half_wrote_is_served(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    sidecar = start_sidecar("--workers", "2", "--parallel-fetch", "1")
    url = origin.url("big.bin", case="workers-kill", rate=4_000_000)  # ~6 s
    expected = (dataset / "big.bin").read_bytes()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(curl, sidecar, url)
        wait_until(lambda: sidecar.stats()["fills_in_progress"] == 1, "the fill to start")
        second = pool.submit(curl, sidecar, url)
        wait_until(lambda: sidecar.stats()["coalesced"] == 1, "a second client to join")
        # The fill's owner is the one worker connected to the origin; the other only
        # follows its partial body.
        fetching = [
            pid for pid in workers_of(sidecar) if sockets(pid, ESTABLISHED, remote_port=origin.port)
        ]
        assert len(fetching) == 1
        (owner,) = fetching
        assert fds_on(owner, "/partial/")
        os.kill(owner, signal.SIGKILL)
        downloads = [first.result(), second.result()]
    # Whoever was following the dead worker's fill sees an error, never a short success.
    for download in downloads:
        assert download.returncode != 0 or download.body == expected
    assert any(download.returncode != 0 for download in downloads)
    wait_until(lambda: sidecar.stats()["workers"] == 2, "the worker to be replaced")
    assert owner not in workers_of(sidecar)
    stats = sidecar.stats()
    assert stats["entries"] == 0 and stats["reserved_bytes"] == 0
    assert list((sidecar.buffer_dir / "partial").iterdir()) == []
    assert "worker" in sidecar.log() and "restarting" in sidecar.log()
    assert curl(sidecar, url).body == expected
    sidecar.wait_for_entries(1)
    assert curl(sidecar, url).body == expected
    assert sidecar.stats()["hits"] == 1


# A small body arrives into memory, a large one into its file.
@pytest.mark.parametrize("name", ["small.bin", "big.bin"])
def test_sigterm_stops_every_worker_within_two_seconds(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, name: str
) -> None:
    sidecar = start_sidecar("--workers", "2")
    workers = workers_of(sidecar)
    assert len(workers) == 2
    slow = subprocess.Popen(  # a download in progress must not hold the stop up
        ["curl", "-s", "-o", "/dev/null", "--proxy", sidecar.proxy, "--cacert",
         str(sidecar.bundle), origin.url(name, case="workers-stop", rate=FILES[name] // 20)],
        env={"PATH": os.environ["PATH"]},
    )  # fmt: skip
    try:
        wait_until(lambda: sidecar.stats()["fills_in_progress"] == 1, "a fill in progress")
        assert sidecar.process is not None
        started = time.monotonic()
        sidecar.process.popen.send_signal(signal.SIGTERM)
        sidecar.process.popen.wait(timeout=5)
        elapsed = time.monotonic() - started
        cut = slow.wait(timeout=5)
    finally:
        slow.kill()
        slow.wait()
    assert elapsed < 2.0
    assert sidecar.process.popen.returncode == 0
    assert cut != 0, "a download the stop cut short ended as a success"
    assert "Traceback" not in sidecar.log()
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists()


def test_one_worker_per_cpu_the_sidecar_may_run_on(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer
) -> None:
    os.sched_setaffinity(0, {0})  # inherited by the sidecar started below
    try:
        sidecar = start_sidecar()
    finally:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    assert sidecar.stats()["workers"] == 1
    assert len(workers_of(sidecar)) == 1


@pytest.mark.parametrize(
    ("cpu_max", "quota", "period", "cpus"),
    [
        ("max 100000\n", None, None, None),
        ("150000 100000\n", None, None, 1.5),
        ("50000 100000", None, None, 0.5),
        (None, "-1\n", "100000\n", None),
        (None, "300000\n", "100000\n", 3.0),
        (None, None, None, None),
    ],
)
def test_the_cgroup_cpu_quota_is_read_in_v1_and_v2(
    cpu_max: str | None, quota: str | None, period: str | None, cpus: float | None
) -> None:
    assert cpu_limit(cpu_max, quota, period) == cpus


def test_a_worker_killed_holding_a_small_claim_and_a_lease_leaves_nothing_behind(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    """A small fill is claimed and stored by its worker alone; killed mid-body, its claim
    is freed (a waiter in the other worker goes to the origin), its lease is returned,
    no partial body is left, and nothing of it is served."""
    sidecar = start_sidecar("--workers", "2")
    url = origin.url("small.bin", case="workers-kill-small", rate=50_000)  # ~2 s
    expected = (dataset / "small.bin").read_bytes()
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(curl, sidecar, url)
        wait_until(lambda: sidecar.stats()["fills_in_progress"] == 1, "the fill to start")
        assert sidecar.stats()["leased_bytes"] > 0
        (owner,) = [
            pid for pid in workers_of(sidecar) if sockets(pid, ESTABLISHED, remote_port=origin.port)
        ]
        waiters = [pool.submit(curl, sidecar, url) for _ in range(3)]
        time.sleep(0.3)  # they wait for the claim
        os.kill(owner, signal.SIGKILL)
        downloads = [first.result(), *(waiter.result() for waiter in waiters)]
    for download in downloads:
        assert download.returncode != 0 or download.body == expected
    wait_until(lambda: sidecar.stats()["workers"] == 2, "the worker to be replaced")
    assert curl(sidecar, url).body == expected
    sidecar.wait_for_entries(1)
    assert curl(sidecar, url).body == expected
    stats = sidecar.stats()
    assert stats["reserved_bytes"] == 0 and stats["fills_in_progress"] == 0, stats
    assert stats["buffer_bytes"] == len(expected) and stats["hits"] >= 1
    assert list((sidecar.buffer_dir / "partial").iterdir()) == []
    # The dead worker's fetch, one for each waiter in the other worker (they pass, as the
    # fill's own client would, at once rather than one after another), and the one that
    # stored it.
    passed = stats["passes"]
    assert f'reason="fill-not-stored"}} {passed}.0' in sidecar.metrics() or passed == 0
    assert origin.full_fetches("small.bin", case="workers-kill-small", rate=50_000) == 2 + passed


def test_a_write_keeps_a_small_fill_in_any_worker_from_being_stored_or_waited_for(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    sidecar = start_sidecar("--workers", "2")
    slow = dataset / "slow-small.bin"
    slow.write_bytes(b"old" * 30_000)
    url = origin.url("slow-small.bin", rate=45_000)  # two seconds of body
    with ThreadPoolExecutor(1) as pool:
        reading = pool.submit(curl, sidecar, url)
        wait_until(lambda: sidecar.stats()["fills_in_progress"] == 1, "the fill to start")
        put = curl(sidecar, url, "-X", "PUT", "--data-binary", "new")
        assert put.returncode == 0, put.stderr
        for _ in range(4):  # on either worker: passed, never the running fill's old body
            assert curl(sidecar, url).body == b"new"
        assert sidecar.stats()["pass_reasons"].get("invalidated", 0) >= 1
        assert reading.result().body == b"old" * 30_000  # began before the write
    assert curl(sidecar, url).body == b"new"  # stored, once the stale fill ended
    sidecar.wait_for_entries(1)
    assert curl(sidecar, url).body == b"new"
    assert sidecar.stats()["hits"] >= 1
    assert "not stored" in sidecar.log()


def test_workers_killed_at_random_moments_serve_nothing_wrong_and_leave_nothing_behind(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    """Two clients for each of 14 objects of every size (small ones stored from a lease,
    larger ones followed in their files), while workers are killed at moments drawn at
    random: every download is exact or fails, and afterwards every object is served
    whole, from the buffer, with nothing of the dead left over."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    sidecar = start_sidecar("--workers", "2")
    # At these rates a fill lasts about half a second: most kills land mid-fill.
    plan = [("small.bin", 200_000)] * 8 + [("medium.bin", 6_000_000)] * 4
    plan += [("big.bin", 48_000_000)] * 2
    urls = {
        origin.url(name, case=f"chaos-{seed}-{index}", rate=rate): name
        for index, (name, rate) in enumerate(plan)
    }
    expected = {name: (dataset / name).read_bytes() for name in FILES}
    requests = list(urls) * 2
    rng.shuffle(requests)
    killed: list[int] = []

    def kill_some() -> None:
        for _ in range(4):
            time.sleep(rng.uniform(0.2, 0.8))
            wait_until(lambda: len(workers_of(sidecar)) == 2, "both workers to be up")
            victim = rng.choice(workers_of(sidecar))
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)

    with ThreadPoolExecutor(7) as pool:
        killer = pool.submit(kill_some)
        downloads = list(pool.map(lambda url: (url, curl(sidecar, url)), requests))
        killer.result()
    for url, download in downloads:
        assert download.returncode != 0 or download.body == expected[urls[url]], (seed, url)
    wait_until(lambda: sidecar.stats()["workers"] == 2, "the workers to be replaced")
    assert not set(killed) & set(workers_of(sidecar))
    for url, name in urls.items():
        assert curl(sidecar, url).body == expected[name], (seed, url)
    sidecar.wait_for_entries(len(urls))
    for url, name in urls.items():
        assert curl(sidecar, url).body == expected[name], (seed, url)
    wait_until(lambda: sidecar.stats()["fills_in_progress"] == 0, "the fills to end")
    stats = sidecar.stats()
    assert stats["reserved_bytes"] == 0 and stats["entries"] == len(urls), (seed, stats)
    assert stats["buffer_bytes"] == sum(len(expected[name]) for name in urls.values()), stats
    assert list((sidecar.buffer_dir / "partial").iterdir()) == [], seed
    assert "Traceback" not in sidecar.log(), (seed, sidecar.log()[-3000:])
