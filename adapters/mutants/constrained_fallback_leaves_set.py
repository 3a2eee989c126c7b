"""Mutant: ``direct_within()`` with an ``allowed`` set falls back to any free worker.

When the target has no transport record the fallback ignores the set (LoRA replicas, an
allowed list) and reaches the first free worker other than the target. It must fail DSP-006.
"""

from __future__ import annotations

from routespec.adapters.reference import ReferenceAdapter
from routespec.routing.push_router import ALLOW, Prepare, PushRouter, RouterStream
from routespec.routing.streaming import Request

VIOLATES = ("DSP-006",)


class UnconstrainedFallbackRouter(PushRouter):
    async def direct_within(
        self,
        request: Request,
        instance_id: int,
        allowed: frozenset[int] | None,
        prepare: Prepare | None = None,
    ) -> RouterStream:
        return await self._dispatch(request, instance_id, ALLOW, None, prepare)


ADAPTER = ReferenceAdapter(
    name="mutant:constrained-fallback-leaves-set", router_class=UnconstrainedFallbackRouter
)
