"""Pure cache policy (RFC 9111): the cache key, what is stored, and how a stored object
answers.

Everything here is a decision made from strings and numbers: no I/O, no mitmproxy. The
generic HTTP pieces it builds on (fields, dates, ranges, conditional requests) are in
`sidecar.wire`; what is here is what a cache adds to them.

The sidecar is a *private* cache in RFC 9111 terms (§1: "A private cache, in contrast,
is dedicated to a single user"): one pod, one tenant, one buffer that nothing outside
the pod can read. That is why requests with `Authorization` and responses marked
`private` are cacheable here (RFC 9111 §3.5 and §5.2.2.7 restrict *shared* caches only).

Freshness is a deliberate choice, not RFC 9111's expiration model: an intercepted host
is one the operator listed as serving immutable dataset files, so a stored object is
served for the pod's lifetime whatever its `max-age`, `Expires` or `no-cache` say,
unless the sidecar runs with `--revalidate` (see `needs_revalidation()`).

How a stored object answers a GET or HEAD (RFC 9110 §13.2.2, with RFC 9111 §4.3.2):

1. `request_may_hit()`: GET and HEAD only.
2. `answers_preconditions()`: a request carrying `If-Match`/`If-Unmodified-Since` is
   answered here only when the object has a strong ETag; otherwise it goes upstream.
3. `conditionals.preconditions_hold()`: 412 when they do not (If-Match, else
   If-Unmodified-Since).
4. `conditionals.not_modified()`: 304 (If-None-Match, else If-Modified-Since).
5. GET with `Range`: if `conditionals.if_range_allows()`, `ranges.parse_range()` picks
   206, 416 or 200.
6. Otherwise 200 with the whole object.

The same steps answer a request that started or joined a fill, against the response
the fill received: that response is the origin's current representation, the very one
the origin would have evaluated the preconditions against.

## Cache keys

`cache_key(url)` is the URL, normalised so that equivalent URLs share one object:

| part | rule |
| --- | --- |
| scheme, host | lower-cased; a trailing dot on the host dropped |
| port | dropped when it is the scheme's default (80, 443) |
| userinfo | dropped (RFC 9110 §4.2.4 deprecates it; never in a request target) |
| path | kept byte for byte (no percent-decoding, no dot segments); empty -> `/` |
| query | kept in order, minus empty items and the host's signing parameters |
| `?` | dropped when the query left is empty |
| fragment | dropped (never sent to the origin) |

Signing parameters change every time a URL is signed again (expiry, date, signature,
credential) while the object stays the same; they are removed, case-insensitively, on
their own host family only. Everything else in the query is kept (`versionId`,
`partNumber`, `generation`, `snapshot`, `response-content-disposition`, ...), because it
selects a different object or a different response. On other hosts the query is whole.

- Amazon S3, `*.amazonaws.com`: `X-Amz-Algorithm`, `X-Amz-Credential`, `X-Amz-Date`,
  `X-Amz-Expires`, `X-Amz-SignedHeaders`, `X-Amz-Signature`, `X-Amz-Security-Token`,
  `AWSAccessKeyId`, `Signature`, `Expires`.
- Google Cloud Storage, `storage.googleapis.com`, `*.storage.googleapis.com`,
  `storage.cloud.google.com`: `X-Goog-Algorithm`, `X-Goog-Credential`, `X-Goog-Date`,
  `X-Goog-Expires`, `X-Goog-SignedHeaders`, `X-Goog-Signature`, `GoogleAccessId`,
  `Expires`, `Signature`, and the S3 `X-Amz-*` names above (URLs signed with HMAC keys).
- Azure Blob Storage, `*.blob.core.windows.net`: the SAS fields `sig`, `se`, `st`, `sp`,
  `sv`, `sr`, `spr`, `sip`, `skoid`, `sktid`, `skt`, `ske`, `sks`, `skv`, `ss`, `srt`,
  `ses`, `sdd`, `saoid`, `suoid`, `scid`, `rscc`, `rscd`, `rsce`, `rscl`, `rsct`.
- Hugging Face CDNs (CloudFront), `*.huggingface.co`, `*.hf.co`: `Expires`, `Signature`,
  `Key-Pair-Id`, `Policy`, and every `X-Amz-*`.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urljoin, urlsplit

from sidecar.cache import endpoints
from sidecar.core import native
from sidecar.settings import host_matches
from sidecar.wire import conditionals, dates, ranges
from sidecar.wire.fields import (
    HOP_BY_HOP,
    Fields,
    Headers,
    body_length,
    cache_directives,
    directives,
    field_lines,
    header,
    parse_length,
    split_list,
)
from sidecar.wire.framing import faulty_framing

# --- cache keys ------------------------------------------------------------------------

_DEFAULT_PORTS = {"http": 80, "https": 443}

_S3_SIGNING = frozenset(
    "x-amz-algorithm x-amz-credential x-amz-date x-amz-expires x-amz-signedheaders"
    " x-amz-signature x-amz-security-token".split()
)


@dataclass(frozen=True)
class _SigningFamily:
    """Hosts that sign URLs the same way, and the query parameters their signing adds."""

    hosts: tuple[str, ...]  # globs, as in --intercept (`*` spans dots)
    names: frozenset[str]  # lower-case parameter names
    prefixes: tuple[str, ...] = ()  # lower-case name prefixes


_SIGNING_FAMILIES: tuple[_SigningFamily, ...] = (
    # Amazon S3: SigV4 query signing, and SigV2 (AWSAccessKeyId, Signature, Expires).
    _SigningFamily(
        hosts=("*.amazonaws.com",),
        names=_S3_SIGNING | {"awsaccesskeyid", "signature", "expires"},
    ),
    # Google Cloud Storage: V4 (X-Goog-*), V2 (GoogleAccessId, Expires, Signature), and V4
    # signed with HMAC keys, which uses the S3 names.
    _SigningFamily(
        hosts=("storage.googleapis.com", "*.storage.googleapis.com", "storage.cloud.google.com"),
        names=_S3_SIGNING
        | frozenset(
            "x-goog-algorithm x-goog-credential x-goog-date x-goog-expires x-goog-signedheaders"
            " x-goog-signature googleaccessid expires signature".split()
        ),
    ),
    # Azure Blob Storage: every shared access signature field (service, account and
    # user-delegation SAS); `snapshot`, `versionid` and `comp` select content and stay.
    _SigningFamily(
        hosts=("*.blob.core.windows.net",),
        names=frozenset(
            "sig se st sp sv sr spr sip skoid sktid skt ske sks skv ss srt ses sdd"
            " saoid suoid scid rscc rscd rsce rscl rsct".split()
        ),
    ),
    # Hugging Face's LFS and Xet CDNs: CloudFront signed URLs, sometimes wrapped around
    # an S3 presigned URL (hence every X-Amz-* parameter).
    _SigningFamily(
        hosts=("*.huggingface.co", "*.hf.co"),
        names=frozenset(("expires", "signature", "key-pair-id", "policy")),
        prefixes=("x-amz-",),
    ),
)


def _signing_family(host: str) -> int | None:
    """The index in _SIGNING_FAMILIES of the family `host` (lower-case) belongs to."""
    return next(
        (i for i, family in enumerate(_SIGNING_FAMILIES) if host_matches(host, family.hosts)),
        None,
    )


# The key's rule, one implementation for Python and the core's streams alike: a plain
# URL is read by the core; any other is split here, and its parts keyed by the core.
KEYS = native.KeyRules(
    [(sorted(family.names), list(family.prefixes)) for family in _SIGNING_FAMILIES],
    _signing_family,
)


# A data loader asks for the same URLs epoch after epoch: their keys are remembered.
@functools.lru_cache(maxsize=65536)
def cache_key(url: str) -> str:
    """The buffer key of an absolute http(s) URL; the table in the module docstring.

    Raises ValueError for anything but an absolute http or https URL with a host.
    """
    return KEYS.key(url) or KEYS.key_of_parts(*_split_parts(url))


class _URLParts(NamedTuple):
    scheme: str  # lower-cased
    host: str  # lower-cased, no trailing dot; an IPv6 literal in brackets
    port: int | None
    path: str
    query: str


def _split_parts(url: str) -> _URLParts:
    """The parts of a URL the core does not read (`native.KeyRules.key`)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").rstrip(".")
    if scheme not in _DEFAULT_PORTS or not host:
        raise ValueError(f"not an absolute http(s) URL: {url!r}")
    if ":" in host:  # an IPv6 literal, which urlsplit hands back without its brackets
        host = f"[{host}]"
    port = parts.port  # raises ValueError for a port that is not 0-65535
    return _URLParts(scheme, host, port, parts.path, parts.query)


