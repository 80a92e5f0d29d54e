"""Header fields (RFC 9110 §5): lookup in any mapping, lists, quoted strings, and the
fields whose syntax every HTTP party reads the same way (Content-Length, Cache-Control,
the hop-by-hop set).

Header arguments are any `Mapping[str, str]` (a dict, mitmproxy's `Headers`, a
multidict) or a stored object's (name, value) pairs, always read case-insensitively
through `header()`.
"""

from __future__ import annotations

import functools
import re
import types
from collections.abc import Iterable, Mapping, Sequence

from multidict import CIMultiDict, CIMultiDictProxy

# A headers mapping, or stored fields as (name, value) pairs.
Headers = Mapping[str, str] | Sequence[tuple[str, str]]

# The multidicts `header()` asks by name rather than scanning (a tuple: a union made at
# each call would cost every lookup an allocation).
_MULTIDICTS = (CIMultiDictProxy, CIMultiDict)

# Longer numbers (after leading zeros) are absurd for a size or an offset: 10**19 bytes is
# beyond any object, and int() of thousands of digits raises. RFC 9110 §14.1.2:
# "recipients MUST anticipate potentially large decimal numerals and prevent parsing
# errors due to integer conversion overflows".
MAX_DIGITS = 19


class Fields(dict[str, str]):
    """A head's fields by lower-case name, several lines joined with ", " (RFC 9110
    §5.3): built once per request, or per origin's response that a fill judges, so that
    each lookup is one dictionary access."""

    @classmethod
    def of(cls, lines: Iterable[tuple[str, str]]) -> Fields:
        fields = cls()
        for name, value in lines:
            key = name.lower()
            fields[key] = f"{fields[key]}, {value}" if key in fields else value
        return fields

    @classmethod
    def view(cls, headers: Headers) -> Fields:
        """`headers` by lower-case name (itself when it is one already): what reads
        several fields of the same headers builds once, rather than scan them each time."""
        return headers if isinstance(headers, Fields) else cls.of(field_lines(headers))


def field_lines(headers: Headers) -> Iterable[tuple[str, str]]:
    """The (name, value) lines of any headers, in their order: a mapping's items (for a
    multidict, one per line), or the pairs themselves."""
    # Asked by attribute: Mapping's isinstance check is an ABC's, a Python call.
    return headers.items() if hasattr(headers, "items") else headers


def header(headers: Headers, name: str) -> str | None:
    """The value of field `name` in any headers mapping, case-insensitively; None if absent.

    Several lines of the same field are joined with ", ", which RFC 9110 §5.3 makes
    equivalent to one line ("A recipient MAY combine multiple field lines ... into one
    field line ... by appending each subsequent field line value to the combined field
    line value in order, separated by a comma"). Scanning `items()` works for every
    mapping we meet: a plain dict holds one entry per spelling, mitmproxy's `Headers`
    yields each name once with its lines already joined, aiohttp's multidicts yield
    every line. The fields of an origin's response (a case-insensitive multidict, asked
    a score of times per miss) and `Fields` are looked up instead.
    """
    if isinstance(headers, _MULTIDICTS):
        lines = headers.getall(name, ())
        return ", ".join(lines) if lines else None
    wanted = name.lower()
    if isinstance(headers, Fields):
        return headers.get(wanted)
    # Pairs (a stored object's) are asked of first: Mapping's check is an ABC's, slower.
    if isinstance(headers, (tuple, list)):
        fields: Iterable[tuple[str, str]] = headers
    else:
        fields = headers.items() if isinstance(headers, Mapping) else headers
    values = [value for key, value in fields if key.lower() == wanted]
    return ", ".join(values) if values else None


def split_list(value: str) -> list[str]:
    """The members of a comma-separated field value (RFC 9110 §5.6.1), quoted strings intact.

    Empty members are dropped: "a recipient MUST parse and ignore a reasonable number of
    empty list elements".
    """
    members: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for char in value:
        if escaped:
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == "," and not quoted:
            members.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    members.append("".join(current).strip())
    return [member for member in members if member]


def unquote(value: str) -> str:
    """A quoted-string's content (RFC 9110 §5.6.4); a token is returned as it is."""
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def cache_directives(headers: Headers) -> Mapping[str, str | None]:
    """The Cache-Control directives (RFC 9111 §5.2): lower-cased name -> argument or None."""
    return directives(header(headers, "Cache-Control") or "")


@functools.lru_cache(maxsize=256)
def directives(value: str) -> Mapping[str, str | None]:
    """The directives of a Cache-Control value, as `cache_directives` reads them."""
    # Remembered by value: an origin sends the same Cache-Control with every object, and
    # a miss asks for it several times. Read-only, as it is shared.
    parsed: dict[str, str | None] = {}
    for member in split_list(value):
        name, sep, argument = member.partition("=")
        parsed.setdefault(name.strip().lower(), unquote(argument.strip()) if sep else None)
    return types.MappingProxyType(parsed)


def content_length(headers: Headers) -> int | None:
    """The Content-Length as a number; None when absent or invalid.

    Identical repeated values count as one ("a recipient MAY ... replace that invalid
    field value with a single instance of the decimal value", RFC 9110 §8.6).
    """
    value = header(headers, "Content-Length")
    return None if value is None else parse_length(value)


def parse_length(value: str) -> int | None:
    """A Content-Length value as a number, as `content_length` reads it; None if invalid."""
    members = {member.strip() for member in value.split(",")}
    if len(members) != 1:
        return None
    (digits,) = members
    if not digits or not digits.isascii() or not digits.isdigit():
        return None
    return int(digits) if len(digits.lstrip("0")) <= MAX_DIGITS else None


def body_length(headers: Headers) -> int | None:
    """The length of a response's body as its head says it; None when only the body's
    end will tell. RFC 9112 §6.3: "If a message is received with both a
    Transfer-Encoding and a Content-Length header field, the Transfer-Encoding overrides
    the Content-Length"; without either, the body ends with the connection."""
    if header(headers, "Transfer-Encoding") is not None:
        return None
    return content_length(headers)


# Hop-by-hop fields describe one connection and are never forwarded or replayed
# (RFC 9110 §7.6.1; RFC 9111 §3.1).
HOP_BY_HOP = frozenset(
    "connection proxy-connection keep-alive te transfer-encoding trailer upgrade"
    " proxy-authenticate proxy-authentication-info proxy-authorization".split()
)
