"""Variables for clients that ignore the proxy variables or the PEM bundle.

Measured with the clients data loaders use (the client table of docs/injector.md):

- `FSSPEC_HTTP` (fsspec's HTTP filesystem: Hugging Face `datasets`, many loaders):
  `{"client_kwargs": {"trust_env": true}}` merged into the container's JSON, so that its
  aiohttp sessions read the proxy variables (aiohttp ignores them by default).
- `NODE_USE_ENV_PROXY=1` (Node.js 22 and later: `fetch`, `https.get`): use the proxy
  variables. Node 20 has no such switch: the hostAliases or transparent capture covers it.
- `JAVA_TOOL_OPTIONS` (every JVM: `HttpClient`, `HttpURLConnection`): the pod's PKCS12
  trust store, and the proxy as system properties, appended to the container's value.

`FSSPEC_HTTP` and `NODE_USE_ENV_PROXY` only matter where the proxy variables are set, and
so do the JVM's proxy properties (`-Dhttps.proxyHost`, ...; `-Dhttp.nonProxyHosts` from
the same no_proxy list). The JVM reads neither `SSL_CERT_FILE` nor the system PEM file, so
it gets the PKCS12 trust store in every capture mode.

A container's own value is kept: JSON is merged, JVM options are appended after it
(later -D options win). A value set by `valueFrom` cannot be read at admission: it is
left alone, with a warning.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from injector.capture import env_entries

FSSPEC_HTTP = "FSSPEC_HTTP"
NODE_USE_ENV_PROXY = "NODE_USE_ENV_PROXY"
JAVA_TOOL_OPTIONS = "JAVA_TOOL_OPTIONS"


def fsspec_http(existing: str | None) -> str:
    """The container's `FSSPEC_HTTP` with `client_kwargs.trust_env` set to true.

    Raises ValueError when `existing` is not a JSON object (nor its client_kwargs).
    """
    options: Any = json.loads(existing) if existing and existing.strip() else {}
    if not isinstance(options, dict):
        raise ValueError("not a JSON object")
    client_kwargs = options.setdefault("client_kwargs", {})
    if not isinstance(client_kwargs, dict):
        raise ValueError("client_kwargs is not a JSON object")
    client_kwargs["trust_env"] = True
    return json.dumps(options, separators=(",", ":"))


def java_non_proxy_hosts(no_proxy: str) -> str:
    """A no_proxy list as `-Dhttp.nonProxyHosts`: `|`-separated, `.suffix` as `*.suffix`."""
    hosts = [item.strip() for item in no_proxy.split(",") if item.strip()]
    return "|".join(f"*{host}" if host.startswith(".") else host for host in hosts)


def java_options(trust_store: str, proxy_url: str | None, no_proxy: str) -> list[str]:
    """The JVM options of the pod: its trust store, and the proxy when there is one."""
    options = [
        f"-Djavax.net.ssl.trustStore={trust_store}",
        "-Djavax.net.ssl.trustStoreType=PKCS12",
    ]
    if proxy_url is not None:
        parts = urlsplit(proxy_url)
        host, port = parts.hostname, str(parts.port)
        options += [
            f"-Dhttps.proxyHost={host}",
            f"-Dhttps.proxyPort={port}",
            f"-Dhttp.proxyHost={host}",
            f"-Dhttp.proxyPort={port}",
            # Both schemes read http.nonProxyHosts.
            f"-Dhttp.nonProxyHosts={java_non_proxy_hosts(no_proxy)}",
        ]
    return options


def java_tool_options(existing: str | None, options: list[str]) -> str:
    """`options` appended to the container's `JAVA_TOOL_OPTIONS`, its text kept as it is.

    A value that already ends with them (an injected pod, injected again) is unchanged.
    """
    ours = " ".join(options)
    own = (existing or "").rstrip()
    if own == ours or own.endswith(" " + ours):
        return own
    return f"{own} {ours}" if own else ours


def variables(
    container: Mapping[str, Any],
    trust_store: str,
    proxy_url: str | None,
    no_proxy: str,
) -> tuple[dict[str, str], list[str]]:
    """The variables of one container, with warnings about values that were left alone.

    `proxy_url` is the sidecar's proxy when the container gets the proxy variables (then
    `no_proxy` is their no_proxy list), else None.
    """
    env = {e.get("name"): e for e in env_entries(container)}
    cname = container.get("name", "?")
    found: dict[str, str] = {}
    warnings: list[str] = []

    def existing(name: str) -> tuple[bool, str | None]:
        entry = env.get(name)
        if entry is not None and "valueFrom" in entry:
            warnings.append(
                f"container {cname}: {name} comes from valueFrom and cannot be read at "
                "admission; it is left as it is"
            )
            return False, None
        return True, None if entry is None else str(entry.get("value", ""))

    if proxy_url is not None:
        readable, value = existing(FSSPEC_HTTP)
        if readable:
            try:
                found[FSSPEC_HTTP] = fsspec_http(value)
            except ValueError as e:
                warnings.append(
                    f"container {cname}: {FSSPEC_HTTP} is not usable JSON ({e}); it is "
                    "left as it is, and fsspec's HTTP sessions ignore the proxy"
                )
        found[NODE_USE_ENV_PROXY] = "1"
    readable, value = existing(JAVA_TOOL_OPTIONS)
    if readable:
        options = java_options(trust_store, proxy_url, no_proxy)
        found[JAVA_TOOL_OPTIONS] = java_tool_options(value, options)
    return found, warnings