# --- cacheability ----------------------------------------------------------------------


class Reason(enum.StrEnum):
    """Why a request or response is (not) cached; the codes logs and metrics use."""

    OK = "ok"
    METHOD = "method"
    ORIGIN_PRECONDITION = "origin-precondition"
    REQUEST_NO_STORE = "request-no-store"
    STATUS = "status"
    FAULTY_FRAMING = "faulty-framing"
    BAD_LENGTH = "bad-length"
    RESPONSE_NO_STORE = "response-no-store"
    CONTENT_ENCODING = "content-encoding"
    VARY = "vary"
    VARY_STAR = "vary-star"
    NOT_THE_SIGNED_RANGE = "not-the-signed-range"
    EXPIRING = "expiring"
    SIGNED_RANGES = "signed-ranges"
    OUTSIDE_SIGNED_RANGE = "outside-signed-range"

    @property
    def sentence(self) -> str:
        """A sentence for humans, e.g. in a log line."""
        return _SENTENCES[self]


_SENTENCES = {
    Reason.OK: "cacheable",
    Reason.METHOD: "only GET fills the buffer (HEAD is answered from stored objects)",
    Reason.ORIGIN_PRECONDITION: (
        "If-Match or If-Unmodified-Since on an object without a strong ETag is for the"
        " origin to evaluate"
    ),
    Reason.REQUEST_NO_STORE: "the request says Cache-Control: no-store",
    Reason.STATUS: "only 200 responses are stored",
    Reason.FAULTY_FRAMING: (
        "the response is HTTP/1.0 with Transfer-Encoding, framing RFC 9112 calls faulty"
    ),
    Reason.BAD_LENGTH: "the response's Content-Length is invalid",
    Reason.RESPONSE_NO_STORE: "the response says Cache-Control: no-store",
    Reason.CONTENT_ENCODING: "the response is content-encoded although identity was asked for",
    Reason.VARY: "the response varies on request fields other than Accept-Encoding and CORS",
    Reason.VARY_STAR: "the response says Vary: *",
    Reason.NOT_THE_SIGNED_RANGE: (
        "the URL is signed for one range, and the response is not the 206 of exactly it"
    ),
    Reason.EXPIRING: "the response carries an access token or URLs that expire",
    Reason.SIGNED_RANGES: "the URL is signed for a range that is not one closed range",
    Reason.OUTSIDE_SIGNED_RANGE: (
        "the URL is signed for one range, and the request does not ask for a part of it"
    ),
}


