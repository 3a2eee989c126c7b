"""Workers a request must not reach again, shared by all of its attempts (MIG-010, MIG-012).

The router records a worker here before the failure it caused becomes visible to the
caller, so a retry that reacts to the failure can never pick the same worker.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from routespec.errors import ErrorKind, RoutingError, match_error_chain

ALL_OVERLOADED = "all eligible workers rejected the request as overloaded"
NONE_UNTRIED = "no untried eligible worker remains after migration"


@attrs.define
class Exclusions:
    failed: dict[int, RoutingError] = attrs.field(factory=dict)
    last_error: RoutingError | None = None

    def record(self, worker_id: int, error: RoutingError) -> None:
        """Once per worker, keeping its latest error."""
        self.failed[worker_id] = error
        self.last_error = error

    def __bool__(self) -> bool:
        return bool(self.failed)

    def eligible(self, worker_ids: Iterable[int]) -> list[int]:
        return [i for i in worker_ids if i not in self.failed]

    def exhausted(self) -> RoutingError:
        """Every eligible worker has been tried: pool-level, so migration ends (MIG-012)."""
        if self.last_error is not None and match_error_chain(
            self.last_error, [ErrorKind.WORKER_OVERLOADED]
        ):
            return RoutingError(ErrorKind.RESOURCE_EXHAUSTED, ALL_OVERLOADED)
        return RoutingError(ErrorKind.UNAVAILABLE, NONE_UNTRIED)
