"""Discovered, routable, overloaded and free worker sets (spec: SET, FLT).

The sets are kept up to date on each event instead of being derived on every read, so a
routing decision does not grow with the fleet:

- an inhibition (report-down), an overload lease or a monitor verdict updates one worker:
  O(log N) (the sorted routable and free sets are ``SortedList``\\ s);
- inhibitions and leases expire lazily: each has an entry in a heap keyed by its deadline,
  and every read first pops the entries whose deadline has passed on the clock as it is at
  that read (O(log N) per expiry, amortised over the events that created them);
- discovery hands over its whole id list, so a read compares it with the last one by
  identity: a store that returns the same tuple while nothing changed costs O(1); a changed
  list costs O(N) to diff, then O(log N) per worker that joined or left.

The spec's definitions (spec/worker-sets.md) remain the oracle: ``conformance/model.py``
derives the sets afresh and the machines compare them with these.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, overload

import attrs
import trio
from sortedcontainers import SortedList

from routespec.discovery.instances import Discovery

DEFAULT_INHIBITED_DURATION = 5.0  # FLT-002
OVERLOAD_LEASE = 1.0  # FLT-004


class FreeSetListener(Protocol):
    """Follows the free set's membership (an index of the free workers by load does)."""

    def free_joined(self, instance_id: int) -> None: ...

    def free_left(self, instance_id: int) -> None: ...

    def rediscovered(self, free: Sequence[int]) -> None:
        """Start over from ``free``: discovery changed, and device types may have too."""
        ...


@attrs.define(eq=False)
class FreeView(Sequence[int]):
    """The free set sorted by id, live: read it at once, before the next event or await."""

    sets: WorkerSets
    _members: SortedList[int]

    def __len__(self) -> int:
        return len(self._members)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...

    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        return self._members[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self._members)


