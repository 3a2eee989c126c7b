"""A worker server that breaks the response-stream protocol on request, for the suite's
wire checks (TRN-007 … TRN-010, TRN-012, TRN-014) and for drilling other runtimes' callers.

It also goes silent at any stage of the wire exchange a ``Silent`` script names (the
caller-side deadlines' checks, spec: TMO): after reading a request without ACKing it, after
the ACK without dialling back, and after the handshake without the prologue.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import socket
import struct

import trio

from routespec.routing.streaming import Request, RequestStream, WorkerHandler
from routespec.testing.scripted import (
    ErrorItemMarker,
    FrameMarker,
    ScriptedWorker,
    WireFaultMarker,
)
from routespec.testing.target import (
    Misbehave,
    Silent,
    SilentStage,
    WireFault,
    WriteAck,
    WriteAcks,
    WritePrologue,
)
from routespec.transport.codecs import PayloadCodec, encode_json
from routespec.transport.connection import (
    CONNECTION_ERRORS,
    LOOPBACK,
    FramedConnection,
    open_stream,
)
from routespec.transport.control import ControlMessage, parse_control
from routespec.transport.frame_writer import FrameWriter
from routespec.transport.frames import (
    ACK_PREFIX,
    TWO_PART_PREFIX,
    TwoPart,
    WireProtocolError,
    decode_two_part,
    encode_ack,
)
from routespec.transport.response_pool import ResponsePool
from routespec.transport.worker_server import (
    PROLOGUE_OK,
    SENTINEL_FRAME,
    WorkerLimits,
    WorkerServer,
    _await_release,
    _dial,
    _read_inputs,
    data_frame,
    final_frame,
)

GARBLED = b"\xc1"  # a byte msgpack never uses
RESET_AFTER = 0.1  # seconds (of the target's clock) before a reset or a late sentinel
LISTEN_AFTER_SENTINEL = 1.0  # seconds ``FRAME_AFTER_SENTINEL`` reads what the caller writes
# The request whose stream a drill task writes (set in ``_respond``, read by ``send_item``).
_REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar(
    "routespec_drill_request", default=""
)


def silent_at(handler: WorkerHandler | None, stage: SilentStage) -> ScriptedWorker | None:
    """The scripted worker behind ``handler`` if its script is silent at ``stage``."""
    if not isinstance(handler, ScriptedWorker):
        return None
    script = handler.script
    return handler if isinstance(script, Silent) and script.stage is stage else None


class DrillWorkerServer(WorkerServer):
    def __init__(self, host: str = LOOPBACK, *, limits: WorkerLimits | None = None) -> None:
        super().__init__(host, limits=limits)  # the server's own default port: any free one
        self.control_messages: dict[str, dict[str, object]] = {}  # by request id, as read
        self.control_words: dict[str, list[object]] = {}  # by request id (WireFault.LISTEN)
        self._held_acks: dict[FramedConnection, list[bytes]] = {}  # WriteAcks, not yet sent
        self._acks_written: dict[FramedConnection, int] = {}  # WriteAcks texts taken so far

    async def _accept(
        self, connection: FramedConnection, path: str, payload: bytes, reuse: bool
    ) -> None:
        self._record_control(payload)
        handler = self._handlers.get(path)
        if isinstance(handler, ScriptedWorker) and isinstance(handler.script, WriteAck):
            await self._write_ack(connection, handler.script)
            return
        if isinstance(handler, ScriptedWorker) and isinstance(handler.script, WriteAcks):
            await self._hold_ack(connection, handler.script)
            return
        worker = silent_at(handler, SilentStage.DIAL_BEFORE_ACK)
        if worker is not None:
            try:
                parts = decode_two_part(payload)
                control = parse_control(parts.header)
            except WireProtocolError:
                control = None  # the server's own handling answers a broken request
            if control is not None:
                worker.arrived(Request(control.request_id, None, control.metadata))
                await self._dial_before_ack(connection, control, worker, parts.body)
                return
        worker = silent_at(handler, SilentStage.ACK)
        if worker is not None:
            try:
                control = parse_control(decode_two_part(payload).header)
            except WireProtocolError:
                control = None  # the server's own handling answers a broken request
            if control is not None:
                worker.arrived(Request(control.request_id, None, control.metadata))
                await worker.silence(control.request_id)  # read, not answered
        await super()._accept(connection, path, payload, reuse)

    def _record_control(self, payload: bytes) -> None:
        try:
            control = json.loads(decode_two_part(payload).header)
        except (WireProtocolError, ValueError):
            return  # the server's own handling answers a broken request
        if isinstance(control, dict) and isinstance(control.get("id"), str):
            self.control_messages[control["id"]] = control

    async def _write_ack(self, connection: FramedConnection, ack: WriteAck) -> None:
        length = len(ack.text) if ack.length is None else ack.length
        await connection.send((ACK_PREFIX.pack(length) + ack.text)[: ack.cut])
        if ack.close:
            await connection.aclose()

    async def _hold_ack(self, connection: FramedConnection, acks: WriteAcks) -> None:
        """Hold the next of ``acks.texts`` with the ACKs held on ``connection``; write them
        all once as many are held as there are texts, or 0.5 s after the first."""
        taken = self._acks_written.get(connection, 0)
        self._acks_written[connection] = taken + 1
        held = self._held_acks.setdefault(connection, [])
        held.append(acks.texts[taken % len(acks.texts)])
        if len(held) == len(acks.texts):
            await self._write_held_acks(connection, acks.split)
        elif len(held) == 1:
            self._start(connection.peer, self._write_held_acks, connection, acks.split, 0.5)

    async def _write_held_acks(
        self, connection: FramedConnection, split: int | None, after: float = 0.0
    ) -> None:
        if after:
            await trio.sleep(after)
        held = self._held_acks.pop(connection, [])
        if not held:
            return  # written already
        data = b"".join(ACK_PREFIX.pack(len(text)) + text for text in held)
        cut = len(data) if split is None else len(data) - len(held[-1]) + split
        with contextlib.suppress(*CONNECTION_ERRORS):
            await connection.send(data[:cut])
            if cut < len(data):
                await trio.sleep(RESET_AFTER)  # the caller reads the first part alone
                await connection.send(data[cut:])

    async def _respond(
        self,
        control: ControlMessage,
        handler: WorkerHandler,
        request: Request,
        failure: WireProtocolError | None,
        pool: ResponsePool | None = None,
    ) -> None:
        script = handler.script if isinstance(handler, ScriptedWorker) else None
        _REQUEST_ID.set(request.request_id)  # this task's context only
        if isinstance(script, Misbehave) and script.fault is WireFault.NO_CALL_HOME:
            await trio.sleep_forever()  # ACKed, and the stream never comes
        if (worker := silent_at(handler, SilentStage.DIAL_BACK)) is not None:
            await worker.silence(request.request_id)  # ACKed; the dial-back comes late
        worker = silent_at(handler, SilentStage.HANDSHAKE)
        if worker is not None and control.request_stream is None and failure is None:
            await self._handshake_then_silence(control, worker, request)
            return
        if (
            isinstance(handler, ScriptedWorker)
            and isinstance(script, WritePrologue)
            and control.request_stream is None
            and failure is None
        ):
            await self._write_prologue(control, handler, request, script.prologue)
            return
        await super()._respond(control, handler, request, failure, pool)

    async def _write_prologue(
        self, control: ControlMessage, worker: ScriptedWorker, request: Request, prologue: str
    ) -> None:
        """Dial back with the prologue ``prologue`` verbatim, then the script's items."""
        try:
            header = TwoPart(header=prologue.encode()).encode()
            async with _dial(control.response, "response", header, self.budget) as connection:
                await self._serve(connection, control, worker, request)
        except* (OSError, *CONNECTION_ERRORS):
            pass  # the caller the prologue failed closed the stream

    async def _handshake_then_silence(
        self, control: ControlMessage, worker: ScriptedWorker, request: Request
    ) -> None:
        """Dial back and introduce the stream, then say nothing until released."""
        try:
            stream = await open_stream(control.response.address)
            async with stream:
                connection = FramedConnection(stream)
                handshake = {"subject": control.response.subject, "stream_type": "response"}
                await connection.send(TwoPart(header=encode_json(handshake)).encode())
                await worker.silence(request.request_id)
                await connection.send(PROLOGUE_OK)
                await self._serve(connection, control, worker, request)
        except* (OSError, *CONNECTION_ERRORS):
            pass  # the caller gave up on the stream and closed it

    async def _dial_before_ack(
        self,
        connection: FramedConnection,
        control: ControlMessage,
        worker: ScriptedWorker,
        body: bytes,
    ) -> None:
        """Dial back the request's streams and introduce them, holding the ACK until
        released; then ACK, and serve the request on the connections dialled."""
        streams = [(control.response, "response")]
        if control.request_stream is not None:
            streams.append((control.request_stream, "request"))
        dialled: list[FramedConnection] = []
        try:
            for address, stream_type in streams:
                dialled.append(FramedConnection(await open_stream(address.address)))
                handshake = {"subject": address.subject, "stream_type": stream_type}
                await dialled[-1].send(TwoPart(header=encode_json(handshake)).encode())
        except (OSError, *CONNECTION_ERRORS):
            pass  # the caller went away: the release finds nothing to serve
        await worker.silence(control.request_id)  # dialled, not ACKed
        await connection.send(encode_ack(""))
        self._start(connection.peer, self._serve_dialled, dialled, control, worker, body)

    async def _serve_dialled(
        self,
        dialled: list[FramedConnection],
        control: ControlMessage,
        worker: ScriptedWorker,
        body: bytes,
    ) -> None:
        codec = control.payload_codec
        try:
            if control.request_stream is not None:
                payload: object = RequestStream(_read_inputs(dialled[1], codec))
            else:
                payload = codec.decode(body, "request.body")
            request = Request(control.request_id, payload, control.metadata)
            await dialled[0].send(PROLOGUE_OK)
            await self._serve(dialled[0], control, worker, request)
        except* (IndexError, WireProtocolError, *CONNECTION_ERRORS):
            pass  # a stream the caller closed, or one never dialled
        finally:
            for stream in dialled:
                stream.close_now()

    async def _serve(
        self,
        connection: FramedConnection,
        control: ControlMessage,
        worker: ScriptedWorker,
        request: Request,
    ) -> None:
        """The script's items on a stream already introduced; the handler closed whatever
        happens."""
        items = await worker.start(request)
        try:
            await self.send_items(connection, control.payload_codec, items)
        finally:
            with trio.CancelScope(shield=True):
                await items.aclose()

    async def send_item(self, out: FrameWriter, codec: PayloadCodec, item: object) -> bool:
        if isinstance(item, ErrorItemMarker):  # verbatim, as another runtime wrote it
            await out.write(data_frame(codec, {"event": "error", "error": json.loads(item.error)}))
            return True
        if isinstance(item, FrameMarker):  # verbatim, whatever it breaks
            frame = item.frame
            body = b"" if frame.body is None else codec.encode(json.loads(frame.body))
            length = len(frame.header) if frame.header_length is None else frame.header_length
            body_length = len(body) if frame.body_length is None else frame.body_length
            await out.write(TWO_PART_PREFIX.pack(length, body_length, 0) + frame.header + body)
            return True
        if not isinstance(item, WireFaultMarker):
            return await super().send_item(out, codec, item)
        if item.fault is WireFault.EMPTY_FRAME:
            await out.write(TwoPart(body=codec.encode({"complete_final": False})).encode())
        elif item.fault is WireFault.GARBLED_FRAME:
            await out.write(TwoPart(body=GARBLED).encode())
        elif item.fault is WireFault.FRAME_AFTER_FINAL:
            await out.write(final_frame(codec) + data_frame(codec, {"data": "late"}))
        elif item.fault is WireFault.LATE_SENTINEL:
            await out.write(final_frame(codec))
            await out.flush()
            await trio.sleep(RESET_AFTER)  # the caller reads complete_final alone
            await out.write(SENTINEL_FRAME)
            await out.flush()
            # The stream ends here; the connection is kept if the caller releases it.
            await _await_release(out._connection, self.response_pool)
            return False
        elif item.fault is WireFault.LISTEN:
            await out.flush()
            await self._listen(out._connection, None)
        elif item.fault is WireFault.FRAME_AFTER_SENTINEL:
            await out.write(final_frame(codec) + SENTINEL_FRAME + data_frame(codec, {"data": 0}))
            await out.flush()
            await self._listen(out._connection, LISTEN_AFTER_SENTINEL)
        elif item.fault is WireFault.CUT_IN_PREFIX:
            await out.write(final_frame(codec)[:10])
        elif item.fault is WireFault.RESET_AFTER_SENTINEL:
            await out.write(final_frame(codec) + SENTINEL_FRAME)
            await out.flush()
            stream = out._connection.stream  # reset in the same step: before the caller reads
            if isinstance(stream, trio.SocketStream):
                stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                stream.socket.close()
        elif item.fault is WireFault.RESET_BEFORE_FINAL:
            await out.flush()
            await trio.sleep(RESET_AFTER)  # the caller reads the items first
            stream = out._connection.stream  # the writer keeps no other handle on it
            if isinstance(stream, trio.SocketStream):  # closed with linger 0: a reset
                stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return item.fault not in (
            WireFault.EOF_BEFORE_FINAL,
            WireFault.RESET_BEFORE_FINAL,
            WireFault.CUT_IN_PREFIX,
            WireFault.RESET_AFTER_SENTINEL,
            WireFault.LISTEN,
            WireFault.FRAME_AFTER_SENTINEL,
        )

    async def _listen(self, connection: FramedConnection, seconds: float | None) -> None:
        """Read the frames the caller writes, until it closes the connection (or for
        ``seconds``), keeping each one's control word (``Target.control_words``)."""
        words = self.control_words.setdefault(_REQUEST_ID.get(), [])
        with trio.move_on_after(math.inf if seconds is None else seconds):
            try:
                while (frame := await connection.read_two_part()) is not None:
                    words.append(json.loads(frame.header) if frame.header else None)
            except (WireProtocolError, ValueError, *CONNECTION_ERRORS):
                pass  # the caller wrote what no frame is, or went away: nothing more to read


async def serve_black_hole(*, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Hold a port on 127.0.0.1 whose connections never complete, for a worker silent at
    ``CONNECT``: a listener with a backlog of 0 that never accepts, its one queue slot taken
    by a connection of its own. Linux then drops the SYN of every further connect, so a
    caller's connect hangs until its own deadline ends it."""
    listener, filler = trio.socket.socket(), trio.socket.socket()
    with listener, filler:
        await listener.bind((LOOPBACK, 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        await filler.connect((LOOPBACK, port))
        task_status.started(f"{LOOPBACK}:{port}")
        await trio.sleep_forever()
