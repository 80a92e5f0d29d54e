"""The soak, briefly (`bench.soak`; `python -m bench --only soak` runs it for minutes).

A warm-up round first fills what a sidecar keeps for good (pooled origin connections,
interpreter caches); that is the baseline. After each of two soak rounds, the sidecar
must be back to it: every connection the clients closed closed by the sidecar too
within 2 s, no more descriptors than the baseline, no more threads than its thread
pools may add; its memory must not grow from one round to the next, and nothing may
be logged at ERROR or as a traceback. Bounded: BURSTBUFFER_SOAK_SECONDS per round
(default 15) and SOAK_CLIENTS coroutines.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.harness import OriginServer, Sidecar, wait_until
from bench.procs import settled
from bench.soak import LARGE, MEDIUM, SMALL, Footprint, soak

pytestmark = pytest.mark.e2e

SOAK_CLIENTS = 64
SECONDS = float(os.environ.get("BURSTBUFFER_SOAK_SECONDS", "15"))  # each of two rounds
WARM_UP_SECONDS = 5.0
RSS_LIMIT = 150 * 1024 * 1024  # bytes, for each of the sidecar's processes
RSS_GROWTH = 8 * 1024 * 1024  # bytes the largest process may grow in the second round
# Thread pools start threads on demand, up to their size: each worker's default executor
# (name lookups) and fill hasher, the main process's janitor. Beyond that is a leak.
POOL_THREADS = min(32, (os.cpu_count() or 1) + 4) + 1


def test_a_mixed_load_leaves_the_sidecar_as_it_found_it(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    sidecar = start_sidecar("--buffer-size", "128MiB", "--eviction", "lru")
    files = {name: (dataset / name).read_bytes() for name in (SMALL, MEDIUM, LARGE)}

    def back_to(baseline: Footprint) -> None:
        wait_until(
            lambda: settled(sidecar.pid, sidecar.proxy_port, origin.port, baseline.fds),
            "client connections closed, descriptors as before",
            timeout=2,
        )

    warm_up = soak(sidecar, origin, files, WARM_UP_SECONDS, SOAK_CLIENTS, "warm-up")
    assert not warm_up.failures, warm_up.failures
    wait_until(lambda: sidecar.stats()["fills_in_progress"] == 0, "the warm-up's fills")
    baseline = Footprint.of(sidecar.pid)

    # Two rounds: memory may rise to a high-water mark in the first (allocators keep
    # what they had), a leak keeps growing past it in the second.
    after = []
    peaks = []
    for round_ in ("soak-1", "soak-2"):
        figures = soak(sidecar, origin, files, SECONDS, SOAK_CLIENTS, label=round_)
        print(f"\n{round_}: {SOAK_CLIENTS} clients, {figures.summary()}")
        assert not figures.failures, figures.failures
        assert all(figures.tally[kind] for kind in ("hit", "miss", "dropped", "abort", "tunnel"))
        assert figures.peak.rss < RSS_LIMIT
        peaks.append(figures.peak.rss)
        wait_until(lambda: sidecar.stats()["fills_in_progress"] == 0, "the soak's fills")
        back_to(baseline)
        after.append(Footprint.of(sidecar.pid))
        assert after[-1].threads <= baseline.threads + sidecar.stats()["workers"] * POOL_THREADS
    # Where the first round ended depends on when its last buffers were freed: what the
    # second may come back to is the first's high-water mark, and a leak goes past it.
    high_water = max(after[0].rss, peaks[0])
    assert after[1].rss < high_water + RSS_GROWTH, (after, peaks)
    stats = sidecar.stats()
    assert stats["client_aborts"] > 0
    assert stats["tunnelled_connections"] > 0
    log = sidecar.log()
    assert " ERROR " not in log and "Traceback" not in log, log[-4000:]
