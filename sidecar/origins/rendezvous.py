"""Rendezvous (highest-random-weight) hashing: which parent cache holds an object.

Every sidecar of a cluster computes, for a cache key, a weight per parent from a hash
of (parent, key) and sends the object to the parent with the highest weight. Sidecars
agree without talking to each other, each object lives in one parent, and adding a
parent moves only the objects it now wins (about 1/N of them), removing one moves only
its own: unlike `hash(key) % N`, which reshuffles nearly everything (Thaler and
Ravishankar 1998; Squid's CARP is the same idea for Squid's own children).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def weight(parent: str, key: str) -> int:
    """The weight of `parent` for `key`: 64 bits of BLAKE2b over both, stable across
    processes and versions (Python's own `hash()` is salted per process)."""
    digest = hashlib.blake2b(f"{parent}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def choose(key: str, parents: Sequence[str]) -> str:
    """The parent that holds `key`: the one of highest weight (ties: the smaller name,
    so every sidecar picks the same one). Raises ValueError without parents."""
    if not parents:
        raise ValueError("no parent to choose from")
    return max(parents, key=lambda parent: (weight(parent, key), _reverse(parent)))


def _reverse(name: str) -> tuple[int, ...]:
    # max() then prefers the lexicographically smaller name on equal weights.
    return tuple(-ord(char) for char in name)
