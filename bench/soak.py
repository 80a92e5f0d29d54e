"""A soak: a mixed, realistic load through one sidecar for a bounded time, and what it
leaves behind. The soak test runs it briefly (`tests/sidecar/test_soak.py`), the soak
benchmark for minutes (`bench/bench_soak.py`).

Every client is a coroutine with a kept-alive session and, for the data loaders that
open a connection per file, a session that closes each connection after its response.
Each request is one of `KINDS`, drawn by weight:

- hit, range, head: a stored object (Range readers, HEADs) on the kept-alive session;
- new-connection: a stored object on a fresh connection, closed after the response;
- miss: an object never asked for before (a fill);
- dropped: a new object whose origin drops the connection mid-body (the fill resumes);
- abort: a client that reads the first 64 KiB of a large stored object and hangs up;
- tunnel: a host that is not intercepted (tunnelled untouched).

A completed download must be byte-identical; a success with a short body is a
failure, and so is any error but the aborts the clients make on purpose.
"""

from __future__ import annotations

import asyncio
import random
import ssl
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench import memory
from bench.harness import OriginServer, Sidecar, process_tree
from bench.procs import open_fds

KINDS = {
    "hit": 6,
    "range": 2,
    "head": 1,
    "new-connection": 2,
    "miss": 1,
    "dropped": 1,
    "abort": 1,
    "tunnel": 1,
}
# The files the origin must serve: the aborted downloads are of LARGE, larger than what
# socket buffers hold, so that the sidecar sees its client hang up.
SMALL, MEDIUM, LARGE = "small.bin", "medium.bin", "big.bin"
ABORT_AFTER = 64 * 1024  # bytes an aborting client reads
DROP_AFTER = 1024 * 1024  # body bytes after which the origin drops a dropped fill
REQUEST_TIMEOUT = 60.0  # seconds for one request
SAMPLE_INTERVAL = 0.5  # seconds between samples of the sidecar's memory and descriptors


@dataclass(frozen=True)
class Footprint:
    """What the sidecar's processes hold: descriptors, threads, the largest RSS.

    The RSS leaves shared memory out: the pages of the shared memory file (its tables
    of claims, clients and answers, bounded by the file's size and held once for all
    processes) count in a process's RSS as it first touches them, which is no leak."""

    fds: int
    threads: int
    rss: int  # bytes, of its largest process, shared memory aside

    @classmethod
    def of(cls, pid: int) -> Footprint:
        members = process_tree(pid)
        return cls(
            fds=open_fds(pid),
            threads=sum(len(list(Path(f"/proc/{m}/task").iterdir())) for m in members),
            rss=max(
                (memory.status_kb(m, "VmRSS") - memory.status_kb(m, "RssShmem")) * 1024
                for m in members
            ),
        )


@dataclass
class Figures:
    """One soak's outcome."""

    seconds: float
    tally: Counter[str]  # "ok", each kind, "bytes", and failures by description
    peak: Footprint

    @property
    def requests(self) -> int:
        return self.tally["ok"]

    @property
    def failures(self) -> dict[str, int]:
        return {k: v for k, v in self.tally.items() if k.startswith(("failed", "wrong"))}

    def summary(self) -> str:
        kinds = ", ".join(f"{kind} {self.tally[kind]}" for kind in KINDS)
        return (
            f"{self.requests} requests in {self.seconds:.0f} s "
            f"({self.requests / self.seconds:.0f}/s; {kinds}), "
            f"{self.tally['bytes'] / 1e6:.0f} MB verified, "
            f"{sum(self.failures.values())} failures, peak RSS {self.peak.rss / 2**20:.0f} MiB "
            f"(largest process), peak descriptors {self.peak.fds}"
        )


