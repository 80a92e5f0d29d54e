"""One benchmark's bench: a tmpfs directory, dataset files, and the processes under test.

A `Lab` owns everything a benchmark starts (nginx, the sidecar, mitmdump, the Python
origin) and stops and deletes it all on exit, so each benchmark starts from nothing
and leaves nothing behind. Files and buffers live on tmpfs, so disks are never what
is measured. `Profile` holds the sizes: the issue's, or tiny ones for `--quick`.
"""

from __future__ import annotations

import contextlib
import filecmp
import hashlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import trustme

from bench.clients import Route, wget
from bench.harness import HUB_HOSTS, HubServer, OriginServer, Sidecar, start_hub, start_origin
from bench.mitmdump import Mitmdump, start_mitmdump
from bench.nginx import Nginx, start_nginx
from bench.squid import Squid, start_squid
from certs.bundle import public_roots_pem

HOST = "datasets.bench.test"
# Another name of the same servers, never intercepted: its connections are tunnelled.
TUNNEL_HOST = "elsewhere.bench.test"
MiB = 1024 * 1024
MB = 1_000_000  # throughputs are in MB/s, as Nezha's were
WRITE_CHUNK = 16 * MiB  # random bytes generated and written at a time


class WrongPath(RuntimeError):
    """The sidecar did not take the path a benchmark meant to measure, or served wrong bytes."""


@dataclass(frozen=True)
class Profile:
    """Sizes and repetitions. Every figure is a median of `runs` runs."""

    quick: bool
    runs: int
    large_bytes: int  # the large hit and the cold miss
    rss_bytes: int  # the object streamed while the sidecar's memory is watched
    small_bytes: int  # one small object
    small_count: int  # small objects, all fetched over one connection
    ready_starts: int
    nezha_bytes: int  # CIFAR-100's tarball is 169,001,437 bytes
    nezha_rate: float  # bytes/s: the far host's per-connection rate Nezha measured
    momenta_objects: int  # the dataset scanned every epoch (Momenta's table is per 160)
    momenta_bytes: int  # each of its objects
    coalesce_bytes: int  # the object many clients ask for at once
    coalesce_rate: float  # bytes/s per origin connection while they do
    parallel_bytes: int  # the cold object fetched over several connections (> 16 MiB)
    parallel_rate: float  # bytes/s per origin connection for it
    loader_files: int  # the data loader's file set (ImageNet-like sizes)
    loader_workers: int  # its worker processes in the multi-worker shapes
    epoch_large_bytes: int  # the large object of the first epoch
    soak_seconds: float  # the soak's length (after a warm-up of a tenth of it)
    parent_pods: int  # sidecars reading one dataset, with and without a parent cache
    parent_objects: int  # the objects of that dataset
    parent_bytes: int  # each of its objects
    parent_rate: float  # bytes/s per origin connection
    scale_counts: tuple[int, ...]  # stored objects a sidecar is restarted on
    scale_reference: int  # stored objects of the hit rate's reference
    scale_hits: int  # distinct stored objects read after each restart (at most)
    hub_bytes: int  # the Hugging Face repository downloaded whole (in HUB_SHARDS files)
    warm_scale_files: tuple[int, int]  # warm epochs over this many files, then over fewer


