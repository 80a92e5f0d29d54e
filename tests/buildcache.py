"""What the tests build once and keep between runs, in the tests' cache folder.

Go clients are built here by `go_build`: once per source, Go version and the packages
they are built against, so that a run after the first starts them at once.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from bench.cachedir import cache_dir


def go_build(source: Path, env: Mapping[str, str], packages: bytes = b"") -> Path | str:
    """`source` built once in the cache folder (`bench.cachedir`), per source, Go version
    and the `packages` it is built against, with `env` (PATH, GOPATH...) on top of a build
    environment of its own; or why not."""
    go = shutil.which("go")
    if go is None:
        return "Go: no toolchain here (Debian's golang-go: .ci/system-deps installs it as root)"
    version = subprocess.run([go, "version"], capture_output=True, check=True).stdout
    key = hashlib.sha256(source.read_bytes() + version + packages).hexdigest()[:12]
    cache = cache_dir()
    binary = cache / f"{source.stem}-go-{key}"
    if not binary.is_file():
        partial = binary.with_suffix(".tmp")
        subprocess.run(
            [go, "build", "-o", str(partial), str(source)],
            env={
                "HOME": str(cache),
                "GOCACHE": str(cache / "go-build"),
                "CGO_ENABLED": "0",
                **env,
            },
            check=True,
            capture_output=True,
            timeout=300,
        )
        partial.rename(binary)
    return binary
