"""Mutant: a stream's permit is released only after its first error item has been yielded.

The error item is handed to the caller with the booking still held; the release is deferred
to the next read of the stream, and ``aclose`` leaves it to that read because the stream has
already ended. A caller stops reading at the first error item, so the booking leaks and the
worker looks busy forever. It must fail DSP-011.

The spec's ordering ("before the caller sees it") is not observable by itself through the
Target interface (occupancy is read only after the caller has closed the stream); what the
suite observes is the consequence: occupancy that never returns to zero.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from routespec.adapters.reference import ReferenceAdapter
from routespec.errors import RoutingError
from routespec.routing.occupancy import Permit
from routespec.routing.push_router import PushRouter, RouterStream
from routespec.routing.streaming import Annotated, ItemStream

VIOLATES = ("DSP-011",)


@attrs.define
class LateReleaseStream(RouterStream):
    _error_yielded: bool = False

    async def __anext__(self) -> Annotated:
        if self._error_yielded:
            self._release()  # only now, after the caller has seen the error item
            raise StopAsyncIteration
        try:
            item = await self._inner.__anext__()
        except BaseException:
            self._release()
            raise
        if item.error is not None:
            self._error_yielded = True
            self._on_fault(self.instance_id, item.error)
        return item

    async def aclose(self) -> None:
        if not self._error_yielded:  # an ended stream's release is left to the next read
            self._release()
        await self._inner.aclose()


class LateReleaseRouter(PushRouter):
    def _router_stream(
        self,
        stream: ItemStream,
        instance_id: int,
        permit: Permit | None,
        on_fault: Callable[[int, RoutingError], None],
    ) -> RouterStream:
        return LateReleaseStream(stream, instance_id, permit, on_fault)


ADAPTER = ReferenceAdapter(
    name="mutant:permit-released-after-error-item", router_class=LateReleaseRouter
)
