"""What the tests build or fetch once and keep between runs, under CACHE.

Go clients are built here by `go_build`: once per source, Go version and the packages
they are built against, so that a run after the first starts them at once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "burstbuffer"


def go_build(source: Path, env: Mapping[str, str], packages: bytes = b"") -> Path | str:
    """`source` built once under CACHE, per source, Go version and the `packages` it is
    built against, with `env` (PATH, GOPATH...) on top of a build environment of its own;
    or why not."""
    go = shutil.which("go")
    if go is None:
        return "Go: no toolchain here (Debian's golang-go: .ci/system-deps installs it as root)"
    version = subprocess.run([go, "version"], capture_output=True, check=True).stdout
    key = hashlib.sha256(source.read_bytes() + version + packages).hexdigest()[:12]
    binary = CACHE / f"{source.stem}-go-{key}"
    if not binary.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = binary.with_suffix(".tmp")
        subprocess.run(
            [go, "build", "-o", str(partial), str(source)],
            env={
                "HOME": str(CACHE),
                "GOCACHE": str(CACHE / "go-build"),
                "CGO_ENABLED": "0",
                **env,
            },
            check=True,
            capture_output=True,
            timeout=300,
        )
        partial.rename(binary)
    return binary
