"""Session affinity: a session's requests go to the worker its first request went to (AFF)."""

from __future__ import annotations

import enum
from collections.abc import Callable

import attrs
import trio

from routespec.errors import ErrorKind, RoutingError

MAX_AFFINITY_TTL = 31_536_000.0  # one year, in seconds
MAX_AFFINITY_ENTRIES = 65_536
MAX_SESSION_ID_BYTES = 256


class AffinityMode(enum.Enum):
    HARD = "hard"  # the bound target is a pin (AFF-006)
    SOFT = "soft"  # the bound target is a preference (AFF-007)


@attrs.frozen
class AffinityTarget:
    worker_id: int
    dp_rank: int | None = None


@attrs.define
class _Binding:
    target: AffinityTarget | None  # None while a request initializes the session
    expires_at: float
    settled: trio.Event = attrs.field(factory=trio.Event)


@attrs.frozen
class Bound:
    session_id: str
    target: AffinityTarget


@attrs.define(eq=False)
class Initialize:
    """The right to choose the session's target; commit it or abandon it, exactly once."""

    _coordinator: AffinityCoordinator
    session_id: str
    _open: bool = True

    def commit(self, target: AffinityTarget) -> None:
        if self._open:
            self._open = False
            self._coordinator._settle(self.session_id, target)

    def abandon(self) -> None:
        """A dropped initialization leaves the session unbound (AFF-002, AFF-012)."""
        if self._open:
            self._open = False
            self._coordinator._settle(self.session_id, None)


Acquired = Initialize | Bound


@attrs.define
class AffinityCoordinator:
    ttl: float
    max_entries: int = MAX_AFFINITY_ENTRIES
    clock: Callable[[], float] = trio.current_time
    _bindings: dict[str, _Binding] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        if not 0 < self.ttl <= MAX_AFFINITY_TTL:
            raise RoutingError(
                ErrorKind.INVALID_ARGUMENT,
                f"session_affinity_ttl={self.ttl} must be in (0, {MAX_AFFINITY_TTL:.0f}] "
                "seconds (AFF-003)",
            )
        if not 0 < self.max_entries <= MAX_AFFINITY_ENTRIES:
            raise RoutingError(
                ErrorKind.INVALID_ARGUMENT,
                f"max_affinity_entries={self.max_entries} must be in (0, "
                f"{MAX_AFFINITY_ENTRIES}] (AFF-004)",
            )

    @staticmethod
    def validate_session_id(session_id: str) -> None:
        size = len(session_id.encode())
        if size > MAX_SESSION_ID_BYTES:
            raise RoutingError(
                ErrorKind.INVALID_ARGUMENT,
                f"session affinity id is {size} bytes; at most {MAX_SESSION_ID_BYTES} are "
                "allowed (AFF-004)",
            )

    async def acquire(self, session_id: str) -> Acquired:
        """``Initialize`` for an unbound session, ``Bound`` for a bound one; waits while
        another request initializes it (AFF-001, AFF-002)."""
        self.validate_session_id(session_id)
        while True:
            binding = self._live(session_id)
            if binding is None:
                return self.initialize(session_id)
            if binding.target is None:
                await binding.settled.wait()
                continue
            binding.expires_at = self.clock() + self.ttl  # a use refreshes the TTL
            return Bound(session_id, binding.target)

    def initialize(self, session_id: str) -> Initialize:
        """Start initializing a session known to be unbound, without waiting: a request
        whose stale binding it has just invalidated chooses the new target (AFF-009)."""
        assert self._live(session_id) is None, f"session {session_id} is still bound"
        self._make_room()
        self._bindings[session_id] = _Binding(None, float("inf"))
        return Initialize(self, session_id)

    def query_target(self, session_id: str) -> AffinityTarget | None:
        binding = self._live(session_id)
        return None if binding is None else binding.target

    def is_initializing(self, session_id: str) -> bool:
        binding = self._live(session_id)
        return binding is not None and binding.target is None

    def rebind(self, session_id: str, target: AffinityTarget) -> None:
        """Soft affinity follows the dispatch (AFF-007)."""
        binding = self._live(session_id)
        if binding is not None and binding.target is not None:
            binding.target = target
            binding.expires_at = self.clock() + self.ttl

    def invalidate(self, session_id: str, target: AffinityTarget) -> None:
        """Forget a binding that still points at ``target`` (AFF-009, HST-009)."""
        binding = self._live(session_id)
        if binding is not None and binding.target == target:
            del self._bindings[session_id]

    def _settle(self, session_id: str, target: AffinityTarget | None) -> None:
        binding = self._bindings.pop(session_id)
        if target is not None:
            self._bindings[session_id] = _Binding(target, self.clock() + self.ttl)
        binding.settled.set()

    def _live(self, session_id: str) -> _Binding | None:
        binding = self._bindings.get(session_id)
        if binding is not None and binding.expires_at <= self.clock():
            del self._bindings[session_id]  # AFF-003
            return None
        return binding

    def _make_room(self) -> None:
        if len(self._bindings) < self.max_entries:
            return
        now = self.clock()
        self._bindings = {s: b for s, b in self._bindings.items() if b.expires_at > now}
        if len(self._bindings) >= self.max_entries:
            raise RoutingError(
                ErrorKind.RESOURCE_EXHAUSTED,
                f"session affinity holds {len(self._bindings)} sessions, the most it may (AFF-004)",
            )
