"""Stage-in: prefetch a job's dataset into the buffer as soon as the sidecar starts.

The defining feature of an HPC burst buffer: the job names its inputs, and they are
copied to fast storage before (or while) the job reads them. `--stage-in` takes URLs,
brace ranges (`shard-{000..099}.tar`, `{train,val}.bin`) and manifests (`@URL`: a text
file listing one URL per line, `#` comments allowed). Objects are fetched with bounded
parallelism as ordinary fills, so a client asking for an object being staged simply
joins that fill, and a staged object that is already stored costs nothing.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.buffer.fill import Declined, FillFailed, Fills, StoredMeanwhile
from sidecar.buffer.keeper import Buffer
from sidecar.buffer.store import StoreError
from sidecar.cache import policy
from sidecar.origins.upstream import Upstream, loggable_url
from sidecar.settings import host_matches
from sidecar.wire.client import UpstreamError

logger = logging.getLogger(__name__)

# A staged run larger than this is refused: a typo in a brace range must not queue
# millions of requests.
MAX_OBJECTS = 100_000
# Progress is logged this often while staging.
PROGRESS_INTERVAL = 10.0  # seconds
# Largest manifest read (bytes).
MAX_MANIFEST = 16 * 1024 * 1024

_NUMERIC_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_ALTERNATIVES = re.compile(r"\{([^{}]*,[^{}]*)\}")
_USER_AGENT = ("User-Agent", "burstbuffer-stage-in")


class StageInError(ValueError):
    """A stage-in specification cannot be expanded."""


def expand(pattern: str) -> list[str]:
    """Expand brace ranges and alternatives, shell style, left to right.

    `shard-{000..002}.tar` -> shard-000.tar, shard-001.tar, shard-002.tar (the width of
    the first bound is kept); `{train,val}.bin` -> train.bin, val.bin.
    """
    numeric = _NUMERIC_RANGE.search(pattern)
    alternatives = _ALTERNATIVES.search(pattern)
    match = min(
        (m for m in (numeric, alternatives) if m is not None),
        key=lambda m: m.start(),
        default=None,
    )
    if match is None:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    if match is numeric:
        first, last = match.group(1), match.group(2)
        low, high = int(first), int(last)
        step = 1 if high >= low else -1
        if abs(high - low) >= MAX_OBJECTS:
            raise StageInError(f"brace range {match.group(0)} expands to too many objects")
        width = len(first) if first.startswith("0") else 0
        items = [str(n).zfill(width) for n in range(low, high + step, step)]
    else:
        items = match.group(1).split(",")
    expanded: list[str] = []
    for item in items:
        expanded += expand(head + item + tail)
        if len(expanded) > MAX_OBJECTS:
            raise StageInError(f"{pattern!r} expands to more than {MAX_OBJECTS} objects")
    return expanded


def parse_manifest(text: str) -> list[str]:
    """URLs of a manifest: one per line; blank lines and `#` comments ignored."""
    urls = []
    for line in text.splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry:
            urls.append(entry)
    return urls


@dataclass
class StageInCounts:
    """How far the stage-in has come: objects listed, stored, failed, already there."""

    objects: int = 0
    done: int = 0
    failed: int = 0
    skipped: int = 0
    bytes: int = 0

    def gauges(self) -> dict[str, int]:
        return {
            "stage_in_objects": self.objects,
            "stage_in_done": self.done,
            "stage_in_failed": self.failed,
            "stage_in_bytes": self.bytes,
        }


class StageIn:
    """Runs one stage-in list to completion in the background."""

    def __init__(
        self,
        specs: Sequence[str],
        intercept: Sequence[str],
        parallel: int,
        buffer: Buffer,
        fills: Fills,
        upstream: Upstream,
    ) -> None:
        self.specs = specs
        self.intercept = intercept
        self.parallel = parallel
        self.buffer = buffer
        self.fills = fills
        self.upstream = upstream
        self.progress = StageInCounts()

    async def run(self) -> None:
        started = time.monotonic()
        urls = await self._urls()
        self.progress.objects = len(urls)
        logger.info("stage-in: %d objects, %d at a time", len(urls), self.parallel)
        queue: asyncio.Queue[str] = asyncio.Queue()
        for url in urls:
            queue.put_nowait(url)
        reporter = asyncio.create_task(self._report(started))
        try:
            await asyncio.gather(*(self._worker(queue) for _ in range(self.parallel)))
        finally:
            reporter.cancel()
        self._log(started, final=True)

    async def _urls(self) -> list[str]:
        urls: list[str] = []
        for spec in self.specs:
            if spec.startswith("@"):
                manifest = await self._fetch_manifest(spec[1:])
                for line in manifest:
                    urls += expand(line)
            else:
                urls += expand(spec)
        unique = list(dict.fromkeys(urls))
        if len(unique) > MAX_OBJECTS:
            raise StageInError(f"stage-in lists more than {MAX_OBJECTS} objects")
        return unique

    async def _fetch_manifest(self, url: str) -> list[str]:
        try:
            response = await self.upstream.get(url, [_USER_AGENT])
            try:
                if response.status != 200:
                    raise StageInError(f"manifest {loggable_url(url)}: HTTP {response.status}")
                body = await response.read(MAX_MANIFEST + 1)
            finally:
                response.release()
        except UpstreamError as e:
            raise StageInError(f"manifest {loggable_url(url)}: {e}") from e
        if len(body) > MAX_MANIFEST:
            raise StageInError(f"manifest {loggable_url(url)} is larger than {MAX_MANIFEST} bytes")
        return parse_manifest(body.decode("utf-8", errors="replace"))

    async def _worker(self, queue: asyncio.Queue[str]) -> None:
        while not queue.empty():
            url = queue.get_nowait()
            try:
                outcome, size = await self._stage(url)
            except (UpstreamError, FillFailed, Declined, StoreError, ValueError) as e:
                outcome, size = "failed", 0
                logger.warning("stage-in: %s failed: %s", loggable_url(url), e)
            if outcome == "done":
                self.progress.done += 1
                self.progress.bytes += size
            elif outcome == "failed":
                self.progress.failed += 1
            else:
                self.progress.skipped += 1

    async def _stage(self, url: str) -> tuple[str, int]:
        host = url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
        if not host_matches(host, self.intercept):
            logger.warning("stage-in: %s is not an intercepted host; skipped", loggable_url(url))
            return "skipped", 0
        key = policy.cache_key(url)
        if (entry := self.buffer.lookup(key)) is not None:
            return "done", entry.size
        try:
            acquired = await self.fills.acquire(key, url, [_USER_AGENT])
        except StoredMeanwhile:
            return "done", entry.size if (entry := self.buffer.lookup(key)) else 0
        if acquired.fill is None:
            assert acquired.response is not None
            try:
                size = await acquired.unsized.drain(acquired.response) if acquired.unsized else None
            finally:
                acquired.release()
            if size is not None:
                return "done", size
            logger.warning(
                "stage-in: %s not stored (%s)",
                loggable_url(url),
                acquired.reason or (acquired.unsized and acquired.unsized.abandoned),
            )
            return "failed", 0
        try:
            return "done", await acquired.fill.outcome()
        finally:
            acquired.fill.detach()

    async def _report(self, started: float) -> None:
        while True:
            await asyncio.sleep(PROGRESS_INTERVAL)
            self._log(started, final=False)

    def _log(self, started: float, final: bool) -> None:
        p = self.progress
        elapsed = max(time.monotonic() - started, 1e-6)
        finished = p.done + p.failed + p.skipped
        rate = p.bytes / elapsed
        eta = ""
        if not final and p.done:
            remaining = (p.objects - finished) * (p.bytes / p.done)
            eta = f", ETA {remaining / max(rate, 1):.0f} s"
        logger.info(
            "stage-in%s: %d/%d objects (%d failed, %d skipped), %.1f MB, %.1f MB/s%s",
            " done" if final else "",
            finished,
            p.objects,
            p.failed,
            p.skipped,
            p.bytes / 1e6,
            rate / 1e6,
            eta,
        )
