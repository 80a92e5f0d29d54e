"""Conditional requests (RFC 9110 §13) evaluated against a representation's validators:
entity tags, If-Match, If-Unmodified-Since, If-None-Match, If-Modified-Since, If-Range.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from sidecar.wire import dates
from sidecar.wire.fields import Headers, header, split_list

_ENTITY_TAG = re.compile(r'(W/)?("[^"]*")')


class EntityTag(NamedTuple):
    weak: bool
    opaque: str  # with its quotes


def entity_tag(value: str) -> EntityTag | None:
    match = _ENTITY_TAG.fullmatch(value.strip())
    return EntityTag(match[1] is not None, match[2]) if match else None


def if_range_allows(if_range: str | None, etag: str | None, last_modified: str | None) -> bool:
    """Does `If-Range` let the Range apply to the stored object? (RFC 9110 §13.1.5).

    True without If-Range. An entity tag must match the stored ETag by strong comparison
    ("the condition is true if the entity-tag validator provided exactly matches the
    ETag field value ... using the strong comparison function"): a weak tag on either
    side never matches. A date must exactly match the stored Last-Modified ("the
    condition is true if the HTTP-date validator provided exactly matches the
    Last-Modified field value"); a stored object never changes, so its Last-Modified
    counts as strong. False means: ignore the Range and send the whole object. The
    caller asks only when the request has a Range (If-Range alone is ignored, §13.1.5).
    """
    if if_range is None:
        return True
    value = if_range.strip()
    if value.startswith(('"', "W/")):  # "examining the first three characters"
        wanted, stored = entity_tag(value), entity_tag(etag) if etag else None
        return (
            wanted is not None
            and stored is not None
            and not wanted.weak
            and not stored.weak
            and wanted.opaque == stored.opaque
        )
    return (
        last_modified is not None
        and value == last_modified.strip()
        and dates.parse_http_date(value) is not None
    )


def has_precondition(request_headers: Headers) -> bool:
    """Does the request carry `If-Match` or `If-Unmodified-Since`?"""
    return (
        header(request_headers, "If-Match") is not None
        or header(request_headers, "If-Unmodified-Since") is not None
    )


def _listed(tags: str, etag: str | None, strong: bool) -> bool:
    """Does an If-Match or If-None-Match list name the stored ETag? `*` names any stored
    object; otherwise a listed tag must match by the strong comparison (neither tag weak)
    or the weak one (RFC 9110 §8.8.3.2)."""
    members = split_list(tags)
    if "*" in members:
        return True
    stored = entity_tag(etag) if etag else None
    if stored is None or (strong and stored.weak):
        return False
    return any(
        (tag := entity_tag(member)) is not None
        and not (strong and tag.weak)
        and tag.opaque == stored.opaque
        for member in members
    )


def preconditions_hold(
    request_headers: Headers, etag: str | None, last_modified: str | None
) -> bool:
    """Steps 1 and 2 of RFC 9110 §13.2.2 for a GET or HEAD: False means 412.

    If-Match first (§13.1.1): `*` holds for any stored object; otherwise some listed
    tag must match the ETag by strong comparison ("An origin server MUST use the strong
    comparison function when comparing entity tags for If-Match"). Only without
    If-Match, If-Unmodified-Since (§13.1.4): it holds when the object's Last-Modified is
    "earlier than or equal to the date provided", and is ignored when it is not a valid
    HTTP-date or the object has no Last-Modified ("A recipient MUST ignore the
    If-Unmodified-Since header field if the resource does not have a modification date
    available").
    """
    if_match = header(request_headers, "If-Match")
    if if_match is not None:
        return _listed(if_match, etag, strong=True)
    if_unmodified_since = header(request_headers, "If-Unmodified-Since")
    if if_unmodified_since is None or last_modified is None:
        return True
    since, modified = (
        dates.parse_http_date(if_unmodified_since),
        dates.parse_http_date(last_modified),
    )
    return since is None or modified is None or modified <= since


def not_modified(request_headers: Headers, etag: str | None, last_modified: str | None) -> bool:
    """Should a GET or HEAD be answered 304 from the stored object's validators?

    RFC 9110 §13.2.2: If-None-Match is evaluated first and, when present, decides alone
    ("A recipient MUST ignore If-Modified-Since if the request contains an If-None-Match
    header field", §13.1.3). It is compared weakly ("A recipient MUST use the weak
    comparison function when comparing entity tags for If-None-Match", §13.1.2); `*`
    matches any stored object. Otherwise If-Modified-Since, when it is a valid date,
    gives 304 if the stored Last-Modified is not later. Without a stored Last-Modified
    the answer is no: a full 200 is always a correct answer to a conditional GET.
    """
    if_none_match = header(request_headers, "If-None-Match")
    if if_none_match is not None:
        return _listed(if_none_match, etag, strong=False)
    if_modified_since = header(request_headers, "If-Modified-Since")
    if if_modified_since is None or last_modified is None:
        return False
    since, modified = dates.parse_http_date(if_modified_since), dates.parse_http_date(last_modified)
    return since is not None and modified is not None and modified <= since
