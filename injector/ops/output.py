"""Printing: aligned tables for people, JSON and YAML for programs (`-o json|yaml`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TextIO

import yaml

FORMATS = ("table", "json", "yaml")


def table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    """Columns padded to their widest cell, as `kubectl get` prints them."""
    if not rows:
        return
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        print("   ".join(cells).rstrip(), file=out)


def document(data: Any, output: str, out: TextIO) -> None:
    """`data` as JSON or YAML."""
    if output == "json":
        json.dump(data, out, indent=2)
        out.write("\n")
    else:
        yaml.safe_dump(data, out, sort_keys=False)


def human_bytes(size: int) -> str:
    """A byte count for a table cell: `0`, `812B`, `1.5KiB` ... `2.0TiB`."""
    if size < 1024:
        return f"{size}B" if size else "0"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f}{unit}"


def percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{100 * ratio:.1f}%"
