"""In-flight occupancy counts and the permits that hold them (spec: SEL, DSP)."""

from __future__ import annotations

from collections.abc import Mapping

import attrs


@attrs.define
class OccupancyTracker:
    """Per-worker count of dispatches booked by occupancy-aware selection."""

    _inflight: dict[int, int] = attrs.field(factory=dict)

    def load(self, instance_id: int) -> int:
        return self._inflight.get(instance_id, 0)

    def snapshot(self) -> Mapping[int, int]:
        """Workers with a non-zero count."""
        return dict(self._inflight)

    def book(self, instance_id: int) -> Permit:
        self._add(instance_id)
        return Permit(self, instance_id)

    def _add(self, instance_id: int) -> None:
        self._inflight[instance_id] = self.load(instance_id) + 1

    def _unbook(self, instance_id: int) -> None:
        remaining = self._inflight[instance_id] - 1
        if remaining:
            self._inflight[instance_id] = remaining
        else:
            del self._inflight[instance_id]


@attrs.define
class Permit:
    """One booked unit of occupancy; released exactly once (DSP-011)."""

    _tracker: OccupancyTracker
    instance_id: int
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._tracker._unbook(self.instance_id)

    def retarget(self, instance_id: int) -> None:
        """Move the booking to the worker actually used after fallback (DSP-012)."""
        self._tracker._unbook(self.instance_id)
        self._tracker._add(instance_id)
        self.instance_id = instance_id
