"""The `proxy-env` capture: which proxy variables point app containers at the sidecar.

(The other two modes live in `aliases` and `redirect`; with them, only containers that
name a proxy of their own get these variables, see `names_a_proxy`.)

Measured with the clients the pods run: GNU wget reads only the lowercase `http_proxy` /
`https_proxy`, curl ignores an uppercase `HTTP_PROXY` (httpoxy), Python reads both; so both
spellings are set. `no_proxy` holds host names and `.suffixes` only, since wget and urllib
ignore CIDRs.

A container that already names a proxy keeps it: that proxy becomes the sidecar's
`--upstream-proxy`, and the container is pointed at the sidecar. Only literal `value`s
can be seen at admission; a proxy set by `valueFrom` or `envFrom` is resolved by the
kubelet later, so the injector can only warn about the former and never sees the latter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from sidecar.settings import parse_proxy_url

# Most specific first: datasets are fetched over HTTPS, so an https proxy is preferred.
PROXY_VARIABLES = ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY")
NO_PROXY_VARIABLES = ("no_proxy", "NO_PROXY")

# Never through the sidecar: the pod itself, cluster services, and the API server, whose
# address in-cluster clients take from KUBERNETES_SERVICE_HOST (the kubelet expands
# `$(...)` references to service variables in env values; that one always exists).
BUILTIN_NO_PROXY = (
    "localhost",
    "127.0.0.1",
    "::1",
    ".svc",
    ".cluster.local",
    "$(KUBERNETES_SERVICE_HOST)",
)


def sidecar_proxy_url(port: int) -> str:
    """The URL app containers use to reach the sidecar on the pod's loopback."""
    return f"http://127.0.0.1:{port}"


def normalize_proxy(value: str) -> str:
    """A proxy URL as the sidecar takes it; a bare `host:port` means http, as for curl."""
    text = value.strip()
    if "://" not in text:
        text = "http://" + text
    url = parse_proxy_url(text)
    parts = urlsplit(url)  # raises ValueError for a broken host ("http://[")
    if not parts.hostname or parts.port == 0:
        raise ValueError(f"invalid proxy {value!r}: no host")
    return url


def redact(url: str) -> str:
    """The proxy URL without credentials, for logs and the status annotation."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}"


def env_entries(container: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The container's env entries; anything malformed is skipped (not validated yet)."""
    env = container.get("env")
    return [e for e in env if isinstance(e, Mapping)] if isinstance(env, list) else []


def names_a_proxy(container: Mapping[str, Any]) -> bool:
    """Whether the container sets a proxy variable (a value, or one from valueFrom)."""
    return any(
        e.get("name") in PROXY_VARIABLES and ("valueFrom" in e or str(e.get("value", "")).strip())
        for e in env_entries(container)
    )


@dataclass(frozen=True)
class UpstreamProxy:
    """The proxy the pod used before the sidecar, if any could be seen."""

    url: str | None
    warnings: tuple[str, ...]


def find_upstream_proxy(containers: Iterable[Mapping[str, Any]], own_url: str) -> UpstreamProxy:
    """The proxy named by the containers' env (the first one, if they disagree).

    Values equal to `own_url` are the sidecar itself (an already injected pod) and are
    not a proxy of the pod's own.
    """
    found: list[tuple[str, str]] = []  # (url, container name)
    warnings: list[str] = []
    for container in containers:
        cname = container.get("name", "?")
        entries = {e.get("name"): e for e in env_entries(container)}
        for variable in PROXY_VARIABLES:
            entry = entries.get(variable)
            if entry is None:
                continue
            if "valueFrom" in entry:
                warnings.append(
                    f"container {cname}: {variable} comes from valueFrom and cannot be "
                    "seen at admission; it is replaced by the sidecar, which goes direct"
                )
                continue
            value = str(entry.get("value", "")).strip()
            if not value:
                continue
            try:
                url = normalize_proxy(value)
            except ValueError:
                warnings.append(
                    f"container {cname}: {variable} is not an http proxy URL; "
                    "it is replaced by the sidecar, which goes direct"
                )
                continue
            if url != own_url and url not in (u for u, _ in found):
                found.append((url, cname))
    if len(found) > 1:
        others = ", ".join(f"{redact(u)} ({c})" for u, c in found[1:])
        warnings.append(
            f"containers name different proxies; the sidecar uses {redact(found[0][0])} "
            f"({found[0][1]}) and ignores {others}"
        )
    return UpstreamProxy(found[0][0] if found else None, tuple(warnings))


def no_proxy_value(container: Mapping[str, Any], extra: Iterable[str]) -> str:
    """The container's no_proxy: the built-in entries, `extra`, then what it already had."""
    entries: list[str] = [*BUILTIN_NO_PROXY, *extra]
    for e in env_entries(container):
        if e.get("name") in NO_PROXY_VARIABLES and "value" in e:
            entries += [item.strip() for item in str(e["value"]).split(",")]
    return ",".join(dict.fromkeys(item for item in entries if item))


def proxy_variables(
    container: Mapping[str, Any], own_url: str, extra: Iterable[str]
) -> dict[str, str]:
    """Every capture variable of one container, with its new value."""
    no_proxy = no_proxy_value(container, extra)
    variables = {name: own_url for name in PROXY_VARIABLES}
    variables.update({name: no_proxy for name in NO_PROXY_VARIABLES})
    return variables
