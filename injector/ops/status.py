"""`burstbuffer status`: every injected pod's buffer and counters, and totals per namespace.

The figures are the sidecar's own `/stats`, read through the API server's pod proxy
(`/api/v1/namespaces/NS/pods/NAME:PORT/proxy/stats`), so nothing but the API server
needs to be reachable. A pod whose sidecar cannot be read is listed with the reason.

The hit ratio is the README's: hits / (hits + misses + coalesced + passes), every
request the sidecar answered for an intercepted host.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from typing import Any, TextIO

from injector import names
from injector.ops import output
from injector.ops.kube import ApiError, ConnectError, Kube
from injector.settings import InjectorSettings

# Sidecars read at once: enough to list a few hundred pods in seconds, few enough not to
# look like a flood to the API server (each read is one proxied request).
_PARALLEL_READS = 8
# The `/stats` counters and gauges a row shows (DESIGN.md, the sidecar's /stats).
COUNTERS = (
    "hits",
    "misses",
    "coalesced",
    "passes",
    "bytes_from_buffer",
    "bytes_from_upstream",
    "entries",
    "buffer_bytes",
)
OK = "ok"


@dataclass(frozen=True)
class Figures:
    """What a sidecar's /stats says (or what several pods' say, added up)."""

    hits: int = 0
    misses: int = 0
    coalesced: int = 0
    passes: int = 0
    bytes_from_buffer: int = 0
    bytes_from_upstream: int = 0
    entries: int = 0
    buffer_bytes: int = 0

    @property
    def hit_ratio(self) -> float | None:
        """hits / (hits + misses + coalesced + passes); None before any request."""
        answered = self.hits + self.misses + self.coalesced + self.passes
        return self.hits / answered if answered else None

    def __add__(self, other: Figures) -> Figures:
        return Figures(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


@dataclass(frozen=True)
class PodRow:
    namespace: str
    pod: str
    capture: str
    buffer_medium: str
    buffer_size: str  # the buffer volume as injected (`1Gi`)
    figures: Figures | None  # None: the sidecar could not be read
    state: str  # "ok", or why there are no figures, or the buffer's trouble


@dataclass(frozen=True)
class NamespaceTotal:
    namespace: str
    pods: int
    unreachable: int
    figures: Figures


def is_injected(pod: Mapping[str, Any]) -> bool:
    """The injector marks every pod it injected with its status annotation."""
    return names.STATUS in (pod.get("metadata", {}).get("annotations") or {})


def admin_port(pod: Mapping[str, Any]) -> int:
    """The sidecar's admin port: its container port named as the injector names it."""
    spec = pod.get("spec", {})
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if container.get("name") != names.CONTAINER:
            continue
        for port in container.get("ports") or []:
            if port.get("name") == names.ADMIN_PORT_NAME:
                return int(port["containerPort"])
    return InjectorSettings().admin_port


def why_unreachable(pod: Mapping[str, Any]) -> str | None:
    """Why the sidecar cannot answer now, from the pod's status; None if it may."""
    status = pod.get("status", {})
    phase = status.get("phase") or "Pending"
    if phase != "Running":
        return f"pod is {phase}"
    if not status.get("podIP"):
        return "pod has no IP yet"
    statuses = [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]
    sidecar = next((s for s in statuses if s.get("name") == names.CONTAINER), None)
    if sidecar is None:
        return "sidecar has not started"
    state = sidecar.get("state") or {}
    if "running" in state:
        return None
    for what in ("waiting", "terminated"):
        if what in state:
            return f"sidecar {what}: {state[what].get('reason') or 'no reason given'}"
    return "sidecar has not started"


def figures(stats: Mapping[str, Any]) -> Figures:
    """The figures of one /stats document; raises ValueError if it is not one."""
    try:
        return Figures(**{name: int(stats[name]) for name in COUNTERS})
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"the sidecar's /stats has no usable {e}") from None


def row(pod: Mapping[str, Any], stats: Mapping[str, Any] | None, reason: str | None) -> PodRow:
    """A pod's row: its injection record, and its /stats or the reason there is none."""
    metadata = pod.get("metadata", {})
    try:
        record = json.loads(metadata.get("annotations", {}).get(names.STATUS, ""))
    except ValueError:
        record = None
    record = record if isinstance(record, dict) else {}
    buffer: dict[str, Any] = record["buffer"] if isinstance(record.get("buffer"), dict) else {}
    counted: Figures | None = None
    state = reason or OK
    if stats is not None:
        try:
            counted = figures(stats)
        except ValueError as e:
            state = str(e)
        else:
            available = str(stats.get("buffer", "available"))
            state = OK if available == "available" else f"buffer {available}"
    return PodRow(
        namespace=str(metadata.get("namespace", "")),
        pod=str(metadata.get("name", "")),
        capture=str(record.get("capture", "?")),
        buffer_medium=str(buffer.get("medium", "?")),
        buffer_size=str(buffer.get("size", "?")),
        figures=counted,
        state=state,
    )


