"""The data loader: many small files, read by several worker processes, epoch after epoch.

An ImageNet-like file set (sizes log-normal around a 104 KiB median, 16 KiB to
1 MiB, fixed seed) on tmpfs, served by nginx with one worker process per core (the
reference) and by the sidecar from its buffer (the first epoch through it fills the
buffer; every measured epoch is all hits, checked in /stats). Three client shapes
(`bench.loader_client`): one worker keeping its connection alive (`http.client`, as
under `requests.Session`), several such workers, and several workers opening a new
connection per file with `urllib`.
Each is measured against nginx in the same run, in turn.

Figures per shape: files/s over the epoch, p50 and p99 per file, and the server's
CPU seconds per 1,000 files (its whole process tree: the sidecar's workers and
nginx's).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.clients import Route
from bench.harness import PYTHON, ROOT, clean_env, cpu_seconds, private_mounts
from bench.lab import HOST, Lab, Profile, expect_stats, in_turn
from bench.report import Requirement, Result, Row, Sample, ratio_at_least

logger = logging.getLogger(__name__)

NAME = "loader"
KiB = 1024
# ImageNet's JPEGs: median ~110 KiB; Momenta's images 16 KB to 5 MB. ln(104 KiB) = 11.58.
MEDIAN_LOG, SIGMA_LOG = 11.58, 0.7
SMALLEST, LARGEST = 16 * KiB, 1024 * KiB
CLIENT_TIMEOUT = 900  # seconds for one epoch


@dataclass(frozen=True)
class Shape:
    name: str
    workers: int
    connection: str  # "keep-alive", "per-file" or "absolute-form" (bench.loader_client --shape)
    required: Requirement | None


@dataclass(frozen=True)
class Epoch:
    files_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_per_1000: float  # the server's CPU seconds per 1,000 files


def file_sizes(count: int) -> list[int]:
    rng = random.Random(20261122)
    return [
        min(LARGEST, max(SMALLEST, int(rng.lognormvariate(MEDIAN_LOG, SIGMA_LOG))))
        for _ in range(count)
    ]


@dataclass(frozen=True)
class File:
    name: str
    size: int
    sha256: str


def make_files(lab: Lab, sizes: list[int]) -> list[File]:
    """The file set in the lab's data directory."""
    files = []
    for index, size in enumerate(sizes):
        path = lab.make_file(f"loader-{index:05d}.jpg", size)
        files.append(File(path.name, size, hashlib.sha256(path.read_bytes()).hexdigest()))
    return files


def write_manifest(path: Path, files: list[File], url: Callable[[str, str], str]) -> Path:
    """The client's manifest of `files`, each at `url(name, HOST)`."""
    path.write_text("".join(f"{url(f.name, HOST)} {f.size} {f.sha256}\n" for f in files))
    return path


def shapes(profile: Profile, bounds: tuple[float, float, float] = (0.6, 0.7, 0.5)) -> list[Shape]:
    """The three client shapes, each with the ratio to the reference it must reach."""
    workers = profile.loader_workers
    one, several, per_file = (ratio_at_least(bound) for bound in bounds)
    return [
        Shape("1 worker, keep-alive", 1, "keep-alive", one),
        Shape(f"{workers} workers, keep-alive", workers, "keep-alive", several),
        Shape(f"{workers} workers, new connection per file", workers, "per-file", per_file),
    ]


