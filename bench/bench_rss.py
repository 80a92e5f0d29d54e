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
from bench.harness import wait_until
from bench.lab import HOST, Lab, Profile, expect_stats
from bench.report import Result, Row, Sample, below

logger = logging.getLogger(__name__)

NAME = "rss"
LIMIT_MB = 250  # the bound on the sidecar's peak RSS


def peaks(pid: int, transfer: Callable[[], object]) -> tuple[float, float]:
    """(VmHWM, largest sampled VmRSS) in MB while `transfer()` runs."""
    memory.reset_peak(pid)
    with memory.RssSampler(pid) as sampler:
        transfer()
    return memory.peak_mb(pid), sampler.max_mb


def run(profile: Profile, lab: Lab) -> Result:
    size = profile.rss_bytes
    result = Result(NAME, f"Sidecar memory streaming a {size // 2**20} MiB object")
    source = lab.make_file("rss.bin", size)
    nginx = lab.nginx()
    sidecar = lab.sidecar(nginx.ca_pem, "--buffer-size", str(profile.runs * size))
    mitmdump = lab.mitmdump(nginx.ca_pem)
    pod, reference = lab.through(sidecar), lab.through_mitmdump(mitmdump)
    idle = memory.rss_mb(sidecar.pid), memory.rss_mb(mitmdump.pid)

    figures: dict[str, list[float]] = {}

    def record(key: str, pid: int, route: clients.Route, url: str) -> None:
        hwm, sampled = peaks(pid, lambda: clients.curl(route, url, size))
        figures.setdefault(f"{key} hwm", []).append(hwm)
        figures.setdefault(f"{key} sampled", []).append(sampled)

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
        Row("idle after start", "MB RSS", Sample.of([idle[0]]), Sample.of([idle[1]]), "mitmdump")
    )
    for path in ("miss", "hit"):
        for figure, label in (("hwm", "peak (VmHWM)"), ("sampled", "largest sampled VmRSS")):
            result.rows.append(
                Row(
                    f"{path}, {label}",
                    "MB",
                    Sample.of(figures[f"{path} {figure}"]),
                    Sample.of(figures[f"mitmdump {figure}"]),
                    "mitmdump pass-through",
                    below(LIMIT_MB, "MB", every_run=True),
                )
            )
    result.notes.append(
        f"medians of {profile.runs} transfers (min–max), the limit holds for the largest; "
        "curl to /dev/null; misses from a fresh sidecar, hits after restarting it on the "
        "same buffer; VmHWM reset through /proc/<pid>/clear_refs before each transfer, "
        f"VmRSS sampled every {memory.SAMPLE_INTERVAL * 1000:.0f} ms"
    )
    return result
