"""A sidecar restarted on a buffer of many stored objects, as after a container restart
in the same pod: it is ready without touching each object, serves what it finds on the
first request, and still never serves a body that does not match its digest.

The buffer holds many small objects made through the store's own API (`bench.stored`),
committed before the objects the test asks for. While the first requests are served,
the main process (where the background check runs) is stopped, so they find their
objects unchecked, as a request that comes before the check does.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from bench import stored
from bench.harness import OriginServer, Sidecar, wait_until
from tests.sidecar.conftest import FILES, curl

pytestmark = pytest.mark.e2e

FILLERS = 12_000  # small stored objects before the ones asked for
FOUND_CORRUPT = "a stored body found at start does not match its digest"  # a worker's log


def corrupt(buffer_dir: Path, size: int) -> None:
    """Flip bytes in the middle of the one stored body of `size` bytes (same size)."""
    (body,) = (p for p in (buffer_dir / "objects").iterdir() if p.stat().st_size == size)
    data = bytearray(body.read_bytes())
    data[len(data) // 2] ^= 0xFF
    body.write_bytes(bytes(data))


def charged(size: int, block: int = 4096) -> int:
    return max(1, -(-size // block)) * block


def test_a_restart_on_many_objects_serves_them_at_once_and_never_a_corrupt_one(
    start_sidecar: Callable[..., Sidecar], origin: OriginServer, dataset: Path, tmp_path: Path
) -> None:
    pod = tmp_path / "pod"
    lines = stored.make(pod / "buffer", FILLERS)
    first = start_sidecar(directory=pod)
    urls = {name: origin.url(name, case="large-buffer") for name in FILES}
    for name, url in urls.items():
        assert curl(first, url).body == (dataset / name).read_bytes()
    first.wait_for_entries(FILLERS + len(FILES))
    first.stop(signal.SIGKILL)  # a crash: nothing is closed cleanly
    corrupt(pod / "buffer", FILES["small.bin"])  # hashed at once on its first request
    corrupt(pod / "buffer", FILES["medium.bin"])  # hashed in a thread first
    # Bodies no object refers to (a crash between writing and indexing one), deleted
    # once everything is checked.
    leftovers = [pod / "buffer" / "objects" / name for name in (uuid.uuid4().hex, "stray")]
    for leftover in leftovers:
        leftover.write_bytes(b"left over")

    again = start_sidecar(directory=pod)
    sizes = [int(line.split()[1]) for line in lines] + list(FILES.values())
    total = sum(charged(size) for size in sizes)  # whole blocks: see `Store.charge`
    stats = again.stats()  # counted from the index at once, checked or not
    assert (stats["entries"], stats["buffer_bytes"]) == (FILLERS + len(FILES), total), stats
    # Hold the main process (and its background check) still: workers serve hits alone.
    os.kill(again.pid, signal.SIGSTOP)
    try:
        assert curl(again, urls["big.bin"]).body == (dataset / "big.bin").read_bytes()
        # A corrupt object is found out by the worker, which then needs the keeper for
        # the fill that replaces it: these wait for the main process.
        misses = [
            concurrent.futures.ThreadPoolExecutor().submit(curl, again, urls[name])
            for name in ("small.bin", "medium.bin")
        ]
        wait_until(lambda: again.log().count(FOUND_CORRUPT) == 2, "workers to find them out")
    finally:
        os.kill(again.pid, signal.SIGCONT)
    for name, miss in zip(("small.bin", "medium.bin"), misses, strict=True):
        assert miss.result(timeout=60).body == (dataset / name).read_bytes()
    stats = again.stats()
    assert stats["hits"] == 1, stats  # big.bin, on its first request
    assert origin.full_fetches("big.bin", case="large-buffer") == 1
    assert origin.full_fetches("small.bin", case="large-buffer") == 2
    assert origin.full_fetches("medium.bin", case="large-buffer") == 2

    wait_until(lambda: again.stats()["unverified_entries"] == 0, "the background check")
    stats = again.stats()  # the corrupt bodies were replaced by their new fills
    assert (stats["entries"], stats["buffer_bytes"]) == (FILLERS + len(FILES), total), stats
    wait_until(lambda: not any(p.exists() for p in leftovers), "leftover bodies deleted")
    assert len(list((pod / "buffer" / "objects").iterdir())) == FILLERS + len(FILES)
    for name, url in urls.items():
        assert curl(again, url).body == (dataset / name).read_bytes()
    assert again.stats()["hits"] == 1 + len(FILES)
