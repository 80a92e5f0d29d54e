"""`burstbuffer-injector render` for tests: the real command as a process, and `main`
itself in this process (argument parsing and error handling included) for many inputs."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from collections.abc import Iterator

from webhook import INJECTOR

from injector.__main__ import main


def run_render(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """The real command, as a user runs it."""
    return subprocess.run(
        [str(INJECTOR), "render", *args], input=stdin, capture_output=True, text=True, timeout=60
    )


@contextlib.contextmanager
def _stdin(data: bytes) -> Iterator[None]:
    saved = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(data))
    try:
        yield
    finally:
        sys.stdin = saved


def render_in_process(*args: str, stdin: str = "") -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `render` run by `main` in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _stdin(stdin.encode()):
        status = main(["render", *args])
    return status, out.getvalue(), err.getvalue()
