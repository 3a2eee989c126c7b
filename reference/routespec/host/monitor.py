"""The response-stream monitor: terminal frames, the drain window, bookings (MON)."""

from __future__ import annotations

import collections
import enum
from collections.abc import Callable, Mapping
from typing import Protocol

import trio

from routespec.host.request import RequestContext
from routespec.routing.streaming import Annotated, ItemStream, ReadInterrupted, interrupter

DRAIN_TIMEOUT = 5.0
DRAINABLE_FINISH_REASONS = frozenset({"error", "cancelled"})


class ItemClass(enum.Enum):
    FAILED = "failed"
    DRAINABLE_TERMINAL = "drainable-terminal"
    HEALTHY = "healthy"


def classify_item(item: Annotated) -> ItemClass:
    """MON-001: a terminal frame carries no typed error, so it is worth draining for one."""
    if item.error is not None:
        return ItemClass.FAILED
    data = item.data
    # ``type(...) is dict`` first: the ABC check costs more than the rest of the item's trip
    if (type(data) is dict or isinstance(data, Mapping)) and data.get(
        "finish_reason"
    ) in DRAINABLE_FINISH_REASONS:
        return ItemClass.DRAINABLE_TERMINAL
    return ItemClass.HEALTHY


class Admission(Protocol):
    def release(self, *, completed: bool) -> None:
        """Ends the request's bookings and counts it; the monitor calls it exactly once."""
        ...


class _Stopped(Exception):
    """The caller stopped the request while the monitor waited for a frame."""


class _DrainExpired(Exception):
    """The drain window closed while the monitor waited for a frame."""


class MonitoredStream:
    """The caller's view of one dispatch: items pass through in order, except that a
    terminal frame waits (at most ``DRAIN_TIMEOUT``) for a typed error that would replace it."""

    def __init__(
        self,
        inner: ItemStream,
        admission: Admission,
        context: RequestContext,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self._inner = inner
        self._admission = admission
        self._context = context
        self._clock = clock
        self._withheld: Annotated | None = None
        self._deadline: float | None = None
        self._ready: collections.deque[Annotated] = collections.deque()
        self._done = False
        self._read_scope: trio.CancelScope | None = None
        self._reading = False
        self._listening = False
        # A stream that can interrupt its own read spares a cancel scope per item (MON-007).
        self._interrupt = interrupter(inner)

    def __aiter__(self) -> MonitoredStream:
        return self

    async def __anext__(self) -> Annotated:
        if (
            self._interrupt is not None
            and self._listening
            and self._deadline is None  # nothing withheld, no drain window
            and not self._ready
            and not self._done
            and not self._context.stopped
        ):
            # The common case, without _step's frames: a healthy item passes straight through.
            self._reading = True
            try:
                item = await self._inner.__anext__()
            except ReadInterrupted:
                await self._ended(_Stopped())
            except StopAsyncIteration as end:
                await self._ended(end)
            else:
                if classify_item(item) is ItemClass.HEALTHY:
                    return item
                await self._take(item)
            finally:
                self._reading = False
        while not self._ready:
            if self._done:
                raise StopAsyncIteration
            await self._step()
        return self._ready.popleft()

    async def _step(self) -> None:
        try:
            item = await self._read()
        except (_Stopped, _DrainExpired, StopAsyncIteration) as end:
            await self._ended(end)
            return
        await self._take(item)

    async def _ended(self, end: Exception) -> None:
        """The read ended without an item: a stop, the drain deadline, or the stream's end."""
        if isinstance(end, _Stopped):
            self._withheld = None  # MON-007: a client stop preempts the drain
            await self._close()
        elif isinstance(end, _DrainExpired):
            await self._close()  # MON-005: the deadline ends the drain
        else:
            await self._close(completed=self._withheld is None)  # MON-005, MON-006

    async def _take(self, item: Annotated) -> None:
        kind = classify_item(item)
        if kind is ItemClass.FAILED:
            self._withheld = None  # MON-003: the error replaces the terminal frame
            await self._close()  # MON-002: released before the caller sees it
            self._ready.append(item)
        elif kind is ItemClass.DRAINABLE_TERMINAL:
            self._publish_withheld()
            self._withheld = item
            if self._deadline is None:
                self._deadline = self._clock() + DRAIN_TIMEOUT  # MON-004: armed once
        else:
            self._publish_withheld()
            self._ready.append(item)

    async def _read(self) -> Annotated:
        if self._context.stopped:
            raise _Stopped
        if not self._listening:  # one listener for the stream's life, not one per item
            self._listening = True
            self._context.listen(self._on_stop)
        deadline = None if self._withheld is None else self._deadline  # set: draining
        if self._interrupt is not None and deadline is None:
            self._reading = True  # a stop interrupts the stream's own read scope
            try:
                return await self._inner.__anext__()
            except ReadInterrupted:
                raise _Stopped from None
            finally:
                self._reading = False
        # no deadline to register: the cheaper scope
        scope = trio.CancelScope() if deadline is None else trio.CancelScope(deadline=deadline)
        with scope:
            self._read_scope = scope
            try:
                return await self._inner.__anext__()
            finally:
                self._read_scope = None
        raise _Stopped if self._context.stopped else _DrainExpired

    def _on_stop(self) -> None:
        if self._read_scope is not None:
            self._read_scope.cancel()  # MON-007: a stop interrupts a waiting read
        elif self._reading and self._interrupt is not None:
            self._interrupt()

    def _publish_withheld(self) -> None:
        if self._withheld is not None:
            self._ready.append(self._withheld)
            self._withheld = None

    def _end(self, *, completed: bool) -> None:
        self._done = True
        if self._listening:
            self._listening = False
            self._context.unlisten(self._on_stop)
        self._admission.release(completed=completed)

    async def _close(self, *, completed: bool = False) -> None:
        self._publish_withheld()
        self._end(completed=completed)
        await self._inner.aclose()  # cancellation-safe itself: no shield needed here

    async def aclose(self) -> None:
        if not self._done:
            self._end(completed=False)
        await self._inner.aclose()
