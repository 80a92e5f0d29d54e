"""Warm epochs over a dataset of many files: does a hit cost the same at any size?

A file set of `Profile.warm_scale_files[0]` small files (2–16 KiB, fixed seed) on tmpfs,
served by nginx with one worker process per core (the reference) and by one sidecar from
its buffer, filled by a first epoch (every file a miss, checked in /stats). Each measured
epoch reads the files in an order of its own (a data loader's shuffle, fixed seeds), in
the three client shapes of `bench.bench_loader`, nginx and the sidecar in turn. Then the
same over the first `Profile.warm_scale_files[1]` of those files, on the same sidecar:
its files/s over the large set against the small set's says whether a hit costs more as
the dataset grows (the core's table of answers must hold them all: `--index-objects`,
its default for the buffer: every hit but a few is the core's, and the answers displaced
by others stay under one in a thousand objects).

Figures per shape and size: files/s, latencies and the server's CPU per 1,000 files,
against nginx's; and the sidecar's files/s over the large set against the small one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random

from bench.bench_loader import Epoch, File, Shape, epoch, epoch_rows, shapes, write_manifest
from bench.lab import Lab, Profile, expect_stats, in_turn
from bench.report import Result, Row, Sample, below, ratio_at_least, target_ratio

logger = logging.getLogger(__name__)

NAME = "warm-scale"
KiB = 1024
SMALLEST, LARGEST = 2 * KiB, 16 * KiB
SEED = 20261207
RUNS = 3


def file_set(lab: Lab, count: int) -> list[File]:
    """`count` files of SMALLEST to LARGEST bytes in the lab's data directory."""
    chance = random.Random(SEED)
    files = []
    for index in range(count):
        size = chance.randint(SMALLEST, LARGEST)
        path = lab.make_file(f"warm/{index:07d}.jpg", size)
        files.append(File(f"warm/{path.name}", size, hashlib.sha256(path.read_bytes()).hexdigest()))
    return files


def shuffled(files: list[File], seed: int) -> list[File]:
    """The files in a data loader's shuffled order for one epoch."""
    order = list(files)
    random.Random(seed).shuffle(order)
    return order


def run(profile: Profile, lab: Lab) -> Result:
    large, small = profile.warm_scale_files
    # At most RUNS epochs a shape: a new connection per file reads 100,000 files in minutes.
    runs = min(profile.runs, RUNS)
    result = Result(
        NAME,
        f"Warm epochs over {large:,} files of {SMALLEST // KiB}–{LARGEST // KiB} KiB, "
        f"shuffled, and over {small:,} of them, all hits",
    )
    cores = len(os.sched_getaffinity(0))
    nginx = lab.nginx(workers=cores)
    files = file_set(lab, large)
    sidecar = lab.sidecar(nginx.ca_pem, "--buffer-size", str(4 * sum(f.size for f in files)))
    direct, pod = lab.direct(nginx), lab.through(sidecar)
    fill = Shape("fill", profile.loader_workers, "keep-alive", None)
    manifest = lab.dir / "warm-scale-manifest.txt"
    write_manifest(manifest, shuffled(files, 0), nginx.url)
    epoch(pod, manifest, fill, sidecar.pid, large)
    sidecar.wait_for_entries(large)
    expect_stats(sidecar, misses=large, hits=0)

    measured: dict[tuple[int, str, str], list[Epoch]] = {}
    epochs = 0
    for count in (large, small):
        for run_index in range(runs):
            for shape in shapes(profile):
                logger.info("%s: %d files, run %d, %s", NAME, count, run_index + 1, shape.name)
                write_manifest(manifest, shuffled(files[:count], run_index + 1), nginx.url)
                sides = [("nginx", direct, nginx.process.popen.pid), ("sidecar", pod, sidecar.pid)]
                for side, route, pid in in_turn(run_index, sides):
                    measured.setdefault((count, shape.name, side), []).append(
                        epoch(route, manifest, shape, pid, count)
                    )
                epochs += count
    stats = sidecar.stats()
    expect_stats(sidecar, misses=large, hits=epochs)
    result.rows.append(
        Row(
            "hits answered by the core, of all hits",
            "hits",
            Sample.of([stats["hits_answered_by_core"]]),
            Sample.of([epochs]),
            "every hit",
            ratio_at_least(0.999),
        )
    )
    result.rows.append(
        Row(
            "answers of the core's table displaced by others",
            "answers",
            Sample.of([stats["answers_displaced"]]),
            required=below(large / 1000, "answers"),
        )
    )
    for count in (large, small):
        for shape in shapes(profile):
            result.rows += epoch_rows(
                f"{count:,} files, {shape.name}",
                measured[count, shape.name, "sidecar"],
                measured[count, shape.name, "nginx"],
                f"nginx, {cores} workers",
                target_ratio(1.0),
            )
    for shape in shapes(profile):
        result.rows.append(
            Row(
                f"{shape.name}: files/s over {large:,} files, of over {small:,}",
                "files/s",
                Sample.of([e.files_per_s for e in measured[large, shape.name, "sidecar"]]),
                Sample.of([e.files_per_s for e in measured[small, shape.name, "sidecar"]]),
                f"the sidecar over {small:,}",
                target_ratio(0.95),
            )
        )
    result.notes.append(
        f"medians of {runs} epochs, each in its own shuffled order; clients: "
        "bench.loader_client; sidecar with its default workers and --index-objects; CPU of each "
        "server's whole process tree"
    )
    return result
