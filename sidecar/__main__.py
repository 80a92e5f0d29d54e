"""`burstbuffer-sidecar`: flags and environment -> Settings -> sockets -> workers.

The main process binds the listening sockets first (a port in use is one clear line)
and starts the worker processes at once: each loads mitmproxy (about half a second),
and meanwhile this process loads the rest and prepares the pod CA, the trust files
and the buffer (`sidecar.runtime.main`), then tells them to start.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from sidecar import logs
from sidecar.buffer.claims import Claims
from sidecar.proxy.listeners import listen, listeners
from sidecar.runtime.supervisor import Workers, WorkersFailed, available_cpus
from sidecar.settings import SettingsError, index_memory, parse
from sidecar.shared import Shared

logger = logging.getLogger("sidecar")


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        settings = parse(args, os.environ)
    except SettingsError as e:
        print(f"burstbuffer-sidecar: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    logs.configure("main")
    sockets = []
    for listener in listeners(settings):
        try:
            sockets.append(listen(listener.host, listener.port))
        except OSError as e:
            logger.error(
                "cannot start: cannot listen on %s:%d: %s", listener.host, listener.port, e
            )
            raise SystemExit(1) from None
    workers_count = settings.workers or available_cpus()
    shared = Shared.create(
        workers_count, Claims.size(workers_count), index_memory(settings.index_capacity)
    )
    workers = Workers(shared, args, sockets, settings.ca_dir, entry="sidecar.runtime.worker:main")
    spawning = workers.spawn()
    # Loaded while the workers load mitmproxy: the CA, the buffer, the admin endpoints.
    from sidecar.runtime import main as main_process

    try:
        asyncio.run(main_process.run(settings, workers, shared, spawning))
    except KeyboardInterrupt:
        pass
    except main_process.CONFIGURATION_ERRORS as e:
        print(f"burstbuffer-sidecar: error: --buffer-dir: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except (*main_process.STARTUP_ERRORS, WorkersFailed) as e:
        # The CA, the trust files or a port cannot be set up: nothing to serve safely.
        logger.error("cannot start: %s", e)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
