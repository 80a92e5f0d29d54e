"""The shared parent tier: many pods reading one dataset, each through its own sidecar,
with and without a Squid parent cache between the sidecars and the origin.

PODS sidecars (one worker each) read the same OBJECTS-object dataset at once, each pod
with one curl in its own shuffled order (a data loader's epoch), from an origin
throttled per connection. Without a parent every sidecar fetches every object from
the origin; with `--parent`, the first sidecar to miss an object makes Squid fetch it
once, and every other sidecar is served by Squid (a hit, or joined to the fetch in
progress). The origin counts the body bytes it sent; each run asks for new URLs (a
query string the origin ignores), so both sides start cold, sidecars and Squid alike.
"""

from __future__ import annotations

import concurrent.futures
import logging
import random
import time

from bench import clients
from bench.harness import OriginServer, Sidecar
from bench.lab import HOST, MB, Lab, Profile, WrongPath, in_turn
from bench.report import Requirement, Result, Row, Sample

logger = logging.getLogger(__name__)

NAME = "parent"
SIDES = ("no parent", "parent")


def epoch(lab: Lab, pods: list[Sidecar], urls: list[str], size: int, seed: int) -> float:
    """Seconds until every pod has read every URL (each in its own order, all at once)."""

    def read(index: int) -> None:
        order = random.Random(seed * 1000 + index).sample(urls, len(urls))
        try:
            transfers = clients.curl_many(lab.through(pods[index]), order)
        except clients.ClientFailed as e:
            # The pod's sidecar says why: the lab and its logs go when the run ends.
            raise clients.ClientFailed(f"{e}\nits sidecar's log:\n{pods[index].log()}") from e
        clients.check_transfers(transfers, size)

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(pods)) as pool:
        list(pool.map(read, range(len(pods))))
    return time.perf_counter() - started


def start_pods(lab: Lab, origin: OriginServer, count: int, *args: str) -> list[Sidecar]:
    pods = [lab.sidecar(origin.ca_pem, "--workers", "1", *args, start=False) for _ in range(count)]
    # Two at a time: a burst of interpreters starting on two cores would miss the
    # harness's start-up timeout.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(Sidecar.start, pods))
    return pods


def run(profile: Profile, lab: Lab) -> Result:
    count, objects = profile.parent_pods, profile.parent_objects
    size, rate = profile.parent_bytes, profile.parent_rate
    dataset = objects * size
    result = Result(
        NAME,
        f"Parent tier: {count} pods read the same {objects} × {size / MB:.1f} MB, "
        f"{rate / MB:g} MB/s per origin connection",
    )
    names = [lab.make_file(f"shard-{n:03d}.bin", size).name for n in range(objects)]
    origin = lab.origin(rate)
    squid = lab.squid()
    pods = {
        "no parent": start_pods(lab, origin, count),
        "parent": start_pods(lab, origin, count, "--parent", squid.url),
    }
    seconds: dict[str, list[float]] = {side: [] for side in SIDES}
    origin_mb: dict[str, list[float]] = {side: [] for side in SIDES}
    for run_index in range(profile.runs):
        logger.info("%s: run %d/%d", NAME, run_index + 1, profile.runs)
        for side in in_turn(run_index, SIDES):
            urls = [origin.url(name, HOST, run=f"{side}-{run_index}") for name in names]
            before = origin.bytes_sent()
            seconds[side].append(epoch(lab, pods[side], urls, size, run_index))
            sent = origin.bytes_sent() - before
            expected = dataset * (1 if side == "parent" else count)
            if sent != expected:
                raise WrongPath(f"{side}: the origin sent {sent} bytes, expected {expected}")
            origin_mb[side].append(sent / MB)
    for pod in pods["parent"]:
        stats = pod.stats()
        if stats["parent_failures"] or stats["parent_requests"] == 0:
            raise WrongPath(f"a sidecar did not use its parent as meant: {stats}")
    served = [code for code, _, url in squid.access_log() if url.startswith("https://")]
    from_cache = sum("HIT" in code for code in served)

    reference = "no parent tier"
    share = 1 / count
    result.rows += [
        Row(
            "bytes the origin sent",
            "MB",
            Sample.of(origin_mb["parent"]),
            Sample.of(origin_mb["no parent"]),
            reference,
            Requirement(f"= 1/{count}×", lambda row: abs((row.ratio or 0) - share) < 1e-9),
        ),
        Row(
            f"wall time until all {count} pods read the dataset",
            "s",
            Sample.of(seconds["parent"]),
            Sample.of(seconds["no parent"]),
            reference,
        ),
    ]
    result.notes.append(
        f"medians of {profile.runs} runs (min–max); {count} sidecars per side, one worker "
        f"each, each pod one curl over its {objects} objects in its own shuffled order, all "
        f"pods at once; the origin's own byte count; Squid {squid.version()} "
        f"(OpenSSL build) answered {len(served)} requests, {from_cache} of them from its "
        "cache (the others joined the one fetch in progress or were the fetch)"
    )
    return result