# The request fields a hit's decision reads: `request_may_hit`, `needs_revalidation`,
# `is_fresh`, `only_if_cached`, `answers_preconditions`, and the 412, 304, 206 and 416 of
# `wire.conditionals` and `wire.ranges`. The answer to a GET with none of them depends on
# its URL and the stored object alone, which is what lets the core send it again
# (`core.native.Answers`); a test reads a hit's decision to keep this list whole.
HIT_FIELDS = frozenset(
    (
        "cache-control",
        "pragma",
        "range",
        "if-range",
        "if-match",
        "if-none-match",
        "if-modified-since",
        "if-unmodified-since",
    )
)
# Hosts whose `--http-freshness` verdict `Uniform` remembers, at most.
HOSTS_REMEMBERED = 100_000


class Uniform:
    """Which keys' objects answer every GET of their key that carries none of the
    HIT_FIELDS with the same whole 200, whoever asks and whenever: those the core's table
    of answers may hold. Not an API page whose answers move (`endpoints.Kind.FRESHNESS`)
    or any object of a `--http-freshness` host (`freshness_hosts`): those follow RFC
    9111 freshness, and their hits are decided each time; not a signed range's part,
    which answers its ranges only.

    Decided when an object is committed and recorded with it (`StoredObject.uniform`),
    so that a restarted sidecar puts the answers of the objects it verified back in the
    table without their keys, which the index does not keep."""

    def __init__(self, freshness_hosts: tuple[str, ...]) -> None:
        self._freshness_hosts = freshness_hosts
        self._by_netloc: dict[str, bool] = {}  # host[:port] -> under --http-freshness

    @property
    def rules(self) -> str:
        """What decides it besides the code: the index keeps it, and empties itself
        when a sidecar starts under others (`buffer.store`)."""
        return "\n".join(sorted(self._freshness_hosts))

    def __call__(self, key: str) -> bool:
        return endpoints.rules(key).part is None and not self.by_freshness(key)

    def by_freshness(self, key: str) -> bool:
        """Do objects of this key follow RFC 9111 freshness?"""
        if endpoints.rules(key).kind is endpoints.Kind.FRESHNESS:
            return True
        if not self._freshness_hosts:
            return False
        netloc = key.split("/", 3)[2]
        known = self._by_netloc.get(netloc)
        if known is None:
            if len(self._by_netloc) >= HOSTS_REMEMBERED:
                self._by_netloc.clear()
            known = host_matches(urlsplit(key).hostname or "", self._freshness_hosts)
            self._by_netloc[netloc] = known
        return known


