"""A worker server that breaks the response-stream protocol on request, for the suite's
wire checks (TRN-008, TRN-009, TRN-010, TRN-014) and for drilling other runtimes' callers."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import trio

from routespec.errors import RoutingError
from routespec.scripted import ScriptedWorker, WireFaultMarker
from routespec.streaming import Request, WorkerHandler
from routespec.target import Misbehave, WireFault
from routespec.transport.codecs import PayloadCodec
from routespec.transport.connection import FramedConnection
from routespec.transport.control import ControlMessage
from routespec.transport.frames import TwoPart, WireProtocolError
from routespec.transport.worker_server import (
    SENTINEL,
    WorkerServer,
    data_frame,
    error_annotated,
    final_frame,
)

GARBLED = b"\xc1"  # a byte msgpack never uses


class DrillWorkerServer(WorkerServer):
    async def _respond(
        self,
        control: ControlMessage,
        handler: WorkerHandler,
        request: Request,
        failure: WireProtocolError | None,
    ) -> None:
        script = handler.script if isinstance(handler, ScriptedWorker) else None
        if isinstance(script, Misbehave) and script.fault is WireFault.NO_CALL_HOME:
            await trio.sleep_forever()  # ACKed, and the stream never comes
        await super()._respond(control, handler, request, failure)

    async def send_items(
        self,
        connection: FramedConnection,
        codec: PayloadCodec,
        items: AsyncGenerator[object, None],
    ) -> None:
        sentinel = TwoPart(header=SENTINEL).encode()
        try:
            async for item in items:
                if isinstance(item, WireFaultMarker):
                    await _commit(connection, codec, item.fault)
                    if item.fault is WireFault.EOF_BEFORE_FINAL:
                        return
                    break
                await connection.send(data_frame(codec, {"data": item}))
        except RoutingError as error:
            await connection.send(data_frame(codec, error_annotated(error)))
        await connection.send(final_frame(codec) + sentinel)


async def _commit(connection: FramedConnection, codec: PayloadCodec, fault: WireFault) -> None:
    if fault is WireFault.EMPTY_FRAME:
        await connection.send(TwoPart(body=codec.encode({"complete_final": False})).encode())
    elif fault is WireFault.GARBLED_FRAME:
        await connection.send(TwoPart(body=GARBLED).encode())
    elif fault is WireFault.FRAME_AFTER_FINAL:
        await connection.send(final_frame(codec) + data_frame(codec, {"data": "late"}))
