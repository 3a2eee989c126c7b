"""The cleanup budget one route's stages share while its caller has gone (HST-014, HST-015)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TypeVar

import attrs
import trio

from routespec.errors import ErrorKind, RoutingError
from routespec.host.request import HostRequest

CLEANUP_BUDGET = 120.0
T = TypeVar("T")


@attrs.define
class CleanupBudget:
    """Started the first time a stage consults it; every later stage draws on the same clock."""

    limit: float = CLEANUP_BUDGET
    clock: Callable[[], float] = trio.current_time
    started_at: float | None = None
    stage: str = ""  # the stage the route is in, which an exhausted budget names

    def deadline(self) -> float:
        if self.started_at is None:
            self.started_at = self.clock()
        return self.started_at + self.limit

    def remaining(self) -> float:
        return max(0.0, self.deadline() - self.clock())

    def exhausted(self, request_id: str, stage: str) -> RoutingError:
        return RoutingError(
            ErrorKind.CANCELLED,
            f"Request {request_id} exhausted its decode cleanup budget at {stage}",
        )


def cancelled(request_id: str) -> RoutingError:
    """A stopped request that may not reach a worker (HST-012)."""
    return RoutingError(ErrorKind.CANCELLED, f"Request {request_id} was cancelled")


class StopScope:
    """One cancel scope and one stop listener for every stage a route runs in one call
    (a scope per stage cost more than the rest of a routing decision)."""

    def __init__(self, request: HostRequest, budget: CleanupBudget) -> None:
        self._request = request
        self._budget = budget
        self._scope = trio.CancelScope()

    def __enter__(self) -> None:
        self._scope.__enter__()
        self._request.context.listen(self._on_stop)

    def _on_stop(self) -> None:
        if self._request.must_reach_worker:  # HST-013: on, but within the budget
            self._scope.deadline = min(self._scope.deadline, self._budget.deadline())
        else:
            self._scope.cancel()  # HST-012

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._request.context.unlisten(self._on_stop)
        self._scope.__exit__(kind, error, traceback)  # swallows only its own cancellation
        if not self._scope.cancelled_caught:
            return
        request_id = self._request.request_id
        if self._request.must_reach_worker:
            raise self._budget.exhausted(request_id, self._budget.stage) from None  # HST-015
        raise cancelled(request_id) from None


async def run_stage(
    request: HostRequest, budget: CleanupBudget, stage: str, step: Callable[[], Awaitable[T]]
) -> T:
    """Run one stage of a route for ``request``, inside the route's ``StopScope``.

    A stopped request ends here with ``Cancelled`` (HST-012), unless it must still reach its
    worker (a decode leg with staged KV); such a request runs every stage on the shared
    budget and fails naming the stage when it runs out (HST-013, HST-015).
    """
    budget.stage = stage
    if request.context.stopped:
        if not request.must_reach_worker:
            raise cancelled(request.request_id)
        if budget.remaining() <= 0:
            raise budget.exhausted(request.request_id, stage)
    return await step()
