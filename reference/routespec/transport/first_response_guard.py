"""The first-response guard: a dispatch whose first item must be seen even if its caller
leaves (TRN-018, TRN-019).

A request may carry a guard (for example a booking that must last until the worker has
answered once). Such a dispatch runs detached from its caller until the first item or the
end of the stream, then releases the guard; the caller gets the first item and the rest of
the stream as usual. Retained dispatches are bounded process-wide.
"""

from __future__ import annotations

import attrs
import trio

from routespec.discovery.instances import Instance
from routespec.errors import ErrorKind, RoutingError
from routespec.routing.streaming import (
    Annotated,
    FirstResponseGuard,
    ItemStream,
    Request,
    StreamingDispatch,
)

MAX_RETAINED_DISPATCHES = 1024
RETAINED_LIMIT_REACHED = "retained request dispatch limit reached"


@attrs.define
class RetainedDispatchSlots:
    limit: int = MAX_RETAINED_DISPATCHES
    in_use: int = 0

    def try_take(self) -> bool:
        if self.in_use >= self.limit:
            return False
        self.in_use += 1
        return True

    def give_back(self) -> None:
        self.in_use -= 1


PROCESS_SLOTS = RetainedDispatchSlots()
"""The process-wide bound every ``FirstResponseGuardedDispatch`` shares by default."""


class FirstResponseGuardedDispatch:
    """A ``StreamingDispatch`` that retains guarded dispatches until their first item."""

    def __init__(
        self,
        inner: StreamingDispatch,
        nursery: trio.Nursery,
        slots: RetainedDispatchSlots = PROCESS_SLOTS,
    ) -> None:
        self._inner = inner
        self._nursery = nursery
        self._slots = slots

    async def generate(self, instance: Instance, request: Request) -> ItemStream:
        guard = request.first_response_guard
        if guard is None:
            return await self._inner.generate(instance, request)
        if not self._slots.try_take():
            guard.release()
            raise RoutingError(ErrorKind.RESOURCE_EXHAUSTED, RETAINED_LIMIT_REACHED)  # TRN-019
        handoff = _Handoff()
        self._nursery.start_soon(self._retain, instance, request, guard, handoff)
        return await handoff.take()

    async def _retain(
        self, instance: Instance, request: Request, guard: FirstResponseGuard, handoff: _Handoff
    ) -> None:
        """Runs in the dispatch's nursery, so a caller's cancellation does not reach it."""
        stream: ItemStream | None = None
        try:
            stream = await self._inner.generate(instance, request)
            first = await _first_item(stream)
        except RoutingError as failure:
            handoff.fail(failure)
            return
        finally:
            guard.release()  # TRN-018: the first item (or the end) has been seen
            self._slots.give_back()
        if not handoff.give(_PrefixedStream(first, stream)):
            with trio.CancelScope(shield=True):
                await stream.aclose()  # the caller left; nobody will read the rest


async def _first_item(stream: ItemStream) -> Annotated | None:
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return None
    except BaseException:
        with trio.CancelScope(shield=True):
            await stream.aclose()
        raise


@attrs.define(eq=False)
class _Handoff:
    """A one-shot hand-over from the detached task to the caller, or to nobody."""

    _ready: trio.Event = attrs.field(factory=trio.Event)
    _stream: ItemStream | None = None
    _failure: RoutingError | None = None
    _abandoned: bool = False

    def give(self, stream: ItemStream) -> bool:
        self._stream = stream
        self._ready.set()
        return not self._abandoned

    def fail(self, failure: RoutingError) -> None:
        self._failure = failure
        self._ready.set()

    async def take(self) -> ItemStream:
        try:
            await self._ready.wait()
        except trio.Cancelled:
            self._abandoned = True
            raise
        if self._failure is not None:
            raise self._failure
        assert self._stream is not None
        return self._stream


@attrs.define(eq=False)
class _PrefixedStream:
    """The first item, already read, then the rest of the stream."""

    _first: Annotated | None
    _rest: ItemStream

    def __aiter__(self) -> _PrefixedStream:
        return self

    async def __anext__(self) -> Annotated:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return await self._rest.__anext__()

    async def aclose(self) -> None:
        await self._rest.aclose()
