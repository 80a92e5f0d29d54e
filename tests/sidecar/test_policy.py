import string
from email.utils import parsedate_to_datetime

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from mitmproxy.http import Headers
from multidict import CIMultiDict, CIMultiDictProxy

from sidecar.cache import policy
from sidecar.cache.policy import Reason, cache_key
from sidecar.wire import conditionals, dates, fields, ranges
from sidecar.wire.ranges import FULL, UNSATISFIABLE, ByteRange, parse_range

# --- headers ---------------------------------------------------------------------------


def storable(status: int, headers: fields.Headers, version: str) -> policy.Verdict:
    """Whether a fill stores the response (`judge_response`), as a verdict."""
    judged = policy.judge_response(status, version, headers, 0.0, 0.0)
    return judged if isinstance(judged, policy.Verdict) else policy.Verdict(True, Reason.OK)


def mitmproxy_headers(*fields: tuple[str, str]) -> Headers:
    return Headers([(k.encode(), v.encode()) for k, v in fields])


def aiohttp_headers(*fields: tuple[str, str]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(fields))


@pytest.mark.parametrize("make", [lambda *f: dict(f), mitmproxy_headers, aiohttp_headers])
def test_header_is_case_insensitive_in_every_mapping(make) -> None:
    headers = make(("Content-Type", "text/plain"), ("cache-control", "no-store"))
    assert fields.header(headers, "content-type") == "text/plain"
    assert fields.header(headers, "CACHE-CONTROL") == "no-store"
    assert fields.header(headers, "ETag") is None


@pytest.mark.parametrize("make", [mitmproxy_headers, aiohttp_headers])
def test_header_joins_repeated_lines(make) -> None:
    headers = make(("Vary", "Origin"), ("vary", "Accept-Encoding"))
    assert fields.header(headers, "Vary") == "Origin, Accept-Encoding"
    headers = make(("Content-Length", "1"), *headers.items())
    assert storable(200, headers, "1.1").cacheable


# --- cache keys ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("HTTPS://Example.ORG/Data/File.bin", "https://example.org/Data/File.bin"),
        ("https://example.org:443/f", "https://example.org/f"),
        ("http://example.org:80/f", "http://example.org/f"),
        ("http://example.org:443/f", "http://example.org:443/f"),
        ("https://example.org:8443/f", "https://example.org:8443/f"),
        ("https://example.org", "https://example.org/"),
        ("https://example.org./f", "https://example.org/f"),
        ("https://user:secret@example.org/f", "https://example.org/f"),
        ("https://example.org/f#part-2", "https://example.org/f"),
        ("https://example.org/f?", "https://example.org/f"),
        ("http://[::1]:80/f", "http://[::1]/f"),
        ("http://[::1]:8080/f", "http://[::1]:8080/f"),
        # The path is the origin's business: no decoding, no dot segments, case kept.
        ("https://example.org/a%2Fb/%7e/../C", "https://example.org/a%2Fb/%7e/../C"),
        ("https://example.org/a%2fb", "https://example.org/a%2fb"),
        # The query keeps its order and its spelling; only empty items go.
        ("https://example.org/f?b=2&&a=1&b=1&", "https://example.org/f?b=2&a=1&b=1"),
        (
            "https://example.org/f?Signature=x&Expires=1",
            "https://example.org/f?Signature=x&Expires=1",
        ),
    ],
)
def test_cache_key_normalises(url: str, key: str) -> None:
    assert cache_key(url) == key


_URL_PIECES = st.lists(
    st.sampled_from(
        ["a", "Z", "9", ".", "-", "_", "/", "?", "#", "&", "=", ":", "@", "[", "]", "%", " ",
         "\t", "\n", "\\", "é", "0", "65535", "65536", "443", "80", "::1", "+", "%2D",
         ".amazonaws.com", "X-Amz-Date", "Expires"]
    ),
    max_size=12,
).map("".join)


@given(
    scheme=st.sampled_from(["http", "https", "HTTPS", "Http", "ftp", ""]),
    host=_URL_PIECES,
    rest=_URL_PIECES,
)
def test_a_plain_url_has_the_key_urlsplit_gives_it(scheme: str, host: str, rest: str) -> None:
    """The core's reading of the URLs nearly every client sends (`native.KeyRules.key`)
    gives the key that urlsplit's parts give, wherever it applies; the rest go to
    urlsplit."""
    url = f"{scheme}://{host}{rest}"
    plain = policy.KEYS.key(url)
    if plain is not None:
        assert plain == policy.KEYS.key_of_parts(*policy._split_parts(url))


@pytest.mark.parametrize(
    "url", ["https://Example.ORG.:8443/a/b?c=d&e", "http://h:80", "https://h?q", "http://h"]
)
def test_a_plain_url_is_read_without_urlsplit(url: str) -> None:
    plain = policy.KEYS.key(url)
    assert plain is not None and plain == policy.KEYS.key_of_parts(*policy._split_parts(url))


S3_PRESIGNED = (
    "https://bucket.s3.us-east-1.amazonaws.com/train/shard-00.tar?versionId=v7&partNumber=2"
    "&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F20250101%2Fus-east-1%2Fs3"
    "&X-Amz-Date=20250101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
    "&X-Amz-Security-Token=tok&X-Amz-Signature=abc123"
)


