"""A worker whose answers follow a ``WorkerScript``: for tests, demos and misbehaviour drills."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable

import attrs
import trio

from routespec.errors import RoutingError, parse_type_label
from routespec.routing.streaming import Rejection, RejectionKind, Request, RequestStream
from routespec.testing.target import (
    CancelThenFail,
    Crash,
    Delivery,
    ErrorSpec,
    FailBeforeStream,
    FailMidStream,
    Misbehave,
    Reject,
    Serve,
    Silent,
    Stall,
    TerminalFlood,
    TerminalThen,
    Trickle,
    WireFault,
    WorkerScript,
    WriteErrorItem,
    WriteFrame,
)

PREPARED_FOR = "prepared-for"
"""Request annotation naming the worker the router prepared the request for."""


def build_error(spec: ErrorSpec) -> RoutingError:
    """The ``RoutingError`` chain an ``ErrorSpec`` describes."""
    cause = None if spec.cause is None else build_error(spec.cause)
    error_type = None if spec.type is None else parse_type_label(spec.type)
    return RoutingError(error_type, spec.message, cause=cause, reason=spec.reason)


@attrs.frozen
class WireFaultMarker:
    """Yielded in place of an item: a drill server commits ``fault`` on the wire here."""

    fault: WireFault


@attrs.frozen
class ErrorItemMarker:
    """Yielded in place of an item: a drill server writes an error item whose ``error`` is
    the JSON text ``error`` here (``WriteErrorItem``)."""

    error: str


@attrs.frozen
class FrameMarker:
    """Yielded in place of an item: a drill server writes ``WriteFrame``'s frame here."""

    frame: WriteFrame


