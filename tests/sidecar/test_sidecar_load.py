"""Load: many concurrent clients mixing hits, misses, ranges and tunnels, for a bounded time.

Bounded in time (BURSTBUFFER_LOAD_SECONDS, default 60) and in concurrency; loopback
only. It asserts zero failed requests, zero wrong bytes, bounded memory and no file
descriptor leak, and prints the figures.
"""

from __future__ import annotations

import asyncio
import os
import random
import ssl
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from bench.harness import OriginServer, Sidecar, process_tree, wait_until
from tests.sidecar.procs import open_fds, settled

pytestmark = pytest.mark.e2e

CLIENTS = 200
SECONDS = float(os.environ.get("BURSTBUFFER_LOAD_SECONDS", "60"))
RSS_LIMIT = 150 * 1024 * 1024  # bytes, for each of the sidecar's processes


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise KeyError("VmRSS")


async def _client(
    number: int,
    deadline: float,
    sidecar: Sidecar,
    origin: OriginServer,
    files: dict[str, bytes],
    tally: Counter[str],
) -> None:
    rng = random.Random(number)
    pod_trust = ssl.create_default_context(cafile=str(sidecar.bundle))
    origin_trust = ssl.create_default_context(cafile=str(origin.ca_pem))
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
        sequence = 0
        while time.monotonic() < deadline:
            sequence += 1
            kind = rng.choices(["hit", "miss", "range", "tunnel"], weights=[6, 1, 2, 1])[0]
            name, context, headers = "small.bin", pod_trust, {}
            expected = files["small.bin"]
            if kind == "hit":
                url = origin.url("small.bin", case="load-hot")
            elif kind == "miss":
                url = origin.url("small.bin", case=f"load-{number}-{sequence}")
            elif kind == "range":
                name = "medium.bin"
                url = origin.url(name, case="load-hot")
                start = rng.randrange(len(files[name]) - 1)
                end = min(start + rng.randrange(1, 512 * 1024), len(files[name]) - 1)
                headers = {"Range": f"bytes={start}-{end}"}
                expected = files[name][start : end + 1]
            else:
                url = origin.url("small.bin", host="tunnel.test", case="load")
                context = origin_trust
            try:
                async with session.get(
                    url, proxy=sidecar.proxy, ssl=context, headers=headers
                ) as response:
                    body = await response.read()
                    if response.status not in (200, 206):
                        tally[f"failed {kind}: status {response.status}"] += 1
                    elif body != expected:
                        tally[f"wrong bytes {kind}"] += 1
                    else:
                        tally["ok"] += 1
                        tally[kind] += 1
                        tally["bytes"] += len(body)
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                tally[f"failed {kind}: {type(e).__name__}"] += 1


def test_two_hundred_clients_for_a_minute(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path
) -> None:
    sidecar = start_sidecar("--buffer-size", "128MiB", "--eviction", "lru")
    assert sidecar.process is not None
    pid = sidecar.process.popen.pid
    files = {name: (dataset / name).read_bytes() for name in ("small.bin", "medium.bin")}
    fds_before = open_fds(pid)
    tally: Counter[str] = Counter()
    peak_rss = 0

    async def run() -> None:
        nonlocal peak_rss
        deadline = time.monotonic() + SECONDS
        clients = [
            asyncio.create_task(_client(n, deadline, sidecar, origin, files, tally))
            for n in range(CLIENTS)
        ]
        while not all(task.done() for task in clients):
            peak_rss = max(peak_rss, *(_rss(member) for member in process_tree(pid)))
            await asyncio.sleep(0.5)
        await asyncio.gather(*clients)

    started = time.monotonic()
    asyncio.run(run())
    elapsed = time.monotonic() - started
    failures = {k: v for k, v in tally.items() if k.startswith(("failed", "wrong"))}
    stats = sidecar.stats()
    # Every connection the clients closed is closed by the sidecar too, at once.
    wait_until(
        lambda: settled(pid, sidecar.proxy_port, origin.port, fds_before),
        "client connections closed, descriptors as before",
        timeout=2,
    )
    print(
        f"\nload: {CLIENTS} clients, {elapsed:.0f} s, {tally['ok']} requests "
        f"({tally['ok'] / elapsed:.0f}/s; hits {tally['hit']}, misses {tally['miss']}, "
        f"ranges {tally['range']}, tunnels {tally['tunnel']}), {tally['bytes'] / 1e6:.0f} MB "
        f"verified, failures {sum(failures.values())}, peak RSS {peak_rss / 2**20:.0f} MiB, "
        f"fds {fds_before} -> {open_fds(pid)}, sidecar hits {stats['hits']} "
        f"misses {stats['misses']} coalesced {stats['coalesced']}"
    )
    assert not failures, failures
    assert tally["ok"] > CLIENTS
    assert peak_rss < RSS_LIMIT
