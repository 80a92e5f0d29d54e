"""A restarted sidecar on a buffer of many small objects: ready, verified, memory, hits.

For each object count, a buffer holding that many objects of 1–4 KiB (`bench.stored`,
made through the store's own API) is found by a sidecar with two workers started on
it, as after a container restart in the same pod. Measured: the seconds from start to
`/healthz` 200 (against an empty buffer's), and again with the index dropped from the page
cache first (`stored.evict`, at the largest size only), whether the first request for a stored
object is a hit, the seconds until every object found is verified, the hit rate over
distinct stored objects (two keep-alive loader processes, `bench.loader_client`)
against the rate with 1,000 stored objects read over and over, and the first hits with
the most objects stored against the first hits with the fewest (restarted on them several
times: their hits last seconds, a moment of the machine's), and the proportional set
size (PSS) of every process of the sidecar after those hits: the shared memory file
apart (the core's table of answers, which holds every object: `--index-objects` is the
object count), and the rest.

No origin runs: every request must be a hit, and a miss would fail the client (checked
in `/stats` as well).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

from bench import clients, memory, stored
from bench.bench_loader import Shape, epoch
from bench.bench_ready import seconds_since
from bench.harness import process_tree, wait_until
from bench.lab import Lab, Profile, WrongPath, counted_since
from bench.report import Result, Row, Sample, below, ratio_at_least, within
from sidecar.settings import INDEX_OBJECTS_MIN
from sidecar.shared import MEMORY_FILE

logger = logging.getLogger(__name__)

NAME = "scale"
WORKERS = 2  # sidecar workers, and loader processes reading through it
READY_LIMIT_S = 2.0
VERIFIED_LIMIT_S = 120.0
PSS_LIMIT_MB = 400.0  # within the injector's 384Mi for a two-worker sidecar
MB = 1_000_000
HIT_RATIO = 0.9  # first hits/s with many stored objects against first hits/s with fewer
VERIFY_TIMEOUT = 900.0  # seconds
REFERENCE_PASSES = 20  # passes over the few objects of the reference


@dataclass(frozen=True)
class Restart:
    """What one restart on a buffer of `count` objects measured."""

    count: int
    ready_s: float
    first_hit: bool
    verified_s: float
    hits_per_s: float
    cpu_per_1000: float  # the sidecar's CPU seconds per 1,000 of those hits
    hits: int
    pss_mb: dict[str, float]  # by process, but the shared memory file's pages
    shared_mb: float  # the shared memory file's pages, every process's share


def manifest_of(source: Path, target: Path, distinct: int, passes: int, seed: int) -> int:
    """`distinct` random lines of `source` in `target`, `passes` times over, each pass
    shuffled; the number of lines written."""
    lines = source.read_text().splitlines(keepends=True)
    chance = random.Random(seed)
    chosen = chance.sample(lines, min(distinct, len(lines)))
    written = []
    for _ in range(passes):
        chance.shuffle(chosen)
        written.extend(chosen)
    target.write_text("".join(written))
    return len(written)


def restart(lab: Lab, count: int, distinct: int, passes: int, cold: bool = False) -> Restart:
    """A restart on `count` stored objects, then `distinct` of them read `passes` times;
    only the ready time with `cold` (the index dropped from the page cache first) or
    without objects."""
    if count:
        directory, manifest = stored.buffer(count)
    else:
        directory, manifest = lab.dir / "empty-buffer", None
        directory.mkdir(exist_ok=True)
    if cold:
        stored.evict(directory)
    size = str(max(count, 1) * stored.LARGEST * 2)
    sidecar = lab.sidecar(
        lab.ca_pem,
        "--workers",
        str(WORKERS),
        "--buffer-size",
        size,
        "--index-objects",
        str(max(count, INDEX_OBJECTS_MIN)),
        start=False,
    )
    sidecar.buffer_dir.symlink_to(directory)
    started = time.perf_counter()
    sidecar.launch()
    ready = seconds_since(started, sidecar.healthy)
    if manifest is None or cold:
        sidecar.stop()
        return Restart(count, ready, True, ready, 0.0, 0.0, 0, {}, 0.0)

    route = lab.through(sidecar)
    loads = lab.dir / f"manifest-{count}.txt"
    requests = manifest_of(manifest, loads, distinct, passes, seed=count)
    first_url = loads.read_text().split(maxsplit=1)[0]
    try:
        clients.curl_many(route, [first_url])
    except clients.ClientFailed:
        pass  # not served from the buffer, and no origin to ask: counted below
    first_hit = sidecar.stats()["hits"] == 1
    wait_until(
        lambda: sidecar.stats()["unverified_entries"] == 0, "every object verified", VERIFY_TIMEOUT
    )
    verified = time.perf_counter() - started
    if sidecar.stats()["entries"] != count:
        raise WrongPath(f"{sidecar.stats()['entries']} objects verified of {count}")

    shape = Shape("hits", WORKERS, "keep-alive", ratio_at_least(0))
    before = sidecar.stats()
    hits = epoch(route, loads, shape, sidecar.pid, requests)
    served = counted_since(sidecar, before, "hits", "misses", "upstream_requests")
    if served != {"hits": requests, "misses": 0, "upstream_requests": 0}:
        raise WrongPath(f"{requests} requests for stored objects made {served}")
    shared = {pid: memory.mapped_pss_mb(pid, MEMORY_FILE) for pid in process_tree(sidecar.pid)}
    pss = {str(pid): memory.pss_mb(pid) - mb for pid, mb in shared.items()}
    sidecar.stop()
    return Restart(
        count,
        ready,
        first_hit,
        verified,
        hits.files_per_s,
        hits.cpu_per_1000,
        requests,
        pss,
        sum(shared.values()),
    )


def run(profile: Profile, lab: Lab) -> Result:
    result = Result(NAME, "A restarted sidecar on many stored objects of 1–4 KiB, 2 workers")
    empty = restart(lab, 0, 0, 0)
    reference = restart(lab, profile.scale_reference, profile.scale_reference, REFERENCE_PASSES)
    distinct: dict[int, list[Restart]] = {}
    for count in profile.scale_counts:
        logger.info("%s: %d stored objects", NAME, count)
        largest = count == max(profile.scale_counts)
        label = f"{count:,} stored"
        if largest:
            cold = restart(lab, count, 0, 0, cold=True)
            result.rows.append(
                Row(
                    f"{label}: ready after start, the index not in the page cache",
                    "s",
                    Sample.of([cold.ready_s]),
                    Sample.of([empty.ready_s]),
                    "empty buffer",
                    below(READY_LIMIT_S, "s"),
                )
            )
        # The fewest objects' first hits last seconds, a moment of the machine's: the
        # reference of the last row is the median of several restarts on them.
        restarts = profile.runs if count == min(profile.scale_counts) else 1
        runs = distinct[count] = [
            restart(lab, count, profile.scale_hits, 1) for _ in range(restarts)
        ]
        found = runs[-1]
        result.rows += [
            Row(
                f"{label}: ready after start",
                "s",
                Sample.of([r.ready_s for r in runs]),
                Sample.of([empty.ready_s]),
                "empty buffer",
                below(READY_LIMIT_S, "s") if largest else None,
            ),
            Row(
                f"{label}: first request a hit",
                "hits",
                Sample.of([float(r.first_hit) for r in runs]),
                required=within(1, 0, "a hit"),
            ),
            Row(
                f"{label}: every object verified after start",
                "s",
                Sample.of([r.verified_s for r in runs]),
                required=below(VERIFIED_LIMIT_S, "s") if largest else None,
            ),
            Row(
                f"{label}: {found.hits:,} distinct hits",
                "hits/s",
                Sample.of([r.hits_per_s for r in runs]),
                Sample.of([reference.hits_per_s]),
                f"{profile.scale_reference:,} stored",
            ),
            Row(
                f"{label}: shared memory per stored object (the table of answers)",
                "bytes",
                Sample.of([r.shared_mb * MB / count for r in runs]),
            ),
            Row(
                f"{label}: PSS of all sidecar processes after them, but the shared memory",
                "MB",
                Sample.of([sum(r.pss_mb.values()) for r in runs]),
                Sample.of([sum(reference.pss_mb.values())]),
                f"{profile.scale_reference:,} stored",
                below(PSS_LIMIT_MB, "MB") if largest else None,
            ),
        ]
        per_process = ", ".join(f"{mb:.0f}" for mb in found.pss_mb.values())
        result.notes.append(
            f"{label}: PSS by process (main, fork server, workers): {per_process}; sidecar CPU"
            f" per 1,000 hits {found.cpu_per_1000:.2f} s ({reference.cpu_per_1000:.2f} s with"
            f" {profile.scale_reference:,} stored)"
        )
    fewest, most = min(distinct), max(distinct)
    result.rows.append(
        Row(
            f"{most:,} stored: distinct hits against distinct hits with {fewest:,}",
            "hits/s",
            Sample.of([r.hits_per_s for r in distinct[most]]),
            Sample.of([r.hits_per_s for r in distinct[fewest]]),
            f"{fewest:,} stored",
            ratio_at_least(HIT_RATIO),
        )
    )
    result.notes.append(
        "the check after a restart puts every object it verified back in the core's table"
        " of answers (sized for them all), so that the hits, all after it, are the core's"
        " with any number of objects stored; the last row, which the requirement is on,"
        " compares the most objects' with the fewest's"
    )
    result.notes.append(
        f"one restart per size, {profile.runs} on the fewest objects (their first hits"
        f" last seconds: the last row's reference is their median); the reference's rate is"
        f" over {REFERENCE_PASSES} shuffled passes of its {profile.scale_reference:,}"
        f" objects, each size's over distinct objects (one pass); buffers on the machine's"
        f" disk (page-cached), made once by bench.stored in {stored.home()}"
    )
    return result