@pytest.mark.parametrize(
    ("url", "key"),
    [
        (
            S3_PRESIGNED,
            "https://bucket.s3.us-east-1.amazonaws.com/train/shard-00.tar?versionId=v7&partNumber=2",
        ),
        (
            "https://s3.amazonaws.com/b/k?AWSAccessKeyId=A&Expires=1&Signature=s%3D&x-id=GetObject",
            "https://s3.amazonaws.com/b/k?x-id=GetObject",
        ),
        (
            "https://b.s3.amazonaws.com/k?x-amz-signature=lower&X-AMZ-DATE=upper&response-content-type=a",
            "https://b.s3.amazonaws.com/k?response-content-type=a",
        ),
        (
            "https://storage.googleapis.com/b/o?generation=17&X-Goog-Algorithm=GOOG4-RSA-SHA256"
            "&X-Goog-Credential=c&X-Goog-Date=d&X-Goog-Expires=60&X-Goog-SignedHeaders=host"
            "&X-Goog-Signature=s",
            "https://storage.googleapis.com/b/o?generation=17",
        ),
        (
            "https://b.storage.googleapis.com/o?GoogleAccessId=g&Expires=1&Signature=s&generation=3",
            "https://b.storage.googleapis.com/o?generation=3",
        ),
        (
            "https://storage.cloud.google.com/b/o?X-Amz-Signature=s&X-Amz-Date=d",
            "https://storage.cloud.google.com/b/o",
        ),
        (
            "https://acct.blob.core.windows.net/c/b.bin?snapshot=2024-01-01&sv=2022-11-02&ss=b"
            "&srt=o&sp=r&se=2030-01-01&st=2024-01-01&spr=https&sig=abc%3D&versionid=v1&comp=x",
            "https://acct.blob.core.windows.net/c/b.bin?snapshot=2024-01-01&versionid=v1&comp=x",
        ),
        (
            "https://cdn-lfs.huggingface.co/repos/ab/cd?response-content-disposition=inline"
            "&Expires=1700000000&Policy=eyJ&Signature=sig&Key-Pair-Id=K2",
            "https://cdn-lfs.huggingface.co/repos/ab/cd?response-content-disposition=inline",
        ),
        (
            "https://cas-bridge.xethub.hf.co/xet/abc?X-Amz-Content-Sha256=UNSIGNED-PAYLOAD"
            "&X-Amz-Credential=c&X-Xet-Cas-Uid=u&x-id=GetObject&Expires=1&Signature=s",
            "https://cas-bridge.xethub.hf.co/xet/abc?X-Xet-Cas-Uid=u&x-id=GetObject",
        ),
    ],
)
def test_cache_key_drops_signing_parameters_of_the_host_family(url: str, key: str) -> None:
    assert cache_key(url) == key


@pytest.mark.parametrize(
    "url",
    [
        "https://example.org/f?X-Amz-Signature=s",  # S3's names on another host
        "https://huggingface.co/f?Signature=s",  # the API host itself is not a CDN
        "https://evil-amazonaws.com/f?X-Amz-Signature=s",
        "https://storage.googleapis.com.example.org/f?X-Goog-Signature=s",
        "https://acct.blob.core.windows.net.example.org/f?sig=s",
    ],
)
def test_cache_key_keeps_signing_lookalikes_elsewhere(url: str) -> None:
    assert cache_key(url) == url


@pytest.mark.parametrize(
    "url", ["ftp://example.org/f", "/relative/path", "https:///no-host", "http://h:99999/f", "x"]
)
def test_cache_key_refuses_what_is_not_an_http_url(url: str) -> None:
    with pytest.raises(ValueError):
        cache_key(url)


_label = st.text(string.ascii_letters + string.digits, min_size=1, max_size=8)
_hosts = st.lists(_label, min_size=1, max_size=4).map(".".join)
_safe = string.ascii_letters + string.digits + "-._~%!$'()*+,;:@/"
_paths = st.text(_safe, max_size=20).map(lambda p: "/" + p)
_names = st.text(string.ascii_letters + string.digits + "-_.", min_size=1, max_size=10)
_values = st.text(_safe + "=?", max_size=10)
_params = st.lists(st.tuples(_names, _values), max_size=6)


def _query(params: list[tuple[str, str]]) -> str:
    return "&".join(f"{name}={value}" for name, value in params)


@st.composite
def _urls(draw: st.DrawFn, hosts: st.SearchStrategy[str] = _hosts) -> str:
    scheme = draw(st.sampled_from(["http", "HTTP", "https", "HttpS"]))
    port = draw(st.sampled_from(["", ":80", ":443", ":8080"]))
    query = _query(draw(_params))
    fragment = draw(st.sampled_from(["", "#", "#frag"]))
    return f"{scheme}://{draw(hosts)}{port}{draw(_paths)}{'?' + query if query else ''}{fragment}"


@given(_urls(hosts=_hosts | st.sampled_from(["b.s3.amazonaws.com", "storage.googleapis.com"])))
def test_cache_key_is_idempotent(url: str) -> None:
    key = cache_key(url)
    assert cache_key(key) == key


# (a host of each family, a signing parameter name of that family)
_SIGNED = st.sampled_from(
    [
        ("bucket.s3.eu-west-1.amazonaws.com", "X-Amz-Signature"),
        ("s3.amazonaws.com", "x-amz-credential"),
        ("s3.amazonaws.com", "AWSAccessKeyId"),
        ("storage.googleapis.com", "X-Goog-Signature"),
        ("b.storage.googleapis.com", "GoogleAccessId"),
        ("storage.cloud.google.com", "X-Goog-Date"),
        ("acct.blob.core.windows.net", "sig"),
        ("acct.blob.core.windows.net", "SE"),
        ("acct.blob.core.windows.net", "skoid"),
        ("cdn-lfs.huggingface.co", "Key-Pair-Id"),
        ("cas-bridge.xethub.hf.co", "X-Amz-Anything"),
        ("cas-bridge.xethub.hf.co", "Policy"),
    ]
)


@given(_SIGNED, _paths, _params, st.lists(_values, min_size=1, max_size=3), st.randoms())
def test_signing_parameters_never_change_the_key_on_their_family(
    signed, path, params, signatures, random
) -> None:
    host, name = signed
    params = [p for p in params if p[0].lower() != name.lower()]
    base = f"https://{host}{path}?{_query(params)}"
    resigned = list(params)
    for value in signatures:
        resigned.insert(random.randint(0, len(resigned)), (name, value))
    assert cache_key(f"https://{host}{path}?{_query(resigned)}") == cache_key(base)


@given(_SIGNED, _paths, _values)
def test_signing_parameters_change_the_key_elsewhere(signed, path, value) -> None:
    _, name = signed
    with_signature = cache_key(f"https://data.example.org{path}?{name}={value}")
    assert with_signature != cache_key(f"https://data.example.org{path}")
    assert with_signature.endswith(f"?{name}={value}")


