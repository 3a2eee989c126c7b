"""Requests, response items and the ``StreamingDispatch`` seam: the final hop of a dispatch."""

from __future__ import annotations

import enum
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Protocol

import attrs

from routespec.discovery.instances import Instance
from routespec.errors import ErrorKind, RoutingError, is_migration_sensitive

STREAM_ENDED_EARLY = "Stream ended before generation completed"
PRE_STREAM_FAILURE = "Worker generate() failed before response stream: "


class FirstResponseGuard(Protocol):
    """Something a request holds until its worker has answered once (TRN-018)."""

    def release(self) -> None:
        """Called exactly once: at the first item, at the end of the stream, or on failure."""
        ...


@attrs.frozen
class Request:
    """One request as the router forwards it.

    ``annotations`` carry routing facts stamped by a ``prepare`` callback, such as the worker
    the request was prepared for (DSP-010).
    """

    request_id: str
    payload: object
    annotations: Mapping[str, str] = attrs.field(factory=dict)
    first_response_guard: FirstResponseGuard | None = attrs.field(default=None, eq=False)
    """Held until the first item or the end of the stream (TRN-018); never sent on a wire."""


@attrs.frozen(eq=False)
class RequestStream:
    """The payload of a bidirectional request: items the caller sends while it reads the
    response (TRN-020). The transport consumes ``items`` once."""

    items: AsyncIterator[object]


@attrs.frozen
class Annotated:
    """One response item: data, or a typed error item."""

    data: object = None
    error: RoutingError | None = None


class ItemStream(Protocol):
    """A response stream; ``aclose`` drops it early."""

    def __aiter__(self) -> ItemStream: ...

    async def __anext__(self) -> Annotated: ...

    async def aclose(self) -> None: ...


class ReadInterrupted(Exception):
    """A pending read ended because its reader interrupted it (see ``interrupter``)."""


def interrupter(stream: object) -> Callable[[], None] | None:
    """How a reader interrupts ``stream``'s pending read, or None if it cannot.

    A stream that opens a cancel scope for each read anyway offers ``interrupter()``: calling
    what it returns cancels that scope, and the read (pending, or the next one) raises
    ``ReadInterrupted``. A reader (the routing host's monitor) then needs no scope of its own
    per item: cancel scopes must nest, so it cannot open one only when a read must wait.
    """
    offer = getattr(stream, "interrupter", None)
    return None if offer is None else offer()


def answered(stream: object) -> bool:
    """Whether ``stream`` has its whole answer (Dynamo's ``complete_final``) and waits only
    for the end-of-stream marker, a wait the stream bounds itself."""
    return bool(getattr(stream, "final_seen", False))


def readiness(stream: object) -> Callable[[], bool] | None:
    """``stream``'s ``ready``, if it has one: True when its next read cannot wait (the item,
    or the end, is already in hand), so a reader need not arm a deadline for it."""
    ready = getattr(stream, "ready", None)
    return ready


class StreamingDispatch(Protocol):
    """Sends a request to one resolved instance and returns its response stream.

    A failure before the stream exists is raised as a top-level typed ``RoutingError``; later
    failures are error items. Anything else would hide faults from fault detection.
    """

    async def generate(self, instance: Instance, request: Request) -> ItemStream: ...


class RejectionKind(enum.Enum):
    """Why a worker refuses a request at its door; the ACK text starts with the prefix."""

    OVERLOADED = "Server overloaded:"
    UNAVAILABLE = "Server unavailable:"


@attrs.frozen
class Rejection:
    kind: RejectionKind
    message: str

    def ack_text(self) -> str:
        return f"{self.kind.value} {self.message}"

    def to_error(self) -> RoutingError:
        """``WorkerOverloaded`` or ``WorkerUnavailable``, carrying the worker's text (TRN-004)."""
        if self.kind is RejectionKind.OVERLOADED:
            return RoutingError(ErrorKind.WORKER_OVERLOADED, self.ack_text())
        return RoutingError(ErrorKind.WORKER_UNAVAILABLE, self.ack_text())


class WorkerHandler(Protocol):
    """A worker as both transports serve it.

    ``admit`` answers at the door (None = accepted). ``start`` raising ``RoutingError`` is a
    failure before the response stream; the iterator raising ``RoutingError`` is an error item.
    """

    def admit(self, request: Request) -> Rejection | None: ...

    async def start(self, request: Request) -> AsyncGenerator[object, None]: ...


def pre_stream_failure(worker_error: RoutingError) -> RoutingError:
    """What the caller sees when a worker fails before its first item (TRN-005).

    The outer error is always ``CannotConnect`` (the request may go elsewhere); the worker's
    typed error is attached as the cause only when no link of it is migration-sensitive, so
    a cause such as ``Cancelled`` can never veto or leak through this path (TRN-006). Its
    text stays.
    """
    message = PRE_STREAM_FAILURE + str(worker_error)
    cause = None if is_migration_sensitive(worker_error) else worker_error
    return RoutingError(ErrorKind.CANNOT_CONNECT, message, cause=cause)


@attrs.define
class InflightGauge:
    """Dispatches between the start of ``generate`` and the end of their stream (TRN-015)."""

    count: int = 0

    def open_slot(self) -> InflightSlot:
        self.count += 1
        return InflightSlot(self)


@attrs.define(eq=False)
class InflightSlot:
    _gauge: InflightGauge
    _open: bool = True

    def close(self) -> None:
        """Idempotent: every path that ends a dispatch may call it."""
        if self._open:
            self._open = False
            self._gauge.count -= 1