class Verdict(NamedTuple):
    """A cacheability decision and its reason code (a `Reason`; `Reason.OK` when cacheable)."""

    cacheable: bool
    reason: str


_YES = Verdict(True, Reason.OK)


def request_may_hit(method: str, headers: Headers) -> Verdict:
    """May this request be answered from a stored object (if there is one)?

    GET and HEAD only (method names are case-sensitive, RFC 9110 §9.1). Preconditions
    (`If-Match`, `If-Unmodified-Since`) are decided once the object is known, by
    `answers_preconditions()`. `Cache-Control: no-store` in a request does not prevent a
    hit: it forbids storing (RFC 9111 §5.2.1.5), not reusing. Whether the hit must first
    be revalidated is `needs_revalidation()`'s question.
    """
    if method not in ("GET", "HEAD"):
        return Verdict(False, Reason.METHOD)
    return _YES


def request_is_cacheable(method: str, headers: Headers) -> Verdict:
    """May the response to this request be stored (a miss starts a fill)?

    Only GET fills: a HEAD is answered from a stored object when there is one and is
    passed upstream otherwise. RFC 9111 §5.2.1.5: the no-store request directive
    "indicates that a cache MUST NOT store any part of either this request or any
    response to it". A request with `Authorization` is cacheable: RFC 9111 §3.5 forbids
    only a *shared* cache to reuse its response, and this one is private to the pod.
    """
    verdict = request_may_hit(method, headers)
    if not verdict.cacheable:
        return verdict
    if method != "GET":
        return Verdict(False, Reason.METHOD)
    if "no-store" in cache_directives(headers):
        return Verdict(False, Reason.REQUEST_NO_STORE)
    return _YES


# Vary members a stored response may name. Accept-Encoding: the sidecar always asks the
# origin for identity and only ever serves identity, which every client accepts. The CORS
# trio (S3 buckets with CORS rules and CDNs send it on every response) only changes the
# Access-Control-* fields, which are never replayed (see `stored_headers()`). Refusing
# them would make the main dataset hosts uncacheable.
_HARMLESS_VARY = frozenset(
    ("accept-encoding", "origin", "access-control-request-method", "access-control-request-headers")
)


def _cacheable(
    status: int, version: str, fields: Fields, signed: endpoints.SignedRange | None
) -> Verdict:
    """May this upstream response to a cacheable GET be stored? `version` is its status
    line's (`1.1`, `1.0`); `signed`: the range its URL is signed for, which the fill
    asked for (`endpoints`).

    - 200 only: a 206 is a piece, redirects and errors are the origin's to repeat. But
      of a URL signed for one range, the 206 of exactly that range, with a
      `Content-Length` of its length: the URL names that part and no other.
    - Framing that is not faulty: an HTTP/1.0 response with `Transfer-Encoding` is
      decoded and relayed, but RFC 9112 §6.1 says to "treat the message as if the
      framing is faulty" (`wire.framing.faulty_framing`), and a body that may not be
      the one its origin meant is not kept.
    - A `Content-Length`, if any, that is valid. A body without one (chunked, or
      delimited by the connection's close, `wire.fields.body_length`) is stored too,
      once its end says it is whole: the fill writes it as it comes (`buffer.fill`).
    - No `Cache-Control: no-store` (RFC 9111 §3: a cache MUST NOT store a response
      unless "the no-store cache directive is not present in the response").
      `private` is fine: this is a private cache. `no-cache`, `max-age` and `Expires`
      are freshness matters, see the module docstring.
    - No content coding: the fill asks for `Accept-Encoding: identity`, so an encoded
      body means the origin ignored us, and a gzip body must never reach a client that
      did not ask for it.
    - `Vary` naming at most Accept-Encoding and the CORS request fields; `Vary: *` never
      matches another request (RFC 9111 §4.1).
    """
    if signed is None:
        if status != 200:
            return Verdict(False, Reason.STATUS)
    elif status != 206:
        return Verdict(False, Reason.STATUS)
    else:
        part = ranges.parse_content_range(fields.get("content-range"))
        announced = parse_length(fields.get("content-length") or "")
        if part is None or (part.first, part.last) != signed or announced != signed.length:
            return Verdict(False, Reason.NOT_THE_SIGNED_RANGE)
    if faulty_framing(version, fields.get("transfer-encoding")):
        return Verdict(False, Reason.FAULTY_FRAMING)
    length = fields.get("content-length")
    if length is not None and parse_length(length) is None:
        return Verdict(False, Reason.BAD_LENGTH)
    if "no-store" in directives(fields.get("cache-control") or ""):
        return Verdict(False, Reason.RESPONSE_NO_STORE)
    # Each list read only when present: most responses have neither.
    codings = fields.get("content-encoding")
    if codings is not None and {c.lower() for c in split_list(codings)} - {"identity"}:
        return Verdict(False, Reason.CONTENT_ENCODING)
    varies = fields.get("vary")
    vary = {member.lower() for member in split_list(varies)} if varies is not None else set()
    if "*" in vary:
        return Verdict(False, Reason.VARY_STAR)
    if not vary <= _HARMLESS_VARY:
        return Verdict(False, Reason.VARY)
    return _YES


