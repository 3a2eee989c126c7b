"""The caller's final hop over TCP: Dynamo's addressed router, as a ``StreamingDispatch``.

Order of one dispatch (TRN-001, TRN-013): encode and size-check the control message, register the
response stream, refuse a tombstoned instance without writing, write the request, read the
ACK, wait for the worker to dial in, read the prologue, then stream frames.

Every stage has a deadline (spec: TMO): connecting and the ACK (the request plane's, TMO-001,
TMO-002), from the ACK to the prologue (TMO-003), and the stream's first item and the gaps
between items (``DeadlineStream``, TMO-004, TMO-005). ``deadlines`` is read once per dispatch.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import trio

from routespec.discovery.instances import Instance
from routespec.errors import ErrorKind, RoutingError
from routespec.routing.deadlines import (
    DEFAULT_DEADLINES,
    Deadlines,
    DeadlineStream,
    establish_timed_out,
)
from routespec.routing.streaming import (
    InflightGauge,
    Rejection,
    RejectionKind,
    Request,
    RequestStream,
    pre_stream_failure,
)
from routespec.transport.codecs import PayloadCodec, decode_json
from routespec.transport.connection import CONNECTION_ERRORS, LOOPBACK, FramedConnection
from routespec.transport.control import ControlMessage, StreamAddress
from routespec.transport.frames import (
    MAX_CONTROL_BYTES,
    SENTINEL,
    RequestMessage,
    TwoPart,
    WireProtocolError,
)
from routespec.transport.request_plane import RequestPlane
from routespec.transport.response_plane import NOT_ESTABLISHED, PendingStream, ResponsePlane
from routespec.transport.response_pool import REUSE_HEADER
from routespec.transport.response_stream import TcpResponseStream
from routespec.transport.wire_errors import decode_error

_json = json.encoder.encode_basestring_ascii  # a str as encode_json writes it

PROLOGUE_OK = b'{"error":null}'  # a worker's prologue when the stream begins (TRN-005)
TOMBSTONE_TTL = 5.0
TOMBSTONED = "Worker removed before request could be sent (tombstoned instance)"


class TcpDispatch:
    """Sends requests to workers over Dynamo's TCP request plane and call-home streams."""

    def __init__(
        self,
        nursery: trio.Nursery,
        response_plane: ResponsePlane,
        deadlines: Deadlines = DEFAULT_DEADLINES,
    ) -> None:
        self.inflight = InflightGauge()
        self.deadlines = deadlines  # TMO-010: this router's, each finite by default (TMO-009)
        self._response_plane = response_plane
        self._nursery = nursery
        self._request_plane = RequestPlane(nursery, self._connection_lost)
        self._tombstones: dict[int, float] = {}
        self._subject_prefix = os.urandom(8).hex()
        self._subjects = itertools.count()

    @classmethod
    @asynccontextmanager
    async def open(
        cls, host: str = LOOPBACK, deadlines: Deadlines = DEFAULT_DEADLINES
    ) -> AsyncIterator[TcpDispatch]:
        async with trio.open_nursery() as nursery:
            response_plane = ResponsePlane(host)
            await nursery.start(response_plane.run)
            dispatch = cls(nursery, response_plane, deadlines)
            try:
                yield dispatch
            finally:
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True):  # the exception in flight stays
                    await dispatch._request_plane.aclose()

    @property
    def response_connections(self) -> int:
        """Response connections the caller holds (TRN-042)."""
        return self._response_plane.held

    @property
    def response_address(self) -> str:
        """host:port where workers dial in with response streams."""
        return self._response_plane.address

    # removal watcher (TRN-013, TRN-014)

    def instance_removed(self, instance_id: int) -> None:
        """Fail the instance's pending registrations and tombstone it."""
        self._tombstones[instance_id] = trio.current_time() + TOMBSTONE_TTL
        self._response_plane.fail_where(
            RoutingError(ErrorKind.DISCONNECTED, NOT_ESTABLISHED), instance_id=instance_id
        )

    def instance_added(self, instance_id: int) -> None:
        self._tombstones.pop(instance_id, None)

    def _tombstoned(self, instance_id: int) -> bool:
        expiry = self._tombstones.get(instance_id)
        if expiry is not None and expiry <= trio.current_time():
            del self._tombstones[instance_id]
            return False
        return expiry is not None

    def _connection_lost(self, address: str) -> None:
        self._response_plane.fail_where(
            RoutingError(ErrorKind.DISCONNECTED, NOT_ESTABLISHED), address=address
        )

    # the dispatch

    def with_deadlines(self, deadlines: Deadlines) -> TcpDispatchWith:
        """This transport with ``deadlines`` in place of its own, for one router (TMO-010)."""
        return TcpDispatchWith(self, deadlines)

    async def generate(
        self, instance: Instance, request: Request, deadlines: Deadlines | None = None
    ) -> DeadlineStream:
        """Send ``request`` to ``instance`` under ``deadlines`` (by default this transport's)."""
        deadlines = self.deadlines if deadlines is None else deadlines
        slot = self.inflight.open_slot()  # TRN-015: closed on every path below
        registrations: list[PendingStream] = []
        connection: FramedConnection | None = None
        pump: trio.CancelScope | None = None
        try:
            address, _, path = instance.address.partition("/")
            codec = PayloadCodec(instance.payload_codec)  # one of CODECS (DSC-013)
            inputs = request.payload if isinstance(request.payload, RequestStream) else None
            response = self._stream_address(request)
            request_stream = None if inputs is None else self._stream_address(request)
            control = self._control(request, codec, response, request_stream)
            body = b"" if inputs is not None else _body(request, codec)  # TRN-020: header only
            for stream in (response, request_stream):
                if stream is not None:
                    registrations.append(
                        self._response_plane.register(stream.subject, instance.instance_id, address)
                    )
            if self._tombstoned(instance.instance_id):
                raise RoutingError(ErrorKind.DISCONNECTED, TOMBSTONED)  # nothing written
            message = _request_message(path, self._headers(path, request), control, body)
            ack = await self._request_plane.send(
                address,
                message,
                connect_timeout=deadlines.connect_timeout,  # TMO-001
                ack_timeout=deadlines.ack_timeout,  # TMO-002
            )
            _raise_rejection(ack)  # TRN-004: before any wait on the response plane
            if inputs is not None:
                pump = await self._nursery.start(_pump, registrations[1], inputs, codec)
            if registrations[0].ready():  # it came with the ACK: nothing to wait for
                connection = await self._establish(registrations[0])
            else:
                connection = None
                with trio.move_on_after(deadlines.establish_timeout):  # TMO-003
                    connection = await self._establish(registrations[0])
                if connection is None:
                    raise establish_timed_out(deadlines.establish_timeout)
            release = self._response_plane.release if connection.reuse_offered else None
            established = TcpResponseStream(connection, codec, slot, pump, release)
            return DeadlineStream(established, deadlines)  # TMO-004, TMO-005
        except BaseException:
            slot.close()
            if pump is not None:
                pump.cancel()
            opened = [pending.drop() for pending in registrations] + [connection]
            with trio.CancelScope(shield=True):
                for leftover in opened:
                    if leftover is not None:
                        await leftover.aclose()
            raise

    @staticmethod
    async def _establish(pending: PendingStream) -> FramedConnection:
        """The stream's connection, its prologue read (TRN-003: any other ACK accepts)."""
        connection = await pending.wait()
        await _read_prologue(connection)
        return connection

    def _stream_address(self, request: Request) -> StreamAddress:
        # A subject unique to this transport, which no peer can predict (TRN-051): a random
        # prefix, then a count (cheaper than a uuid4 per stream; the 32 hex digits are the
        # same shape).
        subject = f"{self._subject_prefix}{next(self._subjects):016x}"
        return StreamAddress(self._response_plane.address, subject, request.request_id)

    @staticmethod
    def _control(
        request: Request,
        codec: PayloadCodec,
        response: StreamAddress,
        request_stream: StreamAddress | None,
    ) -> bytes:
        """The control message, size-checked before anything is registered (TRN-002)."""
        try:
            return ControlMessage(
                request.request_id,
                codec,
                response,
                metadata=dict(request.annotations),
                request_stream=request_stream,
            ).encode()
        except WireProtocolError as error:
            raise RoutingError(
                ErrorKind.INVALID_ARGUMENT,
                f"request control message too large: {error} (TRN-002)",
            ) from None

    @staticmethod
    def _headers(path: str, request: Request) -> bytes:
        # What encode_json gives for the map of these strings, without building it; the
        # last offers the response connection for reuse (TRN-028, TRN-029; Dynamo ignores it).
        return (
            f'{{"x-endpoint-path":{_json(path)},"x-frontend-send-ts-ns":"{time.time_ns()}"'
            f',"request-id":{_json(request.request_id)},{REUSE_HEADER.decode()}}}'
        ).encode()