# --- cacheability ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "headers", "hit", "fill"),
    [
        ("GET", {}, Reason.OK, Reason.OK),
        ("GET", {"Authorization": "Bearer t"}, Reason.OK, Reason.OK),
        ("GET", {"Range": "bytes=0-1"}, Reason.OK, Reason.OK),
        ("HEAD", {}, Reason.OK, Reason.METHOD),
        ("get", {}, Reason.METHOD, Reason.METHOD),
        ("POST", {}, Reason.METHOD, Reason.METHOD),
        ("PUT", {}, Reason.METHOD, Reason.METHOD),
        ("GET", {"cache-control": "no-store"}, Reason.OK, Reason.REQUEST_NO_STORE),
        ("GET", {"Cache-Control": "max-age=0, NO-STORE"}, Reason.OK, Reason.REQUEST_NO_STORE),
        ("GET", {"Cache-Control": "no-cache"}, Reason.OK, Reason.OK),
        # Preconditions are decided against the object (`answers_preconditions`).
        ("GET", {"If-Match": '"a"'}, Reason.OK, Reason.OK),
        ("HEAD", {"if-unmodified-since": "x"}, Reason.OK, Reason.METHOD),
    ],
)
def test_request_cacheability(method, headers, hit, fill) -> None:
    assert policy.request_may_hit(method, headers) == (hit == Reason.OK, hit)
    if fill is not None:
        assert policy.request_is_cacheable(method, headers) == (fill == Reason.OK, fill)


OK_RESPONSE = {"Content-Length": "10", "Content-Type": "application/octet-stream"}


@pytest.mark.parametrize(
    ("status", "extra", "reason"),
    [
        (200, {}, Reason.OK),
        (200, {"Cache-Control": "private, max-age=0, must-revalidate"}, Reason.OK),
        (200, {"Cache-Control": "no-cache"}, Reason.OK),
        (200, {"Content-Encoding": "identity"}, Reason.OK),
        (200, {"Vary": "Accept-Encoding"}, Reason.OK),
        (
            200,
            {"Vary": "Origin, Access-Control-Request-Method, access-control-request-headers"},
            Reason.OK,
        ),
        (200, {"Vary": ""}, Reason.OK),
        (200, {"Content-Length": "0"}, Reason.OK),
        (200, {"Content-Length": "10, 10"}, Reason.OK),
        (206, {"Content-Range": "bytes 0-9/20"}, Reason.STATUS),
        (304, {}, Reason.STATUS),
        (302, {"Location": "https://cdn/"}, Reason.STATUS),
        (404, {}, Reason.STATUS),
        (200, {"Content-Length": None}, Reason.OK),  # stored once its end says it is whole
        (200, {"Transfer-Encoding": "chunked"}, Reason.OK),
        (200, {"Content-Length": "10, 11"}, Reason.BAD_LENGTH),
        (200, {"Content-Length": "-1"}, Reason.BAD_LENGTH),
        (200, {"Content-Length": "1e3"}, Reason.BAD_LENGTH),
        (200, {"Content-Length": "١٢"}, Reason.BAD_LENGTH),  # digits, but not ASCII ones
        (200, {"Content-Length": "9" * 5000}, Reason.BAD_LENGTH),
        (200, {"Cache-Control": "max-age=60, No-Store"}, Reason.RESPONSE_NO_STORE),
        (200, {"Content-Encoding": "gzip"}, Reason.CONTENT_ENCODING),
        (200, {"Content-Encoding": "identity, br"}, Reason.CONTENT_ENCODING),
        (200, {"Vary": "*"}, Reason.VARY_STAR),
        (200, {"Vary": "Accept-Encoding, *"}, Reason.VARY_STAR),
        (200, {"Vary": "Cookie"}, Reason.VARY),
        (200, {"Vary": "Accept-Encoding, Authorization"}, Reason.VARY),
    ],
)
def test_response_cacheability(status: int, extra: dict, reason: Reason) -> None:
    headers = {k: v for k, v in {**OK_RESPONSE, **extra}.items() if v is not None}
    cacheable, why = storable(status, headers, "1.1")
    assert (cacheable, why) == (reason == Reason.OK, reason)
    assert why.sentence


@pytest.mark.parametrize(
    ("version", "extra", "reason"),
    [
        # RFC 9112 §6.1: "treat the message as if the framing is faulty, even if a
        # Content-Length is present".
        ("1.0", {"Content-Length": None, "Transfer-Encoding": "chunked"}, Reason.FAULTY_FRAMING),
        ("1.0", {"Transfer-Encoding": "chunked"}, Reason.FAULTY_FRAMING),
        ("1.0", {"Transfer-Encoding": "identity"}, Reason.FAULTY_FRAMING),
        ("1.0", {}, Reason.OK),
        ("1.0", {"Content-Length": None}, Reason.OK),  # ended by the close
        ("1.1", {"Content-Length": None, "Transfer-Encoding": "chunked"}, Reason.OK),
    ],
)
def test_an_http_1_0_response_with_transfer_encoding_is_never_stored(
    version: str, extra: dict, reason: Reason
) -> None:
    headers = {k: v for k, v in {**OK_RESPONSE, **extra}.items() if v is not None}
    assert storable(200, headers, version) == (reason == Reason.OK, reason)


def test_every_reason_has_a_sentence() -> None:
    assert all(reason.sentence for reason in Reason)


def test_content_length() -> None:
    assert fields.content_length({"content-length": " 42 "}) == 42
    assert fields.content_length({}) is None
    assert fields.content_length({"Content-Length": ""}) is None


def test_body_length_is_unknown_when_chunked_or_delimited_by_the_close() -> None:
    assert fields.body_length({"Content-Length": "42"}) == 42
    assert fields.body_length({}) is None  # RFC 9112 §6.3: read until the close
    # "the Transfer-Encoding overrides the Content-Length"
    assert fields.body_length({"Transfer-Encoding": "chunked", "Content-Length": "42"}) is None


