"""RFC 9112's refusals as pure decisions (the cases the end-to-end table leaves out), and
the authority a request's Host is compared by and an origin is sent."""

from __future__ import annotations

from http import HTTPStatus
from urllib.parse import urlsplit

import pytest

from sidecar.wire.client import Route, request_head
from sidecar.wire.framing import authority, ends_by_close, request_head_error

HOST = ["origin.test"]


@pytest.mark.parametrize(
    ("version", "hosts", "target", "te", "status"),
    [
        ("1.1", HOST, "/f", None, None),
        ("1.0", [], "/f", None, None),  # §3.2: Host is required of HTTP/1.1 only
        ("1.1", HOST, "http://origin.test/f", None, None),
        # §3.2.2, RFC 9110 §4.2.3: the scheme's default port, case and userinfo aside
        ("1.1", ["origin.test:80"], "http://Origin.Test/f", None, None),
        ("1.1", HOST, "https://origin.test:443/f?q", None, None),
        ("1.1", HOST, "http://user@origin.test/f", None, None),
        ("1.1", HOST, "http://origin.test:8080/f", None, HTTPStatus.BAD_REQUEST),
        ("1.1", HOST, "http://origin.test", None, None),
        ("1.1", HOST, "/f", "Chunked", None),
        ("1.1", HOST, "/f", ",chunked", None),
        # §6.1: chunked at most once; §6.3: a request's last coding, or a 400
        ("1.1", HOST, "/f", "chunked, chunked", HTTPStatus.BAD_REQUEST),
        ("1.1", HOST, "/f", "chunked, gzip", HTTPStatus.BAD_REQUEST),
        ("1.1", HOST, "/f", "chunked,", HTTPStatus.BAD_REQUEST),
        ("1.1", HOST, "/f", "gzip", HTTPStatus.BAD_REQUEST),
        ("1.1", HOST, "/f", "", HTTPStatus.BAD_REQUEST),
        # §6.1: a coding we do not decode, chunked last
        ("1.1", HOST, "/f", "gzip, chunked", HTTPStatus.NOT_IMPLEMENTED),
        ("3.0", HOST, "/f", None, HTTPStatus.HTTP_VERSION_NOT_SUPPORTED),
        ("0.9", [], "/f", None, HTTPStatus.BAD_REQUEST),
    ],
)
def test_request_heads(
    version: str, hosts: list[str], target: str, te: str | None, status: HTTPStatus | None
) -> None:
    refusal = request_head_error(version, hosts, target, te)
    assert (refusal[0] if refusal else None) == status, refusal


@pytest.mark.parametrize(
    ("method", "status", "fields", "closes"),
    [
        ("GET", 200, [], True),
        ("GET", 200, [("Content-Length", "5")], False),
        ("GET", 200, [("transfer-encoding", "chunked")], False),
        ("HEAD", 200, [], False),
        ("GET", 204, [], False),
        ("GET", 304, [], False),
        ("GET", 103, [], False),
        ("POST", 500, [("Content-Type", "text/plain")], True),
    ],
)
def test_only_a_response_that_may_have_a_body_and_has_no_framing_ends_by_the_close(
    method: str, status: int, fields: list[tuple[str, str]], closes: bool
) -> None:
    # RFC 9112 §6.3, rules 1 and 8.
    assert ends_by_close(method, status, fields) is closes


@pytest.mark.parametrize(
    ("scheme", "netloc", "expected"),
    [
        ("https", "Origin.Test", "origin.test"),
        ("https", "origin.test:443", "origin.test"),
        ("HTTP", "origin.test:80", "origin.test"),
        ("http", "origin.test:443", "origin.test:443"),
        ("https", "user:secret@origin.test:8443", "origin.test:8443"),
        ("https", "[::1]:443", "[::1]"),
        ("http", "[::1]:8080", "[::1]:8080"),
    ],
)
def test_an_authority_is_compared_and_sent_without_userinfo_case_or_default_port(
    scheme: str, netloc: str, expected: str
) -> None:
    # RFC 9110 §4.2.3. The same function says what a client's Host is compared by and
    # what an origin is sent.
    assert authority(scheme, netloc) == expected
    head = request_head(Route("h", 1, None), "GET", urlsplit(f"{scheme}://{netloc}/f"), [], False)
    assert f"\r\nHost: {expected}\r\n".encode() in head
