"""Request counters and the admission that ties a request's bookings to its end (HST-010,
HST-011)."""

from __future__ import annotations

from collections.abc import Callable

import attrs


@attrs.define
class RequestCounters:
    started: int = 0
    completed: int = 0


@attrs.define(eq=False)
class HostAdmission:
    """What one admitted request holds: bookings and estimates, released together."""

    counters: RequestCounters
    releases: list[Callable[[], None]] = attrs.field(factory=list)
    dispatched: bool = False

    def count_started(self) -> None:
        """Called once per admission; it stays counted even if the request never reaches
        dispatch (HST-010)."""
        self.counters.started += 1

    def release(self, *, completed: bool) -> None:
        """Called exactly once, when the request ends (its stream, or a failure before it)."""
        for release in self.releases:
            release()
        if completed and self.dispatched:
            self.counters.completed += 1  # HST-011