def test_stored_headers_replays_end_to_end_fields_in_order() -> None:
    upstream = aiohttp_headers(
        ("Content-Type", "application/x-tar"),
        ("Content-Length", "10"),
        ("Date", "Sun, 06 Nov 1994 08:49:37 GMT"),
        ("Age", "30"),
        ("ETag", '"abc"'),
        ("Connection", "keep-alive, X-Hop"),
        ("Keep-Alive", "timeout=5"),
        ("X-Hop", "1"),
        ("Transfer-Encoding", "identity"),
        ("Set-Cookie", "a=1"),
        ("Set-Cookie", "b=2"),
        ("Last-Modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
        ("Content-Disposition", 'attachment; filename="f.tar"'),
        ("Cache-Control", 'private, no-cache="X-Secret"'),
        ("X-Secret", "s"),
        ("x-goog-hash", "crc32c=abc"),
        ("x-goog-hash", "md5=def"),
        ("x-amz-version-id", "v7"),
        ("X-Repo-Commit", "0123"),
        ("Accept-Ranges", "bytes"),
        ("Access-Control-Allow-Origin", "*"),
        ("Alt-Svc", 'h3=":443"'),
        ("Proxy-Authenticate", "Basic"),
        ("Upgrade", "h2c"),
        ("Content-Encoding", "identity"),
        ("Content-Range", "bytes 0-9/10"),
    )
    assert policy.stored_headers(upstream) == [
        ("Content-Type", "application/x-tar"),
        ("Date", "Sun, 06 Nov 1994 08:49:37 GMT"),
        ("ETag", '"abc"'),
        ("Last-Modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
        ("Content-Disposition", 'attachment; filename="f.tar"'),
        ("Cache-Control", 'private, no-cache="X-Secret"'),
        ("x-goog-hash", "crc32c=abc"),
        ("x-goog-hash", "md5=def"),
        ("x-amz-version-id", "v7"),
        ("X-Repo-Commit", "0123"),
        ("Accept-Ranges", "bytes"),
        ("Content-Range", "bytes 0-9/10"),  # on a 200, the origin's to say; a 206 has its own
    ]


_JUDGED_HEADS = [
    [("Content-Length", "10"), ("ETag", '"e"'), ("Date", "Sun, 06 Nov 1994 08:49:37 GMT")],
    [
        ("Transfer-Encoding", "chunked"),
        ("Connection", "keep-alive, X-Hop"),
        ("X-Hop", "1"),
        ("Cache-Control", 'max-age=60, no-cache="X-Secret"'),
        ("X-Secret", "s"),
        ("Set-Cookie", "a=1"),
        ("Age", "30, 2"),
        ("Last-Modified", "Sun, 06 Nov 1994 06:49:37 GMT"),
        ("last-modified", "Sun, 06 Nov 1994 06:49:38 GMT"),
    ],
    [("Content-Length", "3"), ("Expires", "Sun, 06 Nov 1994 09:49:37 GMT"), ("Alt-Svc", "x")],
    [
        ("Content-Length", "3"),
        ("Connection", "Expires"),
        ("Expires", "Sun, 06 Nov 1994 09:49:37 GMT"),
    ],
    [("Content-Length", "3"), ("Cache-Control", "no-store")],
    [("Content-Length", "1e3")],
    [("Vary", "Accept-Encoding"), ("Vary", "Cookie")],
]


@pytest.mark.parametrize("lines", _JUDGED_HEADS)
@pytest.mark.parametrize("make", [aiohttp_headers, mitmproxy_headers])
def test_a_fills_judgement_of_a_head_is_each_rules_own(make, lines) -> None:
    headers = make(*lines)
    date = parsedate_to_datetime("Sun, 06 Nov 1994 08:49:37 GMT").timestamp()
    judged = policy.judge_response(200, "1.1", headers, date + 1, date + 2)
    if isinstance(judged, policy.Verdict):
        assert judged.reason in (Reason.RESPONSE_NO_STORE, Reason.BAD_LENGTH, Reason.VARY)
        return
    stored = policy.stored_headers(headers)
    assert judged == policy.Kept(
        fields.body_length(headers),
        tuple(stored),
        judged.relayed,  # its own test: the relayed fields' below
        fields.header(headers, "ETag"),
        fields.header(headers, "Last-Modified"),
        policy.generated_at(
            date + 1, date + 2, fields.header(headers, "Date"), fields.header(headers, "Age")
        ),
        policy.freshness_lifetime(stored, fields.header(headers, "Date"), date + 2),
    )
    assert judged.size in (10, 3, None)


def test_a_fills_judgement_of_a_status_other_than_200_is_the_rules_own() -> None:
    headers = aiohttp_headers(("Content-Length", "3"))
    assert policy.judge_response(206, "1.1", headers, 0, 0) == (False, Reason.STATUS)


def test_stored_headers_from_mitmproxy_headers() -> None:
    upstream = mitmproxy_headers(("content-type", "text/plain"), ("SET-COOKIE", "a=1"))
    assert policy.stored_headers(upstream) == [("content-type", "text/plain")]


# --- ranges ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "size", "expected"),
    [
        (None, 100, FULL),
        ("bytes=0-9", 100, ByteRange(0, 9)),
        ("bytes=10-", 100, ByteRange(10, 99)),
        ("bytes=-10", 100, ByteRange(90, 99)),
        ("bytes=-1000", 100, ByteRange(0, 99)),
        ("bytes=0-0", 100, ByteRange(0, 0)),
        ("bytes=99-99", 100, ByteRange(99, 99)),
        ("bytes=50-1000", 100, ByteRange(50, 99)),
        ("BYTES=0-9", 100, ByteRange(0, 9)),
        (" bytes = 0-9 ", 100, ByteRange(0, 9)),
        ("bytes=0-9,", 100, ByteRange(0, 9)),
        ("bytes=007-0009", 100, ByteRange(7, 9)),
        # unsatisfiable: 416
        ("bytes=100-", 100, UNSATISFIABLE),
        ("bytes=100-200", 100, UNSATISFIABLE),
        ("bytes=-0", 100, UNSATISFIABLE),
        ("bytes=100-,200-300,-0", 100, UNSATISFIABLE),
        # invalid, or not bytes: ignored, 200
        ("bytes=9-0", 100, FULL),
        ("bytes=0-9,5-1", 100, FULL),
        ("bytes=", 100, FULL),
        ("bytes=,", 100, FULL),
        ("bytes=-", 100, FULL),
        ("bytes=a-b", 100, FULL),
        ("bytes=0-9;x", 100, FULL),
        ("bytes=+1-2", 100, FULL),
        ("bytes=١-٢", 100, FULL),
        ("bytes 0-9", 100, FULL),
        ("items=0-9", 100, FULL),
        ("bytes=0-9, bytes=20-29", 100, FULL),  # two Range lines, joined
        # several ranges: one if they coalesce, the whole object otherwise
        ("bytes=0-9,10-19", 100, ByteRange(0, 19)),
        ("bytes=20-29,0-24", 100, ByteRange(0, 29)),
        ("bytes=500-600,601-999", 10000, ByteRange(500, 999)),
        ("bytes=0-9,200-300", 100, ByteRange(0, 9)),  # the other one is unsatisfiable
        ("bytes=0-0,-1", 100, FULL),
        ("bytes=0-9,20-29", 100, FULL),
        (",".join(["bytes=0-1"] + ["0-1"] * ranges.MAX_RANGE_SPECS), 100, FULL),
        # huge numbers saturate, they never raise
        ("bytes=0-" + "9" * 5000, 100, ByteRange(0, 99)),
        ("bytes=" + "9" * 5000 + "-", 100, UNSATISFIABLE),
        ("bytes=-" + "9" * 5000, 100, ByteRange(0, 99)),
        ("bytes=" + "0" * 5000 + "1-2", 100, ByteRange(1, 2)),
        # an empty object: Range is ignored
        ("bytes=0-9", 0, FULL),
        ("bytes=-5", 0, FULL),
    ],
)
def test_parse_range(value: str | None, size: int, expected) -> None:
    assert parse_range(value, size) == expected


def test_content_range() -> None:
    assert ranges.content_range(0, 499, 1234) == "bytes 0-499/1234"
    assert ranges.unsatisfied_range(1234) == "bytes */1234"
    assert ByteRange(10, 19).length == 10


@given(
    st.text(max_size=60) | st.from_regex(r"bytes=[0-9,\- ]{0,40}", fullmatch=True),
    st.integers(0, 10**20),
)
def test_parse_range_never_raises_and_stays_inside(value: str, size: int) -> None:
    result = parse_range(value, size)
    assert result in (FULL, UNSATISFIABLE) or isinstance(result, ByteRange)
    if isinstance(result, ByteRange):
        assert 0 <= result.start <= result.end < size


@given(st.integers(1, 10**6), st.data())
def test_parse_range_single_ranges_match_a_model(size: int, data: st.DataObject) -> None:
    first = data.draw(st.integers(0, 2 * size))
    last = data.draw(st.none() | st.integers(first, 3 * size))
    result = parse_range(f"bytes={first}-{'' if last is None else last}", size)
    if first >= size:
        assert result == UNSATISFIABLE
    else:
        assert result == ByteRange(first, size - 1 if last is None else min(last, size - 1))
    suffix = data.draw(st.integers(0, 2 * size))
    result = parse_range(f"bytes=-{suffix}", size)
    assert result == (UNSATISFIABLE if suffix == 0 else ByteRange(max(size - suffix, 0), size - 1))


# --- conditional requests --------------------------------------------------------------

DATE = "Sun, 06 Nov 1994 08:49:37 GMT"
EARLIER = "Sun, 06 Nov 1994 08:49:36 GMT"
LATER = "Mon, 07 Nov 1994 08:49:37 GMT"


@pytest.mark.parametrize(
    ("if_range", "etag", "last_modified", "allows"),
    [
        (None, '"a"', DATE, True),
        (None, None, None, True),
        ('"a"', '"a"', None, True),
        (' "a" ', '"a"', DATE, True),
        ('"a"', '"b"', DATE, False),
        ('"a"', None, DATE, False),
        ('W/"a"', '"a"', DATE, False),  # a weak tag never passes a strong comparison
        ('"a"', 'W/"a"', DATE, False),
        ("a", "a", DATE, False),  # not an entity tag, and not a date
        (DATE, '"a"', DATE, True),
        (DATE, None, DATE, True),
        (LATER, '"a"', DATE, False),
        ("Sunday, 06-Nov-94 08:49:37 GMT", None, DATE, False),  # same instant, not the same text
        (DATE, '"a"', None, False),
        ("garbage", None, "garbage", False),
    ],
)
def test_if_range_allows(if_range, etag, last_modified, allows: bool) -> None:
    assert conditionals.if_range_allows(if_range, etag, last_modified) is allows


@pytest.mark.parametrize(
    ("request_headers", "etag", "last_modified", "expected"),
    [
        ({}, '"a"', DATE, False),
        ({"If-None-Match": '"a"'}, '"a"', DATE, True),
        ({"if-none-match": 'W/"a"'}, '"a"', DATE, True),  # weak comparison
        ({"If-None-Match": '"a"'}, 'W/"a"', DATE, True),
        ({"If-None-Match": '"x", "y,z", "a"'}, '"a"', DATE, True),
        ({"If-None-Match": '"y,z"'}, '"y,z"', DATE, True),
        ({"If-None-Match": '"b"'}, '"a"', DATE, False),
        ({"If-None-Match": "*"}, None, None, True),
        ({"If-None-Match": '"a"'}, None, DATE, False),
        ({"If-None-Match": "a"}, "a", DATE, False),  # unquoted: not an entity tag
        # If-None-Match decides alone: If-Modified-Since is then ignored
        ({"If-None-Match": '"b"', "If-Modified-Since": LATER}, '"a"', DATE, False),
        ({"If-None-Match": '"a"', "If-Modified-Since": EARLIER}, '"a"', DATE, True),
        ({"If-Modified-Since": DATE}, '"a"', DATE, True),
        ({"If-Modified-Since": LATER}, None, DATE, True),
        ({"If-Modified-Since": EARLIER}, None, DATE, False),
        ({"If-Modified-Since": "Sun Nov  6 08:49:37 1994"}, None, DATE, True),  # asctime
        ({"If-Modified-Since": "Sunday, 06-Nov-94 08:49:37 GMT"}, None, DATE, True),  # RFC 850
        ({"If-Modified-Since": "yesterday"}, None, DATE, False),
        ({"If-Modified-Since": LATER}, None, None, False),
        ({"If-Modified-Since": LATER}, None, "not a date", False),
    ],
)
def test_not_modified(request_headers, etag, last_modified, expected: bool) -> None:
    assert conditionals.not_modified(request_headers, etag, last_modified) is expected


@pytest.mark.parametrize(
    ("request_headers", "etag", "expected"),
    [
        ({}, None, Reason.OK),
        ({"Range": "bytes=0-1"}, 'W/"a"', Reason.OK),
        ({"If-Match": '"a"'}, '"a"', Reason.OK),
        ({"if-unmodified-since": DATE}, '"a"', Reason.OK),
        ({"If-Match": '"a"'}, 'W/"a"', Reason.ORIGIN_PRECONDITION),
        ({"If-Match": '"a"'}, None, Reason.ORIGIN_PRECONDITION),
        ({"If-Unmodified-Since": DATE}, "not-a-tag", Reason.ORIGIN_PRECONDITION),
    ],
)
def test_answers_preconditions(request_headers, etag, expected) -> None:
    assert policy.answers_preconditions(request_headers, etag) == (expected == Reason.OK, expected)


@pytest.mark.parametrize(
    ("request_headers", "etag", "last_modified", "expected"),
    [
        ({}, '"a"', DATE, True),
        # If-Match: strong comparison, any member, `*` for any stored object.
        ({"If-Match": '"a"'}, '"a"', DATE, True),
        ({"If-Match": '"b", "a"'}, '"a"', None, True),
        ({"If-Match": "*"}, '"a"', None, True),
        ({"If-Match": '"b"'}, '"a"', DATE, False),
        ({"If-Match": 'W/"a"'}, '"a"', DATE, False),
        ({"If-Match": '"a"'}, 'W/"a"', DATE, False),
        ({"If-Match": "garbage"}, '"a"', DATE, False),
        # If-Unmodified-Since: Last-Modified not later than the date.
        ({"If-Unmodified-Since": DATE}, '"a"', DATE, True),
        ({"If-Unmodified-Since": LATER}, '"a"', DATE, True),
        ({"If-Unmodified-Since": EARLIER}, '"a"', DATE, False),
        # ... ignored when invalid or without a Last-Modified (RFC 9110 §13.1.4).
        ({"If-Unmodified-Since": "yesterday"}, '"a"', DATE, True),
        ({"If-Unmodified-Since": EARLIER}, '"a"', None, True),
        # ... and ignored when If-Match is there (§13.2.2 evaluates If-Match alone).
        ({"If-Match": '"a"', "If-Unmodified-Since": EARLIER}, '"a"', DATE, True),
        ({"If-Match": '"b"', "If-Unmodified-Since": LATER}, '"a"', DATE, False),
    ],
)
def test_preconditions_hold(request_headers, etag, last_modified, expected: bool) -> None:
    assert conditionals.preconditions_hold(request_headers, etag, last_modified) is expected


def test_conditional_headers() -> None:
    assert policy.conditional_headers('"a"', DATE) == {
        "If-None-Match": '"a"',
        "If-Modified-Since": DATE,
    }
    assert policy.conditional_headers(None, DATE) == {"If-Modified-Since": DATE}
    assert policy.conditional_headers('W/"a"', None) == {"If-None-Match": 'W/"a"'}
    assert policy.conditional_headers(None, None) == {}


# --- freshness -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("revalidate", "request_headers", "expected"),
    [
        (False, {}, False),
        (True, {}, True),
        (False, {"Cache-Control": "no-cache"}, True),
        (False, {"cache-control": "max-age=0, No-Cache"}, True),
        (True, {"Cache-Control": "no-cache"}, True),
        (False, {"Cache-Control": "max-age=0"}, False),  # sent by some clients on every request
        (False, {"Cache-Control": "no-store"}, False),
        (False, {"Pragma": "no-cache"}, True),  # an HTTP/1.0 client
        (False, {"Pragma": "no-cache", "Cache-Control": "max-age=5"}, False),  # Cache-Control wins
        (False, {"Pragma": "x-custom"}, False),
    ],
)
def test_needs_revalidation(revalidate: bool, request_headers, expected: bool) -> None:
    assert policy.needs_revalidation(revalidate, request_headers) is expected


