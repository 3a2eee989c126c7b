"""The in-process ``StreamingDispatch``: workers are objects in the same trio run."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol

import attrs
import trio

from routespec.discovery import Instance
from routespec.errors import ErrorKind, RoutingError
from routespec.streaming import Annotated, Request

STREAM_ENDED_EARLY = "Stream ended before generation completed"


class WorkerHandler(Protocol):
    """A worker. ``start`` raising is a failure before the stream; the iterator raising
    ``RoutingError`` is an error item."""

    async def start(self, request: Request) -> AsyncGenerator[object, None]: ...


@attrs.define
class InProcessDispatch:
    """Delivers requests to handlers by address; a killed address refuses connections and
    ends its open streams with ``Disconnected``."""

    _handlers: dict[str, WorkerHandler] = attrs.field(factory=dict)
    _open: dict[str, set[InProcessStream]] = attrs.field(factory=dict)

    def serve(self, address: str, handler: WorkerHandler) -> None:
        self._handlers[address] = handler
        self._open.setdefault(address, set())

    def kill(self, address: str) -> None:
        del self._handlers[address]
        for stream in self._open.pop(address, set()):
            stream.sever()

    async def generate(self, instance: Instance, request: Request) -> InProcessStream:
        await trio.lowlevel.checkpoint()
        handler = self._handlers.get(instance.address)
        if handler is None:
            raise RoutingError(
                ErrorKind.CANNOT_CONNECT, f"connection to {instance.address} refused"
            )
        items = await handler.start(request)
        stream = InProcessStream(items, self._open[instance.address])
        self._open[instance.address].add(stream)
        return stream


@attrs.define(eq=False)
class InProcessStream:
    _items: AsyncGenerator[object, None]
    _registry: set[InProcessStream]
    _read_scope: trio.CancelScope | None = None
    _severed: bool = False
    _done: bool = False

    def sever(self) -> None:
        """The worker died: a pending or later read ends with ``Disconnected`` (DSP-015)."""
        self._severed = True
        if self._read_scope is not None:
            self._read_scope.cancel()

    def __aiter__(self) -> InProcessStream:
        return self

    async def __anext__(self) -> Annotated:
        if self._done:
            raise StopAsyncIteration
        if not self._severed:
            with trio.CancelScope() as self._read_scope:
                try:
                    return Annotated(data=await self._items.__anext__())
                except StopAsyncIteration:
                    self._finish()
                    raise
                except RoutingError as error:
                    self._finish()
                    return Annotated(error=error)
        self._finish()
        return Annotated(error=RoutingError(ErrorKind.DISCONNECTED, STREAM_ENDED_EARLY))

    async def aclose(self) -> None:
        self._finish()
        await self._items.aclose()

    def _finish(self) -> None:
        self._done = True
        self._registry.discard(self)
