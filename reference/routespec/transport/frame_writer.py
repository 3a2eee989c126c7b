"""Coalesced writes for a response stream: frames produced together leave in one write.

Frames are queued, and leave when the producer is about to wait for something (its
handler's next item is not ready: ``before_waiting``), when a quarter MiB is queued, or at
``flush``. A handler that yields several items without awaiting anything therefore costs one
``send`` instead of one per frame, and a handler that awaits between items still has each
item sent before it waits. No task is needed for that: what leaves when the producer is
about to wait is written without waiting (what the socket cannot take now stays queued for
the next write or ``flush``).
"""

from __future__ import annotations

import types
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

from routespec.transport.connection import FramedConnection

HIGH_WATER_BYTES = 256 * 1024

T = TypeVar("T")


def _nothing() -> None:
    pass


class FrameWriter:
    """Writes a response stream's frames on a socket connection (one the worker dialled).
    ``on_wait`` is called each time the producer is about to wait: for its handler
    (``about_to_wait``) or for the socket (``flush``)."""

    def __init__(
        self, connection: FramedConnection, on_wait: Callable[[], None] = _nothing
    ) -> None:
        self._connection = connection
        self._on_wait = on_wait
        self._pending: list[bytes] = []
        self._size = 0
        self._failure: OSError | None = None  # met by ``send_now``, raised by ``flush``

    async def write(self, frame: bytes) -> None:
        self._pending.append(frame)
        self._size += len(frame)
        if self._size >= HIGH_WATER_BYTES:  # back-pressure from a slow reader
            await self.flush()

    def send_now(self) -> None:
        """Write what is queued (and what the connection holds) as far as the socket takes
        it without waiting; the rest stays queued."""
        if self._failure is not None:
            return
        batch = self._take()
        try:
            rest = self._connection.send_nowait(batch)
        except OSError as error:  # never raised here: the producer may be mid-suspension
            self._failure, rest = error, batch
        self._pending, self._size = ([rest] if rest else []), len(rest)

    def about_to_wait(self) -> None:
        """The producer is about to wait: what is queued leaves now."""
        self.send_now()
        self._on_wait()

    async def flush(self) -> None:
        """Send everything queued. A cancellation leaves what was not sent queued, whole."""
        while self._pending or self._connection.holding:
            self.send_now()
            if self._failure is not None:
                raise self._failure
            if self._pending:
                self._on_wait()
                await self._connection.wait_writable()

    def _take(self) -> bytes:
        batch = b"".join(self._pending)
        self._pending.clear()
        self._size = 0
        return batch


@types.coroutine
def before_waiting(
    awaitable: Awaitable[T], about_to_wait: Callable[[], None]
) -> Generator[Any, Any, T]:
    """Await ``awaitable``; if it is about to suspend the task, call ``about_to_wait()``
    first (once). Each suspension is passed on to trio unchanged, and so is what trio
    resumes the task with: trio only ever ``send``s a task its outcome, never throws."""
    inner = awaitable.__await__()
    try:
        signal = inner.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    about_to_wait()
    while True:
        try:
            signal = inner.send((yield signal))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