def soak(
    sidecar: Sidecar,
    origin: OriginServer,
    files: Mapping[str, bytes],
    seconds: float,
    clients: int,
    label: str = "soak",
    hosts: tuple[str, str] = ("origin.test", "tunnel.test"),
) -> Figures:
    """Run the load for `seconds`; `files`: the bodies of SMALL, MEDIUM and LARGE; `label`
    keeps the objects a soak misses apart from those of another soak; `hosts`: the
    origin's intercepted name and a name of it that is not intercepted."""
    pid = sidecar.pid
    tally: Counter[str] = Counter()
    peak = Footprint.of(pid)

    async def run() -> None:
        nonlocal peak
        deadline = time.monotonic() + seconds
        tasks = [
            asyncio.create_task(_client(n, deadline, sidecar, origin, files, label, hosts, tally))
            for n in range(clients)
        ]
        while not all(task.done() for task in tasks):
            now = Footprint.of(pid)
            peak = Footprint(
                max(peak.fds, now.fds), max(peak.threads, now.threads), max(peak.rss, now.rss)
            )
            await asyncio.sleep(SAMPLE_INTERVAL)
        await asyncio.gather(*tasks)

    started = time.monotonic()
    asyncio.run(run())
    return Figures(time.monotonic() - started, tally, peak)


async def _client(
    number: int,
    deadline: float,
    sidecar: Sidecar,
    origin: OriginServer,
    files: Mapping[str, bytes],
    label: str,
    hosts: tuple[str, str],
    tally: Counter[str],
) -> None:
    intercepted, elsewhere = hosts
    rng = random.Random(f"{label}-{number}")
    pod_trust = ssl.create_default_context(cafile=str(sidecar.bundle))
    origin_trust = ssl.create_default_context(cafile=str(origin.ca_pem))
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    kept = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
    one_shot = aiohttp.ClientSession(
        timeout=timeout,
        auto_decompress=False,
        connector=aiohttp.TCPConnector(force_close=True),
    )
    async with kept, one_shot:
        sequence = 0
        while time.monotonic() < deadline:
            sequence += 1
            kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
            name, query = SMALL, {"case": f"{label}-hot"}
            session, trust, host = kept, pod_trust, intercepted
            method, headers = "GET", {}
            expected = files[SMALL]
            if kind in ("range", "dropped"):
                name, expected = MEDIUM, files[MEDIUM]
            elif kind == "abort":
                name, expected = LARGE, files[LARGE][:ABORT_AFTER]
            if kind == "range":
                start = rng.randrange(len(expected) - 1)
                end = min(start + rng.randrange(1, 512 * 1024), len(expected) - 1)
                headers = {"Range": f"bytes={start}-{end}"}
                expected = expected[start : end + 1]
            elif kind == "head":
                method = "HEAD"
            elif kind == "new-connection":
                session = one_shot
            elif kind == "miss":
                query = {"case": f"{label}-{number}-{sequence}"}
            elif kind == "dropped":
                query = {"case": f"{label}-{number}-{sequence}", "drop": str(DROP_AFTER)}
            elif kind == "tunnel":
                host, trust = elsewhere, origin_trust
            url = origin.url(name, host=host, **query)
            try:
                async with session.request(
                    method, url, proxy=sidecar.proxy, ssl=trust, headers=headers
                ) as response:
                    if kind == "abort":
                        body = await response.content.readexactly(ABORT_AFTER)
                        response.close()  # hangs up mid-body
                    else:
                        body = await response.read()
                    _check(kind, response, body, expected, len(files[name]), tally)
            except (aiohttp.ClientError, asyncio.IncompleteReadError, TimeoutError, OSError) as e:
                tally[f"failed {kind}: {type(e).__name__}"] += 1


def _check(
    kind: str,
    response: aiohttp.ClientResponse,
    body: bytes,
    expected: bytes,
    size: int,
    tally: Counter[str],
) -> None:
    if response.status not in (200, 206):
        tally[f"failed {kind}: status {response.status}"] += 1
    elif kind == "head" and (body or response.headers.get("Content-Length") != str(size)):
        tally["wrong head"] += 1
    elif kind != "head" and body != expected:
        tally[f"wrong bytes {kind}"] += 1
    else:
        tally["ok"] += 1
        tally[kind] += 1
        tally["bytes"] += len(body)
