"""Peak memory: the sidecar's resident set while it streams a big object, miss and hit.

The figure a pod's memory limit is held against is the process's RSS (the buffer
itself is tmpfs, charged to the pod but not to the process). For each transfer the
kernel's peak (VmHWM, reset before it) and the largest sampled VmRSS are recorded;
plain mitmdump passing the same object through is the reference.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from bench import clients, memory
from bench.harness import process_tree, wait_until
from bench.lab import HOST, Lab, Profile, expect_stats
from bench.report import Result, Row, Sample, below

logger = logging.getLogger(__name__)

NAME = "rss"
LIMIT_MB = 150  # the bound on each sidecar process's peak RSS


def peaks(pid: int, transfer: Callable[[], object]) -> tuple[float, float, float]:
    """While `transfer()` runs, in MB: the largest VmHWM of any process of `pid`'s tree,
    the largest sampled VmRSS of any one of them, and of all of them together."""
    pids = process_tree(pid)
    for member in pids:
        memory.reset_peak(member)
    with memory.RssSampler(pids) as sampler:
        transfer()
    return max(memory.peak_mb(p) for p in pids), sampler.max_mb, sampler.max_total_mb


def run(profile: Profile, lab: Lab) -> Result:
    size = profile.rss_bytes
    result = Result(NAME, f"Sidecar memory streaming a {size // 2**20} MiB object")
    source = lab.make_file("rss.bin", size)
    nginx = lab.nginx()
    sidecar = lab.sidecar(nginx.ca_pem, "--buffer-size", str(profile.runs * size))
    mitmdump = lab.mitmdump(nginx.ca_pem)
    pod, reference = lab.through(sidecar), lab.through_mitmdump(mitmdump)
    idle = (
        sum(memory.rss_mb(pid) for pid in process_tree(sidecar.pid)),
        memory.rss_mb(mitmdump.pid),
    )

    figures: dict[str, list[float]] = {}

    def record(key: str, pid: int, route: clients.Route, url: str) -> None:
        hwm, sampled, total = peaks(pid, lambda: clients.curl(route, url, size))
        figures.setdefault(f"{key} hwm", []).append(hwm)
        figures.setdefault(f"{key} sampled", []).append(sampled)
        figures.setdefault(f"{key} total", []).append(total)

    urls = [nginx.url(source.name, HOST, f"miss={i}") for i in range(profile.runs)]
    for run_index, url in enumerate(urls):
        logger.info("%s: miss %d/%d", NAME, run_index + 1, profile.runs)
        record("miss", sidecar.pid, pod, url)
        record("mitmdump", mitmdump.pid, reference, url)
    expect_stats(sidecar, misses=profile.runs, hits=0)

    # The hits come from a restarted sidecar that has never fetched anything, so that
    # its memory is the hit path's alone.
    sidecar.stop()
    sidecar.start()
    wait_until(lambda: sidecar.stats()["unverified_entries"] == 0, "the buffer's verification")
    for run_index, url in enumerate(urls):
        logger.info("%s: hit %d/%d", NAME, run_index + 1, profile.runs)
        record("hit", sidecar.pid, pod, url)
    expect_stats(sidecar, misses=0, hits=profile.runs)

    result.rows.append(
        Row(
            "idle after start, all processes", "MB RSS",
            Sample.of([idle[0]]), Sample.of([idle[1]]), "mitmdump",
        )
    )  # fmt: skip
    for path in ("miss", "hit"):
        for figure, label, required in (
            ("hwm", "peak of one process (VmHWM)", below(LIMIT_MB, "MB", every_run=True)),
            ("sampled", "largest sampled VmRSS of one process", below(LIMIT_MB, "MB", True)),
            ("total", "largest sampled VmRSS, all processes", None),
        ):
            result.rows.append(
                Row(
                    f"{path}, {label}",
                    "MB",
                    Sample.of(figures[f"{path} {figure}"]),
                    Sample.of(figures[f"mitmdump {figure}"]),
                    "mitmdump pass-through",
                    required,
                )
            )
    result.notes.append(
        f"medians of {profile.runs} transfers (min–max), the limit holds for the largest; "
        "curl to /dev/null; misses from a fresh sidecar, hits after restarting it on the "
        "same buffer; the sidecar's main process and its workers each measured, and together; "
        "VmHWM reset through /proc/<pid>/clear_refs before each transfer, "
        f"VmRSS sampled every {memory.SAMPLE_INTERVAL * 1000:.0f} ms"
    )
    return result
