"""Xet storage for the Hub-like origin (`bench.hub`): files cut into chunks, chunks
packed into xorbs, and the reconstruction of a file (or a byte range of it) as terms.

The formats are those of the Xet protocol as `hf_xet` reads them (xet-core:
`xorb_object/xorb_chunk_format.rs`, `cas_types`), written here from the spec:

- a *chunk* on the wire is an 8-byte header, then its bytes: `version` (0), the
  compressed length (3 bytes, little-endian), the compression scheme (0 none, 1 LZ4
  frame), the uncompressed length (3 bytes, little-endian);
- a *xorb* is a run of serialized chunks (at most `MAX_XORB_CHUNKS` and
  `xorb_size` bytes, 64 MiB on the Hub), addressed by its hash; a client reads byte
  ranges of it that hold whole chunks. The footer a stored xorb ends with (its chunk
  table and hashes) is not written: downloads never read it;
- a chunk's hash is BLAKE3 keyed with the spec's data key, so identical chunks have one
  hash whichever file they come from, and a chunk already stored is referenced, never
  stored again: files that share content share xorbs. The xorb and file hashes are
  internal nodes over their chunks' hashes (the spec's `"<hash> : <size>\n"` lines,
  keyed with its internal-node key; a file's keyed again with the zero salt) in one
  level, not the spec's aggregated tree:
  `hf_xet` uses them as names and verifies none of them on download.

Chunks are cut at fixed offsets (`chunk_size`, 64 KiB like the spec's target) rather
than by the spec's content-defined gear hash: a per-byte rolling hash in Python costs
seconds per file, and files that share a prefix still share every whole chunk of it.
A chunk is LZ4-compressed when that makes it smaller (as xet-core does), and only tried
when zlib finds its first 4 KiB compressible at all: random bytes are sent uncompressed.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import blake3

CHUNK_SIZE = 64 * 1024  # bytes: the spec's target chunk size
MAX_CHUNK_SIZE = 128 * 1024  # bytes: the most a chunk header may announce here
XORB_SIZE = 64 * 1024 * 1024  # bytes: the most one xorb holds (the Hub's limit)
MAX_XORB_CHUNKS = 8 * 1024  # chunks: the most one xorb holds (the spec's limit)
HEADER_LENGTH = 8
SCHEME_NONE, SCHEME_LZ4 = 0, 1

# The spec's BLAKE3 keys (xet-core `merklehash/data_hash.rs`): leaves and inner nodes.
DATA_KEY = bytes(
    [102, 151, 245, 119, 91, 149, 80, 222, 49, 53, 203, 172, 165, 151, 24, 28,
     157, 228, 33, 16, 155, 235, 43, 88, 180, 208, 176, 75, 147, 173, 242, 41]
)  # fmt: skip
INTERNAL_NODE_KEY = bytes(
    [1, 126, 197, 199, 165, 71, 41, 150, 253, 148, 102, 102, 180, 138, 2, 230,
     93, 221, 83, 111, 55, 199, 109, 210, 248, 99, 82, 230, 74, 83, 113, 63]
)  # fmt: skip


def chunk_hash(data: bytes) -> str:
    return blake3.blake3(data, key=DATA_KEY).hexdigest()


def node_hash(children: list[tuple[str, int]]) -> str:
    lines = "".join(f"{h} : {size}\n" for h, size in children)
    return blake3.blake3(lines.encode(), key=INTERNAL_NODE_KEY).hexdigest()


def file_hash(chunks: list[tuple[str, int]]) -> str:
    """A file's hash: its chunks' node, keyed again with the spec's zero salt, so that a
    file of one xorb is not named as that xorb is."""
    return blake3.blake3(bytes.fromhex(node_hash(chunks)), key=bytes(32)).hexdigest()


# -- LZ4 frames (the `lz4_flex::frame` format xet-core decodes) --------------------------

_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def xxh32_short(data: bytes, seed: int = 0) -> int:
    """xxHash32 of fewer than 16 bytes (all an LZ4 frame descriptor needs)."""
    assert len(data) < 16
    h = (seed + _P5 + len(data)) & _M32
    i = 0
    while i + 4 <= len(data):
        lane = int.from_bytes(data[i : i + 4], "little")
        h = (_rotl((h + lane * _P3) & _M32, 17) * _P4) & _M32
        i += 4
    for byte in data[i:]:
        h = (_rotl((h + byte * _P5) & _M32, 11) * _P1) & _M32
    h ^= h >> 15
    h = (h * _P2) & _M32
    h ^= h >> 13
    h = (h * _P3) & _M32
    return h ^ (h >> 16)


def _length_bytes(n: int) -> bytes:
    """The extra length bytes of an LZ4 sequence for a field of `n` (15 or more)."""
    n -= 15
    return b"\xff" * (n // 255) + bytes([n % 255])


def lz4_block(data: bytes) -> bytes:
    """An LZ4 block of `data`: greedy matches of 4 bytes or more, found by a table of
    the last position of each 4-byte string. The format's end rules: the last 5 bytes
    are literals, and no match starts in the last 12."""
    n = len(data)
    out = bytearray()
    table: dict[bytes, int] = {}
    anchor = i = 0

    def sequence(literals: bytes, offset: int = 0, match: int = 0) -> None:
        lit, ml = len(literals), match - 4
        token = (min(lit, 15) << 4) | (min(ml, 15) if match else 0)
        out.append(token)
        if lit >= 15:
            out.extend(_length_bytes(lit))
        out.extend(literals)
        if match:
            out.extend(offset.to_bytes(2, "little"))
            if ml >= 15:
                out.extend(_length_bytes(ml))

    while i < n - 12:
        key = data[i : i + 4]
        candidate = table.get(key)
        table[key] = i
        if candidate is None or i - candidate > 0xFFFF:
            i += 1
            continue
        length, longest = 4, n - 5 - i
        while length < longest and data[candidate + length] == data[i + length]:
            length += 1
        sequence(data[anchor:i], i - candidate, length)
        i += length
        anchor = i
    sequence(data[anchor:])
    return bytes(out)


def lz4_frame(data: bytes) -> bytes:
    """One LZ4 frame: independent blocks of at most 256 KiB, no checksums."""
    flags, block_descriptor = 0x60, 0x50  # version 1, independent blocks; 256 KiB
    descriptor = bytes([flags, block_descriptor])
    out = bytearray(b"\x04\x22\x4d\x18" + descriptor)
    out.append((xxh32_short(descriptor) >> 8) & 0xFF)
    for start in range(0, len(data), 256 * 1024):
        raw = data[start : start + 256 * 1024]
        block = lz4_block(raw)
        if len(block) >= len(raw):  # stored: the high bit says uncompressed
            out += (len(raw) | 0x80000000).to_bytes(4, "little") + raw
        else:
            out += len(block).to_bytes(4, "little") + block
    out += b"\0\0\0\0"
    return bytes(out)


def serialize_chunk(data: bytes) -> bytes:
    """A chunk as it sits in a xorb: header, then its bytes, LZ4 where that is smaller."""
    assert len(data) <= MAX_CHUNK_SIZE
    scheme, body = SCHEME_NONE, data
    sample = data[:4096]  # a probe of the chunk's head: zlib on all of it costs more
    if len(zlib.compress(sample, 1)) < len(sample) * 0.9:
        compressed = lz4_frame(data)
        if len(compressed) < len(data):
            scheme, body = SCHEME_LZ4, compressed
    header = (
        bytes([0])
        + len(body).to_bytes(3, "little")
        + bytes([scheme])
        + len(data).to_bytes(3, "little")
    )
    return header + body


# -- the store: xorbs on disk, files as segments of them ------------------------------


@dataclass
class Xorb:
    hash: str
    path: Path
    # Per chunk: (uncompressed length, byte offset of its header in the xorb); the
    # xorb's length last, as the end offset of a chunk past the last.
    chunk_lengths: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=lambda: [0])

    @property
    def size(self) -> int:
        return self.offsets[-1]


@dataclass(frozen=True)
class Segment:
    """Chunks `start` to `end` (exclusive) of one xorb, in a file's order."""

    xorb: str
    start: int
    end: int
    length: int  # uncompressed bytes


