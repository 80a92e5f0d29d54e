"""Byte ranges (RFC 9110 §14): which part of a representation a `Range` asks for, and
the `Content-Range` that answers it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from sidecar.wire.fields import MAX_DIGITS


class ByteRange(NamedTuple):
    """One satisfiable byte range of a stored object: answer 206 with these bytes."""

    start: int
    end: int  # inclusive, as in Content-Range

    @property
    def length(self) -> int:
        return self.end - self.start + 1


@dataclass(frozen=True)
class Full:
    """No usable Range: answer 200 with the whole object."""


@dataclass(frozen=True)
class Unsatisfiable:
    """No requested range overlaps the object: answer 416 with `unsatisfied_range(size)`."""


FULL = Full()
UNSATISFIABLE = Unsatisfiable()

# More range-specs than this and the Range field is ignored: RFC 9110 §14.2 lets a server
# ignore "a set of many small ranges", "indications of either a broken client or a
# deliberate denial-of-service attack".
MAX_RANGE_SPECS = 100
# What longer numbers in a Range become: more than any object's size.
_SATURATED = 10**MAX_DIGITS
_INT_RANGE = re.compile(r"([0-9]+)-([0-9]*)")
# Longer numbers are absurd for an offset, and int() of thousands of digits raises.
_NUMBER = rf"[0-9]{{1,{MAX_DIGITS}}}"
_CONTENT_RANGE = re.compile(rf"bytes ({_NUMBER})-({_NUMBER})/({_NUMBER}|\*)")
_SUFFIX_RANGE = re.compile(r"-([0-9]+)")


def _number(digits: str) -> int:
    significant = digits.lstrip("0")
    return int(significant or "0") if len(significant) <= MAX_DIGITS else _SATURATED


def _coalesce(ranges: list[ByteRange]) -> list[ByteRange]:
    merged: list[ByteRange] = []
    for current in sorted(ranges):
        if merged and current.start <= merged[-1].end + 1:
            merged[-1] = ByteRange(merged[-1].start, max(merged[-1].end, current.end))
        else:
            merged.append(current)
    return merged


def parse_range(value: str | None, size: int) -> ByteRange | Full | Unsatisfiable:
    """Decide a GET's `Range` against a stored object of `size` bytes (RFC 9110 §14).

    Returns `FULL` to serve the whole object with 200, a `ByteRange` to serve with 206,
    or `UNSATISFIABLE` for 416. For GET only: "A server MUST ignore a Range header field
    received with a request method that is unrecognized or for which range handling is
    not defined" (§14.2), and HEAD is such a method.

    - `bytes=a-b`, `bytes=a-`, `bytes=-n`; the unit is case-insensitive (§14.1), the end
      is clamped to `size - 1`, a suffix longer than the object is the whole object.
    - Invalid syntax, a `last-pos` before its `first-pos`, or a unit other than bytes:
      `FULL`, the Range is ignored (§14.2: a server "MAY ignore or reject a Range header
      field that contains an invalid ranges-specifier"; "A proxy MAY discard a Range
      header field that contains a range unit it does not understand").
    - Range-specs that are not satisfiable (a first-pos at or past the end, `-0`) are
      left out; when none is left, the set is unsatisfiable: 416 (§15.5.17).
    - Several satisfiable ranges: overlapping and adjacent ones are coalesced (§15.3.7.2:
      "a server MAY coalesce any of the ranges that overlap, or that are separated by
      a gap that is smaller than the overhead of sending multiple parts"). If they
      collapse into one, that range is served; otherwise the whole object is (`FULL`).
      Download tools ask for one range at a time; `multipart/byteranges` would cost a
      second body format for requests that hardly ever come, and §14.2 allows ignoring
      Range altogether.
    - An empty object: `FULL` (§14.2: a server "MAY ignore a Range header field when the
      selected representation has no content"; no Content-Range can describe it).
    """
    if value is None or size <= 0:
        return FULL
    unit, sep, range_set = value.partition("=")
    if not sep or unit.strip().lower() != "bytes":
        return FULL
    specs = [spec.strip() for spec in range_set.split(",")]
    specs = [spec for spec in specs if spec]
    if not specs or len(specs) > MAX_RANGE_SPECS:
        return FULL
    ranges: list[ByteRange] = []
    for spec in specs:
        if match := _INT_RANGE.fullmatch(spec):
            first = _number(match[1])
            last = _number(match[2]) if match[2] else None
            if last is not None and last < first:
                return FULL
            if first < size:
                ranges.append(ByteRange(first, size - 1 if last is None else min(last, size - 1)))
        elif match := _SUFFIX_RANGE.fullmatch(spec):
            suffix = _number(match[1])
            if suffix > 0:
                ranges.append(ByteRange(max(size - suffix, 0), size - 1))
        else:
            return FULL
    if not ranges:
        return UNSATISFIABLE
    merged = _coalesce(ranges)
    return merged[0] if len(merged) == 1 else FULL


class Part(NamedTuple):
    """What a 206's `Content-Range` says (RFC 9110 §14.4): bytes `first` to `last`
    (inclusive) of a representation of `complete` bytes (None: `*`, unknown)."""

    first: int
    last: int
    complete: int | None


def parse_content_range(value: str | None) -> Part | None:
    """The part a 206's `Content-Range` names, or None for any other value (another
    unit, a `last-pos` before its `first-pos`, past the complete length, or `*` as the
    range, which only a 416 sends)."""
    match = _CONTENT_RANGE.fullmatch(value.strip()) if value else None
    if match is None:
        return None
    first, last = int(match[1]), int(match[2])
    complete = None if match[3] == "*" else int(match[3])
    if last < first or (complete is not None and last >= complete):
        return None
    return Part(first, last, complete)


def closed_range(value: str | None) -> ByteRange | None:
    """The one closed range (`bytes=A-B`) a GET's `Range` asks for, whatever the
    representation's length; None for anything else (no Range, several ranges, an open
    or suffix range, an invalid field)."""
    wanted = parse_range(value, _SATURATED)
    if isinstance(wanted, ByteRange) and wanted.end < _SATURATED - 1:
        return wanted
    return None


def range_within(value: str | None, part: Part) -> ByteRange | None:
    """The one range a GET's `Range` asks for when only `part` of the representation is
    at hand: a `ByteRange` (of the whole representation) that lies within the part, or
    None when the part cannot answer it (no Range, a range reaching outside it, several
    ranges, an invalid field). Of a representation of unknown length, a range open at its
    end or a suffix range is never within a part: where it ends is unknown."""
    complete = part.complete if part.complete is not None else _SATURATED
    wanted = parse_range(value, complete)
    if isinstance(wanted, ByteRange) and part.first <= wanted.start and wanted.end <= part.last:
        return wanted
    return None


def content_range(start: int, end: int, size: int | None) -> str:
    """The Content-Range of a 206 (RFC 9110 §14.4): `bytes 0-499/1234`, or `bytes
    0-499/*` when the complete length is not known (None)."""
    return f"bytes {start}-{end}/{'*' if size is None else size}"


def unsatisfied_range(size: int) -> str:
    """The Content-Range of a 416 (RFC 9110 §14.4): `bytes */1234`."""
    return f"bytes */{size}"
