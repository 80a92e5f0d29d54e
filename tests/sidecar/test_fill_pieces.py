"""A fill's readers in its own worker: the latest pieces the pump wrote come from memory
(`Fill.wrote`, RECENT bytes of them), older bytes from the file, and either way exactly
the bytes of the body, whatever the pieces and the range."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.buffer.fill import RECENT, Fill
from sidecar.buffer.segments import pwrite_all


async def _follow(path: Path, body: bytes, cuts: list[int], start: int, end: int) -> bytes:
    """Write `body` in the pieces `cuts` make, as the pump does, while a reader takes
    [start, end); what it got."""
    fill = Fill("k", "https://example.test/k", 0)
    fill._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    fill._last = len(body)
    got: list[bytes] = []

    async def reader() -> None:
        async for chunk in fill.read(start, end):
            got.append(chunk)

    reading = asyncio.create_task(reader())
    try:
        edges = [0, *sorted(set(cuts)), len(body)]
        for position, stop in zip(edges, edges[1:], strict=False):
            piece = body[position:stop]
            pwrite_all(fill._fd, piece, position)
            fill.wrote(position, piece)
            fill._advance_to(stop)
            await asyncio.sleep(0)  # the reader may keep up, or fall behind
        await asyncio.wait_for(reading, 10)
    finally:
        os.close(fill._fd)
    return b"".join(got)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_reader_gets_exactly_its_range_from_pieces_in_memory_and_the_file(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    size = data.draw(st.integers(1, 3 * RECENT))
    body = os.urandom(size)
    cuts = data.draw(st.lists(st.integers(1, size), max_size=40))
    start = data.draw(st.integers(0, size - 1))
    end = data.draw(st.integers(start + 1, size))
    path = tmp_path_factory.mktemp("fill") / "body"
    assert asyncio.run(_follow(path, body, cuts, start, end)) == body[start:end]


def test_only_the_latest_recent_bytes_stay_in_memory_and_always_the_last_piece() -> None:
    async def main() -> tuple[list[int], list[int]]:
        fill = Fill("k", "https://example.test/k", 0)
        piece = b"x" * (RECENT // 4)
        for i in range(10):
            fill.wrote(i * len(piece), piece)
        kept = [position for position, _ in fill._recent]
        fill.wrote(10 * len(piece), b"y" * (2 * RECENT))  # larger than RECENT alone
        return kept, [position for position, _ in fill._recent]

    kept, then = asyncio.run(main())
    assert kept == [i * (RECENT // 4) for i in range(6, 10)]
    assert then == [10 * (RECENT // 4)]
