"""Mutant: every stopped request is cancelled at the door, staged KV or not.

A decode leg whose remote prefill left KV blocks on its worker never arrives, so the
worker never releases them (NVBugs 5969206). It must fail HST-013.
"""

from __future__ import annotations

from routespec.adapters.reference import ReferenceAdapter
from routespec.host.budget import cancelled
from routespec.host.monitor import MonitoredStream
from routespec.host.request import HostRequest
from routespec.host.routing_host import RoutingHost
from routespec.routing.exclusions import Exclusions

VIOLATES = ("HST-013",)


class EagerCancelHost(RoutingHost):
    async def generate(
        self, request: HostRequest, exclusions: Exclusions | None = None
    ) -> MonitoredStream:
        if request.context.stopped:
            raise cancelled(request.request_id)
        return await super().generate(request, exclusions)


ADAPTER = ReferenceAdapter(
    name="mutant:stopped-staged-decode-cancelled", host_class=EagerCancelHost
)