# Fields never replayed from a stored response. `Date` is: it is "the date and time at
# which the message was originated" (RFC 9110 §6.6.1), and the `Age` of each answer
# tells how long ago that was.
_NOT_REPLAYED = HOP_BY_HOP | frozenset(
    # The responder's: they describe the bytes and the age of this answer.
    "content-length content-encoding age"
    # Cookies are set once, for the exchange that earned them.
    " set-cookie set-cookie2"
    # The origin's own connection options, meaningless behind the interception.
    " alt-svc".split()
)


# The field every answer frames itself (`router.answer()` sets it for its status and
# range; a 206 answer replaces a stored `Content-Range` with its own).
_FRAMING = frozenset(("content-length",))


# Fields never relayed to the client whose request started a fill (`_relayed`).
_NOT_RELAYED = HOP_BY_HOP | _FRAMING | {"alt-svc"}
# The start of the names of fields never replayed: the CORS ones (`stored_headers`).
_NOT_REPLAYED_PREFIX = "access-control-"


def _relayed(lines: Iterable[tuple[str, str]], named: list[str]) -> list[tuple[str, str]]:
    """The response fields sent to the client whose request started a fill, in order
    (`named`: those `Connection` names).

    That client gets what the origin sent (RFC 9110 §7.6.1: a proxy forwards every
    end-to-end field), `Date`, `Age` and `Set-Cookie` included, minus the hop-by-hop
    fields and those `Connection` names, and minus the framing that each answer sets for
    itself. `Alt-Svc` is dropped too: it would send the client around the proxy.
    """
    dropped = set(_NOT_RELAYED)
    dropped.update(named)
    return [(name, value) for name, value in lines if name.lower() not in dropped]


def _named_by_connection(fields: Fields) -> list[str]:
    """The fields a response's `Connection` names (RFC 9110 §7.6.1), lower-cased."""
    connection = fields.get("connection")
    return [name.lower() for name in split_list(connection)] if connection else []


