"""What a cache key says about its responses before any is seen: those never stored,
those kept by RFC 9111 freshness, and those signed for byte ranges.

An intercepted host serves immutable dataset files (`sidecar.cache.policy`), but some of
its URLs answer with something that is only true for a while. Replaying such an answer
breaks the client that gets it later, so these rules are decided from the URL alone,
before the origin is asked:

- Never stored, nor answered from the buffer (they pass, `Range` and all):
  - the Hub's Xet tokens, `/api/{models,datasets,spaces}/<repo>/xet-{read,write}-token/<rev>`:
    an access token that expires (its `exp`); a refresh must get a new one;
  - the Xet CAS's reconstructions, `/v1/reconstructions/<hash>`, `/v2/reconstructions/<hash>`:
    presigned xorb URLs with their expiry inside. Once it passes, every URL in a replayed
    answer is refused, and the client's retry (it asks again on a 403) would get the same
    answer back;
  - a URL signed for what is not closed ranges (an open range, another unit).
- Kept by RFC 9111 freshness, revalidated once stale: the Hub's other `/api/...` pages.
  Revisions move: a branch's commit, a repository's list of files.
- Its own object, each range a URL's query signs (`X-Xet-Signed-Range=bytes%3D0-57388423`,
  or several ranges of one xorb, `bytes%3D0-99%2C200-299`: the Xet CDN). The CDN serves
  those ranges of the xorb (each alone, or all at once) and refuses any other request
  for the URL, an unranged one included. A request for a range within one of them is
  answered from the part that range is stored as (`part_key`), filled with exactly that
  signed range.

The Hub's hosts are `huggingface.co`, `hf.co` and every host under them (the CAS is
`cas-server.xethub.hf.co`, the Xet CDN `cas-bridge.xethub.hf.co`). A part's key is the
xorb's URL without its signature, expiry and signed ranges, and the range
(`<url>#bytes=A-B`, a fragment no request's key has): the same range of the same xorb,
signed again, alone or with others, is the same object, and a xorb shared by two files
or revisions is stored once.
"""

from __future__ import annotations

import enum
import functools
import re
from typing import NamedTuple
from urllib.parse import unquote

from sidecar.settings import host_matches

HUB_HOSTS = ("huggingface.co", "hf.co", "*.huggingface.co", "*.hf.co")


class Kind(enum.Enum):
    """How the responses of a cache key are kept."""

    STORED = "stored"  # for the pod's lifetime (the default of an intercepted host)
    FRESHNESS = "freshness"  # by RFC 9111 freshness, revalidated once stale
    EXPIRING = "expiring"  # never stored: credentials or expiring URLs
    SIGNED = "signed"  # a URL signed for ranges: each is stored as its part (`part_key`)
    SIGNED_RANGES = "signed-ranges"  # never stored: signed for what is not closed ranges


class SignedRange(NamedTuple):
    """A byte range a URL is signed for: bytes `first` to `last`, inclusive."""

    first: int
    last: int

    @property
    def length(self) -> int:
        return self.last - self.first + 1

    @property
    def field(self) -> str:
        """The `Range` that asks for it (what the origin accepts of the URL)."""
        return f"bytes={self.first}-{self.last}"


class Rules(NamedTuple):
    """What a cache key says (`rules`)."""

    kind: Kind
    # Of a URL signed for ranges (SIGNED): those ranges, in the URL's order.
    signed: tuple[SignedRange, ...] = ()
    # Of a part's key (`part_key`): the range it holds.
    part: SignedRange | None = None
    # Of both: the key of the whole they are ranges of, the URL without its signature,
    # expiry and signed ranges. Content-addressed (a xorb's hash is its path): every
    # range of it holds the same bytes at the same offsets, whatever URL named it.
    whole: str | None = None


_STORED = Rules(Kind.STORED)
_EXPIRING_PATHS = re.compile(
    r"/api/(?:models|datasets|spaces)/.+/xet-(?:read|write)-token(?:/.*)?"
    r"|/v[0-9]+/reconstructions?/.*"
)
# The parameter the Xet CDN signs ranges with; its value is percent-encoded in the URL.
_SIGNED_RANGE = re.compile(r"(?:^|&)x-xet-signed-range=([^&]*)", re.IGNORECASE)
_CLOSED_RANGE = re.compile(r"([0-9]{1,18})-([0-9]{1,18})")
# What a part's key ends with: a fragment, which no request's key has (`cache_key`
# drops them), so that it never names what a URL names.
_PART = "#bytes="


@functools.lru_cache(maxsize=65536)
def rules(key: str) -> Rules:
    """The rules of a cache key (`policy.cache_key`, or `part_key`): the table in the
    module docstring. Asked on every request that Python decides, hence remembered."""
    whole, part_sep, part = key.partition(_PART)
    if part_sep:
        first, _, last = part.partition("-")
        return Rules(Kind.STORED, part=SignedRange(int(first), int(last)), whole=whole)
    scheme_sep = key.find("://")
    rest = key[scheme_sep + 3 :]
    slash = rest.find("/")
    netloc, target = (rest, "/") if slash < 0 else (rest[:slash], rest[slash:])
    host = netloc.rpartition(":")[0] if netloc.count(":") == 1 else netloc
    if not host_matches(host, HUB_HOSTS):
        return _STORED
    path, _, query = target.partition("?")
    if _EXPIRING_PATHS.fullmatch(path):
        return Rules(Kind.EXPIRING)
    found = _SIGNED_RANGE.search(query)
    if found is not None:
        signed = _signed_ranges(unquote(found[1]))
        if signed is None:
            return Rules(Kind.SIGNED_RANGES)
        kept = "&".join(item for item in query.split("&") if not _SIGNED_RANGE.fullmatch(item))
        base = key[: len(key) - len(query) - 1]  # without the `?`
        return Rules(Kind.SIGNED, signed, whole=f"{base}?{kept}" if kept else base)
    if path.startswith("/api/"):
        return Rules(Kind.FRESHNESS)
    return _STORED


def _signed_ranges(value: str) -> tuple[SignedRange, ...] | None:
    """The ranges of a signed `bytes=A-B[,C-D...]`; None unless every one is closed."""
    unit, sep, specs = value.strip().partition("=")
    if not sep or unit != "bytes":
        return None
    ranges = []
    for spec in specs.split(","):
        closed = _CLOSED_RANGE.fullmatch(spec.strip())
        if closed is None or int(closed[2]) < int(closed[1]):
            return None
        ranges.append(SignedRange(int(closed[1]), int(closed[2])))
    return tuple(ranges)


def part_key(rules: Rules, first: int, last: int) -> str | None:
    """The key of the part that answers bytes `first` to `last` of a URL signed for
    ranges (`rules` of its key): the smallest signed range that holds them, as the key
    of that range of its whole; None when no signed range holds them (the origin would
    refuse the fill)."""
    holding = [r for r in rules.signed if r.first <= first and last <= r.last]
    if not holding or rules.whole is None:
        return None
    part = min(holding, key=lambda r: r.length)
    return f"{rules.whole}{_PART}{part.first}-{part.last}"
