"""Mutant: the monitor hands a failed item to the caller before releasing its booking.

Every release that does not complete the request waits for the caller to close the
stream; meanwhile migration, reacting to the error, sees the failed worker still booked.
It must fail MON-002.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio

from routespec.adapters.reference import ReferenceAdapter
from routespec.host.monitor import Admission, MonitoredStream
from routespec.host.request import RequestContext
from routespec.host.routing_host import RoutingHost
from routespec.routing.streaming import ItemStream

VIOLATES = ("MON-002",)


@attrs.define
class DeferredAdmission:
    inner: Admission
    released: bool = False

    def release(self, *, completed: bool) -> None:
        if completed:
            self.released = True
            self.inner.release(completed=True)

    def release_now(self) -> None:
        if not self.released:
            self.released = True
            self.inner.release(completed=False)


class LateReleaseMonitor(MonitoredStream):
    def __init__(
        self,
        inner: ItemStream,
        admission: Admission,
        context: RequestContext,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self._deferred = DeferredAdmission(admission)
        super().__init__(inner, self._deferred, context, clock)

    async def aclose(self) -> None:
        self._deferred.release_now()  # only now, after the caller has seen the error
        await super().aclose()


class LateReleaseHost(RoutingHost):
    monitor_class = LateReleaseMonitor


ADAPTER = ReferenceAdapter(name="mutant:booking-released-after-error", host_class=LateReleaseHost)