FULL = Profile(
    quick=False,
    runs=5,
    large_bytes=512 * MiB,
    rss_bytes=400 * MiB,
    small_bytes=64 * 1024,
    small_count=600,
    ready_starts=7,
    nezha_bytes=169_001_437,
    nezha_rate=3.49e6,
    momenta_objects=160,
    momenta_bytes=256 * 1024,
    coalesce_bytes=32 * MiB,
    coalesce_rate=20e6,
    parallel_bytes=128_000_000,
    parallel_rate=3.49e6,
    loader_files=1500,
    loader_workers=4,
    epoch_large_bytes=256 * MiB,
    soak_seconds=180.0,
    parent_pods=8,
    parent_objects=20,
    parent_bytes=4 * MiB,
    parent_rate=3.49e6,  # Nezha's far host, per connection
    scale_counts=(10_000, 100_000, 1_000_000),
    scale_reference=1_000,
    scale_hits=200_000,
    hub_bytes=1024 * MiB,
    warm_scale_files=(100_000, 2_000),
)
QUICK = Profile(
    quick=True,
    runs=3,
    large_bytes=8 * MiB,
    rss_bytes=8 * MiB,
    small_bytes=64 * 1024,
    small_count=20,
    ready_starts=1,
    nezha_bytes=1_000_000,
    nezha_rate=3.49e6,
    momenta_objects=16,  # the same ratios, a tenth of the objects
    momenta_bytes=16 * 1024,
    coalesce_bytes=1 * MiB,
    coalesce_rate=2e6,  # slow enough that every client arrives before the fill ends
    parallel_bytes=24 * MiB,  # only objects over 16 MiB are ever split
    parallel_rate=10e6,
    loader_files=40,
    loader_workers=2,
    epoch_large_bytes=4 * MiB,
    soak_seconds=6.0,
    parent_pods=2,
    parent_objects=4,
    parent_bytes=256 * 1024,
    parent_rate=10e6,
    scale_counts=(300, 3_000),
    scale_reference=100,
    scale_hits=1_000,
    hub_bytes=4 * MiB,
    warm_scale_files=(400, 40),
)


T = TypeVar("T")


def in_turn(run_index: int, sides: Sequence[T]) -> list[T]:
    """The order in which to measure `sides` in run `run_index`: reversed every other
    run (A B, B A, ...), so that the machine's drift favours neither side."""
    return list(sides) if run_index % 2 == 0 else list(reversed(sides))


def mb_per_s(size: int, seconds: float) -> float:
    return size / seconds / MB


def expect_stats(sidecar: Sidecar, **expected: int) -> None:
    """The sidecar's /stats counters are what the benchmark's requests should have made
    them: proof that a "hit" figure measured hits and a "miss" figure misses."""
    stats = sidecar.stats()
    wrong = {k: (stats[k], v) for k, v in expected.items() if stats[k] != v}
    if wrong:
        raise WrongPath(f"sidecar /stats (found, expected): {wrong}; all: {stats}")


def counted_since(sidecar: Sidecar, before: dict[str, int], *names: str) -> dict[str, int]:
    """How much each of the sidecar's /stats counters `names` grew since `before` (an
    earlier `sidecar.stats()`)."""
    after = sidecar.stats()
    return {name: after[name] - before[name] for name in names}


def tmpfs_root() -> Path:
    """/dev/shm when it is a tmpfs (it is on Debian and in containers), else refuse:
    a disk-backed bench would measure the disk."""
    with open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 2 and fields[1] == "/dev/shm" and fields[2] == "tmpfs":
                return Path("/dev/shm")
    raise RuntimeError("/dev/shm is not a tmpfs: mount one there (mount -t tmpfs tmpfs /dev/shm)")


