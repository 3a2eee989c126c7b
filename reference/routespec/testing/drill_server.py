"""A worker server that breaks the response-stream protocol on request, for the suite's
wire checks (TRN-008, TRN-009, TRN-010, TRN-014) and for drilling other runtimes' callers."""

from __future__ import annotations

import trio

from routespec.routing.streaming import Request, WorkerHandler
from routespec.testing.scripted import ScriptedWorker, WireFaultMarker
from routespec.testing.target import Misbehave, WireFault
from routespec.transport.codecs import PayloadCodec
from routespec.transport.control import ControlMessage
from routespec.transport.frame_writer import FrameWriter
from routespec.transport.frames import TwoPart, WireProtocolError
from routespec.transport.worker_server import (
    WorkerServer,
    data_frame,
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

    async def send_item(self, out: FrameWriter, codec: PayloadCodec, item: object) -> bool:
        if not isinstance(item, WireFaultMarker):
            return await super().send_item(out, codec, item)
        if item.fault is WireFault.EMPTY_FRAME:
            await out.write(TwoPart(body=codec.encode({"complete_final": False})).encode())
        elif item.fault is WireFault.GARBLED_FRAME:
            await out.write(TwoPart(body=GARBLED).encode())
        elif item.fault is WireFault.FRAME_AFTER_FINAL:
            await out.write(final_frame(codec) + data_frame(codec, {"data": "late"}))
        return item.fault is not WireFault.EOF_BEFORE_FINAL
