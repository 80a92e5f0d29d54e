"""Where the benchmarks and the tests keep what they download or build once.

Debian roots, Node 22, Go builds, a Docker daemon's state and large stored buffers take
minutes to make, so they are kept between runs, outside the checkout, in one folder:
`$XDG_CACHE_HOME/burstbuffer`, by default `~/.cache/burstbuffer`.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """The folder `parts` under the cache folder, made (with its parents) if missing:
    a new machine has no `~/.cache`, and code that stats or locks in it needs it there."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG base directory specification: an unset or empty variable means ~/.cache,
    # and a relative path is invalid and ignored (it would land in the working folder).
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    path = root.joinpath("burstbuffer", *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
