"""`sidecar.mitm.embedded`: the worker's mitmproxy, as the worker sets it up."""

from __future__ import annotations

import asyncio
import logging
import warnings

from mitmproxy import log
from mitmproxy.log import LogEntry

with warnings.catch_warnings():
    # mitmproxy's command language (which Master loads) calls pyparsing's old names.
    warnings.simplefilter("ignore", DeprecationWarning)
    from mitmproxy.master import Master

    from sidecar.mitm.embedded import forgo_log_hook


class _HearsLogs:
    """An addon with mitmproxy's deprecated `add_log` hook."""

    def __init__(self) -> None:
        self.heard: list[str] = []

    def add_log(self, entry: LogEntry) -> None:
        self.heard.append(entry.msg)


def test_a_worker_log_line_wakes_no_mitmproxy_addon() -> None:
    async def log_before_and_after() -> list[str]:
        master = Master(None)
        listener = _HearsLogs()
        master.addons.add(listener)
        logger = logging.getLogger("sidecar.test_embedded")
        try:
            logger.warning("before")
            await asyncio.sleep(0.05)  # the hook runs on a later turn of the loop
            forgo_log_hook()
            logger.warning("after")
            await asyncio.sleep(0.05)
        finally:
            for handler in list(logging.getLogger().handlers):
                if isinstance(handler, log.LegacyLogEvents):
                    handler.uninstall()
        return listener.heard

    heard = asyncio.run(log_before_and_after())
    # Before: the hook hears the line (and mitmproxy's own warning that it is deprecated).
    assert [line for line in heard if line.endswith(("before", "after"))] == [heard[-1]]
    assert heard[-1].endswith("before")
