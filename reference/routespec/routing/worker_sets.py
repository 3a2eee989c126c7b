"""Discovered, routable, overloaded and free worker sets (spec: SET, FLT)."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio

from routespec.discovery.instances import Discovery

DEFAULT_INHIBITED_DURATION = 5.0  # FLT-002
OVERLOAD_LEASE = 1.0  # FLT-004


@attrs.define
class WorkerSets:
    """The four worker sets of one endpoint, derived on every read.

    Time comes from ``clock`` (trio's clock by default, so a MockClock drives expiry).
    """

    discovery: Discovery
    inhibited_duration: float = DEFAULT_INHIBITED_DURATION
    clock: Callable[[], float] = trio.current_time
    _inhibited_until: dict[int, float] = attrs.field(factory=dict)
    _lease_until: dict[int, float] = attrs.field(factory=dict)
    _monitor_overloaded: set[int] = attrs.field(factory=set)

    def __attrs_post_init__(self) -> None:
        if self.inhibited_duration < 0:
            raise ValueError(f"inhibited_duration={self.inhibited_duration} must be >= 0 (FLT-003)")

    def discovered_ids(self) -> tuple[int, ...]:
        return self.discovery.instance_ids()

    def routable_ids(self) -> tuple[int, ...]:
        """Discovered minus locally inhibited (SET-002)."""
        now = self.clock()
        self._inhibited_until = {i: t for i, t in self._inhibited_until.items() if t > now}
        return tuple(i for i in self.discovered_ids() if i not in self._inhibited_until)

    def overloaded_ids(self) -> tuple[int, ...]:
        """Monitor-reported overload plus live request-path leases, among discovered (SET-003)."""
        now = self.clock()
        self._lease_until = {i: t for i, t in self._lease_until.items() if t > now}
        marked = self._monitor_overloaded | self._lease_until.keys()
        return tuple(i for i in self.discovered_ids() if i in marked)

    def free_ids(self) -> tuple[int, ...]:
        """Routable minus overloaded (SET-004)."""
        overloaded = set(self.overloaded_ids())
        return tuple(i for i in self.routable_ids() if i not in overloaded)

    def is_overloaded(self, instance_id: int) -> bool:
        return instance_id in self.overloaded_ids()

    def report_instance_down(self, instance_id: int) -> None:
        """Inhibit locally for ``inhibited_duration``; 0 disables inhibition (FLT-001, FLT-003)."""
        if self.inhibited_duration > 0:
            self._inhibited_until[instance_id] = self.clock() + self.inhibited_duration

    def mark_overloaded(self, instance_id: int) -> None:
        """Request-path overload: a lease that lapses after ``OVERLOAD_LEASE`` (FLT-004)."""
        self._lease_until[instance_id] = self.clock() + OVERLOAD_LEASE

    def set_monitor_overloaded(self, instance_id: int, overloaded: bool) -> None:
        """The load monitor's verdict for one worker; it stays until the monitor changes it."""
        if overloaded:
            self._monitor_overloaded.add(instance_id)
        else:
            self._monitor_overloaded.discard(instance_id)
