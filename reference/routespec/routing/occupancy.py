"""In-flight occupancy counts and the permits that hold them (spec: SEL, DSP)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

LoadListener = Callable[[int, int, int], None]
"""Called with ``(instance_id, old_load, new_load)`` after every change of a count."""


@attrs.define
class OccupancyTracker:
    """Per-worker count of dispatches booked by occupancy-aware selection.

    Listeners hear of every change, so an index ordered by load (``LoadIndex``) follows
    bookings in O(log N) instead of rescanning every worker per decision."""

    _inflight: dict[int, int] = attrs.field(factory=dict)
    _listeners: list[LoadListener] = attrs.field(factory=list)

    def load(self, instance_id: int) -> int:
        return self._inflight.get(instance_id, 0)

    def snapshot(self) -> Mapping[int, int]:
        """Workers with a non-zero count."""
        return dict(self._inflight)

    def subscribe(self, listener: LoadListener) -> None:
        self._listeners.append(listener)

    def book(self, instance_id: int) -> Permit:
        self._add(instance_id)
        return Permit(self, instance_id)

    def _add(self, instance_id: int) -> None:
        old = self._inflight.get(instance_id, 0)
        self._inflight[instance_id] = old + 1
        self._changed(instance_id, old, old + 1)

    def _unbook(self, instance_id: int) -> None:
        old = self._inflight[instance_id]
        if old > 1:
            self._inflight[instance_id] = old - 1
        else:
            del self._inflight[instance_id]
        self._changed(instance_id, old, old - 1)

    def _changed(self, instance_id: int, old: int, new: int) -> None:
        for listener in self._listeners:
            listener(instance_id, old, new)


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
