"""Caller-side deadlines: every stage of a dispatch ends, with a typed error (spec: TMO).

``Deadlines`` holds a router's five deadlines, each finite by default (TMO-009).
``with_deadlines(transport, deadlines)`` is the transport a router with those deadlines
dispatches through (TMO-010): a transport that applies them itself (``DeadlineAware``: the
TCP transport, whose wire has all five stages) gives a view of itself with them; any other
``StreamingDispatch`` (the in-process one) is wrapped in ``DeadlineDispatch``, which bounds
the stages every transport has: establishing the stream, and its items.

A response stream is bounded by ``DeadlineStream``: the first item within
``first_item_timeout`` (TMO-004), each later one within ``inactivity_timeout`` of the one
before (TMO-005). On expiry the stream is closed (the worker is told to stop) and ends with
one ``ResponseTimeout`` item, which fault detection and migration act on like any other
worker failure (TMO-006, TMO-007).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import attrs
import trio

from routespec.discovery.instances import Instance
from routespec.errors import ErrorKind, RoutingError
from routespec.routing.streaming import (
    Annotated,
    ItemStream,
    ReadInterrupted,
    Request,
    StreamingDispatch,
    answered,
    readiness,
)

DEFAULT_CONNECT_TIMEOUT = 5.0  # TMO-001, as Dynamo's DYN_TCP_CONNECT_TIMEOUT
DEFAULT_ACK_TIMEOUT = 5.0  # TMO-002, as Dynamo's DYN_TCP_REQUEST_TIMEOUT
DEFAULT_ESTABLISH_TIMEOUT = 30.0  # TMO-003; Dynamo 1.6.1: none
DEFAULT_FIRST_ITEM_TIMEOUT = 600.0  # TMO-004; Dynamo 1.6.1: off by default
DEFAULT_INACTIVITY_TIMEOUT = 300.0  # TMO-005; Dynamo 1.6.1: off by default

INACTIVITY = "backend response inactivity timeout"  # Dynamo's words


def _positive_finite(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (isinstance(value, int | float) and 0 < value < math.inf):
        raise ValueError(
            f"{attribute.name} must be a finite number of seconds > 0, got {value!r} (TMO-010)"
        )


@attrs.frozen
class Deadlines:
    """A router's deadlines in seconds, each positive and finite (TMO-009, TMO-010)."""

    connect_timeout: float = attrs.field(
        default=DEFAULT_CONNECT_TIMEOUT, validator=_positive_finite
    )
    ack_timeout: float = attrs.field(default=DEFAULT_ACK_TIMEOUT, validator=_positive_finite)
    establish_timeout: float = attrs.field(
        default=DEFAULT_ESTABLISH_TIMEOUT, validator=_positive_finite
    )
    first_item_timeout: float = attrs.field(
        default=DEFAULT_FIRST_ITEM_TIMEOUT, validator=_positive_finite
    )
    inactivity_timeout: float = attrs.field(
        default=DEFAULT_INACTIVITY_TIMEOUT, validator=_positive_finite
    )


DEFAULT_DEADLINES = Deadlines()


def connect_timed_out(address: str, seconds: float) -> RoutingError:
    return RoutingError(
        ErrorKind.CONNECTION_TIMEOUT,
        f"TCP connect timeout to {address}: no connection within {seconds} s (TMO-001)",
    )


def ack_timed_out(address: str, seconds: float) -> RoutingError:
    return RoutingError(
        ErrorKind.CONNECTION_TIMEOUT,
        f"TCP request to {address} timed out: no ACK within {seconds} s (TMO-002)",
    )


def establish_timed_out(seconds: float) -> RoutingError:
    return RoutingError(
        ErrorKind.CONNECTION_TIMEOUT,
        f"Worker did not establish the response stream within {seconds} s of its ACK (TMO-003)",
    )


class DeadlineStream:
    """A response stream whose items must keep coming (TMO-004, TMO-005).

    The timer restarts with every item, as Dynamo's inactivity timeout does; on expiry the
    inner stream is closed and this stream ends with one ``ResponseTimeout`` item.
    """

    def __init__(self, inner: ItemStream, deadlines: Deadlines) -> None:
        self._inner = inner
        self._first_item_timeout = deadlines.first_item_timeout
        self._inactivity_timeout = deadlines.inactivity_timeout
        self._items_seen = False
        self._expired = False
        self._read_scope: trio.CancelScope | None = None
        self._interrupted = False
        self._ready = readiness(inner)

    def interrupter(self) -> Callable[[], None]:
        return self._interrupt

    def _interrupt(self) -> None:
        # The deadline's scope serves the reader too: one scope per item, not two.
        self._interrupted = True
        if self._read_scope is not None:
            self._read_scope.cancel()

    def __aiter__(self) -> DeadlineStream:
        return self

    async def __anext__(self) -> Annotated:
        if self._expired:
            raise StopAsyncIteration
        if self._interrupted:
            raise ReadInterrupted
        if self._ready is not None and self._ready():  # in hand: no deadline to arm
            item = await self._inner.__anext__()
            self._items_seen = True
            return item
        seconds = self._inactivity_timeout if self._items_seen else self._first_item_timeout
        with trio.move_on_after(seconds) as self._read_scope:
            try:
                item = await self._inner.__anext__()  # its end (StopAsyncIteration) passes
            finally:
                self._read_scope = None
            self._items_seen = True
            return item
        if self._interrupted:
            raise ReadInterrupted  # the reader's stop, not the deadline
        self._expired = True
        with trio.CancelScope(shield=True):
            await self._inner.aclose()  # the worker is told to stop (TRN-017)
        if answered(self._inner):
            raise StopAsyncIteration  # the answer was whole: only its end marker was late
        if self._items_seen:
            message = f"{INACTIVITY}: no item for {seconds} s (TMO-005)"
        else:
            message = f"{INACTIVITY}: no first item within {seconds} s (TMO-004)"
        return Annotated(error=RoutingError(ErrorKind.RESPONSE_TIMEOUT, message))

    async def aclose(self) -> None:
        self._expired = True
        await self._inner.aclose()


@runtime_checkable
class DeadlineAware(Protocol):
    """A transport that applies a router's deadlines itself."""

    def with_deadlines(self, deadlines: Deadlines) -> StreamingDispatch:
        """This transport, as a router with ``deadlines`` dispatches through it."""
        ...


def with_deadlines(transport: StreamingDispatch, deadlines: Deadlines) -> StreamingDispatch:
    """The transport a router with ``deadlines`` dispatches through (TMO-010)."""
    if isinstance(transport, DeadlineAware):
        return transport.with_deadlines(deadlines)
    return DeadlineDispatch(transport, deadlines)


class DeadlineDispatch:
    """Deadlines for a ``StreamingDispatch`` that has no wire stages of its own: its
    ``generate`` must return a stream within the establish timeout (TMO-003), and the stream
    is a ``DeadlineStream``."""

    def __init__(self, inner: StreamingDispatch, deadlines: Deadlines):
        self.inner = inner
        self.deadlines = deadlines

    async def generate(self, instance: Instance, request: Request) -> ItemStream:
        deadlines = self.deadlines
        with trio.move_on_after(deadlines.establish_timeout):
            return DeadlineStream(await self.inner.generate(instance, request), deadlines)
        raise establish_timed_out(deadlines.establish_timeout)
