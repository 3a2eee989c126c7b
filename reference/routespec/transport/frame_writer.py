"""Coalesced writes for a response stream: frames produced together leave in one write.

The producer never waits for the socket unless a quarter MiB is queued, and a writer task
sends whatever is queued whenever it runs. A handler that yields several items without
awaiting anything therefore costs one ``send`` instead of one per frame, and a handler that
awaits between items still has each item sent as soon as it blocks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from routespec.transport.connection import FramedConnection

HIGH_WATER_BYTES = 256 * 1024


class FrameWriter:
    def __init__(self, connection: FramedConnection) -> None:
        self._connection = connection
        self._pending: list[bytes] = []
        self._size = 0
        self._wake = trio.Event()
        self._room = trio.Event()
        self._closed = False

    @classmethod
    @asynccontextmanager
    async def open(cls, connection: FramedConnection) -> AsyncIterator[FrameWriter]:
        """Frames written inside the block are all sent (or the send fails) when it exits."""
        writer = cls(connection)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer._run)
            try:
                yield writer
            finally:
                writer._closed = True
                writer._wake.set()

    async def write(self, frame: bytes) -> None:
        self._pending.append(frame)
        self._size += len(frame)
        self._wake.set()
        if self._size >= HIGH_WATER_BYTES:  # back-pressure from a slow reader
            self._room = trio.Event()
            await self._room.wait()

    async def _run(self) -> None:
        while True:
            if not self._pending:
                if self._closed:
                    return
                await self._wake.wait()
                self._wake = trio.Event()
                continue
            batch = b"".join(self._pending)
            self._pending.clear()
            self._size = 0
            self._room.set()
            await self._connection.send(batch)
