"""The cleanup budget one route's stages share while its caller has gone (HST-014, HST-015)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
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


async def run_stage(
    request: HostRequest, budget: CleanupBudget, stage: str, step: Callable[[], Awaitable[T]]
) -> T:
    """Run one stage of a route for ``request``.

    A stopped request ends here with ``Cancelled`` (HST-012), unless it must still reach its
    worker (a decode leg with staged KV); such a request runs every stage on the shared
    budget and fails naming the stage when it runs out (HST-013, HST-015).
    """
    if request.context.stopped and not request.must_reach_worker:
        raise cancelled(request.request_id)
    with trio.CancelScope() as scope:

        def on_stop() -> None:
            if request.must_reach_worker:
                scope.deadline = min(scope.deadline, budget.deadline())
            else:
                scope.cancel()

        request.context.listen(on_stop)
        try:
            if request.context.stopped and budget.remaining() <= 0:
                scope.cancel()
                await trio.lowlevel.checkpoint()
            return await step()
        finally:
            request.context.unlisten(on_stop)
    if request.must_reach_worker:
        raise budget.exhausted(request.request_id, stage)
    raise cancelled(request.request_id)