# --- age -------------------------------------------------------------------------------


def test_generated_at_follows_the_age_calculation_of_rfc_9111() -> None:
    date = "Sun, 06 Nov 1994 08:49:37 GMT"
    at = parsedate_to_datetime(date).timestamp()
    # The larger of apparent age (clock skew) and Age plus the response delay wins.
    assert policy.generated_at(at + 9, at + 10, date, "3") == at
    assert policy.generated_at(at + 9, at + 10, date, "30") == at + 10 - 31
    assert policy.generated_at(at - 60, at - 50, date, None) == at - 60  # a Date ahead of us
    assert policy.generated_at(at, at, None, "junk") == at
    assert policy.generated_at(at, at, None, "7200, 0") == at - 7200  # the first member
    assert policy.current_age(at - 100.5, at) == 100
    assert policy.current_age(at + 5, at) == 0


def test_a_stored_response_without_a_valid_date_gets_the_time_it_came() -> None:
    date = "Sun, 06 Nov 1994 08:49:37 GMT"
    at = parsedate_to_datetime(date).timestamp()
    assert policy.dated([("ETag", '"e"'), ("Date", date)], at + 60) == [
        ("ETag", '"e"'),
        ("Date", date),
    ]
    for stored in ([("ETag", '"e"')], [("Date", ""), ("ETag", '"e"')], [("date", "now")]):
        assert policy.dated(stored, at)[-1] == ("Date", date)
        assert len([name for name, _ in policy.dated(stored, at) if name.lower() == "date"]) == 1


