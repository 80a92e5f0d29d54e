"""Per-pod overrides by annotation, validated: a bad value is a warning and the default stays.

A pod that asks for something the injector cannot give must still start (with the
configured defaults), and its owner must learn why; so nothing here raises.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from injector import names
from injector.quantity import parse_quantity
from injector.settings import MEDIA, BufferSettings, ConfigError, InjectorSettings, buffer_size
from sidecar.settings import Capture, host_matches, parse_capture, parse_host_globs, parse_stage_in


@dataclass(frozen=True)
class PodOptions:
    """The settings that may differ from pod to pod, after the annotations."""

    buffer: BufferSettings
    capture: Capture
    # Hosts intercepted on top of the configured ones.
    extra_intercept: tuple[str, ...] = ()
    # What the sidecar prefetches at start (URLs, brace ranges, @manifest URLs).
    stage_in: tuple[str, ...] = ()
    # Hosts that follow RFC 9111 freshness on top of the configured ones.
    extra_http_freshness: tuple[str, ...] = ()
    # The sidecar's CPU request (a quantity), when the pod asks for its own.
    sidecar_cpu: str | None = None
    warnings: tuple[str, ...] = ()


def _medium(text: str) -> str:
    value = text.strip()
    if value not in MEDIA:
        raise ValueError(f"invalid medium {text!r}: expected one of {', '.join(MEDIA)}")
    return value


# The sidecar runs one worker process per CPU, at most this many.
MAX_SIDECAR_CPU = 64


def _cpu(text: str) -> str:
    value = text.strip()
    cpus = parse_quantity(value)
    if not 0 < cpus <= MAX_SIDECAR_CPU:
        raise ValueError(f"invalid CPU {text!r}: expected a quantity above 0, at most 64")
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

    capture: Capture = read(names.CAPTURE, parse_capture, settings.capture)
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
    intercepted = settings.intercept + extra
    for spec in stage_in:
        host = _plain_host(spec)
        if host is not None and not host_matches(host, intercepted):
            warnings.append(
                f"{names.STAGE_IN}: {host} is not intercepted, so {spec} is not staged; "
                f"add it to {names.INTERCEPT}"
            )
    asked_fresh: tuple[str, ...] = read(names.HTTP_FRESHNESS, parse_host_globs, ())
    extra_fresh = tuple(glob for glob in asked_fresh if glob not in settings.http_freshness)
    for glob in extra_fresh:
        # A glob may match intercepted hosts in part; only a plain name is certain.
        if "*" not in glob and not host_matches(glob, intercepted):
            warnings.append(
                f"{names.HTTP_FRESHNESS}: {glob} is not intercepted, so nothing of it is "
                f"cached; add it to {names.INTERCEPT}"
            )
    sidecar_cpu: str | None = read(names.SIDECAR_CPU, _cpu, None)
    return PodOptions(
        buffer,
        capture,
        extra,
        stage_in,
        extra_http_freshness=extra_fresh,
        sidecar_cpu=sidecar_cpu,
        warnings=tuple(warnings),
    )


def _plain_host(spec: str) -> str | None:
    """The host of a plain stage-in URL; None for a manifest or a host with a brace range."""
    if spec.startswith("@"):
        return None
    try:
        host = urlsplit(spec).hostname
    except ValueError:
        return None
    return host if host and "{" not in host else None
