"""The in-process ``StreamingDispatch``: workers are objects in the same trio run."""

from __future__ import annotations

import weakref
from collections.abc import AsyncGenerator

import attrs
import trio

from routespec.discovery.instances import Instance
from routespec.errors import BackendKind, ErrorKind, RoutingError, one_line
from routespec.routing.streaming import (
    STREAM_ENDED_EARLY,
    Annotated,
    InflightGauge,
    InflightSlot,
    Request,
    WorkerHandler,
    pre_stream_failure,
)


@attrs.define
class InProcessDispatch:
    """Delivers requests to handlers by address; a killed address refuses connections and
    ends its open streams with ``Disconnected``."""

    _handlers: dict[str, WorkerHandler] = attrs.field(factory=dict)
    # Weak: a stream leaves its worker's set when its caller drops it, ended or not.
    _open: dict[str, weakref.WeakSet[InProcessStream]] = attrs.field(factory=dict)
    inflight: InflightGauge = attrs.field(factory=InflightGauge)

    def serve(self, address: str, handler: WorkerHandler) -> None:
        self._handlers[address] = handler
        self._open.setdefault(address, weakref.WeakSet())

    def kill(self, address: str) -> None:
        del self._handlers[address]
        for stream in list(self._open.pop(address)):  # served, so registered (serve)
            stream.sever()

    async def generate(self, instance: Instance, request: Request) -> InProcessStream:
        slot = self.inflight.open_slot()
        try:
            await trio.lowlevel.checkpoint()
            handler = self._handlers.get(instance.address)
            if handler is None:
                raise RoutingError(
                    ErrorKind.CANNOT_CONNECT, f"connection to {instance.address} refused"
                )
            rejection = handler.admit(request)
            if rejection is not None:
                raise rejection.to_error()  # TRN-004
            try:
                items = await handler.start(request)
            except RoutingError as worker_error:
                failure = self.pre_stream_failure(worker_error)  # TRN-005
                raise failure from failure.__cause__
            except Exception as error:  # TRN-023: the handler's own fault
                failure = self.pre_stream_failure(
                    RoutingError(BackendKind.UNKNOWN, one_line(error))
                )
                raise failure from failure.__cause__
        except BaseException:
            slot.close()
            raise
        stream = InProcessStream(items, slot)
        self._open[instance.address].add(stream)
        return stream

    def pre_stream_failure(self, worker_error: RoutingError) -> RoutingError:
        """What the caller sees when a worker fails before its first item (TRN-005)."""
        return pre_stream_failure(worker_error)


@attrs.define(eq=False)
class InProcessStream:
    _items: AsyncGenerator[object, None]
    _slot: InflightSlot
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
                except Exception as error:  # TRN-023: the handler's fault ends its stream
                    self._finish()
                    return Annotated(error=RoutingError(BackendKind.UNKNOWN, one_line(error)))
                finally:
                    self._read_scope = None
        self._finish()  # only sever() cancels the read: the worker died (DSP-015)
        return Annotated(error=RoutingError(ErrorKind.DISCONNECTED, STREAM_ENDED_EARLY))

    async def aclose(self) -> None:
        self._finish()
        await self._items.aclose()

    def _finish(self) -> None:
        self._done = True
        self._slot.close()
