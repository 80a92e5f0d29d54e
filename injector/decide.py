"""Whether a pod gets the sidecar: a pure decision that says why.

Opt-in is the webhook configuration's job (namespace label or pod label selectors, so
the server only sees opted-in pods, and `render` acts as if the namespace had opted in).
What is left here are the pod's own opt-out and the never-inject rules; every rule that
applies is reported, each with a code (metrics label, log field) and a sentence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from injector import names


@dataclass(frozen=True)
class Reason:
    """Why a pod is, or is not, injected."""

    code: str
    sentence: str


INJECTED = Reason("injected", "the pod is opted in and nothing rules injection out")
OPTED_OUT = Reason("opted-out", f"the pod sets {names.INJECT}=false (label or annotation)")
HOST_NETWORK = Reason(
    "host-network",
    "the pod uses the node's network: a loopback proxy there would serve the whole node",
)
ALREADY_INJECTED = Reason(
    "already-injected",
    f"the pod already has a container named {' or '.join(names.OWN_CONTAINERS)}",
)
WINDOWS = Reason("windows", "the pod runs on Windows; the sidecar image is Linux-only")

SKIP_REASONS = (OPTED_OUT, HOST_NETWORK, ALREADY_INJECTED, WINDOWS)


@dataclass(frozen=True)
class Decision:
    """Inject or not, with every reason that applies."""

    inject: bool
    reasons: tuple[Reason, ...]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    found = []
    for key in ("initContainers", "containers"):
        items = spec.get(key)
        if isinstance(items, list):
            found += [c for c in items if isinstance(c, Mapping)]
    return found


def _opts_out(metadata: Mapping[str, Any]) -> bool:
    return any(
        str(_mapping(metadata.get(where)).get(names.INJECT, "")).strip().lower() == "false"
        for where in ("labels", "annotations")
    )


def _is_windows(spec: Mapping[str, Any]) -> bool:
    os_name = _mapping(spec.get("os")).get("name")
    selected = _mapping(spec.get("nodeSelector")).get("kubernetes.io/os")
    return "windows" in (os_name, selected)


def decide(pod: Mapping[str, Any]) -> Decision:
    """Decide for an opted-in pod (plain dict, as the API server sends it)."""
    metadata = _mapping(pod.get("metadata"))
    spec = _mapping(pod.get("spec"))
    reasons = []
    if _opts_out(metadata):
        reasons.append(OPTED_OUT)
    if spec.get("hostNetwork") is True:
        reasons.append(HOST_NETWORK)
    if any(c.get("name") in names.OWN_CONTAINERS for c in _containers(spec)):
        reasons.append(ALREADY_INJECTED)
    if _is_windows(spec):
        reasons.append(WINDOWS)
    if reasons:
        return Decision(False, tuple(reasons))
    return Decision(True, (INJECTED,))
