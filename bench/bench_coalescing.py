"""Coalescing: many clients asking for one cold object at once, through the sidecar vs
straight to the origin.

CLIENTS wget processes start together, either all through one sidecar (the object is
not stored yet) or all straight to the origin, whose throttle applies per connection.
Straight to the origin every client costs a full download; through the sidecar the
first starts the one fill and the others join it (or hit it, if they come late).
The origin's own request log (/__requests) and the sidecar's /stats both count what
went upstream. Every run asks for a new URL (a query string the origin ignores), so
each is cold. The sidecar runs with `--parallel-fetch 1`: a split fill would add
ranged requests (the parallel-cold benchmark measures those) and blur the one-for-all count.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time

from bench import clients
from bench.clients import Route
from bench.lab import HOST, MB, Lab, Profile, WrongPath, counted_since, in_turn
from bench.report import Result, Row, Sample, within

logger = logging.getLogger(__name__)

NAME = "coalescing"
CLIENTS = 8
COUNTERS = ("hits", "misses", "coalesced", "upstream_requests", "bytes_from_upstream")


def together(route: Route, url: str) -> float:
    """Seconds from starting CLIENTS downloads of `url` at once until the last is done."""
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(lambda _: clients.wget(route, url), range(CLIENTS)))
    return time.perf_counter() - started


def run(profile: Profile, lab: Lab) -> Result:
    size, rate = profile.coalesce_bytes, profile.coalesce_rate
    result = Result(
        NAME,
        f"Coalescing: {CLIENTS} clients, one cold {size // 2**20} MiB object, "
        f"{rate / MB:g} MB/s per origin connection",
    )
    source = lab.make_file("shared.bin", size)
    origin = lab.origin(rate)
    sidecar = lab.sidecar(origin.ca_pem, "--parallel-fetch", "1")
    routes = {"origin": lab.route(origin.ca_pem), "sidecar": lab.through(sidecar)}
    # Untimed and checked byte for byte: the sidecar's leaf certificate and its
    # connection to the origin are made before the clock runs.
    lab.check_download(routes["sidecar"], origin.url(source.name, HOST, run="warmup"), source)

    seconds: dict[str, list[float]] = {"origin": [], "sidecar": []}
    requests: dict[str, list[float]] = {"origin": [], "sidecar": []}
    upstream_mb: dict[str, list[float]] = {"origin": [], "sidecar": []}
    joined = []
    for run_index in range(profile.runs):
        logger.info("%s: run %d/%d", NAME, run_index + 1, profile.runs)
        for side in in_turn(run_index, ["origin", "sidecar"]):
            query = {"run": f"{side}-{run_index}"}
            before = sidecar.stats()
            seconds[side].append(together(routes[side], origin.url(source.name, HOST, **query)))
            seen = origin.count(source.name, **query)
            requests[side].append(seen)
            if side == "origin":
                # Every wget exited 0, so each of these requests sent the whole body.
                upstream_mb[side].append(seen * size / MB)
                continue
            counted = counted_since(sidecar, before, *COUNTERS)
            if counted["upstream_requests"] != seen or counted["misses"] != 1:
                raise WrongPath(f"the origin saw {seen} requests; the sidecar counted {counted}")
            if counted["hits"] + counted["coalesced"] != CLIENTS - 1:
                raise WrongPath(f"{CLIENTS - 1} clients should have joined or hit: {counted}")
            upstream_mb[side].append(counted["bytes_from_upstream"] / MB)
            joined.append(counted["coalesced"])

    direct = f"{CLIENTS} clients direct"
    result.rows += [
        Row(
            "requests the origin served",
            "requests",
            Sample.of(requests["sidecar"]),
            Sample.of(requests["origin"]),
            direct,
            within(1, 0, "= 1"),
        ),
        Row(
            "bytes the origin sent",
            "MB",
            Sample.of(upstream_mb["sidecar"]),
            Sample.of(upstream_mb["origin"]),
            direct,
        ),
        Row(
            f"wall time until all {CLIENTS} have the file",
            "s",
            Sample.of(seconds["sidecar"]),
            Sample.of(seconds["origin"]),
            direct,
        ),
    ]
    low, high = min(joined), max(joined)
    result.notes.append(
        f"medians of {profile.runs} runs (min–max); wget to /dev/null, all {CLIENTS} "
        f"started at once; the sidecar's upstream requests and bytes from its /stats, "
        f"checked against the origin's request log; of the {CLIENTS - 1} later clients, "
        f"{low if low == high else f'{low}–{high}'} joined the fill in "
        "progress per run (any others hit the stored object); the sidecar with "
        "`--parallel-fetch 1` (one request per fill)"
    )
    return result
