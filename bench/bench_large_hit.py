"""Large hit: one big file on tmpfs, nginx serving it directly vs a warm sidecar hit.

Both sides speak HTTPS to an unmodified client writing to /dev/null; runs alternate
between the two so that the machine's noise hits both alike. The sidecar's copy is
filled once (untimed, checked byte for byte), and its counters prove that every
timed download was a hit.
"""

from __future__ import annotations

import logging

from bench import clients
from bench.lab import HOST, Lab, Profile, expect_stats, in_turn, mb_per_s
from bench.report import Result, Row, Sample, ratio_at_least

logger = logging.getLogger(__name__)

NAME = "large-hit"


def run(profile: Profile, lab: Lab) -> Result:
    size = profile.large_bytes
    result = Result(NAME, f"Large hit: {size // 2**20} MiB file on tmpfs")
    source = lab.make_file("large.bin", size)
    nginx = lab.nginx()
    sidecar = lab.sidecar(nginx.ca_pem, "--buffer-size", str(2 * size))
    url = nginx.url(source.name, HOST)
    direct, pod = lab.direct(nginx), lab.through(sidecar)
    lab.check_download(pod, url, source)  # the fill
    lab.check_download(pod, url, source)  # a hit

    speeds: dict[tuple[str, str], list[float]] = {}
    for run_index in range(profile.runs):
        logger.info("%s: run %d/%d", NAME, run_index + 1, profile.runs)
        for client in ("wget", "curl"):
            for side, route in in_turn(run_index, [("nginx", direct), ("sidecar", pod)]):
                if client == "wget":
                    seconds = clients.wget(route, url)
                else:
                    seconds = clients.curl(route, url, size)
                speeds.setdefault((side, client), []).append(mb_per_s(size, seconds))
    expect_stats(sidecar, misses=1, hits=1 + 2 * profile.runs, bytes_from_upstream=size)

    for client, required in (("wget", ratio_at_least(0.8, target=1.0)), ("curl", None)):
        result.rows.append(
            Row(
                f"warm hit through the sidecar, {client}",
                "MB/s",
                Sample.of(speeds["sidecar", client]),
                Sample.of(speeds["nginx", client]),
                "nginx direct",
                required,
            )
        )
    result.notes.append(
        f"medians of {profile.runs} runs (min–max); wall time of the whole client process, "
        "output to /dev/null, both sides under the same `unshare` wrapper"
    )
    return result
