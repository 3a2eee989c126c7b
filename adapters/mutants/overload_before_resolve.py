"""Mutant: the overload check runs on the original target before transport resolution.

A stale overload mark then masks a vanished target (WorkerOverloaded instead of
CannotConnect). It must fail DSP-003.
"""

from __future__ import annotations

from adapters.reference import ReferenceAdapter
from routespec.discovery import Instance
from routespec.occupancy import Permit
from routespec.push_router import PushRouter, TransportFallback

VIOLATES = ("DSP-003",)


class OverloadBeforeResolveRouter(PushRouter):
    def _resolve_and_check(
        self, target: int, fallback: TransportFallback, permit: Permit | None
    ) -> Instance:
        self._check_overload(target)
        instance = self._resolve_transport(target, fallback)
        if permit is not None and instance.instance_id != permit.instance_id:
            permit.retarget(instance.instance_id)
        return instance


ADAPTER = ReferenceAdapter(
    name="mutant:overload-before-resolve", router_class=OverloadBeforeResolveRouter
)
