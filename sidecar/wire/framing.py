"""RFC 9112's rules on which HTTP/1.x messages are refused, and after which a connection
must close, whichever parser read them; and the chunked coding that Python writes.

Both front ends (the lean server with the Rust core's parser, mitmproxy with its own)
and the client towards origins (the core's parser again) ask these pure functions, so
that they refuse the same messages for the same reasons. The parsers frame messages and
hand over more than the RFC allows (a request line without a version, `HTTP/2.0` in
one, a status of 600); these are the checks they leave to us.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from http import HTTPStatus

# RFC 9112 §7.1: last-chunk and the empty trailer section that end a chunked body.
LAST_CHUNK = b"0\r\n\r\n"


def chunk(data: bytes) -> bytes:
    """`data` as one chunk of a chunked body (RFC 9112 §7.1); never give it empty bytes,
    which would be the last chunk."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def request_head_error(
    version: str, hosts: Sequence[str], target: str, transfer_encoding: str | None
) -> tuple[HTTPStatus, str] | None:
    """Why a request head must be refused, with the status to answer; None if it may go on.

    `version` as the request line gave it (`1.1`, `0.9` for a line without one), `hosts`
    the values of every Host line, `target` the request target, `transfer_encoding` the
    field's lines joined. The two front ends parse with different parsers and both ask
    this, so that they refuse the same requests.
    """
    # RFC 9112 §2.3, §3: request-line = method SP request-target SP HTTP-version; a line
    # without a version is HTTP/0.9, which no client of ours speaks. A server "can send a
    # 505 (HTTP Version Not Supported) response if it wishes ... to refuse service of the
    # client's major protocol version".
    if version not in ("1.1", "1.0"):
        if version.startswith("0."):
            return HTTPStatus.BAD_REQUEST, "the request line has no HTTP/1.x version"
        return HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"HTTP/{version} is not spoken here"
    # §3.2: "A server MUST respond with a 400 (Bad Request) status code to any HTTP/1.1
    # request message that lacks a Host header field and to any request message that
    # contains more than one Host header field line or a Host header field with an
    # invalid field value."
    if len(hosts) > 1:
        return HTTPStatus.BAD_REQUEST, "the request has more than one Host field"
    if not hosts and version == "1.1":
        return HTTPStatus.BAD_REQUEST, "the request has no Host field"
    # §3.2.2: an absolute-form target names the origin and Host must agree with it
    # (nginx and HAProxy refuse a request where they differ, as a smuggling sign).
    scheme, sep, rest = target.partition("://")
    if sep and hosts:
        named = authority(scheme, rest.split("/", 1)[0].split("?", 1)[0])
        if named != authority(scheme, hosts[0].strip()):
            return HTTPStatus.BAD_REQUEST, "the Host field differs from the target's authority"
    if transfer_encoding is not None:
        codings = [c.strip(" \t").lower() for c in transfer_encoding.split(",")]
        # §6.3: "If a Transfer-Encoding header field is present in a request and the
        # chunked transfer coding is not the final encoding, the message body length
        # cannot be determined reliably; the server MUST respond with the 400"; §6.1: "A
        # sender MUST NOT apply the chunked transfer coding more than once". The core's
        # parser refuses these itself; mitmproxy's front end asks here.
        if codings[-1] != "chunked" or codings.count("chunked") > 1:
            return HTTPStatus.BAD_REQUEST, f"Transfer-Encoding {transfer_encoding!r}"
        # §6.1: "If any transfer coding other than chunked is applied to a request's
        # content, the sender MUST apply chunked as the final transfer coding"; we decode
        # no other coding, and, as nginx does, refuse them: "A server that receives a
        # request message with a transfer coding it does not understand SHOULD respond
        # with 501".
        if [c for c in codings if c] != ["chunked"]:
            return HTTPStatus.NOT_IMPLEMENTED, f"Transfer-Encoding {transfer_encoding!r}"
    return None


def faulty_framing(version: str, transfer_encoding: str | None) -> bool:
    """Is this message's framing faulty, whatever it looks like? RFC 9112 §6.1: "A server
    or client that receives an HTTP/1.0 message containing a Transfer-Encoding header
    field MUST treat the message as if the framing is faulty, even if a Content-Length is
    present, and close the connection after processing the message."

    The message is still read (its chunks decoded) and relayed; the connection closes
    after it, whatever it asks, and a cache does not keep it
    (`sidecar.cache.policy.judge_response`): a body framed by rules its sender's
    version does not have may not be the body its sender meant.
    """
    return transfer_encoding is not None and version == "1.0"


# The fields that frame a message's body (RFC 9112 §6.1, §6.2).
_FRAMING_FIELDS = frozenset(("content-length", "transfer-encoding"))


def ends_by_close(method: str, status: int, fields: Sequence[tuple[str, str]]) -> bool:
    """Can only closing the connection end this response? RFC 9112 §6.3: a response to
    HEAD, and a 1xx, 204 or 304, has no body; any other without Transfer-Encoding or
    Content-Length "is determined by the number of octets received prior to the server
    closing the connection"."""
    if method == "HEAD" or status < 200 or status in (204, 304):
        return False
    return _FRAMING_FIELDS.isdisjoint([name.lower() for name, _ in fields])


@functools.lru_cache(maxsize=256)
def authority(scheme: str, netloc: str) -> str:
    """`host[:port]` of a URL's `netloc` (or of a Host field), in lower case, without
    userinfo and without the scheme's default port (RFC 9110 §4.2.3): what a request's
    Host says, and what its target's authority is compared by. Remembered: every request
    to an origin sends the same."""
    netloc = netloc.rpartition("@")[2].lower()
    default = {"http": ":80", "https": ":443"}.get(scheme.lower())
    if default and netloc.endswith(default):
        return netloc[: -len(default)]
    return netloc


def response_head_error(
    status: int, fields: Sequence[tuple[str, str]], upgrade: bool = False
) -> str | None:
    """Why a response head cannot be relayed, or None; `upgrade`: the request asked to
    switch protocols.

    RFC 9110 §15: "Values outside the range 100..599 are invalid." §15.2: a 1xx response
    "is terminated by the end of the header section; it cannot contain content or
    trailers": one that announces a body is framed by nobody's rules, and what follows it
    (another response, perhaps) cannot be trusted. A 101 must have been asked for
    (§15.2.2, §7.8).
    """
    if not 100 <= status <= 599:
        return f"the origin answered with status {status}, outside 100-599"
    if status == 101:
        return None if upgrade else "the origin switched protocols, which was not asked for"
    if status < 200 and any(
        (name.lower() == "content-length" and value.strip() != "0")
        or name.lower() == "transfer-encoding"
        for name, value in fields
    ):
        return f"the origin sent a {status} interim response with a body"
    return None
