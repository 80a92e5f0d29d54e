"""`/metrics`: the Prometheus exposition of the numbers `/stats` shows (`sidecar.metrics`).

Only the main process renders it; workers count in plain integers and never load
prometheus-client.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from sidecar.metrics import COUNTER_HELP, REASON_COUNTERS


def prometheus_text(
    counters: Mapping[str, Any], gauges: Mapping[str, int], eviction: str
) -> bytes:
    """The `/metrics` exposition of the same numbers as `stats()`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Exporter(counters, gauges, eviction))
    return generate_latest(registry)


class _Exporter(Collector):
    def __init__(
        self, counters: Mapping[str, Any], gauges: Mapping[str, int], eviction: str
    ) -> None:
        self._counters = counters
        self._gauges = gauges
        self._eviction = eviction

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | InfoMetricFamily]:
        # An info series (always 1, the policy in a label), as Prometheus exporters give
        # settings: an alert joins on it to treat a full `none` buffer, which turns new
        # objects away by design, apart from a full `lru` one, which evicts.
        yield InfoMetricFamily(
            "burstbuffer_eviction_policy",
            "The buffer's eviction policy (--eviction), in the label policy.",
            value={"policy": self._eviction},
        )
        for name, help_text in COUNTER_HELP.items():
            yield CounterMetricFamily(f"burstbuffer_{name}", help_text, value=self._counters[name])
        for key, (family, help_text) in REASON_COUNTERS.items():
            reasons = CounterMetricFamily(family, help_text, labels=["reason"])
            for reason, count in sorted(self._counters[key].items()):
                reasons.add_metric([reason], count)
            yield reasons
        state = GaugeMetricFamily(
            "burstbuffer_parent_up",
            "1 while a parent cache is used; 0 while it is skipped after a failure.",
            labels=["parent"],
        )
        for parent, up in sorted(self._counters["parent_state"].items()):
            state.add_metric([parent], up)
        yield state
        for name, value in self._gauges.items():
            yield GaugeMetricFamily(f"burstbuffer_{name}", _GAUGE_HELP.get(name, name), value=value)


_GAUGE_HELP = {
    "buffer_available": "1 while the buffer stores objects; 0 once it failed (see /stats).",
    "workers": "Worker processes serving (--workers).",
    "client_connections": "Client connections open, tunnels and captured ones included.",
    "entries": "Complete objects stored in the buffer.",
    "unverified_entries": "Objects found at start that the background check has not reached.",
    "buffer_bytes": "Body bytes of the stored objects.",
    "reserved_bytes": "Bytes held for fills in progress.",
    "leased_bytes": "Free bytes lent to workers for small fills and not taken yet.",
    "capacity_bytes": "The buffer's hard cap (--buffer-size).",
    "fills_in_progress": "Upstream fills currently running.",
    "stage_in_objects": "Objects listed for stage-in (--stage-in).",
    "stage_in_done": "Stage-in objects stored in the buffer.",
    "stage_in_failed": "Stage-in objects that could not be stored.",
    "stage_in_bytes": "Bytes of the stage-in objects stored.",
}
