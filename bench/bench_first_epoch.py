"""The first epoch: every file a miss, through the sidecar and through the peers.

Many jobs read their dataset once (LLM pre-training, WebDataset shards, a restarted
pod), so the miss path must keep up with a fast origin. The data loader's file set
(`bench.bench_loader`: ImageNet-like sizes) is read by the same client shapes, each
epoch from an empty cache, five ways:

- direct: from the origin (nginx, one worker per core) itself: the reference;
- the sidecar, with an empty buffer and no connection to the origin yet;
- the sidecar again, asked for every file with `Cache-Control: no-store`, which it passes
  through without storing (RFC 9111 §5.2.1.5): the same front, upstream connections and
  TLS on both sides as a miss, and nothing claimed, hashed, written or indexed. No miss
  path of this sidecar can be faster: the floor the sidecar's own figures are read against;
- the peers a user might run instead, started empty in the same way: Squid ssl-bump
  as a forward proxy, and nginx `proxy_cache` as a reverse proxy (TLS on both sides,
  upstream keep-alive), both from Debian's packages, configured as
  `shared/notes/peers.md` says they were measured.

Then one large object read by one curl, the same four ways; and the second pod of a
job behind a shared parent: a new sidecar whose parent (Squid) already holds the file
set, against the same client reading that Squid directly. Every cold cache is
started anew for each epoch (outside the timing) and deleted after it, so each epoch
starts from nothing, as a new pod does; the sidecar's /stats prove every file was a
miss. Figures per shape: files/s over the epoch, and each server's CPU seconds per
1,000 files (its whole process tree: the sidecar's workers, Squid and its helpers,
nginx's workers; the origin's CPU is not counted for anyone).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import trustme

from bench import bench_loader, clients
from bench.bench_loader import Epoch, Shape
from bench.clients import Route
from bench.harness import Sidecar, cpu_seconds, settle
from bench.lab import HOST, Lab, Profile, WrongPath, expect_stats, in_turn, mb_per_s, tmpfs_root
from bench.nginx import Nginx, start_nginx_cache
from bench.report import Requirement, Result, Row, Sample, ratio_at_least
from bench.squid import start_squid

logger = logging.getLogger(__name__)

NAME = "first-epoch"
PASSING = "burstbuffer passing through (no-store)"
SIDES = ("direct", "burstbuffer", "Squid ssl-bump", "nginx proxy_cache")
# The loader's shapes are also read through the sidecar passing every file through.
LOADER_SIDES = (*SIDES[:2], PASSING, *SIDES[2:])
NO_STORE = ("Cache-Control: no-store",)
KiB = 1024


@dataclass(frozen=True)
class Server:
    """One side, ready for an epoch: how clients reach it, whose CPU counts."""

    route: Route
    pid: int
    url: Callable[[str, str], str]  # (file name, host) -> URL
    sidecar: Sidecar | None = None  # whose /stats prove the path
    passing: bool = False  # every request asks not to be stored (`PASSING`)


def shapes(profile: Profile) -> list[Shape]:
    return bench_loader.shapes(profile, (0.45, 0.35, 0.5))


class Sides:
    """Starts each side empty for one epoch, and removes it after."""

    def __init__(self, lab: Lab, origin: Nginx, buffer_bytes: int, cores: int) -> None:
        self._lab = lab
        self._origin = origin
        self._buffer_bytes = buffer_bytes
        self._cores = cores
        self._bump_ca = trustme.CA()
        self._bump_ca_pem = lab.dir / "bump-ca.pem"
        self._bump_ca.cert_pem.write_to_path(str(self._bump_ca_pem))

    @contextlib.contextmanager
    def cold(self, side: str) -> Iterator[Server]:
        lab, origin = self._lab, self._origin
        if side == "direct":
            yield Server(lab.direct(origin), origin.process.popen.pid, origin.url)
        elif side in ("burstbuffer", PASSING):
            sidecar = lab.sidecar(origin.ca_pem, "--buffer-size", str(self._buffer_bytes))
            try:
                yield Server(
                    lab.through(sidecar), sidecar.pid, origin.url, sidecar, side == PASSING
                )
            finally:
                sidecar.stop()
                shutil.rmtree(sidecar.directory, ignore_errors=True)
        elif side == "Squid ssl-bump":
            # Not in the lab's private directory: Squid's own user must reach it.
            squid = start_squid(origin.ca_pem, [HOST], bump=self._bump_ca, under=tmpfs_root())
            try:
                route = lab.route(self._bump_ca_pem, squid.url)
                yield Server(route, squid.process.popen.pid, origin.url)
            finally:
                squid.remove()
        else:
            workdir = lab.scratch("nginx-cache")
            cache = start_nginx_cache(origin, lab.ca, [HOST], workdir, self._cores)
            try:
                yield Server(lab.route(cache.ca_pem), cache.process.popen.pid, cache.url)
            finally:
                cache.stop()
                shutil.rmtree(workdir, ignore_errors=True)


def parent_rows(
    profile: Profile, lab: Lab, origin: Nginx, files: list[bench_loader.File]
) -> list[Row]:
    """The second pod behind a warm parent: a cold sidecar with `--parent`, against the
    client asking the parent itself (`absolute-form`), each shape with keep-alive."""
    # Not in the lab's private directory: Squid's own user must reach it.
    squid = start_squid(origin.ca_pem, [HOST], under=tmpfs_root())
    try:
        direct = lab.route(origin.ca_pem, squid.url)
        parent = Server(direct, squid.process.popen.pid, origin.url)
        warm = Shape("warm-up", 1, "absolute-form", None)
        # Twice: Squid may still be storing the last object when the next request comes.
        for _ in range(2):
            loader_epoch(lab, parent, files, warm)
        measured: dict[tuple[str, str], list[float]] = {}
        for run_index in range(profile.runs):
            for shape in shapes(profile)[:2]:
                asked = Shape(shape.name, shape.workers, "absolute-form", None)
                logger.info("%s: run %d/%d, parent, %s", NAME, run_index + 1, profile.runs,
                            shape.name)  # fmt: skip
                for side in in_turn(run_index, ("Squid", "burstbuffer")):
                    if side == "Squid":
                        figures = loader_epoch(lab, parent, files, asked)
                    else:
                        sidecar = lab.sidecar(origin.ca_pem, "--parent", squid.url)
                        try:
                            settle(sidecar.pid)
                            pod = Server(lab.through(sidecar), sidecar.pid, origin.url, sidecar)
                            figures = loader_epoch(lab, pod, files, shape)
                        finally:
                            sidecar.stop()
                            shutil.rmtree(sidecar.directory, ignore_errors=True)
                    measured.setdefault((shape.name, side), []).append(figures.files_per_s)
        refetched = [e for e in squid.access_log()[2 * len(files) :] if "MISS" in e[0]]
        if refetched:
            raise WrongPath(f"the parent was not warm: {refetched[:3]}")
    finally:
        squid.remove()
    return [
        Row(
            f"second pod via a warm Squid parent, {shape.name}",
            "files/s",
            Sample.of(measured[shape.name, "burstbuffer"]),
            Sample.of(measured[shape.name, "Squid"]),
            "the client reading Squid directly",
        )
        for shape in shapes(profile)[:2]
    ]


def loader_epoch(lab: Lab, server: Server, files: list[bench_loader.File], shape: Shape) -> Epoch:
    manifest = bench_loader.write_manifest(lab.dir / "first-epoch.txt", files, server.url)
    headers = NO_STORE if server.passing else ()
    figures = bench_loader.epoch(server.route, manifest, shape, server.pid, len(files), headers)
    if server.sidecar is not None:
        passes = len(files) if server.passing else 0
        expect_stats(server.sidecar, misses=len(files) - passes, hits=0, passes=passes)
    return figures


def large_epoch(server: Server, name: str, size: int) -> tuple[float, float]:
    """MB/s of one curl reading the large object, and the server's CPU seconds."""
    before = cpu_seconds(server.pid)
    seconds = clients.curl(server.route, server.url(name, HOST), size)
    cpu = cpu_seconds(server.pid) - before
    if server.sidecar is not None:
        expect_stats(server.sidecar, misses=1, hits=0, passes=0, bytes_from_upstream=size)
    return mb_per_s(size, seconds), cpu


