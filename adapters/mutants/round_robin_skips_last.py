"""Mutant: RoundRobin never picks the last worker of the free set (an off-by-one modulus).

It selects ``free[n mod (len(free) - 1)]`` whenever more than one worker is free, so the
highest-id free worker receives no round-robin traffic. It must fail SEL-006.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from adapters.reference import ReferenceAdapter
from routespec.discovery import Discovery
from routespec.occupancy import Permit
from routespec.push_router import PushRouter
from routespec.selection import DEFAULT_DEVICE_RATIO, RouterMode, Selector
from routespec.streaming import StreamingDispatch
from routespec.worker_sets import DEFAULT_INHIBITED_DURATION

VIOLATES = ("SEL-006",)


class SkipsLastSelector(Selector):
    def select(self, mode: RouterMode, free: Sequence[int]) -> tuple[int, Permit | None]:
        if mode is RouterMode.ROUND_ROBIN:
            chosen = free[self._round_robin_selections % max(1, len(free) - 1)]
            self._round_robin_selections += 1
            return chosen, None
        return super().select(mode, free)


class SkipsLastRouter(PushRouter):
    @classmethod
    def create(
        cls,
        endpoint: str,
        discovery: Discovery,
        transport: StreamingDispatch,
        *,
        inhibited_duration: float = DEFAULT_INHIBITED_DURATION,
        fault_detection: bool = True,
        rng: random.Random | None = None,
        device_ratio: int = DEFAULT_DEVICE_RATIO,
    ) -> PushRouter:
        router = super().create(
            endpoint,
            discovery,
            transport,
            inhibited_duration=inhibited_duration,
            fault_detection=fault_detection,
            rng=rng,
            device_ratio=device_ratio,
        )
        old = router.selector
        router.selector = SkipsLastSelector(old.occupancy, old.rng, old.device_of, old.device_ratio)
        return router


ADAPTER = ReferenceAdapter(name="mutant:round-robin-skips-last", router_class=SkipsLastRouter)