@attrs.define
class WorkerSets:
    """The four worker sets of one endpoint, maintained on each event (see the module).

    Time comes from ``clock`` (trio's clock by default, so a MockClock drives expiry); every
    read evaluates inhibitions and leases against the clock at that read.
    """

    discovery: Discovery
    inhibited_duration: float = DEFAULT_INHIBITED_DURATION
    clock: Callable[[], float] = trio.current_time
    _inhibited_until: dict[int, float] = attrs.field(factory=dict)
    _lease_until: dict[int, float] = attrs.field(factory=dict)
    _monitor_overloaded: set[int] = attrs.field(factory=set)
    # deadline heaps; an entry whose deadline no longer matches the dict is stale
    _inhibit_expiries: list[tuple[float, int]] = attrs.field(factory=list)
    _lease_expiries: list[tuple[float, int]] = attrs.field(factory=list)
    _listed: tuple[int, ...] | None = None  # discovery's list as last seen (by identity)
    _discovered: set[int] = attrs.field(factory=set)
    _routable: SortedList[int] = attrs.field(factory=SortedList)
    _free: SortedList[int] = attrs.field(factory=SortedList)
    _free_ids: tuple[int, ...] | None = None  # snapshot cache, dropped on any free change
    _listeners: list[FreeSetListener] = attrs.field(factory=list)
    _view: FreeView = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        if self.inhibited_duration < 0:
            raise ValueError(f"inhibited_duration={self.inhibited_duration} must be >= 0 (FLT-003)")
        self._view = FreeView(self, self._free)

    def subscribe(self, listener: FreeSetListener) -> None:
        """``listener`` starts from the free set as it is now, without a read of the clock."""
        self._listeners.append(listener)
        listener.rediscovered(self._free)

    # --- reads ---

    def discovered_ids(self) -> tuple[int, ...]:
        self._sync()
        return self._listed or ()

    def is_discovered(self, instance_id: int) -> bool:
        self._sync()
        return instance_id in self._discovered

    def routable_ids(self) -> tuple[int, ...]:
        """Discovered minus locally inhibited (SET-002)."""
        self._sync()
        return tuple(self._routable)

    def overloaded_ids(self) -> tuple[int, ...]:
        """Monitor-reported overload plus live request-path leases, among discovered (SET-003)."""
        self._sync()
        marked = self._monitor_overloaded | self._lease_until.keys()
        return tuple(sorted(marked & self._discovered))

    def free_ids(self) -> tuple[int, ...]:
        """Routable minus overloaded (SET-004), as a snapshot; ``free()`` reads it in place."""
        self._sync()
        if self._free_ids is None:
            self._free_ids = tuple(self._free)
        return self._free_ids

    def free(self) -> FreeView:
        """The free set (SET-004) sorted by id, without copying it."""
        self._sync()
        return self._view

    def is_overloaded(self, instance_id: int) -> bool:
        self._sync()
        return instance_id in self._discovered and self._marked(instance_id)

    # --- events ---

    def report_instance_down(self, instance_id: int) -> None:
        """Inhibit locally for ``inhibited_duration``; 0 disables inhibition (FLT-001, FLT-003)."""
        if self.inhibited_duration > 0:
            self._sync()
            deadline = self.clock() + self.inhibited_duration
            self._inhibited_until[instance_id] = deadline
            heapq.heappush(self._inhibit_expiries, (deadline, instance_id))
            self._place(instance_id)

    def mark_overloaded(self, instance_id: int) -> None:
        """Request-path overload: a lease that lapses after ``OVERLOAD_LEASE`` (FLT-004)."""
        self._sync()
        deadline = self.clock() + OVERLOAD_LEASE
        self._lease_until[instance_id] = deadline
        heapq.heappush(self._lease_expiries, (deadline, instance_id))
        self._place(instance_id)

    def set_monitor_overloaded(self, instance_id: int, overloaded: bool) -> None:
        """The load monitor's verdict for one worker; it stays until the monitor changes it."""
        self._sync()
        if overloaded:
            self._monitor_overloaded.add(instance_id)
        else:
            self._monitor_overloaded.discard(instance_id)
        self._place(instance_id)

    # --- upkeep ---

    def _marked(self, instance_id: int) -> bool:
        return instance_id in self._monitor_overloaded or instance_id in self._lease_until

    def _sync(self) -> None:
        """Catch up with discovery and with the clock (expiries), before any read or event."""
        listed = self.discovery.instance_ids()
        if listed is not self._listed:
            self._rediscover(listed)
        now = self.clock()
        self._expire(self._inhibit_expiries, self._inhibited_until, now)
        self._expire(self._lease_expiries, self._lease_until, now)

    def _expire(
        self, expiries: list[tuple[float, int]], until: dict[int, float], now: float
    ) -> None:
        # a mark holds while its deadline is later than now
        while expiries and expiries[0][0] <= now:
            deadline, instance_id = heapq.heappop(expiries)
            if until.get(instance_id) == deadline:
                del until[instance_id]
                self._place(instance_id)

    def _rediscover(self, listed: tuple[int, ...]) -> None:
        current = set(listed)
        joined, left = current - self._discovered, self._discovered - current
        self._listed, self._discovered = listed, current
        for instance_id in left | joined:
            self._place(instance_id)
        for listener in self._listeners:
            listener.rediscovered(self._free)

    def _place(self, instance_id: int) -> None:
        """Put one worker in the sets its marks and discovery say it belongs to."""
        routable = instance_id in self._discovered and instance_id not in self._inhibited_until
        free = routable and not self._marked(instance_id)
        if routable != (instance_id in self._routable):
            (self._routable.add if routable else self._routable.remove)(instance_id)
        if free != (instance_id in self._free):
            self._free_ids = None
            if free:
                self._free.add(instance_id)
                for listener in self._listeners:
                    listener.free_joined(instance_id)
            else:
                self._free.remove(instance_id)
                for listener in self._listeners:
                    listener.free_left(instance_id)
