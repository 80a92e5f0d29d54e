"""Soak: minutes of a mixed, realistic load through one sidecar (`bench.soak`: kept-alive
and connection-per-file clients, hits, misses, Range readers, HEADs, clients hanging
up mid-body, an origin dropping connections, tunnelled hosts).

Its figures are bounds rather than ratios: no failed request and no wrong byte, memory
under the per-process limit, and the sidecar back to what it held after a warm-up
(descriptors) once the load stops. The reference is the warm-up itself.
"""

from __future__ import annotations

import logging

from bench.harness import wait_until
from bench.lab import HOST, TUNNEL_HOST, Lab, Profile
from bench.procs import settled
from bench.report import Result, Row, Sample, below, within
from bench.soak import LARGE, MEDIUM, SMALL, Footprint, soak

logger = logging.getLogger(__name__)

NAME = "soak"
CLIENTS = 64
RSS_LIMIT_MB = 150.0  # each process, as for the other memory figures
SETTLE = 2.0  # seconds the sidecar has to close what its clients closed
SIZES = {SMALL: 100 * 1024, MEDIUM: 3 * 1024 * 1024, LARGE: 24 * 1024 * 1024}


def run(profile: Profile, lab: Lab) -> Result:
    result = Result(NAME, f"Soak: {CLIENTS} clients, mixed load, {profile.soak_seconds:g} s")
    files = {name: lab.make_file(name, size).read_bytes() for name, size in SIZES.items()}
    origin = lab.origin()
    sidecar = lab.sidecar(lab.ca_pem, "--buffer-size", "128MiB", "--eviction", "lru")
    hosts = (HOST, TUNNEL_HOST)
    warm_up = soak(sidecar, origin, files, profile.soak_seconds / 10, CLIENTS, "warm-up", hosts)
    wait_until(lambda: sidecar.stats()["fills_in_progress"] == 0, "the warm-up's fills")
    baseline = Footprint.of(sidecar.pid)
    logger.info("%s: warm-up %s", NAME, warm_up.summary())
    figures = soak(sidecar, origin, files, profile.soak_seconds, CLIENTS, "soak", hosts)
    logger.info("%s: %s", NAME, figures.summary())
    wait_until(lambda: sidecar.stats()["fills_in_progress"] == 0, "the soak's fills")
    closed = _settles(sidecar.pid, sidecar.proxy_port, origin.port, baseline.fds)
    after = Footprint.of(sidecar.pid)

    def one(value: float) -> Sample:
        return Sample.of([value])

    result.rows += [
        Row("requests completed, byte-identical", "req", one(figures.requests),
            one(warm_up.requests), "the warm-up (a tenth as long)"),
        Row("bytes verified", "MB", one(figures.tally["bytes"] / 1e6),
            one(warm_up.tally["bytes"] / 1e6), "the warm-up"),
        Row("failed requests and wrong bytes", "req", one(sum(figures.failures.values())),
            required=within(0, 0, "none")),
        Row("peak RSS (shared memory aside), largest process", "MB", one(figures.peak.rss / 1e6),
            one(baseline.rss / 1e6), "after the warm-up", below(RSS_LIMIT_MB, "MB")),
        Row("peak descriptors, every process", "fds", one(figures.peak.fds),
            one(baseline.fds), "after the warm-up"),
        Row(f"client connections left open {SETTLE:g} s after the load", "",
            one(0 if closed else 1), required=within(0, 0, "none")),
        Row("descriptors after the load (origin connections kept alive included)", "fds",
            one(after.fds), one(baseline.fds), "after the warm-up"),
        Row("threads after the load", "threads", one(after.threads), one(baseline.threads),
            "after the warm-up"),
    ]  # fmt: skip
    kinds = ", ".join(f"{kind} {figures.tally[kind]}" for kind in sorted(figures.tally))
    result.notes.append(f"requests by kind and failures: {kinds}")
    return result


def _settles(pid: int, proxy_port: int, origin_port: int, baseline: int) -> bool:
    """Are the clients' connections closed and the descriptors back to `baseline`
    (origin connections kept alive aside) within SETTLE seconds?"""
    try:
        wait_until(lambda: settled(pid, proxy_port, origin_port, baseline), "settled", SETTLE)
    except TimeoutError:
        return False
    return True