@attrs.define
class ScriptedWorker:
    """Serves requests as its current script says and logs every request it receives."""

    worker_id: int
    log: list[Delivery]
    script: WorkerScript = attrs.field(factory=Serve)
    on_stall: Callable[[str], None] | None = None
    """Called with the request id when a ``Stall`` script has yielded its items and waits."""
    _release: trio.Event = attrs.field(factory=trio.Event)
    _logged_on_arrival: set[str] = attrs.field(factory=set)

    def release_stalled(self) -> None:
        self._release.set()
        self._release = trio.Event()

    def arrived(self, request: Request) -> None:
        """Log a request that reached the worker before ``admit`` runs (a worker silent at
        its ACK has the request but has not answered); ``admit`` will not log it again."""
        self._log(request)
        self._logged_on_arrival.add(request.request_id)

    def _log(self, request: Request) -> None:
        prepared = request.annotations.get(PREPARED_FOR)
        payload = None if isinstance(request.payload, RequestStream) else request.payload
        self.log.append(
            Delivery(
                request.request_id,
                self.worker_id,
                None if prepared is None else int(prepared),
                payload,
            )
        )

    async def silence(self, request_id: str) -> None:
        """Where a ``Silent`` script's stage falls: wait, like a stall, until released."""
        await self._stall(request_id, self._release)

    def admit(self, request: Request) -> Rejection | None:
        """Every request that reaches the worker is logged, admitted or not."""
        if request.request_id in self._logged_on_arrival:
            self._logged_on_arrival.discard(request.request_id)
        else:
            self._log(request)
        if isinstance(self.script, Crash) and self.script.at_admission:
            raise _crash(self.script)
        if isinstance(self.script, Reject):
            kind = RejectionKind.OVERLOADED if self.script.overloaded else RejectionKind.UNAVAILABLE
            return Rejection(kind, self.script.message)
        return None

    async def start(self, request: Request) -> AsyncGenerator[object, None]:
        script = self.script
        if isinstance(script, FailBeforeStream):
            raise build_error(script.error)
        if isinstance(script, Crash) and script.at_start:
            raise _crash(script)
        items = self._items(request, script, self._release)
        if isinstance(script, Serve) and script.close_fault is not None:
            return _failing_when_closed(items, script.close_fault)
        return items

    async def _items(
        self, request: Request, script: WorkerScript, release: trio.Event
    ) -> AsyncGenerator[object, None]:
        request_id = request.request_id
        if isinstance(request.payload, RequestStream):  # echo each input first (TRN-020)
            async for value in request.payload.items:
                yield {"worker": self.worker_id, "request": request_id, "input": value}
        tokens = _token_request(request.payload)
        first = getattr(script, "items", 0)
        total = first + (script.items_after if isinstance(script, Stall) else 0)
        if tokens is not None:  # a token request: the script decides only where it fails
            budget = tokens[1]
            whole = isinstance(script, Serve | Silent | Trickle)
            first = budget if whole else min(first, budget)
            total = budget if whole or isinstance(script, Stall) else first
        if isinstance(script, TerminalThen | TerminalFlood):
            total = first + 1  # the terminal frame, not a data item, ends the stream
        for index in range(first):
            if index and isinstance(script, Trickle):
                await trio.sleep(script.interval)
            yield self._item(request, index, tokens, last=index == total - 1)
        if isinstance(script, FailMidStream):
            raise build_error(script.error)
        if isinstance(script, Crash):
            raise _crash(script)
        if isinstance(script, CancelThenFail):
            yield self._terminal(request_id, "cancelled")
            raise build_error(script.error)
        if isinstance(script, Misbehave):
            yield WireFaultMarker(script.fault)
        if isinstance(script, WriteErrorItem):
            yield ErrorItemMarker(script.error)
        if isinstance(script, WriteFrame):
            yield FrameMarker(script)
        if isinstance(script, Stall):
            await self._stall(request_id, release)
            for index in range(first, total):
                yield self._item(request, index, tokens, last=index == total - 1)
        if isinstance(script, TerminalThen):
            yield self._terminal(request_id, script.finish)
            for index in range(first, first + script.items_after):
                yield self._item(request, index, tokens, last=False)
            if script.stall:
                await self._stall(request_id, release)
            if script.error is not None:
                raise build_error(script.error)
        if isinstance(script, TerminalFlood):
            while True:
                yield self._terminal(request_id, "cancelled")
                await trio.sleep(script.interval)

    async def _stall(self, request_id: str, release: trio.Event) -> None:
        if self.on_stall is not None:
            self.on_stall(request_id)
        await release.wait()

    def _terminal(self, request_id: str, finish: str) -> dict[str, object]:
        return {"worker": self.worker_id, "request": request_id, "token_ids": [],
                "finish_reason": finish}  # fmt: skip

    def _item(
        self, request: Request, index: int, tokens: tuple[int, int] | None, *, last: bool
    ) -> object:
        if isinstance(request.payload, str):  # a text request: text items
            return f"worker {self.worker_id} request {request.request_id} item {index}"
        item: dict[str, object] = {
            "worker": self.worker_id,
            "request": request.request_id,
            "index": index,
        }
        if tokens is not None:
            item["token_ids"] = [tokens[0] + index]  # the position it continues
            if last:
                item["finish_reason"] = "stop"
        return item


def _token_request(payload: object) -> tuple[int, int] | None:
    """(prompt length, max_tokens) of a token request, or None for any other payload."""
    if not isinstance(payload, dict) or not isinstance(payload.get("token_ids"), list):
        return None
    budget = payload.get("max_tokens")
    return len(payload["token_ids"]), budget if isinstance(budget, int) else 16


async def _failing_when_closed(
    items: AsyncGenerator[object, None], fault: str
) -> AsyncGenerator[object, None]:
    """``items``; closed before their end, a ``RuntimeError(fault)`` (``Serve.close_fault``)."""
    try:
        async for item in items:
            yield item
    except GeneratorExit:
        await items.aclose()
        raise RuntimeError(fault) from None


def _crash(script: Crash) -> Exception:
    faults = [RuntimeError(message) for message in script.messages]
    return faults[0] if len(faults) == 1 else ExceptionGroup("handler", faults)
