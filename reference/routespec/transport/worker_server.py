"""The worker side of the TCP transport: request server, ACK, call-home response streams.

One ``WorkerServer`` listens on a request-plane port and serves handlers by endpoint path.
For each accepted request it ACKs on the same connection, dials the caller's response-stream
address, and writes handshake, prologue, data frames, ``complete_final`` and the sentinel.
A ``stop`` or ``kill`` from the caller ends the stream without a final frame. ``drain`` is a
graceful shutdown: new requests are refused, open streams get a grace period to finish, and
the rest end with ``Backend(EngineShutdown)`` so that their callers migrate them.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator

import attrs
import trio

from routespec.errors import BackendKind, ErrorKind, RoutingError
from routespec.routing.streaming import (
    Rejection,
    RejectionKind,
    Request,
    RequestStream,
    WorkerHandler,
)
from routespec.transport.codecs import PayloadCodec, decode_json, encode_json
from routespec.transport.connection import (
    CONNECTION_ERRORS,
    LOOPBACK,
    FramedConnection,
    open_stream,
)
from routespec.transport.control import KILL, STOP, ControlMessage, StreamAddress, parse_control
from routespec.transport.frame_writer import FrameWriter
from routespec.transport.frames import (
    SENTINEL,
    TwoPart,
    WireProtocolError,
    decode_two_part,
    encode_ack,
)
from routespec.transport.wire_errors import encode_error

SENTINEL_FRAME = TwoPart(header=SENTINEL).encode()
PROLOGUE_OK = TwoPart(header=b'{"error":null}').encode()
SHUTTING_DOWN = "worker is shutting down"
STREAM_CUT_AT_SHUTDOWN = "worker shut down before the stream finished"


def data_frame(codec: PayloadCodec, annotated: dict[str, object]) -> bytes:
    return TwoPart(body=codec.encode({"data": annotated, "complete_final": False})).encode()


def final_frame(codec: PayloadCodec) -> bytes:
    return TwoPart(body=codec.encode({"complete_final": True})).encode()


def error_annotated(error: RoutingError) -> dict[str, object]:
    return {"event": "error", "error": encode_error(error)}


class WorkerServer:
    """Serves ``WorkerHandler``s over the request plane on ``host`` (loopback by default)."""

    def __init__(self, host: str = LOOPBACK, port: int = 0) -> None:
        self.host = host
        self.port = port
        self.bytes_received: collections.Counter[str] = collections.Counter()
        self._handlers: dict[str, WorkerHandler] = {}
        self._scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self._draining = False
        self._open_streams: set[trio.CancelScope] = set()
        self._streams_changed = trio.Event()

    def serve(self, path: str, handler: WorkerHandler) -> str:
        """Serve ``handler`` at ``path``; returns the transport address discovery records.

        The worker answers in whichever codec (msgpack or JSON) the caller's control message
        names, so its discovery record may declare either."""
        self._handlers[path] = handler
        return f"{self.host}:{self.port}/{path}"

    def withdraw(self, path: str) -> None:
        self._handlers.pop(path, None)

    def kill(self) -> None:
        """Stop at once, as a crashed process would: every socket closes, nothing is flushed."""
        self._scope.cancel()

    async def drain(self, grace_period: float) -> None:
        """Refuse new requests, give open streams ``grace_period`` seconds to finish, then end
        the rest with ``Backend(EngineShutdown)``, a migratable error."""
        self._draining = True
        with trio.move_on_after(grace_period):
            await self._wait_for_streams()
        for scope in self._open_streams:
            scope.cancel()
        await self._wait_for_streams()

    async def _wait_for_streams(self) -> None:
        while self._open_streams:
            self._streams_changed = trio.Event()
            await self._streams_changed.wait()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        with self._scope:
            listeners = await trio.open_tcp_listeners(self.port, host=self.host)
            self.port = listeners[0].socket.getsockname()[1]
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started(self.port)
                await trio.serve_listeners(self._serve_connection, listeners)

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        connection = FramedConnection(stream)
        async with stream:
            try:
                while (message := await connection.read_request()) is not None:
                    self.bytes_received[message.path] += len(message.encode())
                    await self._accept(connection, message.path, message.payload)
            except (WireProtocolError, *CONNECTION_ERRORS):
                return  # a broken peer loses only its own connection (TRN-012)

    async def _accept(self, connection: FramedConnection, path: str, payload: bytes) -> None:
        parts = decode_two_part(payload)
        control = parse_control(parts.header)
        handler = self._handlers.get(path)
        if handler is None:
            await connection.send(encode_ack(f"Server unavailable: no endpoint at {path}"))
            return
        failure: WireProtocolError | None = None
        body: object = None
        if control.request_stream is None:  # a bidirectional envelope is header-only
            try:
                body = control.payload_codec.decode(parts.body, "request.body")
            except WireProtocolError as error:
                failure = error
        request = Request(control.request_id, body, control.metadata)
        rejection = handler.admit(request)
        if self._draining:  # WorkerUnavailable at the caller: it migrates the request
            rejection = Rejection(RejectionKind.UNAVAILABLE, SHUTTING_DOWN)
        await connection.send(encode_ack("" if rejection is None else rejection.ack_text()))
        if rejection is None:
            assert self._nursery is not None
            self._nursery.start_soon(self._respond, control, handler, request, failure)

    async def _respond(
        self,
        control: ControlMessage,
        handler: WorkerHandler,
        request: Request,
        failure: WireProtocolError | None,
    ) -> None:
        try:
            async with contextlib.AsyncExitStack() as streams:
                if control.request_stream is not None:
                    inputs = await streams.enter_async_context(
                        _dial(control.request_stream, "request")
                    )
                    request = attrs.evolve(
                        request, payload=RequestStream(_read_inputs(inputs, control.payload_codec))
                    )
                try:
                    if failure is not None:
                        raise RoutingError(ErrorKind.INVALID_ARGUMENT, str(failure))
                    items = await handler.start(request)
                except RoutingError as error:
                    prologue = {"error": str(error), "typed_error": encode_error(error)}
                    refusal = TwoPart(header=encode_json(prologue)).encode()
                    await streams.enter_async_context(_dial(control.response, "response", refusal))
                    return
                streams.push_async_callback(_close_shielded, items)
                output = await streams.enter_async_context(
                    _dial(control.response, "response", PROLOGUE_OK)
                )
                await self._stream(output, control.payload_codec, items)
        except* (OSError, *CONNECTION_ERRORS):
            pass  # the caller went away; nothing is left to tell it

    async def _stream(
        self, output: FramedConnection, codec: PayloadCodec, items: AsyncGenerator[object, None]
    ) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_control, output, nursery.cancel_scope)
            await self.send_items(output, codec, items)
            nursery.cancel_scope.cancel()

    async def send_items(
        self,
        connection: FramedConnection,
        codec: PayloadCodec,
        items: AsyncGenerator[object, None],
    ) -> None:
        """Data frames, an error item if the handler fails or a drain cuts the stream, then
        final frame and sentinel."""
        drained = trio.CancelScope()  # cancelled by ``drain`` after its grace period
        self._open_streams.add(drained)
        try:
            async with FrameWriter.open(connection) as out:
                with drained:
                    try:
                        async for item in items:
                            if not await self.send_item(out, codec, item):
                                return  # the stream ends here, without a final frame
                    except RoutingError as error:
                        await out.write(data_frame(codec, error_annotated(error)))
                if drained.cancelled_caught:
                    cut = RoutingError(BackendKind.ENGINE_SHUTDOWN, STREAM_CUT_AT_SHUTDOWN)
                    await out.write(data_frame(codec, error_annotated(cut)))
                await out.write(final_frame(codec) + SENTINEL_FRAME)
        finally:  # after the writer has flushed: a drain waits for the frames to leave
            self._open_streams.discard(drained)
            self._streams_changed.set()

    async def send_item(self, out: FrameWriter, codec: PayloadCodec, item: object) -> bool:
        """Write one item; False ends the stream at once."""
        await out.write(data_frame(codec, {"data": item}))
        return True


@contextlib.asynccontextmanager
async def _dial(
    address: StreamAddress, stream_type: str, then: bytes = b""
) -> AsyncIterator[FramedConnection]:
    """Dial the caller's stream server, introduce the stream by its subject and send
    ``then`` (the prologue) in the same write."""
    stream = await open_stream(address.address)
    async with stream:
        connection = FramedConnection(stream)
        handshake = {"subject": address.subject, "stream_type": stream_type}
        await connection.send(TwoPart(header=encode_json(handshake)).encode() + then)
        yield connection


async def _read_inputs(
    connection: FramedConnection, codec: PayloadCodec
) -> AsyncGenerator[object, None]:
    """A bidirectional request's items, until the caller's ``complete_final`` (TRN-020)."""
    while True:
        try:
            frame = await connection.read_two_part()
        except (WireProtocolError, *CONNECTION_ERRORS):
            frame = None
        if frame is None:
            raise RoutingError(ErrorKind.DISCONNECTED, "request stream ended before complete_final")
        wrapper = codec.decode(frame.body, "request_stream.frame")
        if not isinstance(wrapper, dict) or wrapper.get("complete_final") is True:
            return
        yield wrapper.get("data")


async def _close_shielded(items: AsyncGenerator[object, None]) -> None:
    with trio.CancelScope(shield=True):
        await items.aclose()


async def _watch_control(connection: FramedConnection, stream_scope: trio.CancelScope) -> None:
    """End the stream when the caller sends ``stop``/``kill`` or goes away."""
    try:
        while (frame := await connection.read_two_part()) is not None:
            if frame.header and decode_json(frame.header, "control") in (STOP, KILL):
                break
    except (WireProtocolError, *CONNECTION_ERRORS):
        pass
    stream_scope.cancel()