def totals(rows: Iterable[PodRow]) -> list[NamespaceTotal]:
    """Per namespace: pods, unreachable pods, and the reachable pods' figures added up."""
    by_namespace: dict[str, NamespaceTotal] = {}
    for r in rows:
        total = by_namespace.get(r.namespace, NamespaceTotal(r.namespace, 0, 0, Figures()))
        by_namespace[r.namespace] = NamespaceTotal(
            r.namespace,
            total.pods + 1,
            total.unreachable + (r.figures is None),
            total.figures + (r.figures or Figures()),
        )
    return [by_namespace[n] for n in sorted(by_namespace)]


def document(rows: Sequence[PodRow]) -> dict[str, Any]:
    """`-o json|yaml`: every pod and every namespace total, counters as plain integers."""

    def numbers(counted: Figures | None) -> dict[str, Any]:
        if counted is None:
            return {}
        return {**asdict(counted), "hit_ratio": counted.hit_ratio}

    pods = [
        {
            "namespace": r.namespace,
            "pod": r.pod,
            "capture": r.capture,
            "buffer_medium": r.buffer_medium,
            "buffer_size": r.buffer_size,
            "reachable": r.figures is not None,
            "state": r.state,
            **numbers(r.figures),
        }
        for r in rows
    ]
    namespaces = [
        {"namespace": t.namespace, "pods": t.pods, "unreachable": t.unreachable}
        | numbers(t.figures)
        for t in totals(rows)
    ]
    return {"pods": pods, "namespaces": namespaces}


def tables(rows: Sequence[PodRow]) -> tuple[list[list[str]], list[list[str]]]:
    """The two tables people read: one line per pod, then one per namespace."""

    def cells(counted: Figures | None) -> list[str]:
        if counted is None:
            return ["-"] * 8
        return [
            output.human_bytes(counted.buffer_bytes),
            str(counted.entries),
            str(counted.hits),
            str(counted.misses),
            str(counted.passes),
            output.percent(counted.hit_ratio),
            output.human_bytes(counted.bytes_from_buffer),
            output.human_bytes(counted.bytes_from_upstream),
        ]

    figures_header = ["USED", "ENTRIES", "HITS", "MISSES", "PASSES", "HIT RATIO"]
    figures_header += ["FROM BUFFER", "FROM UPSTREAM"]
    pods = [["NAMESPACE", "POD", "CAPTURE", "BUFFER", *figures_header, "STATE"]]
    for r in rows:
        buffer = f"{r.buffer_size} {r.buffer_medium}"
        pods.append([r.namespace, r.pod, r.capture, buffer, *cells(r.figures), r.state])
    namespaces = [["NAMESPACE", "PODS", "UNREACHABLE", *figures_header]]
    for t in totals(rows):
        namespaces.append([t.namespace, str(t.pods), str(t.unreachable), *cells(t.figures)])
    return pods, namespaces


def collect(kube: Kube, namespace: str | None) -> list[PodRow]:
    """Read every injected pod of `namespace` (every namespace when None)."""
    pods = sorted(
        (p for p in kube.list_pods(namespace) if is_injected(p)),
        key=lambda p: (p["metadata"].get("namespace", ""), p["metadata"].get("name", "")),
    )

    def read(pod: dict[str, Any]) -> PodRow:
        reason = why_unreachable(pod)
        if reason is not None:
            return row(pod, None, reason)
        metadata = pod["metadata"]
        try:
            stats = kube.pod_proxy_get(
                metadata["namespace"], metadata["name"], admin_port(pod), "stats"
            )
        except ApiError as e:
            return row(pod, None, f"sidecar unreachable: {e.code} {e.message}")
        except ConnectError as e:
            return row(pod, None, f"sidecar unreachable: {e}")
        return row(pod, stats, None)

    with ThreadPoolExecutor(_PARALLEL_READS) as pool:
        return list(pool.map(read, pods))


def run(kube: Kube, namespace: str | None, output_format: str, out: TextIO, err: TextIO) -> int:
    rows = collect(kube, namespace)
    if output_format != "table":
        output.document(document(rows), output_format, out)
        return 0
    if not rows:
        where = "any namespace" if namespace is None else f"namespace {namespace}"
        print(f"No injected pods in {where}.", file=err)
        return 0
    pods, namespaces = tables(rows)
    output.table(pods, out)
    print(file=out)
    output.table(namespaces, out)
    return 0
