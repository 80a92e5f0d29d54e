"""Hits whichever worker serves them: the data loader's warm epochs with the sidecar at
1, 2 and 4 worker processes.

What one worker learns serves every worker: an object one worker's fill stored is
answered by the core's table of answers (shared memory) in all of them, from the same
body file. So a warm hit should cost the same CPU whichever worker a client's
connection lands on, and however many workers share the machine. The loader's file set
(`bench.bench_loader`) is read by several kept-alive clients; each worker count gets a
sidecar of its own, filled by one epoch, and the three are measured in turn, run after
run. The reference is the one-worker sidecar.
"""

from __future__ import annotations

import logging
import os
import statistics

from bench.bench_loader import Epoch, Shape, epoch, file_sizes, make_files, write_manifest
from bench.lab import Lab, Profile, expect_stats, in_turn
from bench.report import Requirement, Result, Row, Sample

logger = logging.getLogger(__name__)

NAME = "workers"
WORKER_COUNTS = (1, 2, 4)
# The CPU per 1,000 kept-alive hits the sidecar aims at with any number of workers, and
# how much more than with one worker "the same" allows (the spread of one figure here).
CPU_TARGET = 0.2  # seconds
SAME_AS_ONE = 1.25


def _same_cost() -> Requirement:
    return Requirement(
        f"target < {CPU_TARGET:g} s and ≤ {SAME_AS_ONE:g}× 1 worker",
        lambda row: row.ours.median < CPU_TARGET
        and (row.ratio is None or row.ratio <= SAME_AS_ONE),
        binding=False,
    )


def run(profile: Profile, lab: Lab) -> Result:
    count = profile.loader_files
    sizes = file_sizes(count)
    clients = profile.loader_workers
    result = Result(
        NAME,
        f"Hits whichever worker serves them: {count} files (median "
        f"{statistics.median(sizes) / 1024:.0f} KiB), {clients} kept-alive clients",
    )
    nginx = lab.nginx(workers=len(os.sched_getaffinity(0)))
    manifest = write_manifest(lab.dir / "workers-manifest.txt", make_files(lab, sizes), nginx.url)
    shape = Shape(f"{clients} clients, keep-alive", clients, "keep-alive", None)
    sidecars = {}
    for workers in WORKER_COUNTS:
        sidecar = lab.sidecar(
            nginx.ca_pem, "--buffer-size", str(2 * sum(sizes)), "--workers", str(workers)
        )
        epoch(lab.through(sidecar), manifest, shape, sidecar.pid, count)
        sidecar.wait_for_entries(count)
        sidecars[workers] = sidecar

    measured: dict[int, list[Epoch]] = {workers: [] for workers in WORKER_COUNTS}
    for run_index in range(profile.runs):
        for workers in in_turn(run_index, WORKER_COUNTS):
            logger.info("%s: run %d/%d, %d workers", NAME, run_index + 1, profile.runs, workers)
            sidecar = sidecars[workers]
            measured[workers].append(
                epoch(lab.through(sidecar), manifest, shape, sidecar.pid, count)
            )
    for sidecar in sidecars.values():
        # Every measured request a hit, in whichever worker it landed.
        expect_stats(sidecar, misses=count, hits=count * profile.runs)

    one = measured[1]
    for workers in WORKER_COUNTS:
        label = f"{workers} worker{'s' if workers > 1 else ''}"
        for what, unit, pick, required in (
            ("CPU per 1,000 kept-alive hits", "s", lambda e: e.cpu_per_1000, _same_cost()),
            ("throughput", "files/s", lambda e: e.files_per_s, None),
        ):
            result.rows.append(
                Row(
                    f"{label}, {what}",
                    unit,
                    Sample.of([pick(e) for e in measured[workers]]),
                    Sample.of([pick(e) for e in one]),
                    "1 worker",
                    required,
                )
            )
    result.notes.append(
        f"medians of {profile.runs} warm epochs (min–max) per worker count, the three "
        f"sidecars measured in turn; clients: bench.loader_client ({clients} http.client "
        "connections kept alive, each landing on whichever worker the kernel gives it); "
        "CPU of each sidecar's whole process tree, to the nanosecond; every request a hit "
        f"(checked in /stats); the machine has {len(os.sched_getaffinity(0))} cores"
    )
    return result
