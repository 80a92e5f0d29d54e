"""Momenta's table: the per-epoch hit ratio of a job that scans a dataset larger than
its buffer, under no replacement (`--eviction none`) and under LRU.

A dataset of equal objects is read whole, in the same order, once per epoch, over one
keep-alive connection (one curl per epoch), through a fresh sidecar whose buffer holds
exactly k objects (`--buffer-size` counts body bytes only). From the second epoch on,
no replacement still holds the first k objects and hits them: a steady k/n. LRU
evicts every object before the scan comes back to it, so unless the whole dataset
fits it hits nothing. Momenta's table, buffer/dataset = 10, 50, 100, 160 and 200 per
160: no replacement 6.25, 31.25, 62.5, 100, 100 %; LRU about 0 below 100 %.

The figures are the sidecar's own counters: /stats before and after each epoch.
"""

from __future__ import annotations

import logging

from bench import clients
from bench.clients import Route
from bench.harness import Sidecar
from bench.lab import HOST, Lab, Profile, WrongPath, counted_since
from bench.report import Result, Row, Sample, within

logger = logging.getLogger(__name__)

NAME = "momenta"
PER = 160  # Momenta's table gives buffer sizes per 160 objects of dataset
RATIOS = (10, 50, 100, 160, 200)  # buffer/dataset, per PER
EPOCHS = 3  # the first fills the buffer; the others are the steady state
POLICIES = {"none": "no replacement", "lru": "LRU"}  # --eviction value -> name
# Every request of an epoch is exactly one of these in /stats.
OUTCOMES = ("hits", "misses", "coalesced", "passes")


def buffer_objects(ratio: int, objects: int) -> int:
    """Objects a buffer of `ratio`/PER of a dataset of `objects` objects holds."""
    return ratio * objects // PER


def expected_hits(eviction: str, buffer: int, objects: int) -> int:
    """Hits per epoch once the buffer is warm, for a scan in a fixed order: no
    replacement keeps the `buffer` objects it stored first; LRU has evicted each object
    by the time the scan returns to it, unless the whole dataset fits."""
    if buffer >= objects:
        return objects
    return buffer if eviction == "none" else 0


def label(eviction: str, buffer: int, objects: int) -> str:
    """The row of one policy and buffer size (bench.plot finds rows by it)."""
    return f"{POLICIES[eviction]}, buffer {buffer}/{objects} objects, hit ratio per epoch"


def scan(sidecar: Sidecar, route: Route, urls: list[str], size: int) -> int:
    """Read every URL once, in order, on one connection; the hits the sidecar counted."""
    before = sidecar.stats()
    clients.check_transfers(clients.curl_many(route, urls), size)
    counted = counted_since(sidecar, before, *OUTCOMES)
    if sum(counted.values()) != len(urls):
        raise WrongPath(f"{len(urls)} requests, but the sidecar counted {counted}")
    return counted["hits"]


def run(profile: Profile, lab: Lab) -> Result:
    objects, size = profile.momenta_objects, profile.momenta_bytes
    result = Result(
        NAME, f"Momenta's table: {objects} objects of {size // 1024} KiB, {EPOCHS} epochs"
    )
    names = [lab.make_file(f"sample-{i:04d}.bin", size).name for i in range(objects)]
    nginx = lab.nginx()
    urls = [nginx.url(name, HOST) for name in names]
    cases = [(buffer_objects(r, objects), eviction) for r in RATIOS for eviction in POLICIES]
    ratios: dict[tuple[int, str], Sample] = {}
    for buffer, eviction in cases:
        logger.info("%s: buffer %d/%d, --eviction %s", NAME, buffer, objects, eviction)
        args = ["--buffer-size", str(buffer * size), "--eviction", eviction]
        sidecar = lab.sidecar(nginx.ca_pem, *args)
        route = lab.through(sidecar)
        hits = [scan(sidecar, route, urls, size) for _ in range(EPOCHS)]
        sidecar.stop()  # its figures are in; ten would idle side by side until the end
        if hits[0] != 0:
            raise WrongPath(f"a fresh sidecar counted {hits[0]} hits in the first epoch")
        ratios[buffer, eviction] = Sample.of([100 * h / objects for h in hits[1:]])

    for buffer in sorted({buffer for buffer, _ in cases}):
        expected = {e: 100 * expected_hits(e, buffer, objects) / objects for e in POLICIES}
        result.rows += [
            Row(
                label("none", buffer, objects),
                "%",
                ratios[buffer, "none"],
                Sample.of([expected["none"]]),
                "expected (Momenta)",
                within(expected["none"], 100 / objects, "expected ± 1 object"),
            ),
            Row(
                label("lru", buffer, objects),
                "%",
                ratios[buffer, "lru"],
                ratios[buffer, "none"],
                "no replacement",
                within(expected["lru"], 0, f"= {expected['lru']:g} %"),
            ),
        ]
    result.notes.append(
        f"hit ratio = hits / requests of one epoch, from the sidecar's /stats; epochs 2 "
        f"to {EPOCHS} (min–max), the first being all misses; one fresh sidecar per row, "
        "buffer = exactly k objects; no replacement is held to Momenta's expectation "
        "(buffer/dataset), LRU is compared with no replacement measured on the same "
        "dataset in the same run"
    )
    return result
