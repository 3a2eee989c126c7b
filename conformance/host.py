"""Helpers shared by the routing-host checks (HST, AFF, MON, KVS)."""

from __future__ import annotations

from routespec.conformance.checks import RequirementViolation, require
from routespec.conformance.scenario import finished, reached, shows_outer
from routespec.testing.target import (
    HostConfig,
    ObservedError,
    Outcome,
    PlanView,
    RoutingHostTarget,
    Target,
    WorkerScript,
)


def host_of(target: Target, requirement: str, config: HostConfig) -> RoutingHostTarget:
    """The target's routing host built with ``config``; a refusal fails ``requirement``."""
    built = target.open_host(config)
    if isinstance(built, ObservedError):
        raise RequirementViolation(requirement, f"building a host {config} failed: {built}")
    return built


def refused_at_construction(target: Target, requirement: str, config: HostConfig, why: str) -> None:
    """Building a host with ``config`` must fail with ``InvalidArgument``."""
    built = target.open_host(config)
    require(
        requirement,
        isinstance(built, ObservedError) and shows_outer(built, "InvalidArgument"),
        f"{why}: a host {config} should be refused with InvalidArgument, got {built}",
    )


def workers(target: Target, count: int, script: WorkerScript | None = None) -> list[int]:
    found = []
    for _ in range(count):
        worker = target.add_worker()
        if script is not None:
            target.script_worker(worker, script)
        found.append(worker)
    return found


def planned(view: PlanView | ObservedError, requirement: str) -> PlanView:
    if isinstance(view, ObservedError):
        raise RequirementViolation(requirement, f"expected a route plan, got {view.describe()}")
    return view


def ended(target: Target, request_id: str, requirement: str) -> tuple[Outcome, list[int]]:
    """The request's outcome (it must have ended) and the workers it reached."""
    return finished(target, request_id, requirement), reached(target, request_id)
