"""Worker sets (SET): one small scenario per rule.

The sets are read through the target's WorkerSetsView; a *vanished* worker has lost its
transport record while discovery still lists it.
"""

from __future__ import annotations

from collections.abc import Callable

from routespec.conformance.checks import covers, require_compare, require_equal, requires
from routespec.conformance.scenario import (
    reached,
)
from routespec.testing.target import (
    Capability,
    Direct,
    Generate,
    Reject,
    Target,
    WorkerSetsView,
)


def _require_free_derived(view: WorkerSetsView, context: str) -> None:
    require_equal(
        "SET-004",
        view.free,
        view.routable - view.overloaded,
        f"{context}: free is {sorted(view.free)}, routable {sorted(view.routable)} minus "
        f"overloaded {sorted(view.overloaded)} is {sorted(view.routable - view.overloaded)}",
    )


@covers("SET-001")
@requires(Capability.OBSERVE_WORKER_SETS, Capability.REMOVE_WORKER, Capability.ROUND_ROBIN)
def test_discovered_is_what_discovery_lists(target: Target) -> None:
    require_equal("SET-001", target.worker_sets().discovered, set(), "a new target lists workers")
    first, second, third = (target.add_worker() for _ in range(3))
    view = target.worker_sets()
    require_equal(
        "SET-001",
        view.discovered,
        {first, second, third},
        f"after adding {first}, {second}, {third}, discovered is {sorted(view.discovered)}",
    )
    target.remove_worker(second)
    view = target.worker_sets()
    require_equal(
        "SET-001",
        view.discovered,
        {first, third},
        f"after removing {second}, discovered is {sorted(view.discovered)}",
    )
    picks = [w for _ in range(4) for w in reached(target, target.submit(Generate("round-robin")))]
    require_compare(
        "SET-001",
        second,
        "not in",
        picks,
        f"removed worker {second} was reached by round-robin: {picks}",
    )
    fourth = target.add_worker()
    view = target.worker_sets()
    require_equal(
        "SET-001",
        view.discovered,
        {first, third, fourth},
        f"after adding {fourth}, discovered is {sorted(view.discovered)}",
    )


@covers("SET-001")
@requires(Capability.OBSERVE_WORKER_SETS, Capability.VANISH_WORKER)
def test_a_vanished_worker_stays_discovered(target: Target) -> None:
    first, second = target.add_worker(), target.add_worker()
    target.vanish_worker(first)
    view = target.worker_sets()
    require_equal(
        "SET-001",
        view.discovered,
        {first, second},
        f"worker {first} lost only its transport record, discovery still lists it; "
        f"discovered is {sorted(view.discovered)}",
    )


@covers("SET-002")
@requires(
    Capability.OBSERVE_WORKER_SETS,
    Capability.REPORT_DOWN,
    Capability.MOCK_CLOCK,
    Capability.REMOVE_WORKER,
)
def test_routable_excludes_inhibited_workers(target: Target) -> None:
    first, second, third = (target.add_worker() for _ in range(3))
    target.report_down(second)
    target.advance_time(1.0)
    target.report_down(third)
    view = target.worker_sets()
    require_equal(
        "SET-002",
        view.routable,
        {first},
        f"with {second} and {third} inhibited, routable is {sorted(view.routable)}",
    )
    target.remove_worker(third)
    target.advance_time(4.0)  # second's inhibition has lapsed
    view = target.worker_sets()
    require_equal(
        "SET-002",
        view.routable,
        {first, second},
        f"with {second}'s inhibition lapsed and {third} removed, routable is "
        f"{sorted(view.routable)}",
    )


@covers("SET-003")
@requires(Capability.OBSERVE_WORKER_SETS, Capability.MARK_OVERLOADED, Capability.REMOVE_WORKER)
def test_overloaded_follows_monitor_verdicts(target: Target) -> None:
    first, _, third = (target.add_worker() for _ in range(3))
    target.mark_overloaded(first, True)
    target.mark_overloaded(third, True)
    view = target.worker_sets()
    require_equal(
        "SET-003",
        view.overloaded,
        {first, third},
        f"the monitor reports {first} and {third}; overloaded is {sorted(view.overloaded)}",
    )
    target.remove_worker(third)
    target.mark_overloaded(first, False)
    view = target.worker_sets()
    require_equal(
        "SET-003",
        view.overloaded,
        set(),
        f"with {first} cleared and {third} removed, overloaded is {sorted(view.overloaded)}",
    )


@covers("SET-003")
@requires(
    Capability.OBSERVE_WORKER_SETS,
    Capability.MARK_OVERLOADED,
    Capability.DIRECT,
    Capability.SCRIPT_REJECTION,
    Capability.MOCK_CLOCK,
    Capability.REPORT_DOWN,
)
def test_overloaded_is_verdicts_plus_leases(target: Target) -> None:
    marked, leased, inhibited, idle = (target.add_worker() for _ in range(4))
    target.mark_overloaded(marked, True)
    target.script_worker(leased, Reject(overloaded=True))
    target.submit(Direct(leased))
    target.report_down(inhibited)
    target.mark_overloaded(inhibited, True)
    view = target.worker_sets()
    require_equal(
        "SET-003",
        view.overloaded,
        {marked, leased, inhibited},
        f"marked {marked}, leased {leased}, inhibited and marked {inhibited}: overloaded is "
        f"{sorted(view.overloaded)}",
    )
    target.advance_time(1.0)
    view = target.worker_sets()
    require_equal(
        "SET-003",
        view.overloaded,
        {marked, inhibited},
        f"the lease on {leased} has lapsed; overloaded is {sorted(view.overloaded)}",
    )
    require_compare(
        "SET-003", idle, "not in", view.overloaded, f"idle worker {idle} is overloaded: {view}"
    )


@covers("SET-004")
@requires(
    Capability.OBSERVE_WORKER_SETS,
    Capability.MARK_OVERLOADED,
    Capability.REPORT_DOWN,
    Capability.VANISH_WORKER,
    Capability.MOCK_CLOCK,
)
def test_free_is_routable_minus_overloaded(target: Target) -> None:
    first, second, third, fourth = (target.add_worker() for _ in range(4))
    steps: list[tuple[str, Callable[[], None], set[int]]] = [
        ("nothing marked", lambda: None, {first, second, third, fourth}),
        ("first overloaded", lambda: target.mark_overloaded(first, True), {second, third, fourth}),
        ("second inhibited", lambda: target.report_down(second), {third, fourth}),
        ("third overloaded", lambda: target.mark_overloaded(third, True), {fourth}),
        ("second overloaded too", lambda: target.mark_overloaded(second, True), {fourth}),
        ("fourth vanished", lambda: target.vanish_worker(fourth), {fourth}),
        ("5 s later", lambda: target.advance_time(5.0), {fourth}),
        ("second cleared", lambda: target.mark_overloaded(second, False), {second, fourth}),
        ("first cleared", lambda: target.mark_overloaded(first, False), {first, second, fourth}),
    ]
    for context, step, expected in steps:
        step()
        view = target.worker_sets()
        _require_free_derived(view, context)
        require_equal(
            "SET-004",
            view.free,
            expected,
            f"{context}: free is {sorted(view.free)}, expected {sorted(expected)} ({view})",
        )
