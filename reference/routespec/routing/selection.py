"""Router modes and non-exact worker selection over the free set (spec: SEL).

Over the router's own free set (a ``FreeView``) with a ``LoadIndex`` attached, a decision
does not grow with the fleet: RoundRobin and Random read one position of the sorted free
set (a ``SortedList``: O(log N) with a tiny constant, O(1) up to 1,000 free workers),
PowerOfTwoChoices two positions and two counts, LeastLoaded and DeviceAwareWeighted the head
of a load-ordered index (O(log N) to book). Any other sequence of candidates (a migrating
request's untried workers, a routing host's constrained list) takes the plain O(N) path;
both pick the same worker (the spec's definitions, spec/selection.md).
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Sequence

import attrs

from routespec.routing.load_index import CPU, LoadIndex
from routespec.routing.occupancy import OccupancyTracker, Permit
from routespec.routing.worker_sets import FreeView

__all__ = ["CPU", "DEFAULT_DEVICE_RATIO", "RouterMode", "Selector"]

DEFAULT_DEVICE_RATIO = 8  # SEL-010: non-CPU to CPU capacity ratio


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
    index: LoadIndex | None = None

    def __attrs_post_init__(self) -> None:
        if self.device_ratio < 1:
            raise ValueError(f"device_ratio={self.device_ratio} must be >= 1 (SEL-010)")

    def follow(self, index: LoadIndex) -> None:
        """Select over ``index.sets``' free set by the load index, not by scanning it."""
        if index.occupancy is not self.occupancy:
            raise ValueError("the load index must follow this selector's occupancy")
        self.index = index

    def select(self, mode: RouterMode, free: Sequence[int]) -> tuple[int, Permit | None]:
        index = self.index
        if index is not None and isinstance(free, FreeView) and free.sets is index.sets:
            if mode is RouterMode.LEAST_LOADED:
                chosen = index.least_loaded()
                return chosen, self.occupancy.book(chosen)
            if mode is RouterMode.DEVICE_AWARE_WEIGHTED:
                chosen = index.device_aware(self.device_ratio)
                return chosen, self.occupancy.book(chosen)
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
        # two distinct positions, without copying the free set
        size = len(free)
        first_at = self.rng.randrange(size)
        second_at = self.rng.randrange(size - 1)
        first, second = free[first_at], free[second_at + (second_at >= first_at)]
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