def stored_headers(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """The response fields to store and replay on every hit, in their order.

    RFC 9111 §3.1: "Caches MUST include all received response header fields --
    including unrecognized ones -- when storing a response", so this is a deny list:
    vendor fields that clients read (`x-amz-version-id`, `x-goog-hash`,
    `x-goog-generation`, `Content-MD5`, `X-Repo-Commit`, `X-Linked-Etag`, ...) survive.
    Dropped: hop-by-hop fields and the fields `Connection` names; `Content-Length`,
    `Content-Encoding` and `Age`, which the responder sets;
    `Set-Cookie`; `Alt-Svc`; the `Access-Control-*` fields, which depend on the request's
    `Origin` (a Vary this cache accepts); and the fields named by a qualified
    `no-cache="..."`, which "MUST NOT be sent in the response to a subsequent request
    without successful revalidation" (RFC 9111 §5.2.2.4).
    """
    fields = Fields.view(headers)
    return _stored(field_lines(headers), fields, _named_by_connection(fields))


def _stored(
    lines: Iterable[tuple[str, str]], fields: Fields, named: list[str]
) -> list[tuple[str, str]]:
    dropped = set(_NOT_REPLAYED)
    dropped.update(named)
    no_cache = directives(fields.get("cache-control") or "").get("no-cache")
    if no_cache:
        dropped.update([name.lower() for name in split_list(no_cache)])
    kept = []
    for name, value in lines:
        lowered = name.lower()
        if lowered not in dropped and not lowered.startswith(_NOT_REPLAYED_PREFIX):
            kept.append((name, value))
    return kept


def updated_headers(
    stored: Sequence[tuple[str, str]], headers: Mapping[str, str]
) -> list[tuple[str, str]]:
    """A stored object's fields updated from a 304 that validated it (RFC 9111 §4.3.4).

    RFC 9111 §3.2: the cache "MUST add each header field in the provided response to the
    stored response, replacing field values that are already present", except the fields
    that are not stored and `Content-Length`: every field `stored_headers()` keeps from
    the 304 replaces all lines of that name; the others stay as they were.
    """
    fresh = stored_headers(headers)
    replaced = {name.lower() for name, _ in fresh}
    return [(name, value) for name, value in stored if name.lower() not in replaced] + fresh


class Kept(NamedTuple):
    """What a fill keeps of an origin's storable response (`judge_response`)."""

    size: int | None  # the body's length as its head says (`body_length`); None: its end tells
    stored: tuple[tuple[str, str], ...]  # `stored_headers`
    relayed: tuple[tuple[str, str], ...]  # `_relayed`
    etag: str | None
    last_modified: str | None
    generated_at: float  # `generated_at`
    lifetime: float  # `freshness_lifetime` of the stored fields


# The common case's judgement, with the names of the fields kept here.
_COMMON = native.JudgeRules(sorted(_NOT_REPLAYED), _NOT_REPLAYED_PREFIX, sorted(_NOT_RELAYED))


def judge_response(
    status: int,
    version: str,
    headers: Headers,
    requested: float,
    received: float,
    signed: endpoints.SignedRange | None = None,
) -> Verdict | Kept:
    """An origin's response to a cacheable GET, asked for at `requested` and come at
    `received` (`version`: its status line's, `1.1` or `1.0`; `signed`: the range the
    URL is signed for, `endpoints.rules`): why it is not stored (`_cacheable`), or what
    the fill keeps. A signed range's `Content-Range` is kept with it: it says which part
    of the xorb the object is.

    The common case (what dataset origins answer: a 200 with a Content-Length, dates and
    an ETag, nothing that bears on freshness) is judged by the core
    (`native.JudgeRules`), which a property test holds to `_judge`'s verdicts; every
    other response by `_judge`.
    """
    lines = field_lines(headers)
    if not isinstance(lines, list):
        lines = list(lines)
    if signed is None:
        common = _COMMON.judge(status, version, lines, requested, received)
        if common is not None:
            return Kept._make(common)
    return _judge(status, version, lines, requested, received, signed)


def _judge(
    status: int,
    version: str,
    lines: Iterable[tuple[str, str]],
    requested: float,
    received: float,
    signed: endpoints.SignedRange | None,
) -> Verdict | Kept:
    """`judge_response`, every rule of it: the rules are the functions named in `Kept`;
    this reads each field of the head once for all of them, which every miss does."""
    fields = Fields.of(lines)
    verdict = _cacheable(status, version, fields, signed)
    if not verdict.cacheable:
        return verdict
    named = _named_by_connection(fields)
    stored = _stored(lines, fields, named)
    date = fields.get("date")
    return Kept(
        body_length(fields),
        tuple(stored),
        tuple(_relayed(lines, named)),
        fields.get("etag"),
        fields.get("last-modified"),
        generated_at(requested, received, date, fields.get("age")),
        _lifetime(Fields.of(stored), date, received),
    )


def answers_preconditions(request_headers: Headers, etag: str | None) -> Verdict:
    """May an object with this ETag evaluate the request's preconditions itself?

    RFC 9111 §4.3.2 leaves If-Match and If-Unmodified-Since to the origin ("not
    applicable to a cache"), because a cache cannot tell whether its copy is the origin's
    current representation. Here it can: an intercepted host serves immutable objects (the
    module docstring), and an object with a *strong* ETag names exactly its bytes (RFC 9110
    §8.8.1), so comparing with it is what the origin would do. Without a strong ETag,
    If-Match could never match (§13.1.1 compares strongly) and If-Unmodified-Since would
    rest on a one-second date: such requests go upstream (`ORIGIN_PRECONDITION`).
    Requests without either field are always answered here.
    """
    if not conditionals.has_precondition(request_headers):
        return _YES
    stored = conditionals.entity_tag(etag) if etag else None
    if stored is None or stored.weak:
        return Verdict(False, Reason.ORIGIN_PRECONDITION)
    return _YES


def conditional_headers(etag: str | None, last_modified: str | None) -> dict[str, str]:
    """The request fields that revalidate a stored object with its origin.

    RFC 9111 §4.3.1: a cache "MUST send the relevant entity tags (using If-Match,
    If-None-Match, or If-Range) if the entity tags were provided in the stored
    response(s) being validated" and "SHOULD send the Last-Modified value (using
    If-Modified-Since) if the request is not for a subrange, a single stored response
    is being validated, and that response contains a Last-Modified value". The origin
    answers 304 when the stored object is still current.
    """
    fields: dict[str, str] = {}
    if etag:
        fields["If-None-Match"] = etag
    if last_modified:
        fields["If-Modified-Since"] = last_modified
    return fields


# --- invalidation ----------------------------------------------------------------------

# RFC 9110 §9.2.1; every other method, known or not, is unsafe.
_SAFE_METHODS = frozenset(("GET", "HEAD", "OPTIONS", "TRACE"))


def invalidated_keys(method: str, status: int, url: str, headers: Headers) -> list[str]:
    """The cache keys a response to `method` on `url` makes stale (RFC 9111 §4.4).

    "A cache MUST invalidate the target URI ... when it receives a non-error status code
    in response to an unsafe request method (including methods whose safety is
    unknown)"; non-error is 2xx and 3xx. The URIs in `Location` and `Content-Location`
    are invalidated too, resolved against the target, but only on the target's origin:
    "a cache MUST NOT trigger an invalidation under these conditions if the origin ...
    of the URI to be invalidated differs from that of the target URI".
    """
    if method in _SAFE_METHODS or not 200 <= status < 400:
        return []
    target = cache_key(url)
    origin = _origin_of(target)
    keys = [target]
    for name in ("Location", "Content-Location"):
        value = header(headers, name)
        if not value:
            continue
        try:
            key = cache_key(urljoin(url, value.strip()))
        except ValueError:
            continue  # not an http(s) URL: nothing of ours
        if _origin_of(key) == origin and key not in keys:
            keys.append(key)
    return keys


def _origin_of(key: str) -> str:
    """`scheme://host[:port]` of a cache key (keys are normalised, see `cache_key()`)."""
    scheme, _, rest = key.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


# --- age ---------------------------------------------------------------------------------


def generated_at(
    request_time: float, response_time: float, date: str | None, age: str | None
) -> float:
    """When the origin generated (or validated) a response, on this machine's clock.

    RFC 9111 §4.2.3 computes a stored response's current age as

        apparent_age = max(0, response_time - date_value)
        corrected_age_value = age_value + (response_time - request_time)
        corrected_initial_age = max(apparent_age, corrected_age_value)
        current_age = corrected_initial_age + (now - response_time)

    so `current_age = now - (response_time - corrected_initial_age)`: this returns that
    bracket, and `current_age()` is one subtraction per hit. Times are `time.time()`
    seconds; a missing or invalid `Date` or `Age` counts as zero age.
    """
    moment = dates.parse_http_date(date) if date is not None else None
    apparent = max(0.0, response_time - moment.timestamp()) if moment is not None else 0.0
    # "a cache encountering a message with a list-based Age field value SHOULD use the
    # first member of the field value, discarding subsequent ones" (RFC 9111 §5.1).
    members = split_list(age) if age else []
    corrected = _delta_seconds(members[0] if members else None) + (response_time - request_time)
    return response_time - max(apparent, corrected)


def current_age(generated: float, now: float) -> int:
    """The Age of a stored response (RFC 9111 §5.1), whole seconds, never negative."""
    return max(0, int(now - generated))


def _delta_seconds(value: str | None) -> int:
    """A delta-seconds value (RFC 9111 §1.2.2); 0 when absent or invalid, saturated at
    2**31 ("a cache receiving a delta-seconds value greater than the greatest integer it
    can represent ... MUST consider the value to be 2147483648")."""
    digits = (value or "").strip()
    if not digits.isascii() or not digits.isdigit():
        return 0
    significant = digits.lstrip("0")
    return min(int(significant or "0"), 2**31) if len(significant) <= 10 else 2**31


def dated(fields: Sequence[tuple[str, str]], received: float) -> list[tuple[str, str]]:
    """A stored response's fields with a valid `Date`: its own, else `received` as one.

    RFC 9110 §6.6.1: "A recipient with a clock that receives a response message without a
    Date header field MUST add one if that message is cached or forwarded downstream",
    and one that "receives a response with an invalid Date header field value MAY replace
    that value with the time that response was received".
    """
    date = header(fields, "Date")
    if date is not None and dates.parse_http_date(date) is not None:
        return list(fields)
    undated = [(name, value) for name, value in fields if name.lower() != "date"]
    return [*undated, ("Date", dates.http_date(received))]


# --- freshness -------------------------------------------------------------------------

# For hosts named by `--http-freshness`, stored objects follow RFC 9111's expiration
# model as a private cache (§4.2): `freshness_lifetime()` is computed once when a
# response is stored or validated, and `is_fresh()` decides each request.


def freshness_lifetime(headers: Headers, date: str | None, received: float) -> float:
    """How long a response stays fresh, in seconds (RFC 9111 §4.2.1, private cache).

    `max-age` first (`s-maxage` is for shared caches); else `Expires` minus `Date`
    (an invalid `Expires` means already expired, §5.3); else, since a 200 is
    heuristically cacheable, a tenth of the time since `Last-Modified` (§4.2.2: "a
    typical setting of this fraction might be 10%"); else 0. `date` is the response's
    `Date` (not stored), `received` when it came, standing in for a missing one.
    """
    return _lifetime(Fields.view(headers), date, received)


def _lifetime(fields: Fields, date: str | None, received: float) -> float:
    response = directives(fields.get("cache-control") or "")
    if "max-age" in response:
        return float(_delta_seconds(response["max-age"]))
    moment = dates.parse_http_date(date) if date is not None else None
    date_value = moment.timestamp() if moment is not None else received
    expires = fields.get("expires")
    if expires is not None:
        until = dates.parse_http_date(expires)
        return max(0.0, until.timestamp() - date_value) if until is not None else 0.0
    modified_value = fields.get("last-modified")
    modified = dates.parse_http_date(modified_value) if modified_value is not None else None
    if modified is not None:
        return max(0.0, (date_value - modified.timestamp()) / 10)
    return 0.0


def is_fresh(
    headers: Headers, lifetime: float, generated: float, request_headers: Headers, now: float
) -> bool:
    """May a stored response answer this request without validation (RFC 9111 §4.2)?

    Not when it says `no-cache` (§5.2.2.4: "MUST NOT be used to satisfy any other
    request without forwarding it for validation"; a `no-cache="field"` only withholds
    fields, see `stored_headers()`), nor when the request's `max-age` is below its age
    (§5.2.1.1), nor when it will not stay fresh for the request's `min-fresh` (§5.2.1.3);
    otherwise while its age is below its freshness lifetime, or beyond it by no more
    than the request's `max-stale` (§5.2.1.2; no value: any staleness) when the response
    allows serving it stale (`may_serve_stale()`).
    """
    directives = cache_directives(headers)
    if "no-cache" in directives and directives["no-cache"] is None:
        return False
    age = now - generated
    wanted = cache_directives(request_headers)
    max_age = wanted.get("max-age")
    if max_age and age > _delta_seconds(max_age):
        return False
    if "min-fresh" in wanted and lifetime - age < _delta_seconds(wanted["min-fresh"]):
        return False
    if age < lifetime:
        return True
    if "max-stale" not in wanted or not may_serve_stale(headers):
        return False
    max_stale = wanted["max-stale"]
    return max_stale is None or age - lifetime <= _delta_seconds(max_stale)


def may_serve_stale(headers: Headers) -> bool:
    """May a stale response be served when the origin cannot be reached (§4.2.4)?

    "A cache MUST NOT generate a stale response if it is prohibited by an explicit
    in-protocol directive (e.g., by a no-cache response directive, a must-revalidate
    response directive ...)"; with must-revalidate "the cache MUST generate an error
    response rather than reuse the stale response" (§5.2.2.2).
    """
    directives = cache_directives(headers)
    return "must-revalidate" not in directives and directives.get("no-cache", "") is not None


def client_asks_no_cache(request_headers: Headers) -> bool:
    """Does the client ask for validation with the origin (`no-cache`)?

    `Cache-Control: no-cache` (RFC 9111 §5.2.1.4: "the client prefers a stored response
    not be used to satisfy the request without successful validation on the origin
    server"), or, from HTTP/1.0 clients, `Pragma: no-cache` when there is no
    Cache-Control at all (the rule of RFC 7234 §5.4; RFC 9111 §5.4 deprecates Pragma
    but clients still send it). `max-age=0` does not count: some clients send it on
    every request, and stored objects here do not age.
    """
    if header(request_headers, "Cache-Control") is not None:
        return "no-cache" in cache_directives(request_headers)
    pragma = header(request_headers, "Pragma")
    return pragma is not None and "no-cache" in [m.lower() for m in split_list(pragma)]


def only_if_cached(request_headers: Headers) -> bool:
    """Does the client want a stored response or nothing (`only-if-cached`)?

    RFC 9111 §5.2.1.7: "a cache SHOULD either respond using a stored response consistent
    with the other constraints of the request or respond with a 504 (Gateway Timeout)".
    """
    return "only-if-cached" in cache_directives(request_headers)


def needs_revalidation(revalidate: bool, request_headers: Headers) -> bool:
    """Must a stored object be revalidated with the origin before it answers this request?

    Always with `--revalidate`. Without it, stored objects are immutable for the pod's
    lifetime, except when the client itself asks for `no-cache` (`client_asks_no_cache()`):
    that is an explicit, rare request (`wget --no-cache`, `curl -H 'Cache-Control:
    no-cache'`), the one way a user can check an object without restarting the pod, and
    it costs one conditional request whose 304 still serves the body from the buffer.
    """
    return revalidate or client_asks_no_cache(request_headers)
