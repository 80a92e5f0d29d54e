"""Buffers of many stored objects, made through `sidecar.buffer.store`'s own API.

A restarted sidecar finds what an earlier one committed; making that through real
fills would time the fills, not the restart. So the objects (random bodies of 1–4 KiB,
as a small-image dataset's) are reserved, written and committed through `store.Store`
exactly as the keeper would, and the sidecar is then started on the directory.

Large buffers take minutes to make, so they are made once and kept outside the
checkout, in the cache folder (`home()`), one per object count and per format of the
store's index (FORMAT), with a manifest of every object's URL, size and SHA-256 for
`bench.loader_client`. A run of the sidecar on such a buffer
only serves hits from it: what it finds is what the next run finds.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import shutil
from pathlib import Path

from bench.cachedir import cache_dir
from sidecar.buffer import store as store_module
from sidecar.buffer.store import Store
from sidecar.cache import policy
from sidecar.core import native

logger = logging.getLogger(__name__)

SMALLEST, LARGEST = 1024, 4096  # bytes per body
HOST = "datasets.bench.test"  # port 443: the key the sidecar computes for the URL
LAST_MODIFIED = "Mon, 01 Jan 2024 00:00:00 GMT"
GENERATED_AT = 1_704_067_200.0  # the same instant
LOG_EVERY = 100_000


def url(index: int) -> str:
    return f"https://{HOST}/files/img-{index:07d}.jpg"


# The store's index format the buffers are made in: a buffer of another is made anew.
FORMAT = f"index-format-{store_module.FORMAT}"


def home() -> Path:
    """Where the buffers of this FORMAT are kept, one folder per object count."""
    return cache_dir("stored", FORMAT)


def buffer(count: int) -> tuple[Path, Path]:
    """The buffer directory holding `count` objects and its manifest, made if missing."""
    kept = home() / str(count)
    directory, manifest = kept / "buffer", kept / "manifest.txt"
    if manifest.is_file():
        return directory, manifest
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir()
    logger.info("making a buffer of %d stored objects in %s", count, directory)
    lines = make(directory, count)
    partial = manifest.with_suffix(".partial")
    partial.write_text("".join(lines))
    partial.rename(manifest)  # last: a buffer with a manifest is complete
    return directory, manifest


def evict(directory: Path) -> None:
    """Drop the index of the buffer at `directory` from the page cache, as on a node
    whose memory went to other pods since the buffer was written (a Disk or pmem buffer;
    tmpfs pages cannot be dropped). Only those files: dropping every cache of the
    machine would also time the interpreter's imports, and disturb whatever else runs."""
    os.sync()
    for path in (directory / "index").iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def make(directory: Path, count: int) -> list[str]:
    """Commit `count` objects into a new buffer at `directory`; their manifest lines."""
    chance = random.Random(count)
    store = Store(directory, count * LARGEST * 2, "none")
    store.open()
    lines = []
    try:
        for index in range(count):
            body = os.urandom(chance.randint(SMALLEST, LARGEST))
            sha256 = hashlib.sha256(body).hexdigest()  # the client's own check
            digest = native.Digest()
            digest.update(body)
            reservation = store.reserve(len(body))
            assert reservation is not None, "the buffer is sized to hold every object"
            Path(reservation.path).write_bytes(body)
            headers = (
                ("Content-Type", "image/jpeg"),
                ("ETag", f'"{sha256[:16]}"'),
                ("Last-Modified", LAST_MODIFIED),
            )
            key = policy.cache_key(url(index))
            store.commit(reservation, key, digest.hexdigest(), headers, GENERATED_AT, 0.0)
            lines.append(f"{url(index)} {len(body)} {sha256}\n")
            if (index + 1) % LOG_EVERY == 0:
                logger.info("  %d objects stored", index + 1)
    finally:
        store.close()
    return lines