def test_relayed_fields_keep_end_to_end_fields_and_drop_hop_by_hop_and_framing() -> None:
    relayed = policy.judge_response(
        200,
        "1.1",
        aiohttp_headers(
            ("Date", "x"),
            ("Age", "5"),
            ("Set-Cookie", "a=b"),
            ("Set-Cookie", "c=d"),
            ("Connection", "close, X-Hop"),
            ("X-Hop", "1"),
            ("Keep-Alive", "timeout=5"),
            ("Content-Length", "3"),
            ("Alt-Svc", 'h3=":443"'),
            ("ETag", '"e"'),
        ),
        0.0,
        0.0,
    )
    assert isinstance(relayed, policy.Kept)
    assert relayed.relayed == (
        ("Date", "x"),
        ("Age", "5"),
        ("Set-Cookie", "a=b"),
        ("Set-Cookie", "c=d"),
        ("ETag", '"e"'),
    )


# --- invalidation ----------------------------------------------------------------------


def test_writes_invalidate_the_target_and_same_origin_locations() -> None:
    url = "https://Data.Example:443/a/b?v=1"
    assert policy.invalidated_keys("GET", 200, url, {}) == []
    assert policy.invalidated_keys("OPTIONS", 200, url, {}) == []
    assert policy.invalidated_keys("PUT", 404, url, {}) == []
    assert policy.invalidated_keys("PUT", 500, url, {}) == []
    assert policy.invalidated_keys("PUT", 204, url, {}) == ["https://data.example/a/b?v=1"]
    assert policy.invalidated_keys("FROB", 302, url, {}) == ["https://data.example/a/b?v=1"]
    headers = {"Location": "../c", "Content-Location": "https://other.example/a/b"}
    assert policy.invalidated_keys("POST", 201, url, headers) == [
        "https://data.example/a/b?v=1",
        "https://data.example/c",
    ]
    assert policy.invalidated_keys("DELETE", 200, url, {"Location": "mailto:x@y"}) == [
        "https://data.example/a/b?v=1"
    ]


