"""The free workers ordered by occupancy, per device group (spec: SEL-009, SEL-010).

LeastLoaded and DeviceAwareWeighted read the top of a heap of ``(load, id)`` instead of
scanning the free set. A booking, a release or a worker joining the free set pushes one
entry (O(log N), in C); an entry whose load or group membership is no longer current is
stale and is dropped when it reaches the top, and the heap is rebuilt from the members once
stale entries outnumber them, so a selection costs O(log N) amortised. Ties go to the
lowest id, as SEL-009's "first worker with the minimum" over the id-sorted free set does.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import attrs

from routespec.routing.occupancy import OccupancyTracker
from routespec.routing.worker_sets import WorkerSets

CPU = "cpu"
SLACK = 64  # stale entries tolerated beyond the member count before a rebuild


@attrs.define(eq=False)
class DeviceGroup:
    """The free workers of one device group, their total load and a lazy load heap."""

    load_of: Callable[[int], int]
    members: set[int] = attrs.field(factory=set)
    load: int = 0
    _heap: list[tuple[int, int]] = attrs.field(factory=list)

    def __len__(self) -> int:
        return len(self.members)

    def add(self, instance_id: int, load: int) -> None:
        self.members.add(instance_id)
        self.load += load
        self.push(instance_id, load)

    def remove(self, instance_id: int, load: int) -> None:
        self.members.discard(instance_id)  # its heap entries are stale from now on
        self.load -= load

    def push(self, instance_id: int, load: int) -> None:
        heap = self._heap
        if len(heap) > 2 * len(self.members) + SLACK:
            heap[:] = [(self.load_of(i), i) for i in self.members]
            heapq.heapify(heap)
        else:
            heapq.heappush(heap, (load, instance_id))

    def least_loaded(self) -> tuple[int, int]:
        """``(load, id)`` of the member with the lowest load, lowest id among equals."""
        heap = self._heap
        while True:
            load, instance_id = heap[0]
            if instance_id in self.members and self.load_of(instance_id) == load:
                return load, instance_id
            heapq.heappop(heap)


@attrs.define
class LoadIndex:
    """Follows ``sets``' free set and ``occupancy``'s counts; ``device_of`` groups workers."""

    sets: WorkerSets
    occupancy: OccupancyTracker
    device_of: Callable[[int], str | None]
    cpu: DeviceGroup = attrs.field(init=False)
    non_cpu: DeviceGroup = attrs.field(init=False)
    _group_of: dict[int, DeviceGroup] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        self.cpu, self.non_cpu = DeviceGroup(self.occupancy.load), DeviceGroup(self.occupancy.load)
        self.sets.subscribe(self)
        self.occupancy.subscribe(self.load_changed)

    def least_loaded(self) -> int:
        """SEL-009 over the whole free set: the lower of the two groups' tops."""
        tops = [group.least_loaded() for group in (self.cpu, self.non_cpu) if group.members]
        return min(tops)[1]

    def device_aware(self, ratio: int) -> int:
        """SEL-010: CPU workers only while their load is under the capacity-weighted budget."""
        cpu_count, non_cpu_count = len(self.cpu), len(self.non_cpu)
        if not cpu_count or not non_cpu_count:
            return self.least_loaded()
        allowed_cpu_load = self.non_cpu.load * cpu_count // (ratio * non_cpu_count)
        group = self.cpu if self.cpu.load < allowed_cpu_load else self.non_cpu
        return group.least_loaded()[1]

    # --- FreeSetListener ---

    def free_joined(self, instance_id: int) -> None:
        group = self.cpu if self.device_of(instance_id) == CPU else self.non_cpu
        self._group_of[instance_id] = group
        group.add(instance_id, self.occupancy.load(instance_id))

    def free_left(self, instance_id: int) -> None:
        self._group_of.pop(instance_id).remove(instance_id, self.occupancy.load(instance_id))

    def rediscovered(self, free: Sequence[int]) -> None:
        """Regroup: a discovery change may also change a listed worker's device type (O(N)
        device look-ups, O(log N) per worker that moves)."""
        for instance_id in free:
            group = self.cpu if self.device_of(instance_id) == CPU else self.non_cpu
            current = self._group_of.get(instance_id)
            if current is not group:
                if current is not None:
                    self.free_left(instance_id)
                self.free_joined(instance_id)

    # --- occupancy listener ---

    def load_changed(self, instance_id: int, old: int, new: int) -> None:
        group = self._group_of.get(instance_id)
        if group is not None:
            group.load += new - old
            group.push(instance_id, new)
