"""Decoding a call-home response stream into items (TRN-007 … TRN-011, TRN-016, TRN-017)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import trio

from routespec.errors import ErrorKind, RoutingError
from routespec.routing.streaming import STREAM_ENDED_EARLY, Annotated, InflightSlot
from routespec.transport.codecs import PayloadCodec, encode_json
from routespec.transport.connection import CONNECTION_ERRORS, FramedConnection
from routespec.transport.control import KILL
from routespec.transport.frames import SENTINEL, TwoPart, WireProtocolError
from routespec.transport.wire_errors import decode_error

AFTER_FINAL = "Response received after generation ended"
EMPTY_RESPONSE = "Empty response received"
SENTINEL_WAIT = 5.0  # how long to wait for the sentinel after complete_final


class TcpResponseStream:
    """Frames in, ``Annotated`` items out. Never hangs past the worker's close and never ends
    silently before ``complete_final`` (unless the caller stopped it)."""

    def __init__(
        self,
        connection: FramedConnection,
        codec: PayloadCodec,
        slot: InflightSlot,
        request_pump: trio.CancelScope | None = None,
        release: Callable[[FramedConnection], bool] | None = None,
    ):
        self._connection = connection
        self._release = release  # gives a connection read to its sentinel back (TRN-028)
        self._codec = codec
        self._slot = slot
        self._request_pump = request_pump  # a bidirectional request's sender, ended with us
        self._final_seen = False
        self._done = False

    def __aiter__(self) -> TcpResponseStream:
        return self

    @property
    def final_seen(self) -> bool:
        """``complete_final`` came: the answer is whole, the sentinel may follow."""
        return self._final_seen

    def ready(self) -> bool:
        """The next read cannot wait: the stream has ended, or the frames it will read are
        buffered (one after ``complete_final``; else two, in case the first is that)."""
        if self._done:
            return True
        return self._connection.frames_buffered(2) >= (1 if self._final_seen else 2)

    async def __anext__(self) -> Annotated:
        while not self._done:
            item = await self._next_item()
            if item is not None:
                return item
        raise StopAsyncIteration

    async def _next_item(self) -> Annotated | None:
        """One frame's worth: an item, or None when the frame carried none."""
        try:
            if self._final_seen:
                if self._connection.frame_buffered():  # it came with the final frame
                    return await self._after_final(await self._connection.read_two_part())
                with trio.move_on_after(SENTINEL_WAIT):
                    frame = await self._connection.read_two_part()
                    return await self._after_final(frame)
                return await self._end()
            frame = await self._connection.read_two_part()
        except WireProtocolError as error:
            return await self._end(RoutingError(None, f"malformed response frame: {error}"))
        except CONNECTION_ERRORS:
            frame = None
        if frame is None:  # EOF before complete_final (TRN-008, TRN-016)
            return await self._end(RoutingError(ErrorKind.DISCONNECTED, STREAM_ENDED_EARLY))
        return await self._decode(frame)

    async def _decode(self, frame: TwoPart) -> Annotated | None:
        if frame.header:
            return await self._end(RoutingError(None, "unexpected control frame in stream"))
        try:
            wrapper = self._codec.decode(frame.body, "response.frame")
        except WireProtocolError as error:
            return Annotated(error=RoutingError(None, f"failed to decode response: {error}"))
        if not isinstance(wrapper, dict):
            return Annotated(error=RoutingError(None, "response frame is not a map"))
        data = wrapper.get("data")
        if data is None:
            if wrapper.get("complete_final") is True:
                self._final_seen = True  # TRN-007
                return None
            return Annotated(error=RoutingError(None, EMPTY_RESPONSE))  # TRN-010
        return _annotated(data)

    async def _after_final(self, frame: TwoPart | None) -> Annotated | None:
        if frame is None:
            return await self._end()
        if frame.header == SENTINEL:
            return await self._end(reusable=True)
        return await self._end(RoutingError(None, AFTER_FINAL))  # TRN-009

    async def _end(
        self, error: RoutingError | None = None, *, reusable: bool = False
    ) -> Annotated | None:
        self._done = True
        self._slot.close()
        if self._request_pump is not None:
            self._request_pump.cancel()
        if (
            reusable
            and self._release is not None
            and self._connection.reuse_offered
            and self._release(self._connection)
        ):
            return None
        if not self._connection.close_now():  # a socket closes without a checkpoint
            with trio.CancelScope(shield=True):
                await self._connection.aclose()
        return None if error is None else Annotated(error=error)

    async def aclose(self) -> None:
        """The caller stops reading: tell the worker to stop (best effort) and close (TRN-017)."""
        if not self._done:
            # A few bytes, so the shielded send does not block.
            with trio.CancelScope(shield=True), contextlib.suppress(*CONNECTION_ERRORS):
                await self._connection.send(TwoPart(header=encode_json(KILL)).encode())
            await self._end()


def _annotated(data: object) -> Annotated:
    """Dynamo's ``Annotated``: ``{"data": item}`` or ``{"event": "error", "error": {...}}``."""
    if not isinstance(data, dict):
        return Annotated(error=RoutingError(None, "response item is not an Annotated map"))
    if data.get("event") == "error":
        if "error" in data:
            return Annotated(error=decode_error(data["error"]))
        comment = data.get("comment")
        return Annotated(error=RoutingError(None, str(comment)))
    return Annotated(data=data.get("data"))