def test_a_304_replaces_the_stored_fields_it_names_but_not_the_framing() -> None:
    stored = [("ETag", '"a"'), ("Cache-Control", "max-age=1"), ("X-Meta", "1"), ("X-Meta", "2")]
    answer = aiohttp_headers(
        ("Cache-Control", "max-age=3600"),
        ("X-Meta", "3"),
        ("Content-Length", "0"),
        ("Date", "now"),
        ("Set-Cookie", "a=b"),
    )
    assert policy.updated_headers(stored, answer) == [
        ("ETag", '"a"'),
        ("Cache-Control", "max-age=3600"),
        ("X-Meta", "3"),
        ("Date", "now"),
    ]


# --- freshness (--http-freshness) ---------------------------------------------------------


def test_freshness_lifetime_prefers_max_age_then_expires_then_the_heuristic() -> None:
    date = "Sun, 06 Nov 1994 08:49:37 GMT"
    at = parsedate_to_datetime(date).timestamp()
    expires = ("Expires", "Sun, 06 Nov 1994 09:49:37 GMT")
    modified = ("Last-Modified", "Sun, 06 Nov 1994 06:49:37 GMT")
    lifetime = policy.freshness_lifetime
    assert lifetime([("Cache-Control", "max-age=60"), expires], date, at) == 60
    assert lifetime([("Cache-Control", "max-age=bogus")], date, at) == 0
    assert lifetime([("Cache-Control", "s-maxage=60"), expires], date, at) == 3600
    assert lifetime([("Expires", "0"), modified], date, at) == 0
    assert lifetime([expires], None, at - 600) == 3600 + 600  # received stands in for Date
    assert lifetime([modified], date, at) == 720  # a tenth of two hours
    assert lifetime([], date, at) == 0


@pytest.mark.parametrize(
    "expires, lifetime",
    [
        ("Sun, 06 Nov 1994 09:49:37 GMT", 3600),
        ("Sunday, 06-Nov-94 09:49:37 GMT", 3600),
        ("Sun Nov  6 09:49:37 1994", 3600),
        ("Sun, 06 Nov 1994 09:49:37 UTC", 0),
        ("Sun, 06 Nov 94 09:49:37 GMT", 0),
        ("Sun 06 Nov 1994 09:49:37 GMT", 0),
        ("Sun, 06  Nov  1994 09:49:37 GMT", 0),
        ("Sun, 06-Nov-1994 09:49:37 GMT", 0),
        ("Sun, 06 Nov 1994 09.49.37 GMT", 0),
        ("Sun, 06 Nov 1994 9:49:37 GMT", 0),
        ("sun, 06 NOV 1994 09:49:37 gmt", 3600),
        ("Sun, 31 Feb 1994 09:49:37 GMT", 0),
    ],
)
def test_only_the_three_http_date_formats_are_dates(expires: str, lifetime: int) -> None:
    date = "Sun, 06 Nov 1994 08:49:37 GMT"
    at = parsedate_to_datetime(date).timestamp()
    assert policy.freshness_lifetime([("Expires", expires)], date, at) == lifetime


def test_freshness_honours_no_cache_request_max_age_and_stale_prohibitions() -> None:
    fresh = policy.is_fresh
    assert fresh([], 60, 1000, {}, 1059)
    assert not fresh([], 60, 1000, {}, 1060)
    assert not fresh([("Cache-Control", "no-cache")], 60, 1000, {}, 1001)
    assert fresh([("Cache-Control", 'no-cache="Set-Cookie2"')], 60, 1000, {}, 1001)
    assert not fresh([], 60, 1000, {"Cache-Control": "max-age=0"}, 1001)
    assert fresh([], 60, 1000, {"Cache-Control": "max-age=5"}, 1001)
    assert fresh([], 60, 1000, {"Cache-Control": "min-fresh=10"}, 1050)
    assert not fresh([], 60, 1000, {"Cache-Control": "min-fresh=10"}, 1051)
    assert fresh([], 60, 1000, {"Cache-Control": "max-stale=10"}, 1070)
    assert not fresh([], 60, 1000, {"Cache-Control": "max-stale=10"}, 1071)
    assert fresh([], 60, 1000, {"Cache-Control": "max-stale"}, 10**9)
    assert not fresh(
        [("Cache-Control", "must-revalidate")], 60, 1000, {"Cache-Control": "max-stale"}, 1061
    )
    assert policy.only_if_cached({"Cache-Control": "max-age=5, Only-If-Cached"})
    assert not policy.only_if_cached({"Pragma": "only-if-cached"})
    assert policy.may_serve_stale([("Cache-Control", "max-age=0")])
    assert not policy.may_serve_stale([("Cache-Control", "max-age=0, must-revalidate")])
    assert not policy.may_serve_stale([("Cache-Control", "no-cache")])


