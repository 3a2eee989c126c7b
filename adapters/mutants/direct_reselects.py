"""Mutant: ``direct()`` silently reselects another free worker when its target vanished.

This is the behaviour upstream PR #10429 removed. It must fail DSP-001 (and DSP-002).
"""

from __future__ import annotations

from routespec.adapters.reference import ReferenceAdapter
from routespec.routing.push_router import ALLOW, Prepare, PushRouter, RouterStream
from routespec.routing.streaming import Request

VIOLATES = ("DSP-001", "DSP-002")


class DirectReselectsRouter(PushRouter):
    async def direct(
        self, request: Request, instance_id: int, prepare: Prepare | None = None
    ) -> RouterStream:
        return await self._dispatch(request, instance_id, ALLOW, None, prepare)


ADAPTER = ReferenceAdapter(name="mutant:direct-reselects", router_class=DirectReselectsRouter)