@attrs.frozen
class TcpDispatchWith:
    """A ``TcpDispatch`` as one router with its own deadlines sends through it."""

    dispatch: TcpDispatch
    deadlines: Deadlines

    async def generate(self, instance: Instance, request: Request) -> DeadlineStream:
        return await self.dispatch.generate(instance, request, self.deadlines)


def _request_message(path: str, headers: bytes, control: bytes, body: bytes) -> bytes:
    """The request message; one over the message size limit is the caller's
    ``InvalidArgument``, like an oversized control message (TRN-002)."""
    try:
        return RequestMessage(path, headers, TwoPart(control, body).encode()).encode()
    except WireProtocolError as error:
        raise RoutingError(
            ErrorKind.INVALID_ARGUMENT, f"request message too large: {error} (TRN-002)"
        ) from None


# TRN-043: a payload the codec cannot encode is the caller's InvalidArgument, before sending.
def _body(request: Request, codec: PayloadCodec) -> bytes:
    try:
        return codec.encode(request.payload)
    except (TypeError, ValueError, OverflowError) as error:
        raise RoutingError(
            ErrorKind.INVALID_ARGUMENT,
            f"request payload cannot be encoded as {codec.value}: {error}",
        ) from None


async def _pump(
    pending: PendingStream,
    inputs: RequestStream,
    codec: PayloadCodec,
    *,
    task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Send a bidirectional request's items to the worker that dialled in for them."""
    with trio.CancelScope() as scope:
        task_status.started(scope)
        connection = await pending.wait()
        try:
            async for item in inputs.items:  # one frame per item, as Dynamo 1.6.1 (TRN-047)
                await connection.send(TwoPart(body=codec.encode(item)).encode())
            await connection.send(TwoPart(header=SENTINEL).encode())
        except (RoutingError, *CONNECTION_ERRORS):
            pass  # the worker left: its response stream reports that
        finally:
            with trio.CancelScope(shield=True):
                await connection.aclose()


def _raise_rejection(ack: str) -> None:
    if not ack:  # accepted
        return
    for kind in RejectionKind:
        if ack.startswith(kind.value):
            raise Rejection(kind, ack[len(kind.value) :].strip()).to_error()


async def _read_prologue(connection: FramedConnection) -> None:
    try:
        frame = await connection.read_two_part(MAX_CONTROL_BYTES)
        if frame is not None and frame.header == PROLOGUE_OK:  # the usual one: no decoding
            return
        prologue = decode_json(frame.header, "prologue") if frame is not None else None
    except (WireProtocolError, *CONNECTION_ERRORS):
        prologue = None
    if not isinstance(prologue, dict):  # none came: the worker is lost (TRN-033)
        raise RoutingError(ErrorKind.DISCONNECTED, NOT_ESTABLISHED)
    typed, text = prologue.get("typed_error"), prologue.get("error")
    if typed is None and text is None:
        return
    worker_error = decode_error(typed) if typed is not None else RoutingError(None, str(text))
    failure = pre_stream_failure(worker_error)  # TRN-005
    raise failure from failure.__cause__
