"""Mutant: the overload check runs on the original target before transport resolution.

A stale overload mark then masks a vanished target (WorkerOverloaded instead of
CannotConnect). It must fail DSP-003.
"""

from __future__ import annotations

from routespec.adapters.reference import ReferenceAdapter
from routespec.discovery.instances import Instance
from routespec.routing.push_router import PushRouter, TransportFallback

VIOLATES = ("DSP-003",)


class OverloadBeforeResolveRouter(PushRouter):
    def _resolve_and_check(
        self, target: int, fallback: TransportFallback, check_overload: bool
    ) -> Instance:
        if check_overload:
            self._check_overload(target)
        return self._resolve_transport(target, fallback)


ADAPTER = ReferenceAdapter(
    name="mutant:overload-before-resolve", router_class=OverloadBeforeResolveRouter
)
