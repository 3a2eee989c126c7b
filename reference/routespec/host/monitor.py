"""The response-stream monitor: terminal frames, the drain window, bookings (MON)."""

from __future__ import annotations

import collections
import enum
from collections.abc import Callable, Mapping
from typing import Protocol

import trio

from routespec.host.request import RequestContext
from routespec.routing.streaming import Annotated, ItemStream

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
    finish = data.get("finish_reason") if isinstance(data, Mapping) else None
    if finish in DRAINABLE_FINISH_REASONS:
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

    def __aiter__(self) -> MonitoredStream:
        return self

    async def __anext__(self) -> Annotated:
        while not self._ready:
            if self._done:
                raise StopAsyncIteration
            await self._step()
        return self._ready.popleft()

    async def _step(self) -> None:
        try:
            item = await self._read()
        except _Stopped:
            self._withheld = None  # MON-007: a client stop preempts the drain
            await self._close()
            return
        except _DrainExpired:
            await self._close()  # MON-005: the deadline ends the drain
            return
        except StopAsyncIteration:
            await self._close(completed=self._withheld is None)  # MON-005, MON-006
            return
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
        deadline = float("inf")
        if self._withheld is not None and self._deadline is not None:  # draining
            deadline = self._deadline
        with trio.CancelScope(deadline=deadline) as scope:
            self._context.listen(scope.cancel)
            try:
                return await self._inner.__anext__()
            finally:
                self._context.unlisten(scope.cancel)
        raise _Stopped if self._context.stopped else _DrainExpired

    def _publish_withheld(self) -> None:
        if self._withheld is not None:
            self._ready.append(self._withheld)
            self._withheld = None

    def _end(self, *, completed: bool) -> None:
        self._done = True
        self._admission.release(completed=completed)

    async def _close(self, *, completed: bool = False) -> None:
        self._publish_withheld()
        self._end(completed=completed)
        with trio.CancelScope(shield=True):
            await self._inner.aclose()

    async def aclose(self) -> None:
        if not self._done:
            self._end(completed=False)
        with trio.CancelScope(shield=True):
            await self._inner.aclose()
