"""What a cache key says about its responses before any is seen: those never stored,
those kept by RFC 9111 freshness, and those signed for one byte range.

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
  - a URL signed for a range that is not one closed range (several, or open).
- Kept by RFC 9111 freshness, revalidated once stale: the Hub's other `/api/...` pages.
  Revisions move: a branch's commit, a repository's list of files.
- Its own object, the signed range: a URL whose query signs a range
  (`X-Xet-Signed-Range=bytes%3D0-57388423`, the Xet CDN). The CDN serves that range of
  the xorb and refuses any other request for the URL, an unranged one included.

The Hub's hosts are `huggingface.co`, `hf.co` and every host under them (the CAS is
`cas-server.xethub.hf.co`, the Xet CDN `cas-bridge.xethub.hf.co`). A signed range is
kept in the key (`policy.cache_key` strips only the signature and expiry), so the same
range of the same xorb, signed again, is the same object, and a xorb shared by two
files or revisions is stored once.
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
    SIGNED_RANGES = "signed-ranges"  # never stored: signed for a range that is not one


class SignedRange(NamedTuple):
    """The byte range a URL is signed for: bytes `first` to `last`, inclusive."""

    first: int
    last: int

    @property
    def length(self) -> int:
        return self.last - self.first + 1

    @property
    def field(self) -> str:
        """The `Range` that asks for it (the only one the origin accepts)."""
        return f"bytes={self.first}-{self.last}"


class Rules(NamedTuple):
    """What a cache key's URL says (`rules`)."""

    kind: Kind
    signed: SignedRange | None = None  # the range an object of this key holds
    # Of a signed range: the key without it, which names the whole xorb (content-
    # addressed: every signed range of it holds the same bytes at the same offsets).
    whole: str | None = None


_STORED = Rules(Kind.STORED)
_EXPIRING_PATHS = re.compile(
    r"/api/(?:models|datasets|spaces)/.+/xet-(?:read|write)-token(?:/.*)?"
    r"|/v[0-9]+/reconstructions?/.*"
)
# The parameter the Xet CDN signs a range with; its value is percent-encoded in the URL.
_SIGNED_RANGE = re.compile(r"(?:^|&)x-xet-signed-range=([^&]*)", re.IGNORECASE)
_ONE_RANGE = re.compile(r"bytes=([0-9]{1,18})-([0-9]{1,18})")


@functools.lru_cache(maxsize=65536)
def rules(key: str) -> Rules:
    """The rules of a cache key (`policy.cache_key`): the table in the module docstring.
    Asked on every request that Python decides, hence remembered."""
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
    signed = _SIGNED_RANGE.search(query)
    if signed is not None:
        one = _ONE_RANGE.fullmatch(unquote(signed[1]).strip())
        if one is None or int(one[2]) < int(one[1]):
            return Rules(Kind.SIGNED_RANGES)
        kept = "&".join(item for item in query.split("&") if not _SIGNED_RANGE.fullmatch(item))
        base = key[: len(key) - len(query) - 1]  # without the `?`
        whole = f"{base}?{kept}" if kept else base
        return Rules(Kind.STORED, SignedRange(int(one[1]), int(one[2])), whole)
    if path.startswith("/api/"):
        return Rules(Kind.FRESHNESS)
    return _STORED
