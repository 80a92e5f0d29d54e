"""Nezha's demo reproduced over HTTPS: a CIFAR-100-sized file from a far host.

The Python origin is throttled to the per-connection rate Nezha measured to a far
host (3.49 MB/s). wget downloads the file straight from the origin (what a pod gets
without a cache), then through the sidecar cold (the miss fills the buffer, over
several ranged connections by default) and warm (hits). Nezha, with plain HTTP and
a central nginx cache, went from 3.49 to 323 MB/s (92.5×).
"""

from __future__ import annotations

import logging

from bench import clients
from bench.lab import HOST, Lab, Profile, expect_stats, mb_per_s
from bench.report import Result, Row, Sample, target_ratio

logger = logging.getLogger(__name__)

NAME = "nezha"
NEZHA_SPEEDUP = 323 / 3.49  # Nezha's published warm/cold, over HTTP


def run(profile: Profile, lab: Lab) -> Result:
    size, rate = profile.nezha_bytes, profile.nezha_rate
    result = Result(NAME, f"Nezha's demo: {size / 1e6:.0f} MB from a {rate / 1e6:.2f} MB/s host")
    source = lab.make_file("cifar-100-python.tar.gz", size)
    origin = lab.origin(rate)
    sidecar = lab.sidecar(origin.ca_pem)
    pod = lab.through(sidecar)
    url = origin.url(source.name, host=HOST)

    logger.info("%s: direct download from the origin (about %.0f s)", NAME, size / rate)
    direct = Sample.of([mb_per_s(size, clients.wget(lab.route(origin.ca_pem), url))])
    logger.info("%s: cold download through the sidecar", NAME)
    cold = Sample.of([mb_per_s(size, lab.check_download(pod, url, source))])
    lab.check_download(pod, url, source)  # the first hit
    warm = Sample.of([mb_per_s(size, clients.wget(pod, url)) for _ in range(profile.runs)])
    expect_stats(sidecar, misses=1, hits=1 + profile.runs, bytes_from_upstream=size)

    result.rows += [
        Row("cold (miss) through the sidecar, wget", "MB/s", cold, direct, "origin direct"),
        Row("warm (hit) vs cold (miss), wget", "MB/s", warm, cold, "cold", target_ratio(100)),
        Row("warm (hit) vs the origin direct, wget", "MB/s", warm, direct, "origin direct"),
    ]
    result.notes.append(
        f"the direct and the cold download once each (bound by the origin's throttle), "
        f"warm: medians of {profile.runs} (min–max); Nezha (2018, HTTP, central nginx "
        f"cache): 3.49 → 323 MB/s, {NEZHA_SPEEDUP:.1f}×"
    )
    return result