class Lab:
    """`with Lab() as lab:` a private tmpfs directory and the processes of one benchmark."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self.dir = Path("/nonexistent")
        self.ca = trustme.CA()  # signs nginx's and the Python origin's certificates

    def __enter__(self) -> Lab:
        self.dir = Path(
            self._stack.enter_context(
                tempfile.TemporaryDirectory(prefix="burstbuffer-bench-", dir=tmpfs_root())
            )
        )
        self.data = self.dir / "data"
        self.data.mkdir()
        self.hosts = self.dir / "hosts"
        self.hosts.write_text(f"127.0.0.1 localhost {HOST} {TUNNEL_HOST}\n")
        self.ca_pem = self.dir / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_pem))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stack.close()

    def make_file(self, name: str, size: int, directory: Path | None = None) -> Path:
        """A dataset file of `size` random (incompressible) bytes, in `directory` (the
        lab's data directory unless given)."""
        path = (directory or self.data) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            for offset in range(0, size, WRITE_CHUNK):
                f.write(os.urandom(min(WRITE_CHUNK, size - offset)))
        return path

    def check_download(self, route: Route, url: str, source: Path) -> float:
        """Download `url` with wget, compare it with `source` byte by byte; the seconds
        the download took."""
        copy = self.dir / "download"
        seconds = wget(route, url, copy)
        try:
            if not filecmp.cmp(copy, source, shallow=False):
                raise WrongPath(f"{url} differs from {source.name}")
        finally:
            copy.unlink()
        return seconds

    def nginx(self, workers: int = 1, origin_address: str | None = None) -> Nginx:
        server = start_nginx(
            self.data, self.ca, [HOST], self.scratch("nginx"), workers, origin_address
        )
        self._stack.callback(server.stop)
        return server

    def origin(self, rate: float | None = None) -> OriginServer:
        """The Python origin, throttled to `rate` bytes/s per response (if given)."""
        workdir = self.scratch("origin")
        server = start_origin(self.data, self.ca, [HOST, TUNNEL_HOST], workdir, rate=rate)
        self._stack.callback(server.process.stop)
        return server

    def hub(self, repositories: Path, *args: str) -> HubServer:
        """A Hugging Face Hub of our own (`bench.hub`) over `repositories`, its hosts
        named in the lab's /etc/hosts."""
        with open(self.hosts, "a") as hosts:
            hosts.write("127.0.0.1 " + " ".join(HUB_HOSTS) + "\n")
        server = start_hub(repositories, self.ca, self.scratch("hub"), *args)
        self._stack.callback(server.process.stop)
        return server

    def sidecar(
        self,
        upstream_ca: Path,
        *args: str,
        start: bool = True,
        hosts: Path | None = None,
        resolv_conf: Path | None = None,
        user: int | None = None,
    ) -> Sidecar:
        """A sidecar intercepting HOST, trusting `upstream_ca` for the origin; with
        `hosts` for its /etc/hosts (the lab's unless given), `resolv_conf` for its
        /etc/resolv.conf and the UID `user` (root unless given) if given."""
        argv = ["--intercept", HOST, "--upstream-ca", str(upstream_ca), *args]
        directory = self.scratch("sidecar")
        sidecar = Sidecar(directory, hosts or self.hosts, argv, resolv_conf, user)
        self._stack.callback(sidecar.stop)
        if start:
            sidecar.start()
        return sidecar

    def squid(self) -> Squid:
        """A Squid parent cache trusting the lab's CA for the origin."""
        squid = start_squid(self.ca_pem, [HOST])
        self._stack.callback(squid.remove)
        return squid

    def mitmdump(self, upstream_ca: Path) -> Mitmdump:
        proxy = start_mitmdump(self.scratch("mitmdump"), self.hosts, upstream_ca)
        self._stack.callback(proxy.stop)
        return proxy

    def route(self, ca_pem: Path, proxy: str | None = None) -> Route:
        """A client of a reference server (an origin, a peer cache), through `proxy` if
        given, trusting `ca_pem` as a client trusts a public origin: among the public
        roots. The pod bundle holds them too (`through`), and a client that starts a TLS
        session reads its whole bundle first (tens of milliseconds for curl's OpenSSL),
        so every side pays the same for it."""
        ca = ca_pem.read_bytes()
        bundle = self.dir / f"trust-{hashlib.sha256(ca).hexdigest()[:16]}.pem"
        if not bundle.exists():
            bundle.write_bytes(public_roots_pem() + b"\n" + ca)
        return Route(bundle, self.hosts, proxy)

    def direct(self, server: Nginx) -> Route:
        """A client talking to nginx itself, trusting nginx's CA among the public roots."""
        return self.route(server.ca_pem)

    def through(self, sidecar: Sidecar) -> Route:
        """A client of the sidecar, trusting the pod bundle, as an injected pod does."""
        return Route(sidecar.bundle, self.hosts, sidecar.proxy)

    def through_mitmdump(self, proxy: Mitmdump) -> Route:
        return self.route(proxy.ca_pem, proxy.proxy)

    def scratch(self, prefix: str) -> Path:
        """A new directory of the lab's (deleted with it)."""
        return Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=self.dir))