def test_directives_remembered_by_value_are_the_same_for_every_reader() -> None:
    # One origin's Cache-Control is parsed once and shared: no reader may change it.
    first = fields.cache_directives([("Cache-Control", "max-age=60, no-cache")])
    with pytest.raises(TypeError):
        first["max-age"] = "0"  # type: ignore[index]
    again = fields.cache_directives({"cache-control": "max-age=60, no-cache"})
    assert again is first
    assert dict(again) == {"max-age": "60", "no-cache": None}


# --- the core's judgement of the common case ---------------------------------------------

_DATES = st.one_of(
    st.integers(0, 4_102_444_800).map(lambda second: dates.http_date(second)),
    st.sampled_from(
        [
            "sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
            "Fri, 30 Feb 2024 00:00:00 GMT",
            "Sun, 06 Nov 1994 08:49:99 GMT",
            "Sun, 06 Nov 0000 08:49:37 GMT",
            " Sun, 06 Nov 1994 08:49:37 GMT",
            "soon",
        ]
    ),
)
_VALUES = {
    "Date": _DATES,
    "Last-Modified": _DATES,
    "Content-Length": st.sampled_from(
        ["0", "16384", "000123", "5, 5", " 7", "7 ", "abc", "", "99999999999999999999"]
    ),
    "ETag": st.sampled_from(['"a"', 'W/"b"', ""]),
    "Connection": st.sampled_from(
        ["keep-alive", "close", "Last-Modified", "x-custom, date", '"quoted"', ", ,", "ETag"]
    ),
    "Cache-Control": st.sampled_from(["max-age=60", "no-store", 'no-cache="x-custom"']),
    "Expires": _DATES,
    "Age": st.sampled_from(["0", "30", "x"]),
    "Vary": st.sampled_from(["Accept-Encoding", "*", "Cookie"]),
    "Content-Encoding": st.sampled_from(["identity", "gzip"]),
    "Transfer-Encoding": st.sampled_from(["chunked"]),
    "Content-Range": st.sampled_from(["bytes 0-9/10"]),
    "Pragma": st.sampled_from(["no-cache"]),
}
_OTHER_FIELDS = [
    "Server", "X-Custom", "Set-Cookie", "Set-Cookie2", "Alt-Svc", "Keep-Alive",
    "Access-Control-Allow-Origin", "Proxy-Connection", "Content-Type", "Trailer",
]
_DEFERRED = ("Cache-Control", "Expires", "Age", "Vary", "Content-Encoding", "Transfer-Encoding")


def _lines(names: list[str]) -> st.SearchStrategy[tuple[str, str]]:
    return st.sampled_from(names).flatmap(lambda name: st.tuples(st.just(name), _VALUES[name]))


# Most lines of a kind the core judges (a Connection, another Date, a field never
# replayed), some of a kind it leaves to Python.
_FIELD = st.one_of(
    _lines([name for name in _VALUES if name not in _DEFERRED]),
    st.tuples(st.sampled_from(_OTHER_FIELDS), st.sampled_from(["v", "a=b", ""])),
    _lines(["Connection"]),
    _lines(list(_DEFERRED)),
).flatmap(
    # A name in any case: the rules read names case-insensitively.
    lambda line: st.sampled_from([str.lower, str.upper, str]).map(
        lambda case: (case(line[0]), line[1])
    )
)
# The head nearly every dataset origin sends, which the core judges on its own.
_COMMON_HEAD = [
    ("Server", "nginx"),
    ("Date", "Mon, 07 Dec 2026 23:00:00 GMT"),
    ("Content-Length", "16384"),
    ("Last-Modified", "Mon, 07 Dec 2026 22:00:00 GMT"),
    ("ETag", '"6571b2c0-4000"'),
]


@settings(max_examples=500)
@given(
    status=st.sampled_from([200, 200, 200, 200, 206, 304, 404]),
    version=st.sampled_from(["1.1", "1.1", "1.0"]),
    # The common head, most of it, with a few lines of any kind among it.
    head=st.tuples(
        st.lists(st.sampled_from(_COMMON_HEAD), min_size=2, max_size=5, unique=True),
        st.lists(_FIELD, max_size=3),
    ).flatmap(lambda parts: st.permutations(parts[0] + parts[1])),
    received=st.floats(1.7e9, 1.9e9),
    round_trip=st.floats(0, 5),
)
def test_what_the_core_judges_alone_python_judges_alike(
    status: int, version: str, head: list[tuple[str, str]], received: float, round_trip: float
) -> None:
    """Every response the core's judgement keeps on its own (`native.JudgeRules`: the
    common case) is kept by Python's own rules (`_judge`) with the same fields stored
    and relayed, the same validators, the same moment of generation and lifetime; the
    rest it leaves to Python."""
    requested = received - round_trip
    common = policy._COMMON.judge(status, version, head, requested, received)
    event("judged by the core" if common is not None else "left to Python")
    if common is not None:
        assert policy.Kept._make(common) == policy._judge(
            status, version, head, requested, received, None
        )


@pytest.mark.parametrize(
    "head",
    [
        _COMMON_HEAD,
        [*_COMMON_HEAD, ("Connection", "keep-alive"), ("Accept-Ranges", "bytes")],
        # S3's: fields of its own, and a Set-Cookie that is never replayed.
        [
            ("x-amz-id-2", "abc"),
            ("Date", "Mon, 07 Dec 2026 23:00:00 GMT"),
            ("Last-Modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("ETag", '"9b2cf535f27731c974343645a3985328"'),
            ("x-amz-version-id", "null"),
            ("Content-Length", "5"),
            ("Set-Cookie", "a=b"),
        ],
    ],
)
def test_a_dataset_origins_head_is_judged_by_the_core(head: list[tuple[str, str]]) -> None:
    now = 1_796_684_400.25
    common = policy._COMMON.judge(200, "1.1", head, now - 0.5, now)
    assert common is not None
    assert policy.Kept._make(common) == policy._judge(200, "1.1", head, now - 0.5, now, None)
    assert policy.judge_response(200, "1.1", head, now - 0.5, now) == policy.Kept._make(common)
