"""Per-pod overrides by annotation, validated: a bad value is a warning and the default stays.

A pod that asks for something the injector cannot give must still start (with the
configured defaults), and its owner must learn why; so nothing here raises.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from injector import names
from injector.settings import MEDIA, BufferSettings, ConfigError, InjectorSettings, buffer_size
from sidecar.settings import parse_host_globs

# Stage-in URLs are separated by commas or white space (a YAML block scalar lists one a line).
_URL_SEPARATORS = re.compile(r"[\s,]+")


@dataclass(frozen=True)
class PodOptions:
    """The settings that may differ from pod to pod, after the annotations."""

    buffer: BufferSettings
    # Hosts intercepted on top of the configured ones.
    extra_intercept: tuple[str, ...] = ()
    # URLs to prefetch (validated; not yet supported by the sidecar, see pod_options).
    stage_in: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def parse_stage_in(text: str) -> tuple[str, ...]:
    """Parse stage-in URLs: absolute http(s) URLs with a host, separated by commas or spaces."""
    urls: list[str] = []
    for url in _URL_SEPARATORS.split(text.strip()):
        if not url:
            continue
        parts = urlsplit(url)
        try:
            port_ok = parts.port is None or parts.port > 0
        except ValueError:
            port_ok = False
        if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
            raise ValueError(f"invalid URL {url!r}: expected an http:// or https:// URL")
        if url not in urls:
            urls.append(url)
    if not urls:
        raise ValueError("no URL given")
    return tuple(urls)


def _medium(text: str) -> str:
    value = text.strip()
    if value not in MEDIA:
        raise ValueError(f"invalid medium {text!r}: expected one of {', '.join(MEDIA)}")
    return value


def pod_options(annotations: Mapping[str, Any], settings: InjectorSettings) -> PodOptions:
    """The pod's options: the configured defaults, overridden by valid annotations."""
    warnings: list[str] = []

    def read[T](key: str, parse: Any, default: T) -> T:
        raw = annotations.get(key)
        if raw is None:
            return default
        try:
            return parse(str(raw))  # type: ignore[no-any-return]
        except ValueError as e:
            warnings.append(f"{key}: {e}; using the default")
            return default

    buffer = settings.buffer
    medium = read(names.BUFFER_MEDIUM, _medium, buffer.medium)
    size = read(names.BUFFER_SIZE, buffer_size, buffer.size)
    try:
        buffer = dataclasses.replace(buffer, medium=medium, size=size)
    except ConfigError:
        # pmem asked for by annotation, but the configuration names no pmem source.
        warnings.append(
            f"{names.BUFFER_MEDIUM}: pmem is not configured on this cluster "
            f"(buffer.pmem); using {buffer.medium}"
        )
        buffer = dataclasses.replace(buffer, size=size)
    asked: tuple[str, ...] = read(names.INTERCEPT, parse_host_globs, ())
    extra = tuple(glob for glob in asked if glob not in settings.intercept)
    stage_in: tuple[str, ...] = read(names.STAGE_IN, parse_stage_in, ())
    if stage_in:
        warnings.append(
            f"{names.STAGE_IN}: stage-in is not yet supported by this sidecar version; "
            f"the URLs are recorded in {names.STATUS} but not prefetched"
        )
    return PodOptions(buffer, extra, stage_in, tuple(warnings))
