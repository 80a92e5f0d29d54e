"""HTTP-dates (RFC 9110 §5.6.7): parsed strictly, formatted once per second."""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime
from email.utils import formatdate

_DAY = "(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTH = f"({'|'.join(_MONTHS)})"
_TIME = "([0-9]{2}):([0-9]{2}):([0-9]{2})"
# RFC 9110 §5.6.7: IMF-fixdate `Sun, 06 Nov 1994 08:49:37 GMT`, rfc850-date
# `Sunday, 06-Nov-94 08:49:37 GMT`, asctime-date `Sun Nov  6 08:49:37 1994`. The grammar
# is case-sensitive, but a name in the wrong case still says which day it means.
_IMF_FIXDATE = re.compile(f"{_DAY}, ([0-9]{{2}}) {_MONTH} ([0-9]{{4}}) {_TIME} GMT", re.IGNORECASE)
_RFC850_DATE = re.compile(
    f"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), "
    f"([0-9]{{2}})-{_MONTH}-([0-9]{{2}}) {_TIME} GMT",
    re.IGNORECASE,
)
_ASCTIME_DATE = re.compile(
    f"{_DAY} {_MONTH} ([0-9]{{2}}| [0-9]) {_TIME} ([0-9]{{4}})", re.IGNORECASE
)


def parse_http_date(value: str) -> datetime | None:
    """An HTTP-date in one of RFC 9110 §5.6.7's three formats, as an aware UTC datetime;
    None for anything else.

    Strict on purpose (but for the case of names): lenient parsers read `Thu, 18 Aug 50
    ...`, a `UTC` or `AEST` zone or a one-digit hour as some moment, but "a cache
    recipient MUST interpret invalid date formats ... as representing a time in the
    past (i.e., 'already expired')" (RFC 9111 §5.3), and invalid `If-Modified-Since` and
    `If-Unmodified-Since` values MUST be ignored (RFC 9110 §13.1.3, §13.1.4). A
    two-digit rfc850 year more than 50 years ahead is "the most recent year in the past
    that had the same last two digits".
    """
    return _parsed(value.strip(), datetime.now(UTC).year)


@functools.lru_cache(maxsize=1024)
def _parsed(text: str, this_year: int) -> datetime | None:
    # Remembered: an origin's responses share their Date within each second, and a data
    # set's files often their Last-Modified; a miss reads both more than once.
    if match := _IMF_FIXDATE.fullmatch(text):
        day, month, year, hour, minute, second = match.groups()
    elif match := _ASCTIME_DATE.fullmatch(text):
        month, day, hour, minute, second, year = match.groups()
    elif match := _RFC850_DATE.fullmatch(text):
        day, month, short_year, hour, minute, second = match.groups()
        year_value = this_year - this_year % 100 + int(short_year)
        year = str(year_value - 100 if year_value > this_year + 50 else year_value)
    else:
        return None
    try:
        return datetime(
            int(year),
            _MONTHS.index(month.capitalize()) + 1,
            int(day),
            int(hour),
            int(minute),
            min(int(second), 59),  # 60 is a leap second
            tzinfo=UTC,
        )
    except ValueError:  # Feb 30, hour 25, ...
        return None


@functools.lru_cache(maxsize=4)
def _formatted_date(second: int) -> str:
    return formatdate(second, usegmt=True)


def http_date(now: float) -> str:
    """`now` as an IMF-fixdate (RFC 9110 §5.6.7), formatted once per second."""
    return _formatted_date(int(now))