@dataclass
class XetFile:
    hash: str
    size: int
    segments: list[Segment]


@dataclass(frozen=True)
class Term:
    xorb: str
    start: int  # chunk indices, end exclusive
    end: int
    length: int  # uncompressed bytes of those chunks


@dataclass(frozen=True)
class Reconstruction:
    """What the CAS answers for a file or a byte range of it."""

    offset_into_first_range: int
    terms: list[Term]
    # Per xorb, its merged chunk ranges with their byte ranges (end exclusive).
    fetches: dict[str, list[tuple[int, int, int, int]]]


class RangeNotSatisfiable(Exception):
    """The byte range asked for starts past the file's end."""


class Store:
    """Xorbs written under `directory` as files are added, and the files' segments."""

    def __init__(
        self, directory: Path, chunk_size: int = CHUNK_SIZE, xorb_size: int = XORB_SIZE
    ) -> None:
        assert 0 < chunk_size <= MAX_CHUNK_SIZE
        self.directory = directory
        self.chunk_size = chunk_size
        self.xorb_size = xorb_size
        self.xorbs: dict[str, Xorb] = {}
        self.files: dict[str, XetFile] = {}
        self._chunks: dict[str, tuple[str, int]] = {}  # chunk hash -> (xorb, index)
        directory.mkdir(parents=True, exist_ok=True)

    def add(self, path: Path) -> XetFile:
        """Cut `path` into chunks, store the new ones in new xorbs (closed at the file's
        end, as one upload's are), and return the file's reconstruction."""
        order: list[tuple[str, int]] = []  # (chunk hash, length), in the file's order
        pending: list[tuple[bytes, str]] = []  # new chunks of the xorb being filled
        pending_hashes: set[str] = set()
        pending_bytes = 0
        for data in _read_chunks(path, self.chunk_size):
            h = chunk_hash(data)
            order.append((h, len(data)))
            if h in self._chunks or h in pending_hashes:
                continue
            serialized = serialize_chunk(data)
            full = (
                len(pending) >= MAX_XORB_CHUNKS or pending_bytes + len(serialized) > self.xorb_size
            )
            if pending and full:
                self._write_xorb(pending)
                pending, pending_hashes, pending_bytes = [], set(), 0
            pending.append((serialized, h))
            pending_hashes.add(h)
            pending_bytes += len(serialized)
        if pending:
            self._write_xorb(pending)
        segments: list[Segment] = []
        for h, length in order:
            xorb, index = self._chunks[h]
            last = segments[-1] if segments else None
            if last is not None and last.xorb == xorb and last.end == index:
                segments[-1] = Segment(xorb, last.start, index + 1, last.length + length)
            else:
                segments.append(Segment(xorb, index, index + 1, length))
        size = sum(n for _, n in order)
        file = XetFile(file_hash(order), size, segments)
        self.files[file.hash] = file
        return file

    def _write_xorb(self, chunks: list[tuple[bytes, str]]) -> None:
        """Write one xorb of `chunks` (serialized, with their hashes)."""
        lengths = [int.from_bytes(c[5:8], "little") for c, _ in chunks]
        h = node_hash([(ch, n) for (_, ch), n in zip(chunks, lengths, strict=True)])
        xorb = Xorb(h, self.directory / h, lengths)
        with xorb.path.open("wb") as out:
            for serialized, _ in chunks:
                out.write(serialized)
                xorb.offsets.append(xorb.offsets[-1] + len(serialized))
        self.xorbs[h] = xorb
        for index, (_, ch) in enumerate(chunks):
            self._chunks[ch] = (h, index)

    def reconstruct(self, file_hash: str, first: int = 0, end: int | None = None) -> Reconstruction:
        """The terms covering bytes `first` to `end` (exclusive; the file's end when
        None) of a file, as xet-core's reference CAS computes them: whole chunks, the
        first term's offset into its first chunk, and per xorb the chunk ranges to
        fetch, merged where they touch."""
        file = self.files[file_hash]
        if file.size == 0 and first == 0:
            return Reconstruction(0, [], {})
        if first >= file.size:
            raise RangeNotSatisfiable(f"{first} >= {file.size}")
        end = file.size if end is None else min(end, file.size)
        terms: list[Term] = []
        position = 0  # file offset of the current segment's first chunk
        first_chunk_start = 0
        for segment in file.segments:
            if position >= end:
                break
            if position + segment.length <= first:
                position += segment.length
                continue
            lengths = self.xorbs[segment.xorb].chunk_lengths
            start, stop, length = segment.start, segment.end, segment.length
            while position + lengths[start] <= first:  # chunks before the range
                position += lengths[start]
                length -= lengths[start]
                start += 1
            if not terms:
                first_chunk_start = position
            while stop - 1 > start and position + length - lengths[stop - 1] >= end:
                length -= lengths[stop - 1]  # chunks after the range
                stop -= 1
            terms.append(Term(segment.xorb, start, stop, length))
            position += length
        fetches: dict[str, list[tuple[int, int, int, int]]] = {}
        for xorb in dict.fromkeys(t.xorb for t in terms):
            merged: list[list[int]] = []
            for t in sorted((t for t in terms if t.xorb == xorb), key=lambda t: t.start):
                if merged and t.start <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], t.end)
                else:
                    merged.append([t.start, t.end])
            offsets = self.xorbs[xorb].offsets
            fetches[xorb] = [(a, b, offsets[a], offsets[b]) for a, b in merged]
        return Reconstruction(first - first_chunk_start, terms, fetches)

    def read(self, xorb: str, first: int, last: int) -> Iterator[bytes]:
        """Bytes `first` to `last` (inclusive) of a xorb, in pieces."""
        fd = os.open(self.xorbs[xorb].path, os.O_RDONLY)
        try:
            position = first
            while position <= last:
                piece = os.pread(fd, min(256 * 1024, last + 1 - position), position)
                if not piece:
                    return
                position += len(piece)
                yield piece
        finally:
            os.close(fd)


def _read_chunks(path: Path, size: int) -> Iterator[bytes]:
    with path.open("rb") as file:
        while data := file.read(size):
            yield data
