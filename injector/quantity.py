"""Kubernetes resource quantities: parsing (`128Mi`, `1.5G`, `100m`, `1e3`) and byte spellings.

The injector adds the burst buffer's size to the sidecar's memory (or ephemeral-storage)
requests and limits, so it needs the exact value of a quantity, not just its text. The
grammar is the API server's (k8s.io/apimachinery resource.Quantity): a signed decimal
number, then a binary suffix (Ki..Ei), a decimal suffix (n, u, m, k, M..E) or an
exponent (`e3`, `E-2`).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY_RE = re.compile(
    r"^(?P<number>[+-]?(?:\d+\.?\d*|\.\d+))"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?|[eE](?P<exponent>[+-]?\d+))$"
)


def parse_quantity(text: str | int) -> Fraction:
    """The exact value of a Kubernetes quantity (`"128Mi"` -> 134217728).

    Raises ValueError for anything the API server would refuse.
    """
    if isinstance(text, bool):
        raise ValueError(f"invalid quantity {text!r}")
    if isinstance(text, int):
        return Fraction(text)
    match = _QUANTITY_RE.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"invalid quantity {text!r}: expected e.g. 128Mi, 1G or 500m")
    number = Fraction(match["number"])
    if match["exponent"] is not None:
        exponent = int(match["exponent"])
        if abs(exponent) > 30:
            raise ValueError(f"invalid quantity {text!r}: exponent out of range")
        return number * Fraction(10) ** exponent
    suffix = match["suffix"] or ""
    return number * (_BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix])


def parse_bytes(text: str | int) -> int:
    """A quantity of bytes, rounded up to a whole byte (`"1.5Gi"`, `"2G"`, `1048576`)."""
    value = math.ceil(parse_quantity(text))
    if value <= 0:
        raise ValueError(f"invalid size {text!r}: must be positive")
    return value


def format_bytes(size: int) -> str:
    """The shortest exact quantity for a number of bytes (`2**30` -> `1Gi`, `10**10` -> `10G`).

    Of equally short spellings the binary one wins (what users write for memory).
    """
    if size == 0:
        return "0"
    multipliers = [*_BINARY.items(), *((suffix, int(_DECIMAL[suffix])) for suffix in "kMGTPE")]
    spellings = [f"{size // m}{suffix}" for suffix, m in multipliers if size % m == 0]
    return min([*spellings, str(size)], key=len)
