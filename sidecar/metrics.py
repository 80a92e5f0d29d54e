"""The sidecar's counters, exposed as Prometheus metrics and as the `/stats` JSON.

Each worker process counts in plain integers; at scrape time the parent asks every
worker for its counters, adds them up with the buffer's gauges, and renders both
`/metrics` (`sidecar.runtime.exposition`) and `/stats` from that one sum, so the two can never
disagree.

Definitions (DESIGN.md): a *hit* is a GET or HEAD answered from a stored object
(Range included); a *miss* is a cacheable GET that started an upstream fill;
*coalesced* counts clients that joined a fill already in progress; a *pass* is a
request served from upstream without storing (not cacheable, not admitted).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

# Conditions such as "buffer full" or "tmpfs read-only" are logged at most this often.
_CONDITION_LOG_INTERVAL = 60.0  # seconds


@dataclass
class Counters:
    hits: int = 0
    hits_answered_by_core: int = 0  # the worker adds the core's count (`native.Answers`)
    answers_displaced: int = 0  # the same
    misses: int = 0
    coalesced: int = 0
    passes: int = 0
    bytes_from_buffer: int = 0
    bytes_from_upstream: int = 0
    upstream_requests: int = 0
    upstream_errors: int = 0
    admissions_refused: int = 0
    buffer_errors: int = 0
    client_aborts: int = 0
    tunnelled_connections: int = 0
    tunnelled_bytes: int = 0
    pass_reasons: collections.Counter[str] = field(default_factory=collections.Counter)
    tunnel_reasons: collections.Counter[str] = field(default_factory=collections.Counter)
    parent_requests: int = 0
    parent_failures: collections.Counter[str] = field(default_factory=collections.Counter)
    parent_bypasses: collections.Counter[str] = field(default_factory=collections.Counter)
    parent_state: dict[str, int] = field(default_factory=dict)  # parent -> 1 used, 0 skipped


COUNTER_HELP = {
    "hits": "Requests answered from a stored object (GET or HEAD, ranges included).",
    "hits_answered_by_core": (
        "Of the hits, those the Rust core sent again from its table of recorded answers."
    ),
    "answers_displaced": (
        "Answers of the core's table that gave way to others while still valid: more than a"
        " few per epoch say --index-objects is too small for the objects read."
    ),
    "misses": "Cacheable GETs that started an upstream fill.",
    "coalesced": "Clients served by joining a fill already in progress.",
    "passes": "Requests served from upstream without storing the object.",
    "bytes_from_buffer": "Body bytes sent to clients from the buffer.",
    "bytes_from_upstream": "Body bytes received from origins by fills and passes.",
    "upstream_requests": "Requests sent to origins by the sidecar's own fetcher.",
    "upstream_errors": "Upstream requests that failed (connect, TLS, reset, short body).",
    "admissions_refused": "Cacheable objects passed through because the buffer had no room.",
    "buffer_errors": "Buffer operations that failed (disk full, read-only, index busy).",
    "client_aborts": "Responses cut short because the client went away.",
    "tunnelled_connections": "Connections tunnelled untouched (see tunnels_by_reason).",
    "tunnelled_bytes": (
        "Bytes relayed untouched through tunnels and upgraded connections, both directions"
        " (never cached)."
    ),
    "parent_requests": "Requests sent to a parent cache (--parent).",
}
# Counters by reason: the /stats key, and the Prometheus family with its help.
REASON_COUNTERS = {
    "pass_reasons": ("burstbuffer_passes_by_reason", "Passes by reason."),
    "tunnel_reasons": (
        "burstbuffer_tunnels_by_reason",
        "Connections tunnelled untouched, by reason (a host not intercepted, a client"
        " whose ALPN offers no HTTP/1.x, a client that refused the pod CA's certificate).",
    ),
    "parent_failures": (
        "burstbuffer_parent_failures_by_reason",
        "Parent requests that fell back to the origin, by reason.",
    ),
    "parent_bypasses": (
        "burstbuffer_parent_bypasses_by_reason",
        "Upstream requests not sent to a parent because they may not be shared, by reason.",
    ),
}


class Metrics:
    """One process's counters, and how it reports buffer trouble."""

    def __init__(self) -> None:
        self.counters = Counters()
        self._last_logged: dict[str, float] = {}

    def count_pass(self, reason: str) -> None:
        self.counters.passes += 1
        self.counters.pass_reasons[reason] += 1

    def buffer_trouble(self, what: str, error: BaseException) -> None:
        """Count a buffer error; log it at most once a minute per kind of trouble."""
        self.counters.buffer_errors += 1
        now = time.monotonic()
        if now - self._last_logged.get(what, -_CONDITION_LOG_INTERVAL) >= _CONDITION_LOG_INTERVAL:
            self._last_logged[what] = now
            logger.warning(
                "buffer: %s failed, serving from upstream instead: %s (%d buffer errors so far)",
                what,
                error,
                self.counters.buffer_errors,
            )

    def snapshot(self) -> dict[str, object]:
        """The counters as plain data (what a worker reports to the parent)."""
        c = self.counters
        snapshot: dict[str, object] = {name: getattr(c, name) for name in COUNTER_HELP}
        for name in REASON_COUNTERS:
            snapshot[name] = dict(getattr(c, name))
        snapshot["parent_state"] = dict(c.parent_state)
        return snapshot


def add_snapshots(snapshots: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The sum of several workers' snapshots (counters add up, reasons per reason); a
    parent counts as used only if every worker uses it."""
    total: dict[str, Any] = {name: 0 for name in COUNTER_HELP}
    reasons: dict[str, collections.Counter[str]] = {
        name: collections.Counter() for name in REASON_COUNTERS
    }
    state: dict[str, int] = {}
    for snapshot in snapshots:
        for name in COUNTER_HELP:
            total[name] += snapshot.get(name, 0)
        for name, counter in reasons.items():
            counter.update(snapshot.get(name, {}))
        for parent, up in snapshot.get("parent_state", {}).items():
            state[parent] = min(up, state.get(parent, 1))
    for name, counter in reasons.items():
        total[name] = dict(counter)
    total["parent_state"] = state
    return total


def stats(
    counters: Mapping[str, Any], gauges: Mapping[str, int], buffer: str, eviction: str
) -> dict[str, object]:
    """The `/stats` document: every counter, passes by reason, every gauge, the buffer's
    state (`available`, or `unavailable: <why>`) and its eviction policy."""
    return {**counters, **gauges, "buffer": buffer, "eviction": eviction}
