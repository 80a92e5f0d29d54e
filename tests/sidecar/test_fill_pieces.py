"""A fill's readers in its own worker: ranges of a body's file, handed over as the pump
writes them, or a small body handed over whole in memory; either way exactly the bytes
of the body, whatever the pieces and the range."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.buffer.fill import Fill, Piece
from sidecar.buffer.segments import pwrite_all


def _contents(piece: Piece) -> bytes:
    """The bytes a reader was handed: kept in memory, or read from the file's range
    (whose descriptor the reader closes)."""
    if isinstance(piece, bytes):
        return piece
    try:
        return os.pread(piece.fd, piece.end - piece.start, piece.start)
    finally:
        os.close(piece.fd)


async def _follow(path: Path, body: bytes, cuts: list[int], start: int, end: int) -> bytes:
    """Write `body` in the pieces `cuts` make, as the pump does, while a reader takes
    [start, end); what it got."""
    fill = Fill("k", "https://example.test/k", 0)
    fill._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    fill._last = len(body)
    got: list[bytes] = []

    async def reader() -> None:
        async for piece in fill.read(start, end):
            got.append(_contents(piece))

    reading = asyncio.create_task(reader())
    try:
        edges = [0, *sorted(set(cuts)), len(body)]
        for position, stop in zip(edges, edges[1:], strict=False):
            piece = body[position:stop]
            pwrite_all(fill._fd, piece, position)
            fill._advance_to(stop)
            await asyncio.sleep(0)  # the reader may keep up, or fall behind
        await asyncio.wait_for(reading, 10)
    finally:
        os.close(fill._fd)
    return b"".join(got)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_reader_gets_exactly_its_range_from_pieces_in_the_file(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    size = data.draw(st.integers(1, 3 * 1024 * 1024))
    body = os.urandom(size)
    cuts = data.draw(st.lists(st.integers(1, size), max_size=40))
    start = data.draw(st.integers(0, size - 1))
    end = data.draw(st.integers(start + 1, size))
    path = tmp_path_factory.mktemp("fill") / "body"
    assert asyncio.run(_follow(path, body, cuts, start, end)) == body[start:end]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_body_handed_over_whole_gives_each_reader_exactly_its_range(
    data: st.DataObject,
) -> None:
    body = os.urandom(data.draw(st.integers(1, 256 * 1024)))
    start = data.draw(st.integers(0, len(body) - 1))
    end = data.draw(st.integers(start + 1, len(body)))

    async def main() -> tuple[list[bytes], list[bytes]]:
        fill = Fill("k", "https://example.test/k", 0)

        async def read(start: int, end: int) -> list[bytes]:
            return [_contents(piece) async for piece in fill.read(start, end)]

        # Readers that came before the body was whole wait for it.
        waiting = asyncio.gather(read(start, end), read(0, len(body)))
        await asyncio.sleep(0)
        fill.hand_over(body)
        return await asyncio.wait_for(waiting, 10)

    part, whole = asyncio.run(main())
    assert b"".join(part) == body[start:end]
    assert len(whole) == 1 and whole[0] is body  # all of it, without a copy
