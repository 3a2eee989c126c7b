"""Router modes and non-exact worker selection over the free set (spec: SEL)."""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Sequence

import attrs

from routespec.routing.occupancy import OccupancyTracker, Permit

DEFAULT_DEVICE_RATIO = 8  # SEL-010: non-CPU to CPU capacity ratio
CPU = "cpu"


class RouterMode(enum.Enum):
    """How the router picks a worker; labels match Dynamo's."""

    ROUND_ROBIN = "round-robin"
    RANDOM = "random"
    POWER_OF_TWO_CHOICES = "power-of-two-choices"
    KV = "kv"
    DIRECT = "direct"
    LEAST_LOADED = "least-loaded"
    DEVICE_AWARE_WEIGHTED = "device-aware-weighted"


@attrs.define
class Selector:
    """Picks one worker from a non-empty free set; occupancy modes book it."""

    occupancy: OccupancyTracker
    rng: random.Random
    device_of: Callable[[int], str | None]
    device_ratio: int = DEFAULT_DEVICE_RATIO
    _round_robin_selections: int = 0

    def __attrs_post_init__(self) -> None:
        if self.device_ratio < 1:
            raise ValueError(f"device_ratio={self.device_ratio} must be >= 1 (SEL-010)")

    def select(self, mode: RouterMode, free: Sequence[int]) -> tuple[int, Permit | None]:
        if mode is RouterMode.ROUND_ROBIN:
            chosen = free[self._round_robin_selections % len(free)]  # SEL-006
            self._round_robin_selections += 1
            return chosen, None
        if mode is RouterMode.RANDOM:
            return self.rng.choice(free), None  # SEL-007
        if mode is RouterMode.POWER_OF_TWO_CHOICES:
            chosen = self._power_of_two(free)
        elif mode is RouterMode.LEAST_LOADED:
            chosen = self._least_loaded(free)
        else:
            chosen = self._least_loaded(self._device_group(free))
        return chosen, self.occupancy.book(chosen)  # SEL-011

    def _power_of_two(self, free: Sequence[int]) -> int:
        """Two distinct random candidates; the less loaded wins, a tie keeps the first (SEL-008)."""
        if len(free) == 1:
            return free[0]
        first, second = self.rng.sample(list(free), 2)
        return first if self.occupancy.load(first) <= self.occupancy.load(second) else second

    def _least_loaded(self, candidates: Sequence[int]) -> int:
        """The first worker with the minimum in-flight count (SEL-009)."""
        return min(candidates, key=self.occupancy.load)

    def _device_group(self, free: Sequence[int]) -> Sequence[int]:
        """CPU workers only while their load is under the capacity-weighted budget (SEL-010)."""
        cpu = [i for i in free if self.device_of(i) == CPU]
        non_cpu = [i for i in free if self.device_of(i) != CPU]
        if not cpu or not non_cpu:
            return free
        cpu_load = sum(map(self.occupancy.load, cpu))
        non_cpu_load = sum(map(self.occupancy.load, non_cpu))
        allowed_cpu_load = non_cpu_load * len(cpu) // (self.device_ratio * len(non_cpu))
        return cpu if cpu_load < allowed_cpu_load else non_cpu
