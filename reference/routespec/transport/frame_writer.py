"""Coalesced writes for a response stream: frames produced together leave in one write.

The producer never waits for the socket unless a quarter MiB is queued, and a writer task
sends whatever is queued whenever it runs. A handler that yields several items without
awaiting anything therefore costs one ``send`` instead of one per frame, and a handler that
awaits between items still has each item sent as soon as it blocks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import trio

from routespec.transport.connection import FramedConnection

HIGH_WATER_BYTES = 256 * 1024

Watcher = Callable[[FramedConnection, trio.CancelScope], Awaitable[None]]


class FrameWriter:
    def __init__(self, connection: FramedConnection) -> None:
        self._connection = connection
        self._pending: list[bytes] = []
        self._size = 0
        self._wake = trio.Event()
        self._room = trio.Event()
        self._closed = False
        self._then_cancel: trio.CancelScope | None = None  # the watcher's, once all is sent
        self.flushed = False  # every frame written was sent, and the block has ended

    @classmethod
    @asynccontextmanager
    async def open(
        cls, connection: FramedConnection, watch: Watcher | None = None
    ) -> AsyncIterator[FrameWriter]:
        """Frames written inside the block are all sent (or the send fails) when it exits.

        ``watch(connection, scope)``, if given, runs alongside in the same nursery (one
        nursery per stream, not two) from the moment the producer first blocks: cancelling
        ``scope`` ends the block at once, unsent frames dropped (a caller's stop); once every
        frame is sent, the watcher is cancelled. A block that never waits (a handler whose
        items are ready) has nothing to interrupt, so it costs no watcher task.
        """
        writer = cls(connection)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer._run, watch, nursery)
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

    async def _run(self, watch: Watcher | None, nursery: trio.Nursery) -> None:
        # This task first runs when the producer first blocks, or once it has finished.
        if watch is not None and not self._closed:
            nursery.start_soon(watch, self._connection, nursery.cancel_scope)
            self._then_cancel = nursery.cancel_scope
        if not self._pending and self._connection.holding:
            # The producer blocked before its first frame: what the connection holds (the
            # stream's introduction) must not wait for it.
            await self._connection.send(b"")
        while True:
            if not self._pending:
                if self._closed:
                    self.flushed = True
                    if self._then_cancel is not None:
                        self._then_cancel.cancel()
                    return
                await self._wake.wait()
                self._wake = trio.Event()
                continue
            batch = b"".join(self._pending)
            self._pending.clear()
            self._size = 0
            self._room.set()
            await self._connection.send(batch)