def run(profile: Profile, lab: Lab) -> Result:
    count = profile.loader_files
    sizes = bench_loader.file_sizes(count)
    large = profile.epoch_large_bytes
    result = Result(
        NAME,
        f"First epoch: {count} files of {min(sizes) // KiB}–{max(sizes) // KiB} KiB "
        f"(median {statistics.median(sizes) / KiB:.0f} KiB) and one {large // 2**20} MiB "
        "object, every one a miss",
    )
    cores = len(os.sched_getaffinity(0))
    origin = lab.nginx(workers=cores)
    files = bench_loader.make_files(lab, sizes)
    large_name = lab.make_file("large.bin", large).name
    sides = Sides(lab, origin, 2 * max(sum(sizes), large), cores)

    epochs: dict[tuple[str, str], list[Epoch]] = {}
    for run_index in range(profile.runs):
        for shape in shapes(profile):
            logger.info("%s: run %d/%d, %s", NAME, run_index + 1, profile.runs, shape.name)
            for side in in_turn(run_index, LOADER_SIDES):
                with sides.cold(side) as server:
                    settle(server.pid)
                    figures = loader_epoch(lab, server, files, shape)
                epochs.setdefault((shape.name, side), []).append(figures)
    speeds: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    for run_index in range(profile.runs):
        logger.info("%s: run %d/%d, the large object", NAME, run_index + 1, profile.runs)
        for side in in_turn(run_index, SIDES):
            with sides.cold(side) as server:
                settle(server.pid)
                speed, cpu = large_epoch(server, large_name, large)
            speeds.setdefault(side, []).append(speed)
            cpus.setdefault(side, []).append(cpu)

    for shape in shapes(profile):
        direct = epochs[shape.name, "direct"]
        for side in LOADER_SIDES[1:]:
            ours = epochs[shape.name, side]
            result.rows.append(
                Row(
                    f"{shape.name}, {side}",
                    "files/s",
                    Sample.of([e.files_per_s for e in ours]),
                    Sample.of([e.files_per_s for e in direct]),
                    "direct",
                    shape.required if side == "burstbuffer" else None,
                )
            )
        for side in LOADER_SIDES[1:]:
            result.rows.append(
                Row(
                    f"{shape.name}, {side}, CPU per 1,000 files",
                    "s",
                    Sample.of([e.cpu_per_1000 for e in epochs[shape.name, side]]),
                    Sample.of([e.cpu_per_1000 for e in direct]),
                    "the origin serving directly",
                )
            )
    result.rows += parent_rows(profile, lab, origin, files)
    large_required: Requirement = ratio_at_least(0.45)
    for side in SIDES[1:]:
        result.rows.append(
            Row(
                f"one {large // 2**20} MiB object, curl, {side}",
                "MB/s",
                Sample.of(speeds[side]),
                Sample.of(speeds["direct"]),
                "direct",
                large_required if side == "burstbuffer" else None,
            )
        )
    result.notes.append(
        f"medians of {profile.runs} epochs (min–max); the clients of `bench.loader_client` "
        f"and curl; every cache started empty before each epoch (the sidecar with its "
        f"defaults: {cores} workers, a tmpfs buffer; Squid and nginx as in "
        "shared/notes/peers.md, their caches on tmpfs); the origin nginx with "
        f"{cores} workers; CPU of each server's whole process tree, to the nanosecond"
    )
    return result
