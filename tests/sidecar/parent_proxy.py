"""A minimal corporate proxy (HTTP CONNECT only) that counts what passes through it.

It runs in a thread of the test process and maps the test host names to loopback
itself, since the test process has no private /etc/hosts.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ParentProxy:
    def __init__(self, names: dict[str, str]) -> None:
        self.names = names
        self.connects: collections.Counter[str] = collections.Counter()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
            if method != "CONNECT":
                writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                return
            host, port = target.rsplit(":", 1)
            self.connects[target] += 1
            up_reader, up_writer = await asyncio.open_connection(
                self.names.get(host, host), int(port)
            )
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.run_until_complete(server.wait_closed())
        self._loop.close()

    @contextmanager
    def running(self) -> Iterator[ParentProxy]:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        self._ready.wait(5)
        try:
            yield self
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            thread.join(5)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(256 * 1024):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()
