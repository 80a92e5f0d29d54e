"""The sidecar's log format, the same in the parent and in every worker."""

from __future__ import annotations

import logging
import sys


def configure(process: str) -> None:
    """Log INFO and above to stderr, each line naming the process (`main`, `w0`, ...)."""
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s [{process}] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # mitmproxy logs every client connect and disconnect at INFO: too chatty for a sidecar.
    logging.getLogger("mitmproxy").setLevel(logging.WARNING)
