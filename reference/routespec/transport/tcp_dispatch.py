"""The caller's final hop over TCP: Dynamo's addressed router, as a ``StreamingDispatch``.

Order of one dispatch (TRN-001, TRN-013): encode and size-check the control message, register the
response stream, refuse a tombstoned instance without writing, write the request, read the
ACK, wait for the worker to dial in, read the prologue, then stream frames.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from routespec.discovery import Instance
from routespec.errors import ErrorKind, RoutingError
from routespec.streaming import (
    InflightGauge,
    Rejection,
    RejectionKind,
    Request,
    pre_stream_failure,
)
from routespec.transport.codecs import PayloadCodec, decode_json, encode_json
from routespec.transport.connection import FramedConnection
from routespec.transport.control import ControlMessage, StreamAddress
from routespec.transport.frames import (
    MAX_CONTROL_BYTES,
    RequestMessage,
    TwoPart,
    WireProtocolError,
)
from routespec.transport.request_plane import RequestPlane
from routespec.transport.response_plane import NOT_ESTABLISHED, PendingStream, ResponsePlane
from routespec.transport.response_stream import TcpResponseStream
from routespec.transport.wire_errors import decode_error
from routespec.transport.worker_server import CONNECTION_ERRORS, LOOPBACK

TOMBSTONE_TTL = 5.0
TOMBSTONED = "Worker removed before request could be sent (tombstoned instance)"


class TcpDispatch:
    """Sends requests to workers over Dynamo's TCP request plane and call-home streams."""

    def __init__(self, nursery: trio.Nursery, response_plane: ResponsePlane) -> None:
        self.inflight = InflightGauge()
        self._response_plane = response_plane
        self._request_plane = RequestPlane(nursery, self._connection_lost)
        self._tombstones: dict[int, float] = {}

    @classmethod
    @asynccontextmanager
    async def open(cls, host: str = LOOPBACK) -> AsyncIterator[TcpDispatch]:
        async with trio.open_nursery() as nursery:
            response_plane = ResponsePlane(host)
            await nursery.start(response_plane.run)
            dispatch = cls(nursery, response_plane)
            try:
                yield dispatch
            finally:
                nursery.cancel_scope.cancel()
                await dispatch._request_plane.aclose()

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

    async def generate(self, instance: Instance, request: Request) -> TcpResponseStream:
        slot = self.inflight.open_slot()  # TRN-015: closed on every path below
        pending: PendingStream | None = None
        connection: FramedConnection | None = None
        try:
            address, _, path = instance.address.partition("/")
            codec = PayloadCodec.named(instance.payload_codec)
            envelope = self._envelope(request, codec)
            pending = self._response_plane.register(instance.instance_id, address)
            if self._tombstoned(instance.instance_id):
                raise RoutingError(ErrorKind.DISCONNECTED, TOMBSTONED)  # nothing written
            message = RequestMessage(
                path, self._headers(path, request), envelope(pending.subject)
            ).encode()
            ack = await self._request_plane.send(address, message)
            _raise_rejection(ack)  # TRN-004: before any wait on the response plane
            connection = await pending.wait()  # TRN-003: any other ACK accepts
            await _read_prologue(connection)
            return TcpResponseStream(connection, codec, slot)
        except BaseException:
            slot.close()
            if pending is not None:
                connection = pending.drop() or connection
            if connection is not None:
                with trio.CancelScope(shield=True):
                    await connection.aclose()
            raise

    def _envelope(self, request: Request, codec: PayloadCodec) -> Callable[[str], bytes]:
        """Encode the body now and check the control size before anything is registered."""
        try:
            body = codec.encode(request.payload)
        except (TypeError, ValueError, OverflowError) as error:
            raise RoutingError(
                ErrorKind.INVALID_ARGUMENT,
                f"request payload cannot be encoded as {codec.value}: {error}",
            ) from None
        self._control(request, codec, "0" * 32)  # size check with a subject of final length

        def build(subject: str) -> bytes:
            return TwoPart(self._control(request, codec, subject), body).encode()

        return build

    def _control(self, request: Request, codec: PayloadCodec, subject: str) -> bytes:
        response = StreamAddress(self._response_plane.address, subject, request.request_id)
        try:
            return ControlMessage(
                request.request_id, codec, response, metadata=dict(request.annotations)
            ).encode()
        except WireProtocolError as error:
            raise RoutingError(
                ErrorKind.INVALID_ARGUMENT,
                f"request control message too large: {error} (TRN-002)",
            ) from None

    @staticmethod
    def _headers(path: str, request: Request) -> bytes:
        return encode_json(
            {
                "x-endpoint-path": path,
                "x-frontend-send-ts-ns": str(time.time_ns()),
                "request-id": request.request_id,
            }
        )


def _raise_rejection(ack: str) -> None:
    for kind in RejectionKind:
        if ack.startswith(kind.value):
            raise Rejection(kind, ack[len(kind.value) :].strip()).to_error()


async def _read_prologue(connection: FramedConnection) -> None:
    try:
        frame = await connection.read_two_part(MAX_CONTROL_BYTES)
        prologue = decode_json(frame.header, "prologue") if frame is not None else None
    except (WireProtocolError, *CONNECTION_ERRORS):
        prologue = None
    if not isinstance(prologue, dict):
        raise RoutingError(ErrorKind.DISCONNECTED, NOT_ESTABLISHED)
    typed, text = prologue.get("typed_error"), prologue.get("error")
    if typed is None and text is None:
        return
    worker_error = decode_error(typed) if typed is not None else RoutingError(None, str(text))
    failure = pre_stream_failure(worker_error)  # TRN-005
    raise failure from failure.__cause__
