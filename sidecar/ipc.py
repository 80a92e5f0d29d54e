"""Messages between the sidecar's parent process and its workers.

One Unix stream socket per worker carries JSON objects, one per line, both ways.
A call carries an `id` and is answered by a message with the same `reply`; a
notification has neither and is never answered. Messages on one socket are handled
in the order they were sent, so a notification sent after a call is seen after it.

Only small metadata crosses here (cache keys, sizes, file names, counters): bodies
stay in the buffer directory, which every process opens itself.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger(__name__)

# One message may carry a stored object's response headers; far below this.
MAX_MESSAGE = 4 * 1024 * 1024  # bytes

Message = dict[str, Any]
# Handles a call (returns the reply's fields) or a notification (returns None).
Handler = Callable[[Message], Awaitable[Message | None]]


class PeerGone(Exception):
    """The process at the other end is gone (exited, crashed, or closed the channel)."""


class CallFailed(Exception):
    """The other process could not handle a call (its handler raised)."""


class Channel:
    """A message channel over one connected socket, with calls and notifications."""

    def __init__(self, sock: socket.socket, handler: Handler) -> None:
        self._sock = sock
        self._handler = handler
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Message]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._unsent: list[bytes] = []  # sent before the channel was open
        self._open = asyncio.Event()
        self._closed = asyncio.Event()

    async def run(self) -> None:
        """Read and dispatch messages until the peer is gone; then fail pending calls."""
        reader, self._writer = await asyncio.open_unix_connection(
            sock=self._sock, limit=MAX_MESSAGE
        )
        self._writer.writelines(self._unsent)
        self._unsent.clear()
        self._open.set()
        tasks: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        try:
            while line := await reader.readline():
                message = json.loads(line)
                if "reply" in message:
                    future = self._waiting.pop(message["reply"], None)
                    if future is not None and not future.done():
                        future.set_result(message)
                    continue
                # Started at once: most handlers never wait, and a message then costs
                # no turn of the event loop of its own (the keeper handles thousands).
                task = asyncio.Task(self._dispatch(message), loop=loop, eager_start=True)
                if not task.done():
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
        except (ConnectionError, asyncio.IncompleteReadError, ValueError) as e:
            logger.debug("channel closed: %s", e)
        finally:
            self._open.set()
            self._closed.set()
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(PeerGone("the other process is gone"))
            self._waiting.clear()
            for task in tasks:
                task.cancel()
            self._writer.close()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def _dispatch(self, message: Message) -> None:
        try:
            result = await self._handler(message)
        except Exception as e:
            logger.exception("handling %s failed", message.get("op"))
            result = {"failed": f"{type(e).__name__}: {e}"}
        if "id" in message:
            self._send({**(result or {}), "reply": message["id"]})

    async def call(self, op: str, **fields: Any) -> Message:
        """Send a call and wait for its reply; PeerGone if the other side is gone,
        CallFailed if it could not handle the call."""
        await self._open.wait()
        if self._closed.is_set():
            raise PeerGone("the other process is gone")
        ident = next(self._ids)
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        self._send({**fields, "op": op, "id": ident})
        reply = await future
        if "failed" in reply:
            raise CallFailed(f"{op}: {reply['failed']}")
        return reply

    def notify(self, op: str, **fields: Any) -> None:
        """Send a notification (fire and forget; dropped if the other side is gone)."""
        if not self._closed.is_set():
            self._send({**fields, "op": op})

    def _send(self, message: Message) -> None:
        line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        if self._writer is None:
            self._unsent.append(line)
        elif not self._writer.is_closing():
            self._writer.write(line)
