"""Fault detection (FLT): local inhibition, overload leases, and errors passed through unchanged.

A worker is made to fail by scripting it (before the stream, or with an error item after some
data), a request is sent to it with ``direct``, and the worker sets are read afterwards. Time
moves only through ``advance_time``; durations are binary fractions so that the boundaries
are exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from routespec.conformance import oracle
from routespec.conformance.checks import (
    RequirementViolation,
    covers,
    require,
    require_compare,
    require_equal,
    requires,
)
from routespec.conformance.plugin import OpenTarget
from routespec.conformance.scenario import (
    BUILTIN_MODES,
    finished,
    reached,
    shows,
    shows_outer,
    spec_of,
)
from routespec.testing.target import (
    Call,
    Capability,
    Direct,
    DirectWithin,
    ErrorSpec,
    FailBeforeStream,
    FailMidStream,
    Generate,
    Outcome,
    Serve,
    Stall,
    Target,
    TargetConfig,
    WorkerScript,
)

WHERE = ["before-stream", "stream-item"]
NEUTRAL_TYPES = [
    label
    for label in oracle.TYPE_LABELS
    if label not in oracle.INHIBITING_TYPES and label != "WorkerOverloaded"
]


def failing(where: str, error: ErrorSpec) -> WorkerScript:
    if where == "before-stream":
        return FailBeforeStream(error)
    return FailMidStream(2, error)


def show(labels: Sequence[str | None]) -> str:
    return " <- ".join(label or "untyped" for label in labels)


def fail_once(target: Target, worker: int, script: WorkerScript, requirement: str) -> Outcome:
    """Send one direct request to ``worker`` under ``script``, then let it serve normally."""
    target.script_worker(worker, script)
    outcome = finished(target, target.submit(Direct(worker)), requirement)
    target.script_worker(worker, Serve())
    if outcome.error is None:
        raise RequirementViolation(
            requirement, f"worker {worker} scripted {script} did not fail the request: {outcome}"
        )
    return outcome


# --- FLT-001 ---

INHIBITING_CHAINS = [
    pytest.param((label,), id=label) for label in sorted(oracle.INHIBITING_TYPES)
] + [
    pytest.param((None, "Unknown", "Disconnected"), id="deep-Disconnected"),
    pytest.param(("WorkerOverloaded", "Backend(EngineShutdown)"), id="under-WorkerOverloaded"),
    pytest.param(("InvalidArgument", None, "ResponseTimeout"), id="under-InvalidArgument"),
]


@covers("FLT-001")
@requires(
    Capability.DIRECT,
    Capability.SCRIPT_FAILURES,
    Capability.OBSERVE_WORKER_SETS,
    Capability.MOCK_CLOCK,
)
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("labels", INHIBITING_CHAINS)
def test_an_inhibiting_error_inhibits_the_worker(
    target: Target, labels: tuple[str | None, ...], where: str
) -> None:
    worker, other = target.add_worker(), target.add_worker()
    fail_once(target, worker, failing(where, spec_of(labels)), "FLT-001")
    sets = target.worker_sets()
    require(
        "FLT-001",
        worker not in sets.routable and other in sets.routable,
        f"after {show(labels)} ({where}) from worker {worker}, routable is "
        f"{sorted(sets.routable)}; expected {worker} inhibited and {other} routable",
    )
    target.advance_time(4.5)
    sets = target.worker_sets()
    require_compare(
        "FLT-001",
        worker,
        "not in",
        sets.routable,
        f"4.5 s after {show(labels)} ({where}), worker {worker} is routable again "
        f"({sorted(sets.routable)}); inhibition lasts 5 s",
    )


@covers("FLT-001")
@requires(
    Capability.DIRECT,
    Capability.SCRIPT_FAILURES,
    Capability.ROUND_ROBIN,
)
def test_an_inhibited_worker_gets_no_new_selections(target: Target) -> None:
    worker, *others = (target.add_worker() for _ in range(3))
    fail_once(target, worker, FailBeforeStream(ErrorSpec("CannotConnect")), "FLT-001")
    picks = [reached(target, target.submit(Generate("round-robin"))) for _ in range(6)]
    require(
        "FLT-001",
        all(pick and pick[0] in others for pick in picks),
        f"after worker {worker} failed with CannotConnect, round-robin reached {picks}; "
        f"expected only {others}",
    )


@covers("FLT-001")
@requires(
    Capability.DIRECT,
    Capability.KILL_WORKER,
    Capability.SCRIPT_STALL,
    Capability.OBSERVE_WORKER_SETS,
)
def test_a_dead_worker_is_inhibited(target: Target) -> None:
    streaming, idle, other = (target.add_worker() for _ in range(3))
    target.script_worker(streaming, Stall(items=1))
    open_request = target.submit(Direct(streaming))
    target.kill_worker(streaming)
    target.kill_worker(idle)
    refused = finished(target, target.submit(Direct(idle)), "FLT-001")
    require_compare(
        "FLT-001", refused.error, "is not", None, f"direct to a killed worker ended {refused}"
    )
    sets = target.worker_sets()
    require_equal(
        "FLT-001",
        sets.routable,
        {other},
        f"after worker {streaming} died mid-stream ({target.outcome(open_request)}) and "
        f"worker {idle} refused a connection ({refused}), routable is {sorted(sets.routable)}, "
        f"expected [{other}]",
    )


# --- FLT-002 ---


@covers("FLT-002")
@requires(
    Capability.DIRECT,
    Capability.SCRIPT_FAILURES,
    Capability.OBSERVE_WORKER_SETS,
    Capability.MOCK_CLOCK,
    Capability.ROUND_ROBIN,
)
def test_inhibition_expires_after_five_seconds(target: Target) -> None:
    worker, other = target.add_worker(), target.add_worker()
    fail_once(target, worker, FailBeforeStream(ErrorSpec("CannotConnect")), "FLT-002")
    target.advance_time(4.5)
    require_compare(
        "FLT-002",
        worker,
        "not in",
        target.worker_sets().routable,
        f"worker {worker} is routable 4.5 s after failing with CannotConnect",
    )
    target.advance_time(0.5)
    sets = target.worker_sets()
    require_equal(
        "FLT-002",
        sets.routable,
        {worker, other},
        f"5 s after worker {worker} was reported down, routable is {sorted(sets.routable)}; "
        f"expected [{worker}, {other}]",
    )
    picks = {w for _ in range(2) for w in reached(target, target.submit(Generate("round-robin")))}
    require_compare(
        "FLT-002",
        worker,
        "in",
        picks,
        f"after the inhibition lapsed, two round-robin requests reached {sorted(picks)}, "
        f"never worker {worker}",
    )


@covers("FLT-002")
@requires(Capability.REPORT_DOWN, Capability.OBSERVE_WORKER_SETS, Capability.MOCK_CLOCK)
def test_inhibition_counts_from_the_last_report(target: Target) -> None:
    worker = target.add_worker()
    target.report_down(worker)
    target.advance_time(3.0)
    target.report_down(worker)
    target.advance_time(3.0)
    require_compare(
        "FLT-002",
        worker,
        "not in",
        target.worker_sets().routable,
        f"worker {worker} is routable 6 s after the first report but 3 s after the last",
    )
    target.advance_time(2.0)
    require_compare(
        "FLT-002",
        worker,
        "in",
        target.worker_sets().routable,
        f"worker {worker} is still not routable 5 s after it was last reported down",
    )


@covers("FLT-002")
@requires(
    Capability.CONFIGURE_INHIBITION,
    Capability.REPORT_DOWN,
    Capability.OBSERVE_WORKER_SETS,
    Capability.MOCK_CLOCK,
)
@pytest.mark.parametrize("duration", [2.0, 1.0, 0.5])
def test_a_configured_duration_is_honoured(open_target: OpenTarget, duration: float) -> None:
    """A configured duration is honoured for what it is, a second or under one as much as a
    longer one."""
    with open_target(TargetConfig(inhibited_duration=duration)) as target:
        worker = target.add_worker()
        target.report_down(worker)
        target.advance_time(duration * 0.75)
        require_compare(
            "FLT-002",
            worker,
            "not in",
            target.worker_sets().routable,
            f"with a {duration} s inhibition, worker {worker} is routable "
            f"{duration * 0.75} s after being reported down",
        )
        target.advance_time(duration * 0.25)
        require_compare(
            "FLT-002",
            worker,
            "in",
            target.worker_sets().routable,
            f"with a {duration} s inhibition, worker {worker} is not routable {duration} s "
            f"after being reported down",
        )


# --- FLT-003 ---


@covers("FLT-003")
@requires(Capability.CONFIGURE_INHIBITION, Capability.REPORT_DOWN, Capability.OBSERVE_WORKER_SETS)
def test_zero_duration_report_down_leaves_the_worker_routable(open_target: OpenTarget) -> None:
    with open_target(TargetConfig(inhibited_duration=0.0)) as target:
        worker, other = target.add_worker(), target.add_worker()
        target.report_down(worker)
        sets = target.worker_sets()
        require_equal(
            "FLT-003",
            sets.routable,
            {worker, other},
            f"with inhibition duration 0, reporting {worker} down left routable "
            f"{sorted(sets.routable)}",
        )


@covers("FLT-003")
@requires(
    Capability.CONFIGURE_INHIBITION,
    Capability.DIRECT,
    Capability.SCRIPT_FAILURES,
    Capability.ROUND_ROBIN,
)
def test_zero_duration_failure_leaves_the_worker_selectable(open_target: OpenTarget) -> None:
    with open_target(TargetConfig(inhibited_duration=0.0)) as target:
        worker, other = target.add_worker(), target.add_worker()
        fail_once(target, worker, FailBeforeStream(ErrorSpec("Disconnected")), "FLT-003")
        picks = {
            w for _ in range(2) for w in reached(target, target.submit(Generate("round-robin")))
        }
        require_equal(
            "FLT-003",
            picks,
            {worker, other},
            f"with inhibition duration 0, after {worker} failed with Disconnected two "
            f"round-robin requests reached {sorted(picks)}, expected both workers",
        )


# --- FLT-004 ---


@covers("FLT-004")
@requires(
    Capability.DIRECT,
    Capability.SCRIPT_FAILURES,
    Capability.OBSERVE_WORKER_SETS,
    Capability.MOCK_CLOCK,
)
@pytest.mark.parametrize(
    "labels",
    [
        ("WorkerOverloaded",),
        (None, "Unknown", "WorkerOverloaded"),
        ("WorkerOverloaded", "Cancelled"),
    ],
    ids=["plain", "deep", "with-cause"],
)
def test_worker_overloaded_leases_overload_for_one_second(
    target: Target, labels: tuple[str | None, ...]
) -> None:
    worker, other = target.add_worker(), target.add_worker()
    fail_once(target, worker, FailMidStream(0, spec_of(labels)), "FLT-004")
    sets = target.worker_sets()
    require(
        "FLT-004",
        sets.overloaded == {worker} and sets.free == {other} and worker in sets.routable,
        f"after {show(labels)} from worker {worker}: {sets}; expected it overloaded "
        "(still routable, not free)",
    )
    target.advance_time(0.5)
    require_equal(
        "FLT-004",
        target.worker_sets().overloaded,
        {worker},
        f"0.5 s into its 1 s lease, worker {worker} is no longer overloaded",
    )
    target.advance_time(0.5)
    sets = target.worker_sets()
    require(
        "FLT-004",
        not sets.overloaded and sets.free == {worker, other},
        f"1 s after the lease began, sets are {sets}; expected worker {worker} free again",
    )


@covers("FLT-004")
@requires(
    Capability.DIRECT,
    Capability.SCRIPT_FAILURES,
    Capability.MARK_OVERLOADED,
    Capability.OBSERVE_WORKER_SETS,
    Capability.MOCK_CLOCK,
)
def test_a_monitor_verdict_outlives_the_lease(target: Target) -> None:
    worker = target.add_worker()
    fail_once(target, worker, FailMidStream(0, ErrorSpec("WorkerOverloaded")), "FLT-004")
    target.mark_overloaded(worker, True)
    target.advance_time(2.0)
    require_equal(
        "FLT-004",
        target.worker_sets().overloaded,
        {worker},
        f"after the lease lapsed, worker {worker} is not overloaded though the monitor reports it",
    )
    target.mark_overloaded(worker, False)
    require_equal(
        "FLT-004",
        target.worker_sets().free,
        {worker},
        f"with the lease lapsed and the monitor verdict cleared, worker {worker} is not free",
    )


# --- FLT-005 ---


@covers("FLT-005")
@requires(Capability.DIRECT, Capability.REPORT_DOWN)
def test_direct_reaches_a_reported_down_worker(target: Target) -> None:
    worker, _ = target.add_worker(), target.add_worker()
    target.report_down(worker)
    request = target.submit(Direct(worker))
    outcome = finished(target, request, "FLT-005")
    require(
        "FLT-005",
        reached(target, request) == [worker] and outcome.error is None and len(outcome.items) == 1,
        f"direct to locally inhibited worker {worker} reached {reached(target, request)} "
        f"and ended {outcome}; expected it served by {worker}",
    )


@covers("FLT-005")
@requires(Capability.DIRECT, Capability.SCRIPT_FAILURES)
def test_direct_reaches_a_worker_inhibited_by_its_failure(target: Target) -> None:
    worker, _ = target.add_worker(), target.add_worker()
    fail_once(target, worker, FailBeforeStream(ErrorSpec("ConnectionTimeout")), "FLT-005")
    request = target.submit(Direct(worker))
    outcome = finished(target, request, "FLT-005")
    require(
        "FLT-005",
        reached(target, request) == [worker] and outcome.error is None,
        f"direct to worker {worker}, inhibited by its ConnectionTimeout, reached "
        f"{reached(target, request)} and ended {outcome}; expected it served by {worker}",
    )


# --- FLT-006 ---

NEUTRAL_CHAINS = [pytest.param((label,), id=label) for label in NEUTRAL_TYPES] + [
    pytest.param((None,), id="untyped"),
    pytest.param((None, "Cancelled", "InvalidArgument"), id="deep-neutral"),
]


@covers("FLT-006")
@requires(
    Capability.DIRECT,
    Capability.SCRIPT_FAILURES,
    Capability.OBSERVE_WORKER_SETS,
)
@pytest.mark.parametrize("where", ["stream-item"])  # before the stream, TRN-005 applies
@pytest.mark.parametrize("labels", NEUTRAL_CHAINS)
def test_other_errors_leave_the_sets_alone(
    target: Target, labels: tuple[str | None, ...], where: str
) -> None:
    worker, _ = target.add_worker(), target.add_worker()
    before = target.worker_sets()
    fail_once(target, worker, failing(where, spec_of(labels)), "FLT-006")
    after = target.worker_sets()
    require_equal(
        "FLT-006",
        (after.routable, after.overloaded),
        (before.routable, before.overloaded),
        f"{show(labels)} ({where}) from worker {worker} changed the sets from {before} to {after}",
    )


# --- FLT-007 ---

CHAINS = [
    ("CannotConnect",),
    ("WorkerOverloaded",),
    ("InvalidArgument",),
    ("Disconnected", "Backend(EngineShutdown)"),
    (None, "WorkerUnavailable", None, "Cancelled"),
    ("Backend(StreamIncomplete)", "ResponseTimeout", "Unknown"),
    ("Unavailable", "ResourceExhausted", "Backend(Cancelled)"),
    (None,),
]


@covers("FLT-007")
@requires(Capability.DIRECT, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("labels", CHAINS, ids=show)
def test_the_caller_sees_the_error_unchanged(
    target: Target, labels: tuple[str | None, ...], where: str
) -> None:
    worker = target.add_worker()
    outcome = fail_once(target, worker, failing(where, spec_of(labels)), "FLT-007")
    assert outcome.error is not None  # fail_once guarantees it
    seen = oracle.pre_stream_chain(labels) if where == "before-stream" else labels
    expected = tuple(oracle.typed(seen))
    require(
        "FLT-007",
        shows(outcome.error, seen),
        f"the worker failed with {show(labels)} ({where}); the caller saw "
        f"{outcome.error.describe()}, expected typed chain {show(expected)}",
    )
    require_equal(
        "FLT-007",
        outcome.error.pre_stream,
        where == "before-stream",
        f"the worker failed {where}; the caller saw the error "
        f"{'before the stream' if outcome.error.pre_stream else 'as a stream item'}",
    )


# --- FLT-009 ---

OFF = TargetConfig(fault_detection=False)


@covers("FLT-009")
@requires(Capability.CONFIGURE_INHIBITION, Capability.DIRECT, Capability.MARK_OVERLOADED)
def test_fault_detection_off_skips_the_overload_check(open_target: OpenTarget) -> None:
    with open_target(OFF) as target:
        worker = target.add_worker()
        target.mark_overloaded(worker, True)
        request = target.submit(Direct(worker))
        outcome = finished(target, request, "FLT-009")
        require(
            "FLT-009",
            outcome.error is None and reached(target, request) == [worker],
            f"with fault detection off, a direct request to overloaded worker {worker} ended "
            f"{outcome}, reaching {reached(target, request)}; expected it served by {worker}",
        )


@covers("FLT-009")
@requires(
    Capability.CONFIGURE_INHIBITION,
    Capability.DIRECT,
    Capability.SCRIPT_FAILURES,
    Capability.OBSERVE_WORKER_SETS,
)
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("label", ["Disconnected", "WorkerOverloaded", "Backend(EngineShutdown)"])
def test_fault_detection_off_leaves_the_sets_alone(
    open_target: OpenTarget, label: str, where: str
) -> None:
    with open_target(OFF) as target:
        worker = target.add_worker()
        target.add_worker()  # a second worker, so the sets are not trivially one
        before = target.worker_sets()
        fail_once(target, worker, failing(where, ErrorSpec(label)), "FLT-009")
        after = target.worker_sets()
        require_equal(
            "FLT-009",
            (after.routable, after.overloaded),
            (before.routable, before.overloaded),
            f"with fault detection off, {label} ({where}) from worker {worker} changed the "
            "(routable, overloaded) sets",
        )


@covers("FLT-009", "TMO-006")
@requires(
    Capability.CONFIGURE_INHIBITION,
    Capability.DIRECT,
    Capability.SCRIPT_STALL,
    Capability.MOCK_CLOCK,
    Capability.OBSERVE_WORKER_SETS,
)
def test_fault_detection_off_a_timeout_reports_nobody_down(open_target: OpenTarget) -> None:
    """The inactivity deadline still ends the stream, but reports nobody down."""
    with open_target(OFF) as target:
        worker, other = target.add_worker(), target.add_worker()
        target.script_worker(worker, Stall(items=1))
        request = target.submit(Direct(worker))
        target.advance_time(301.0)  # past the default inactivity deadline (TMO-005)
        outcome = finished(target, request, "FLT-009")
        require(
            "FLT-009",
            outcome.error is not None and shows_outer(outcome.error, "ResponseTimeout"),
            f"a stalled stream past its inactivity deadline ended {outcome}; "
            "expected ResponseTimeout",
        )
        sets = target.worker_sets()
        require_equal(
            "FLT-009",
            sets.routable,
            {worker, other},
            f"with fault detection off, the timeout of worker {worker} changed routable",
        )


# --- FLT-008 ---


def fails_at_resolution(target: Target, call: Call, what: str) -> None:
    """The dispatch fails before any stream and reaches no worker (its error's type is
    DSP-002, DSP-007 and DSP-008's matter, not this rule's)."""
    request = target.submit(call)
    outcome = finished(target, request, "FLT-008")
    require(
        "FLT-008",
        outcome.error is not None and outcome.error.pre_stream and not reached(target, request),
        f"{what}: expected a failure at resolution reaching no worker; got {outcome}, "
        f"reached {reached(target, request)}",
    )


@covers("FLT-008")
@requires(
    Capability.DIRECT,
    Capability.DIRECT_WITHIN,
    Capability.VANISH_WORKER,
    Capability.MARK_OVERLOADED,
    Capability.OBSERVE_WORKER_SETS,
)
def test_a_failed_resolution_changes_no_set(target: Target) -> None:
    """Each way a dispatch can fail at transport resolution — the target without a record,
    the fallback without one, no fallback candidate at all — leaves routable and overloaded
    as they were (a vanished worker stays routable; an overloaded one stays overloaded)."""
    vanished, fallback, overloaded, _free = (target.add_worker() for _ in range(4))
    target.mark_overloaded(overloaded, True)
    target.vanish_worker(vanished)
    target.vanish_worker(fallback)
    before = target.worker_sets()
    cases: list[tuple[Call, str]] = [
        (Direct(vanished), "direct to a vanished worker"),
        (DirectWithin(vanished, frozenset({fallback})), "a vanished fallback"),
        (DirectWithin(vanished, frozenset()), "no fallback allowed"),
        (DirectWithin(vanished, frozenset({overloaded})), "only an overloaded fallback"),
    ]
    for call, what in cases:
        fails_at_resolution(target, call, what)
        after = target.worker_sets()
        require_equal(
            "FLT-008",
            (after.routable, after.overloaded),
            (before.routable, before.overloaded),
            f"{what} ({call}) changed the sets from {before} to {after}",
        )


@covers("FLT-008")
@requires(Capability.VANISH_WORKER, Capability.OBSERVE_WORKER_SETS)
@pytest.mark.parametrize("mode", BUILTIN_MODES)
def test_generate_failing_at_resolution_changes_no_set(target: Target, mode: str) -> None:
    """The only worker is selected but has vanished: no fallback candidate exists, and the
    worker is neither inhibited nor leased as overloaded."""
    only = target.add_worker()
    target.vanish_worker(only)
    before = target.worker_sets()
    fails_at_resolution(target, Generate(mode), f"{mode} to a vanished only worker")
    after = target.worker_sets()
    require_equal(
        "FLT-008",
        (after.routable, after.overloaded),
        (before.routable, before.overloaded),
        f"{mode} failing at resolution changed the sets from {before} to {after}",
    )
