"""Mutant: RoundRobin never picks the last worker of the free set (an off-by-one modulus).

It selects ``free[n mod (len(free) - 1)]`` whenever more than one worker is free, so the
highest-id free worker receives no round-robin traffic. It must fail SEL-006.
"""

from __future__ import annotations

from collections.abc import Sequence

from routespec.adapters.reference import ReferenceAdapter
from routespec.routing.occupancy import Permit
from routespec.routing.push_router import PushRouter
from routespec.routing.selection import RouterMode, Selector

VIOLATES = ("SEL-006",)


class SkipsLastSelector(Selector):
    def select(self, mode: RouterMode, free: Sequence[int]) -> tuple[int, Permit | None]:
        if mode is RouterMode.ROUND_ROBIN:
            chosen = free[self._round_robin_selections % max(1, len(free) - 1)]
            self._round_robin_selections += 1
            return chosen, None
        return super().select(mode, free)


class SkipsLastRouter(PushRouter):
    selector_class = SkipsLastSelector


ADAPTER = ReferenceAdapter(name="mutant:round-robin-skips-last", router_class=SkipsLastRouter)
