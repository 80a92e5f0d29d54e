"""Cold miss: a big file fetched through the sidecar (stored while streamed) vs plain
mitmdump passing it through, both from the unthrottled reference nginx.

Every timed run asks for a new URL (a query string nginx ignores), so each one is a
real miss that fills the buffer; the buffer is sized to keep them all, so no run
measures eviction or the no-room pass-through. One untimed request per proxy first
warms its connection to nginx and its leaf certificate for the host.
"""

from __future__ import annotations

import logging

from bench import clients
from bench.lab import HOST, Lab, Profile, expect_stats, mb_per_s
from bench.report import Result, Row, Sample, ratio_at_least

logger = logging.getLogger(__name__)

NAME = "cold-miss"


def run(profile: Profile, lab: Lab) -> Result:
    size = profile.large_bytes
    result = Result(NAME, f"Cold miss: {size // 2**20} MiB file from nginx")
    source = lab.make_file("cold.bin", size)
    nginx = lab.nginx()
    fills = 2 * profile.runs + 1
    sidecar = lab.sidecar(nginx.ca_pem, "--buffer-size", str(fills * size + 2**20))
    mitmdump = lab.mitmdump(nginx.ca_pem)
    pod, reference = lab.through(sidecar), lab.through_mitmdump(mitmdump)
    lab.check_download(pod, nginx.url(source.name, HOST, "warmup"), source)
    lab.check_download(reference, nginx.url(source.name, HOST, "warmup"), source)

    speeds: dict[tuple[str, str], list[float]] = {}
    for run_index in range(profile.runs):
        logger.info("%s: run %d/%d", NAME, run_index + 1, profile.runs)
        for client in ("wget", "curl"):
            url = nginx.url(source.name, HOST, f"cold={client}-{run_index}")
            for side, route in (("mitmdump", reference), ("sidecar", pod)):
                if client == "wget":
                    seconds = clients.wget(route, url)
                else:
                    seconds = clients.curl(route, url, size)
                speeds.setdefault((side, client), []).append(mb_per_s(size, seconds))
    expect_stats(sidecar, misses=fills, hits=0, passes=0, upstream_requests=fills)

    for client in ("wget", "curl"):
        result.rows.append(
            Row(
                f"miss through the sidecar (stored), {client}",
                "MB/s",
                Sample.of(speeds["sidecar", client]),
                Sample.of(speeds["mitmdump", client]),
                "mitmdump pass-through",
                ratio_at_least(0.9),
            )
        )
    result.notes.append(
        f"medians of {profile.runs} runs (min–max); mitmdump 12.2.3 with "
        "`-q --set stream_large_bodies=1m`, otherwise its defaults (eager connections, "
        "HTTP/2 offered to clients)"
    )
    return result
