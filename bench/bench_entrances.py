"""The data loader's warm epochs through each way into the sidecar, against nginx.

The file set of `bench.bench_loader`, stored once through each entrance and then read,
every file a hit, in its three client shapes:

- forward HTTPS: a CONNECT to the host, TLS inside (`https://` URLs through the proxy
  variables), against nginx's HTTPS;
- forward plain HTTP: `GET http://host/path` asked of the proxy itself (`http://`
  dataset hosts through the proxy variables), against nginx's plain HTTP.

Each against nginx serving the same files in the same run, in turn, with each server's
CPU per 1,000 files (its whole process tree). The hostAliases and transparent captures
take the same entrances' code once their connection names its host (a ClientHello's
SNI, a request's Host); they need a network namespace with its own hosts file or
iptables rule, which the pod-run tests make and this benchmark does not.
"""

from __future__ import annotations

import logging
import os
import statistics

from bench.bench_loader import (
    LARGEST,
    SMALLEST,
    KiB,
    Shape,
    epoch,
    file_sizes,
    make_files,
    write_manifest,
)
from bench.lab import Lab, Profile, expect_stats, in_turn
from bench.report import Result, Row, Sample, target_ratio

logger = logging.getLogger(__name__)

NAME = "entrances"
# The targets of a warm epoch through every entrance, of nginx's files/s.
KEPT_ALIVE, PER_FILE = 0.95, 0.9


def shapes(profile: Profile) -> list[Shape]:
    workers = profile.loader_workers
    return [
        Shape("1 worker, keep-alive", 1, "keep-alive", target_ratio(KEPT_ALIVE)),
        Shape(f"{workers} workers, keep-alive", workers, "keep-alive", target_ratio(KEPT_ALIVE)),
        Shape(
            f"{workers} workers, new connection per file",
            workers,
            "per-file",
            target_ratio(PER_FILE),
        ),
    ]


def run(profile: Profile, lab: Lab) -> Result:
    count = profile.loader_files
    sizes = file_sizes(count)
    result = Result(
        NAME,
        f"Entrances: the data loader's warm epochs over {count} files of "
        f"{SMALLEST // KiB} KiB–{LARGEST // KiB} KiB (median "
        f"{statistics.median(sizes) / KiB:.0f} KiB), through each way in",
    )
    cores = len(os.sched_getaffinity(0))
    nginx = lab.nginx(workers=cores)
    files = make_files(lab, sizes)
    manifests = {
        "forward HTTPS": write_manifest(lab.dir / "https.txt", files, nginx.url),
        "forward plain HTTP": write_manifest(lab.dir / "plain.txt", files, nginx.plain_url),
    }
    sidecar = lab.sidecar(nginx.ca_pem, "--buffer-size", str(3 * sum(sizes)))
    direct, pod = lab.direct(nginx), lab.through(sidecar)
    fill = Shape("fill", profile.loader_workers, "keep-alive", None)
    for manifest in manifests.values():
        epoch(pod, manifest, fill, sidecar.pid, count)
    sidecar.wait_for_entries(count * len(manifests))
    expect_stats(sidecar, misses=count * len(manifests), hits=0)

    measured: dict[tuple[str, str, str], list[float]] = {}
    for run_index in range(profile.runs):
        for entrance, manifest in manifests.items():
            for shape in shapes(profile):
                logger.info("%s: run %d/%d, %s, %s", NAME, run_index + 1, profile.runs,
                            entrance, shape.name)  # fmt: skip
                sides = [("nginx", direct, nginx.process.popen.pid), ("sidecar", pod, sidecar.pid)]
                for side, route, pid in in_turn(run_index, sides):
                    found = epoch(route, manifest, shape, pid, count)
                    for figure, value in (("files/s", found.files_per_s),
                                          ("cpu", found.cpu_per_1000)):  # fmt: skip
                        measured.setdefault((entrance, shape.name, side + figure), []).append(value)
    epochs = profile.runs * len(manifests) * len(shapes(profile))
    expect_stats(sidecar, misses=count * len(manifests), hits=count * epochs)

    for entrance in manifests:
        for shape in shapes(profile):
            for label, unit, figure, required in (
                ("throughput", "files/s", "files/s", shape.required),
                ("CPU per 1,000 files", "s", "cpu", None),
            ):
                result.rows.append(
                    Row(
                        f"{entrance}, {shape.name}, {label}",
                        unit,
                        Sample.of(measured[entrance, shape.name, "sidecar" + figure]),
                        Sample.of(measured[entrance, shape.name, "nginx" + figure]),
                        f"nginx, {cores} workers, "
                        + ("HTTPS" if entrance == "forward HTTPS" else "plain HTTP"),
                        required,
                    )
                )
    result.notes.append(
        f"medians of {profile.runs} epochs (min–max), every file a hit (checked in /stats);"
        " clients: bench.loader_client, as in the loader benchmark; an http URL is asked of"
        " the proxy in absolute form, as clients ask a proxy for one; CPU of each server's"
        " whole process tree"
    )
    return result
