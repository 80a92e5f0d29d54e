"""What a URL says about its responses (`sidecar.cache.endpoints`), and how a URL signed
for one range is stored and answered: the pure rules, decided before any I/O."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.cache import policy
from sidecar.cache.endpoints import Kind, Rules, SignedRange, part_key, rules
from sidecar.cache.policy import Reason, cache_key
from sidecar.proxy.router import Representation, answer
from sidecar.wire import ranges
from sidecar.wire.exchange import Request

XORB = "https://cas-bridge.xethub.hf.co/xorbs/default/" + "ab" * 32
SIGNING = "&Expires=1764000000&Policy=eyJTdGF0ZW1lbnQiOltdfQ__&Signature=c2ln&Key-Pair-Id=K2J"


def signed_url(first: int, last: int, signing: str = SIGNING) -> str:
    return f"{XORB}?X-Xet-Signed-Range=bytes%3D{first}-{last}{signing}"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        # The Hub's Xet tokens: expiring credentials.
        ("https://huggingface.co/api/models/org/m/xet-read-token/main", Rules(Kind.EXPIRING)),
        ("https://hf.co/api/datasets/org/d/xet-read-token/abc123", Rules(Kind.EXPIRING)),
        ("https://huggingface.co/api/spaces/o/s/xet-write-token/main", Rules(Kind.EXPIRING)),
        # The CAS's reconstructions: presigned URLs.
        ("https://cas-server.xethub.hf.co/v1/reconstructions/" + "0f" * 32, Rules(Kind.EXPIRING)),
        ("https://cas-server.xethub.hf.co/v2/reconstructions/" + "0f" * 32, Rules(Kind.EXPIRING)),
        # The Hub's other API pages move with their revisions.
        ("https://huggingface.co/api/models/org/m/revision/main", Rules(Kind.FRESHNESS)),
        ("https://hub.hf.co:8443/api/datasets/org/d/tree/main", Rules(Kind.FRESHNESS)),
        # Files, and LFS CDN URLs: stored, as every intercepted host's.
        ("https://huggingface.co/org/m/resolve/main/config.json", Rules(Kind.STORED)),
        ("https://cdn-lfs.hf.co/repos/aa/bb/cc?Expires=1&Signature=x", Rules(Kind.STORED)),
        # Signed ranges: each its own object, a part of the xorb.
        (signed_url(0, 57388423), Rules(Kind.SIGNED, (SignedRange(0, 57388423),), whole=XORB)),
        (
            f"{XORB}?a=1&X-Xet-Signed-Range=bytes%3D0-9&Signature=s",
            Rules(Kind.SIGNED, (SignedRange(0, 9),), whole=f"{XORB}?a=1"),
        ),
        (
            f"{XORB}?X-Xet-Signed-Range=bytes%3D0-9%2C20-29",
            Rules(Kind.SIGNED, (SignedRange(0, 9), SignedRange(20, 29)), whole=XORB),
        ),
        # An open range, an inverted one, or an unreadable one: never stored.
        (f"{XORB}?X-Xet-Signed-Range=bytes%3D10-", Rules(Kind.SIGNED_RANGES)),
        (f"{XORB}?X-Xet-Signed-Range=bytes%3D0-9%2C20-", Rules(Kind.SIGNED_RANGES)),
        (f"{XORB}?X-Xet-Signed-Range=bytes%3D10-9", Rules(Kind.SIGNED_RANGES)),
        (f"{XORB}?x-xet-signed-range=items%3D0-9", Rules(Kind.SIGNED_RANGES)),
        # Another host's same paths and parameters are its own business.
        ("https://origin.test/api/models/org/m/xet-read-token/main", Rules(Kind.STORED)),
        ("https://origin.test/v2/reconstructions/ff", Rules(Kind.STORED)),
        ("https://origin.test/x?X-Xet-Signed-Range=bytes%3D0-9", Rules(Kind.STORED)),
        ("https://origin.test/api/x", Rules(Kind.STORED)),
    ],
)
def test_rules_of_a_url(url: str, expected: Rules) -> None:
    assert rules(cache_key(url)) == expected


def part(url: str, first: int, last: int) -> str | None:
    """The key of the part that answers bytes `first` to `last` of `url`."""
    return part_key(rules(cache_key(url)), first, last)


def test_a_signed_range_signed_again_alone_or_with_others_is_the_same_part() -> None:
    """A part's key is its xorb's and its range: a URL signed an hour later for the same
    range of the same xorb, or one signed for it among other ranges, finds what the
    first stored."""
    first = part(signed_url(0, 999), 0, 999)
    assert first == f"{XORB}#bytes=0-999"
    again = signed_url(0, 999, "&Expires=1764999999&Policy=b3RoZXI_&Signature=bmV3")
    assert part(again, 0, 999) == first
    several = f"{XORB}?X-Xet-Signed-Range=bytes%3D5000-5999%2C0-999{SIGNING}"
    assert part(several, 0, 999) == first
    assert part(several, 5000, 5999) == f"{XORB}#bytes=5000-5999"
    assert part(signed_url(0, 1000), 0, 1000) != first
    assert rules(first) == Rules(Kind.STORED, part=SignedRange(0, 999), whole=XORB)
    assert cache_key(first) == XORB  # no URL a client asks for is a part's key


def test_a_range_within_a_signed_one_is_answered_by_its_part_and_others_by_none() -> None:
    several = f"{XORB}?X-Xet-Signed-Range=bytes%3D0-999%2C100-199%2C5000-5999{SIGNING}"
    assert part(several, 150, 160) == f"{XORB}#bytes=100-199"  # the smallest that holds it
    assert part(several, 150, 300) == f"{XORB}#bytes=0-999"
    assert part(several, 900, 5000) is None  # across two: the origin would refuse it
    assert part(several, 6000, 6000) is None
    assert part_key(rules(cache_key("https://origin.test/a")), 0, 9) is None


def test_a_content_range_is_read_strictly() -> None:
    parse = ranges.parse_content_range
    assert parse("bytes 0-499/1234") == ranges.Part(0, 499, 1234)
    assert parse("bytes 10-19/*") == ranges.Part(10, 19, None)
    wrongs = (None, "", "bytes */1234", "bytes 5-4/10", "bytes 0-10/10", "items 0-1/2", "0-1/2")
    for wrong in wrongs:
        assert parse(wrong) is None


@pytest.mark.parametrize(
    ("field", "complete", "expected"),
    [
        ("bytes=100-199", 1000, ranges.ByteRange(100, 199)),
        ("bytes=150-160", 1000, ranges.ByteRange(150, 160)),
        ("bytes=100-200", 1000, None),  # one byte past the part
        ("bytes=99-150", 1000, None),
        (None, 1000, None),  # the whole representation is not at hand
        ("bytes=100-110,150-160", 1000, None),  # several ranges
        ("bytes=-10", None, None),  # a suffix of a representation of unknown length
        ("bytes=150-", None, None),  # open, of unknown length: where it ends is unknown
        ("bytes=150-", 200, ranges.ByteRange(150, 199)),  # open, ending where the part does
        ("bytes=-50", 200, ranges.ByteRange(150, 199)),
    ],
)
def test_which_ranges_a_part_answers(
    field: str | None, complete: int | None, expected: ranges.ByteRange | None
) -> None:
    part = ranges.Part(100, 199, complete)
    assert ranges.range_within(field, part) == expected


@given(
    first=st.integers(0, 10**6),
    length=st.integers(1, 10**6),
    start=st.integers(0, 3 * 10**6),
    size=st.integers(1, 10**6),
)
def test_a_part_answers_exactly_the_ranges_inside_it(
    first: int, length: int, start: int, size: int
) -> None:
    part = ranges.Part(first, first + length - 1, None)
    end = start + size - 1
    within = ranges.range_within(f"bytes={start}-{end}", part)
    inside = first <= start and end <= part.last
    assert within == (ranges.ByteRange(start, end) if inside else None)


def judged(status: int, headers: list[tuple[str, str]], signed: SignedRange | None):
    return policy.judge_response(status, "1.1", dict(headers), 0.0, 0.0, signed)


def test_a_signed_range_stores_the_206_of_exactly_it() -> None:
    signed = SignedRange(1000, 1999)
    head = [("Content-Range", "bytes 1000-1999/5000"), ("Content-Length", "1000")]
    kept = judged(206, head, signed)
    assert isinstance(kept, policy.Kept)
    assert kept.size == 1000
    assert ("Content-Range", "bytes 1000-1999/5000") in kept.stored


@pytest.mark.parametrize(
    ("status", "head", "reason"),
    [
        (200, [("Content-Length", "5000")], Reason.STATUS),  # the origin ignored the Range
        (403, [("Content-Length", "0")], Reason.STATUS),
        (206, [("Content-Range", "bytes 1000-1998/5000"), ("Content-Length", "999")], None),
        (206, [("Content-Range", "bytes 1000-1999/5000"), ("Content-Length", "999")], None),
        (206, [("Content-Length", "1000")], None),
        (206, [("Content-Range", "bytes */5000"), ("Content-Length", "1000")], None),
    ],
)
def test_anything_but_that_206_is_not_stored(
    status: int, head: list[tuple[str, str]], reason: Reason | None
) -> None:
    verdict = judged(status, head, SignedRange(1000, 1999))
    assert isinstance(verdict, policy.Verdict)
    assert verdict.reason == (reason or Reason.NOT_THE_SIGNED_RANGE)


def test_without_a_signed_range_a_206_is_never_stored() -> None:
    head = [("Content-Range", "bytes 1000-1999/5000"), ("Content-Length", "1000")]
    verdict = judged(206, head, None)
    assert verdict == policy.Verdict(False, Reason.STATUS)


def stored_part(complete: str = "5000") -> Representation:
    stored = (
        ("ETag", '"xorb"'),
        ("Content-Range", f"bytes 1000-1999/{complete}"),
        ("Content-Type", "application/octet-stream"),
    )
    return Representation(1000, stored, time.time(), SignedRange(1000, 1999))


def request(*fields: tuple[str, str], method: str = "GET") -> Request:
    return Request(method, signed_url(1000, 1999), fields)


def test_a_stored_part_answers_its_range_and_the_ranges_inside_it() -> None:
    now = time.time()
    whole = answer(request(("Range", "bytes=1000-1999")), stored_part(), now)
    assert whole is not None
    assert (whole.status, whole.start, whole.end) == (206, 0, 1000)
    assert dict(whole.headers)["Content-Range"] == "bytes 1000-1999/5000"
    assert dict(whole.headers)["Content-Length"] == "1000"
    inner = answer(request(("Range", "bytes=1500-1509")), stored_part("*"), now)
    assert inner is not None
    assert (inner.status, inner.start, inner.end) == (206, 500, 510)
    assert dict(inner.headers)["Content-Range"] == "bytes 1500-1509/*"
    head = answer(request(("Range", "bytes=1000-1999"), method="HEAD"), stored_part(), now)
    assert head is not None and (head.status, head.start, head.end) == (206, 0, 0)


@pytest.mark.parametrize(
    "fields",
    [
        (),  # the whole xorb
        (("Range", "bytes=0-1999"),),  # more than the part
        (("Range", "bytes=1000-1009,1500-1509"),),  # two pieces
        (("Range", "bytes=1000-1999"), ("If-Range", '"other"')),  # a changed object
    ],
)
def test_a_stored_part_answers_nothing_else(fields: tuple[tuple[str, str], ...]) -> None:
    assert answer(request(*fields), stored_part(), time.time()) is None


def test_a_stored_part_still_evaluates_conditionals() -> None:
    """If-None-Match is about the representation, which the part's ETag names."""
    matched = answer(
        request(("Range", "bytes=1000-1999"), ("If-None-Match", '"xorb"')), stored_part(), 0.0
    )
    assert matched is not None and matched.status == 304
