"""Mutant: the drain deadline is re-armed by every terminal frame.

A worker that keeps sending ``finish_reason: cancelled`` frames (a stuck engine in a
shutdown loop) then holds the request open forever, and its booking with it. It must
fail MON-004.
"""

from __future__ import annotations

from routespec.adapters.reference import ReferenceAdapter
from routespec.host.monitor import MonitoredStream
from routespec.host.routing_host import RoutingHost

VIOLATES = ("MON-004",)


class RearmingMonitor(MonitoredStream):
    async def _step(self) -> None:
        if self._withheld is None:
            self._deadline = None  # forgets the window: the next terminal opens a new one
        await super()._step()
        if self._withheld is not None and self._deadline is not None:
            self._deadline = self._clock() + 5.0


class RearmingHost(RoutingHost):
    monitor_class = RearmingMonitor


ADAPTER = ReferenceAdapter(name="mutant:drain-deadline-rearmed", host_class=RearmingHost)
