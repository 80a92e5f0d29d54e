"""Small objects: many 64 KiB files over one keep-alive connection, warm hits through
the sidecar vs nginx serving them directly.

One curl invocation fetches every URL in order and reuses its connection (through
the proxy: its CONNECT tunnel); curl's per-transfer `num_connects` proves that only
the first transfer connected, and its `time_total` gives each request's latency.
Requests/s is the number of requests over the sum of their times, so curl's own
start-up is left out on both sides.
"""

from __future__ import annotations

import logging
import statistics

from bench import clients
from bench.lab import HOST, Lab, Profile, WrongPath, expect_stats, in_turn
from bench.report import Result, Row, Sample, below, ratio_at_least

logger = logging.getLogger(__name__)

NAME = "small"


def fetch_all(route: clients.Route, urls: list[str], size: int) -> list[float]:
    """Seconds per request, all over one connection."""
    transfers = clients.curl_many(route, urls)
    clients.check_transfers(transfers, size)
    connects = sum(t.connects for t in transfers)
    if connects != 1:
        raise WrongPath(f"curl opened {connects} connections for {len(urls)} requests")
    return [t.seconds for t in transfers]


def percentile(values: list[float], p: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def run(profile: Profile, lab: Lab) -> Result:
    size, count = profile.small_bytes, profile.small_count
    result = Result(NAME, f"Small objects: {count} × {size // 1024} KiB on one connection")
    names = [lab.make_file(f"small-{i:04d}.bin", size).name for i in range(count)]
    nginx = lab.nginx()
    sidecar = lab.sidecar(nginx.ca_pem)
    urls = [nginx.url(name, HOST) for name in names]
    direct, pod = lab.direct(nginx), lab.through(sidecar)
    fetch_all(pod, urls, size)  # the fills
    expect_stats(sidecar, misses=count, hits=0)

    figures: dict[tuple[str, str], list[float]] = {}
    for run_index in range(profile.runs):
        logger.info("%s: run %d/%d", NAME, run_index + 1, profile.runs)
        for side, route in in_turn(run_index, [("nginx", direct), ("sidecar", pod)]):
            seconds = fetch_all(route, urls, size)
            figures.setdefault((side, "req/s"), []).append(count / sum(seconds))
            figures.setdefault((side, "p50"), []).append(percentile(seconds, 50) * 1000)
            figures.setdefault((side, "p99"), []).append(percentile(seconds, 99) * 1000)
    expect_stats(sidecar, misses=count, hits=count * profile.runs, bytes_from_upstream=count * size)

    for figure, label, unit, required in (
        ("req/s", "warm hits, throughput", "requests/s", ratio_at_least(0.6)),
        ("p50", "warm hits, latency p50", "ms", None),
        ("p99", "warm hits, latency p99", "ms", below(2, "ms")),
    ):
        result.rows.append(
            Row(
                label,
                unit,
                Sample.of(figures["sidecar", figure]),
                Sample.of(figures["nginx", figure]),
                "nginx direct",
                required,
            )
        )
    result.notes.append(
        f"medians of {profile.runs} runs (min–max) of {count} requests each; curl "
        "`-w %{time_total}` per request, one connection per run (checked)"
    )
    return result