def epoch(
    route: Route,
    manifest: Path,
    shape: Shape,
    server_pid: int,
    files: int,
    headers: tuple[str, ...] = (),
) -> Epoch:
    """One epoch of `shape` over `route`, timed by the client, the server's CPU counted;
    `headers` ("Name: value") go with every request."""
    argv = [PYTHON, "-m", "bench.loader_client", "--manifest", str(manifest),
            "--workers", str(shape.workers), "--shape", shape.connection,
            "--cafile", str(route.bundle)]  # fmt: skip
    if route.proxy:
        argv += ["--proxy", route.proxy]
    for line in headers:
        argv += ["--header", line]
    before = cpu_seconds(server_pid)
    done = subprocess.run(
        private_mounts({"/etc/hosts": route.hosts}, argv),
        env=clean_env(PYTHONPATH=str(ROOT)),
        capture_output=True,
        timeout=CLIENT_TIMEOUT,
        check=True,
        cwd="/",
    )
    cpu = cpu_seconds(server_pid) - before
    figures = json.loads(done.stdout)
    latencies = figures["latencies"]
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return Epoch(files / figures["seconds"], cuts[49] * 1000, cuts[98] * 1000, cpu * 1000 / files)


def epoch_rows(
    what: str, ours: list[Epoch], theirs: list[Epoch], reference: str, required: Requirement | None
) -> list[Row]:
    """The rows of one shape's epochs against the reference's: files/s (which must meet
    `required`), latencies and the server's CPU per 1,000 files."""
    figures: list[tuple[str, str, Callable[[Epoch], float], Requirement | None]] = [
        ("throughput", "files/s", lambda e: e.files_per_s, required),
        ("latency p50", "ms", lambda e: e.p50_ms, None),
        ("latency p99", "ms", lambda e: e.p99_ms, None),
        ("CPU per 1,000 files", "s", lambda e: e.cpu_per_1000, None),
    ]
    return [
        Row(
            f"{what}, {label}",
            unit,
            Sample.of([pick(e) for e in ours]),
            Sample.of([pick(e) for e in theirs]),
            reference,
            wanted,
        )
        for label, unit, pick, wanted in figures
    ]


def run(profile: Profile, lab: Lab) -> Result:
    count = profile.loader_files
    sizes = file_sizes(count)
    result = Result(
        NAME,
        f"Data loader: {count} files of {SMALLEST // KiB} KiB–{LARGEST // KiB} KiB "
        f"(median {statistics.median(sizes) / KiB:.0f} KiB), all hits",
    )
    cores = len(os.sched_getaffinity(0))
    nginx = lab.nginx(workers=cores)
    manifest = write_manifest(lab.dir / "loader-manifest.txt", make_files(lab, sizes), nginx.url)
    sidecar = lab.sidecar(nginx.ca_pem, "--buffer-size", str(2 * sum(sizes)))
    direct, pod = lab.direct(nginx), lab.through(sidecar)
    fill = Shape("fill", profile.loader_workers, "keep-alive", ratio_at_least(0))
    epoch(pod, manifest, fill, sidecar.pid, count)
    sidecar.wait_for_entries(count)
    expect_stats(sidecar, misses=count, hits=0)

    measured: dict[tuple[str, str], list[Epoch]] = {}
    for run_index in range(profile.runs):
        for shape in shapes(profile):
            logger.info("%s: run %d/%d, %s", NAME, run_index + 1, profile.runs, shape.name)
            sides = [("nginx", direct, nginx.process.popen.pid), ("sidecar", pod, sidecar.pid)]
            for side, route, pid in in_turn(run_index, sides):
                measured.setdefault((shape.name, side), []).append(
                    epoch(route, manifest, shape, pid, count)
                )
    epochs = profile.runs * len(shapes(profile))
    expect_stats(sidecar, misses=count, hits=count * epochs, bytes_from_upstream=sum(sizes))

    for shape in shapes(profile):
        result.rows += epoch_rows(
            shape.name,
            measured[shape.name, "sidecar"],
            measured[shape.name, "nginx"],
            f"nginx, {cores} workers",
            shape.required,
        )
    result.notes.append(
        f"medians of {profile.runs} epochs (min–max); clients: bench.loader_client "
        "(http.client keep-alive, or urllib per file), epoch sharded over the workers, all "
        f"started behind a barrier; sidecar with {cores} workers (its default here); "
        "CPU of each server's whole process tree, to the nanosecond; every body's size and every "
        "16th body's SHA-256 checked"
    )
    return result
