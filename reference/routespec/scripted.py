"""A worker whose answers follow a ``WorkerScript``: for tests, demos and misbehaviour drills."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable

import attrs
import trio

from routespec.errors import RoutingError, parse_type_label
from routespec.streaming import Rejection, RejectionKind, Request, RequestStream
from routespec.target import (
    Delivery,
    ErrorSpec,
    FailBeforeStream,
    FailMidStream,
    Misbehave,
    Reject,
    Serve,
    Stall,
    WireFault,
    WorkerScript,
)

PREPARED_FOR = "prepared-for"
"""Request annotation naming the worker the router prepared the request for."""


def build_error(spec: ErrorSpec) -> RoutingError:
    """The ``RoutingError`` chain an ``ErrorSpec`` describes."""
    cause = None if spec.cause is None else build_error(spec.cause)
    error_type = None if spec.type is None else parse_type_label(spec.type)
    return RoutingError(error_type, spec.message, cause=cause)


@attrs.frozen
class WireFaultMarker:
    """Yielded in place of an item: a drill server commits ``fault`` on the wire here."""

    fault: WireFault


@attrs.define
class ScriptedWorker:
    """Serves requests as its current script says and logs every request it receives."""

    worker_id: int
    log: list[Delivery]
    script: WorkerScript = attrs.field(factory=Serve)
    on_stall: Callable[[str], None] | None = None
    """Called with the request id when a ``Stall`` script has yielded its items and waits."""
    _release: trio.Event = attrs.field(factory=trio.Event)

    def release_stalled(self) -> None:
        self._release.set()
        self._release = trio.Event()

    def admit(self, request: Request) -> Rejection | None:
        """Every request that reaches the worker is logged, admitted or not."""
        prepared = request.annotations.get(PREPARED_FOR)
        self.log.append(
            Delivery(
                request.request_id, self.worker_id, None if prepared is None else int(prepared)
            )
        )
        if isinstance(self.script, Reject):
            kind = RejectionKind.OVERLOADED if self.script.overloaded else RejectionKind.UNAVAILABLE
            return Rejection(kind, self.script.message)
        return None

    async def start(self, request: Request) -> AsyncGenerator[object, None]:
        script = self.script
        if isinstance(script, FailBeforeStream):
            raise build_error(script.error)
        return self._items(request, script, self._release)

    async def _items(
        self, request: Request, script: WorkerScript, release: trio.Event
    ) -> AsyncGenerator[object, None]:
        request_id = request.request_id
        if isinstance(request.payload, RequestStream):  # echo each input first (TRN-020)
            async for value in request.payload.items:
                yield {"worker": self.worker_id, "request": request_id, "input": value}
        for index in range(getattr(script, "items", 0)):
            yield self._item(request_id, index)
        if isinstance(script, FailMidStream):
            raise build_error(script.error)
        if isinstance(script, Misbehave):
            yield WireFaultMarker(script.fault)
        if isinstance(script, Stall):
            if self.on_stall is not None:
                self.on_stall(request_id)
            await release.wait()
            for after in range(script.items_after):
                yield self._item(request_id, script.items + after)

    def _item(self, request_id: str, index: int) -> object:
        return {"worker": self.worker_id, "request": request_id, "index": index}
