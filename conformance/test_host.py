"""Routing host (HST): policies and their inputs, explicit workers, Direct mode, counters,
cancellation and its budget, LoRA filtering, and migration over the host.

Requests are token requests (``HostRoute``): a completed one reads the tokens
``len(tokens) .. len(tokens) + max_tokens - 1``, whichever workers produced them.
"""

from __future__ import annotations

import attrs
import pytest

from routespec.conformance.checks import (
    covers,
    require,
    require_compare,
    require_equal,
    require_false,
    requires,
)
from routespec.conformance.host import ended, host_of, planned, refused_at_construction, workers
from routespec.conformance.plugin import OpenTarget
from routespec.conformance.scenario import no_workers_available, reached, shows_outer, tokens
from routespec.testing.target import (
    Adapter,
    CancelThenFail,
    Capability,
    ErrorSpec,
    FailBeforeStream,
    FailMidStream,
    HostConfig,
    HostRoute,
    ObservedError,
    Outcome,
    Preselected,
    RoutingHostTarget,
    Serve,
    Silent,
    SilentStage,
    Stall,
    Target,
    TargetConfig,
    TerminalThen,
    WorkerScript,
)

HOST = Capability.ROUTING_HOST
UNKNOWN = 9_999
STEADY = TargetConfig(fault_detection=False)
"""No fault detection: a failure does not inhibit the only worker a scenario goes on using."""


def failed_with(outcome: Outcome, label: str, message: str | None = None) -> bool:
    error = outcome.error
    return (
        error is not None
        and shows_outer(error, label)
        and (message is None or error.links[0][1] == message)
    )


# --- HST-001, HST-002: policies and the inputs they declare ---

POLICY_INPUTS = {
    "round-robin": frozenset(),
    "random": frozenset(),
    "power-of-two-choices": frozenset({"occupancy"}),
    "least-loaded": frozenset({"occupancy"}),
    "device-aware-weighted": frozenset({"occupancy"}),
    "direct": frozenset(),
    "kv": frozenset({"cache", "load"}),
}


@covers("HST-001")
@pytest.mark.parametrize("policy", sorted(POLICY_INPUTS))
@requires(HOST, Capability.SCRIPT_STALL)
def test_a_host_builds_only_the_inputs_its_policy_declares(target: Target, policy: str) -> None:
    (worker,) = workers(target, 1, Stall())
    host = host_of(target, "HST-001", HostConfig(policy=policy))
    view = host.inputs()
    require(
        "HST-001",
        view.required_inputs == POLICY_INPUTS[policy]
        and view.constructed_inputs == view.required_inputs,
        f"{policy} should declare and build {sorted(POLICY_INPUTS[policy])}; it declares "
        f"{sorted(view.required_inputs)} and built {sorted(view.constructed_inputs)}",
    )
    host.route(HostRoute())
    booked = host.bookings()
    target.release_stalled(worker)
    require_equal(
        "HST-001",
        booked,
        {worker: 1} if POLICY_INPUTS[policy] else {},
        f"with one request open, a {policy} host booked {booked}: only a policy with a load "
        "input books admitted requests",
    )


@covers("HST-002")
@requires(HOST, Capability.SCRIPT_STALL, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("policy", ["least-loaded", "power-of-two-choices"])
def test_an_occupancy_policy_books_before_dispatch_and_releases_at_the_end(
    target: Target, policy: str
) -> None:
    first, second = workers(target, 2, Stall(items=1))
    host = host_of(target, "HST-002", HostConfig(policy=policy))
    held = host.route(HostRoute())
    chosen = reached(target, held)
    require_equal("HST-002", host.bookings(), {chosen[0]: 1}, f"booked {host.bookings()}")
    other = host.route(HostRoute())
    require_equal(
        "HST-002",
        {*chosen, *reached(target, other)},
        {first, second},
        f"with one worker booked the next request should go to the idle one; the two went "
        f"to {chosen + reached(target, other)}",
    )
    target.release_stalled(first)
    target.release_stalled(second)
    require_equal("HST-002", host.bookings(), {}, f"bookings after both ended: {host.bookings()}")
    target.script_worker(first, FailBeforeStream(ErrorSpec("Backend(InvalidArgument)")))
    target.script_worker(second, FailMidStream(0, ErrorSpec("Disconnected")))
    for _ in range(2):
        host.route(HostRoute())
    require_equal("HST-002", host.bookings(), {}, f"bookings after failures: {host.bookings()}")


BOOKING_POLICIES = ["least-loaded", "power-of-two-choices", "device-aware-weighted", "kv"]


@covers("HST-002", "HST-011", "MON-007")
@requires(HOST, Capability.SCRIPT_STALL)
@pytest.mark.parametrize("policy", BOOKING_POLICIES)
@pytest.mark.parametrize("items", [0, 1], ids=["before-the-first-item", "mid-stream"])
def test_a_booking_ends_when_the_caller_stops_or_drops_the_stream(
    target: Target, policy: str, items: int
) -> None:
    """HST-002's aborted request, on the cancellation path: the caller's context stops, or
    the caller drops the stream, while the worker is silent (before its first token, or after
    one). The booking is gone as soon as the stream has ended, and it is not a finished
    stream."""
    (worker,) = workers(target, 1, Stall(items=items))
    host = host_of(target, "HST-002", HostConfig(policy=policy))
    for how in ("stopped", "dropped"):
        started, completed = host.counters()
        request = host.route(HostRoute(max_tokens=2))
        require(
            "HST-002",
            reached(target, request) == [worker]
            and target.outcome(request) is None
            and host.bookings() == {worker: 1},
            f"{policy}: a request open on worker {worker} after {items} tokens should be "
            f"booked there; reached {reached(target, request)}, outcome "
            f"{target.outcome(request)}, bookings {host.bookings()}",
        )
        if how == "stopped":
            host.stop(request)
        else:
            target.drop(request)
        outcome, _ = ended(target, request, "MON-007")
        require(
            "MON-007",
            outcome.error is None and len(tokens(outcome)) == items,
            f"{policy}: the caller {how} the stream after {items} tokens; it should end with "
            f"those tokens and no error, got {outcome}",
        )
        require_equal(
            "HST-002",
            host.bookings(),
            {},
            f"{policy}: the caller {how} its stream on worker {worker} after {items} tokens; "
            f"the booking should be released, bookings are {host.bookings()}",
        )
        require_equal(
            "HST-011",
            host.counters(),
            (started + 1, completed),
            f"{policy}: a stream the caller {how} after {items} tokens did not finish: counters "
            f"went from {(started, completed)} to {host.counters()}, expected "
            f"{(started + 1, completed)}",
        )
    target.release_stalled(worker)


# --- HST-003 to HST-009: explicit workers and Direct mode ---


@covers("HST-003")
@requires(HOST)
@pytest.mark.parametrize(
    ("phase", "fields", "expected"),
    [
        ("aggregated", {"decode_worker_id": 0, "backend_instance_id": 1}, 0),
        ("aggregated", {"backend_instance_id": 1, "prefill_worker_id": UNKNOWN}, 1),
        ("decode", {"decode_worker_id": 2, "backend_instance_id": 1}, 2),
        ("decode", {"backend_instance_id": 1, "prefill_worker_id": 0}, 1),
        ("prefill", {"prefill_worker_id": 2, "decode_worker_id": 0}, 2),
        ("prefill", {"backend_instance_id": 0, "decode_worker_id": UNKNOWN}, 0),
    ],
)
def test_the_phase_decides_which_field_names_the_explicit_worker(
    target: Target, phase: str, fields: dict[str, int], expected: int
) -> None:
    pool = workers(target, 3)
    resolved = {name: pool[i] if i < len(pool) else i for name, i in fields.items()}
    host = host_of(target, "HST-003", HostConfig(policy="round-robin"))
    request = host.route(HostRoute(phase=phase, **resolved))  # type: ignore[arg-type]
    outcome, attempts = ended(target, request, "HST-003")
    require(
        "HST-003",
        outcome.error is None and attempts == [pool[expected]],
        f"a {phase} request with {resolved} should reach worker {pool[expected]}; it reached "
        f"{attempts} ({outcome.error and outcome.error.describe()})",
    )


@covers("HST-004")
@requires(HOST)
@pytest.mark.parametrize("policy", ["round-robin", "least-loaded", "kv"])
@pytest.mark.parametrize(
    ("field", "phase"),
    [
        ("backend_instance_id", "aggregated"),
        ("decode_worker_id", "decode"),
        ("prefill_worker_id", "prefill"),
    ],
)
def test_an_unknown_explicit_worker_is_an_invalid_argument(
    target: Target, policy: str, field: str, phase: str
) -> None:
    workers(target, 2)
    host = host_of(target, "HST-004", HostConfig(policy=policy))
    request = host.route(HostRoute(phase=phase, **{field: UNKNOWN}))  # type: ignore[arg-type]
    outcome, attempts = ended(target, request, "HST-004")
    message = f"nvext.{field}={UNKNOWN} does not identify a known worker"
    require(
        "HST-004",
        failed_with(outcome, "InvalidArgument", message)
        and not attempts
        and host.bookings() == {}
        and host.counters() == (0, 0),
        f"expected InvalidArgument {message!r} before admission; got {outcome}, reached "
        f"{attempts}, bookings {host.bookings()}, counters {host.counters()}",
    )


@covers("HST-005")
@requires(HOST, Capability.REPORT_DOWN, Capability.MARK_OVERLOADED)
@pytest.mark.parametrize("policy", ["round-robin", "kv"])
def test_validation_asks_discovery_not_routability(target: Target, policy: str) -> None:
    inhibited, overloaded, _ = workers(target, 3)
    host = host_of(target, "HST-005", HostConfig(policy=policy))
    target.report_down(inhibited)
    target.mark_overloaded(overloaded, True)
    for worker in (inhibited, overloaded):
        outcome, _ = ended(target, host.route(HostRoute(backend_instance_id=worker)), "HST-005")
        require(
            "HST-005",
            outcome.error is None or outcome.error.type != "InvalidArgument",
            f"worker {worker} is discovered (though inhibited or overloaded), so naming it "
            f"is valid; got {outcome.error and outcome.error.describe()}",
        )


@covers("HST-006")
@requires(HOST, Capability.REMOVE_WORKER)
def test_an_explicit_worker_is_not_revalidated_after_preview(target: Target) -> None:
    pinned, _ = workers(target, 2)
    host = host_of(target, "HST-006", HostConfig(policy="kv"))
    preview = planned(host.preview(HostRoute(phase="decode", decode_worker_id=pinned)), "HST-006")
    plan = planned(host.plan(preview.plan_id), "HST-006")
    target.remove_worker(pinned)
    outcome, attempts = ended(target, host.dispatch_plan(plan.plan_id), "HST-006")
    require(
        "HST-006",
        outcome.error is not None and outcome.error.type != "InvalidArgument" and not attempts,
        f"worker {pinned} left after the preview; the dispatch should fail as a service error, "
        f"not InvalidArgument; got {outcome}, reached {attempts}",
    )


@covers("HST-007")
@requires(HOST)
@pytest.mark.parametrize("phase", ["aggregated", "prefill", "decode"])
def test_direct_mode_needs_a_target(target: Target, phase: str) -> None:
    workers(target, 2)
    host = host_of(target, "HST-007", HostConfig(policy="direct", affinity_ttl=10))
    outcome, attempts = ended(target, host.route(HostRoute(phase=phase, session="s")), "HST-007")
    message = f"worker ID required for {phase} request in Direct routing mode"
    require(
        "HST-007",
        failed_with(outcome, "InvalidArgument", message) and not attempts,
        f"expected InvalidArgument {message!r}; got {outcome}, reached {attempts}",
    )


@covers("HST-008")
@requires(HOST, Capability.VANISH_WORKER, Capability.REPORT_DOWN)
def test_pins_are_exact_while_direct_mode_keeps_the_fallback(target: Target) -> None:
    vanished, inhibited, spare = workers(target, 3)
    target.vanish_worker(vanished)
    target.report_down(inhibited)
    pinning = host_of(target, "HST-008", HostConfig(policy="round-robin"))
    outcome, attempts = ended(target, pinning.route(HostRoute(backend_instance_id=vanished)), "")
    require(
        "HST-008",
        shows_outer(outcome.error, "CannotConnect") and not attempts,
        f"a pin on worker {vanished}, whose transport record is gone, must fail CannotConnect "
        f"without reaching another worker; got {outcome}, reached {attempts}",
    )
    outcome, attempts = ended(target, pinning.route(HostRoute(backend_instance_id=inhibited)), "")
    require(
        "HST-008",
        outcome.error is None and attempts == [inhibited],
        f"a pin ignores local inhibition; reached {attempts}, got {outcome.error}",
    )
    direct = host_of(target, "HST-008", HostConfig(policy="direct"))
    outcome, attempts = ended(target, direct.route(HostRoute(backend_instance_id=vanished)), "")
    require(
        "HST-008",
        outcome.error is None and attempts == [spare],
        f"Direct mode without affinity falls back from vanished worker {vanished} to the free "
        f"worker {spare}; reached {attempts}, got {outcome.error}",
    )


@covers("HST-009")
@requires(HOST, Capability.REMOVE_WORKER)
def test_a_stale_binding_in_direct_mode_is_a_connection_failure(target: Target) -> None:
    bound, _ = workers(target, 2)
    host = host_of(target, "HST-009", HostConfig(policy="direct", affinity_ttl=10))
    host.bind_session("s", bound)
    target.remove_worker(bound)
    outcome, attempts = ended(target, host.route(HostRoute(session="s")), "HST-009")
    session = host.session("s")
    require(
        "HST-009",
        failed_with(outcome, "CannotConnect") and not attempts and session.state == "unbound",
        f"the session's worker {bound} left; expected CannotConnect, no worker reached and the "
        f"binding cleared; got {outcome}, reached {attempts}, session {session}",
    )


@covers("HST-021")
@requires(HOST, Capability.MARK_OVERLOADED)
@pytest.mark.parametrize("policy", ["round-robin", "kv"])
def test_no_eligible_free_worker_fails_like_a_router_selection(target: Target, policy: str) -> None:
    """Every worker routable but overloaded: the busy answer (SEL-004's)."""
    pool = workers(target, 2)
    host = host_of(target, "HST-021", HostConfig(policy=policy))
    for worker in pool:
        target.mark_overloaded(worker, True)
    busy, attempts = ended(target, host.route(HostRoute()), "HST-021")
    require(
        "HST-021",
        failed_with(busy, "ResourceExhausted", "All workers are busy, please retry later")
        and not attempts,
        f"every worker overloaded: expected ResourceExhausted before any worker is reached, "
        f"got {busy}, reached {attempts}",
    )


@covers("HST-021")
@requires(HOST, Capability.REPORT_DOWN)
@pytest.mark.parametrize("policy", ["round-robin", "kv"])
@pytest.mark.parametrize(
    "overloaded",
    [False, pytest.param(True, marks=pytest.mark.requires(Capability.MARK_OVERLOADED))],
    ids=["down", "down-and-overloaded"],
)
def test_no_routable_eligible_worker_fails_unavailable(
    target: Target, policy: str, overloaded: bool
) -> None:
    """No worker routable (each reported down, overloaded too or not): SEL-005's answer."""
    pool = workers(target, 2)
    host = host_of(target, "HST-021", HostConfig(policy=policy))
    for worker in pool:
        if overloaded:
            target.mark_overloaded(worker, True)
        target.report_down(worker)
    gone, attempts = ended(target, host.route(HostRoute()), "HST-021")
    require(
        "HST-021",
        no_workers_available(gone.error) and not attempts,
        "no worker routable: expected Unavailable 'No workers available for endpoint "
        f"namespace/component/name' before any worker is reached, got {gone}, "
        f"reached {attempts}",
    )


# --- HST-010, HST-011: request counters ---


@covers("HST-010")
@requires(HOST, Capability.SCRIPT_FAILURES)
def test_the_started_counter_counts_admissions(open_target: OpenTarget) -> None:
    with open_target(STEADY) as target:
        started_counter_scenario(target)


def started_counter_scenario(target: Target) -> None:
    (worker,) = workers(target, 1)
    host = host_of(target, "HST-010", HostConfig(policy="kv"))

    def expect(started: int, after: str) -> None:
        require_equal(
            "HST-010",
            host.counters()[0],
            started,
            f"after {after} started should be {started}, is {host.counters()[0]}",
        )

    host.route(HostRoute(stopped=True))
    expect(0, "a request cancelled before admission")
    preview = planned(host.preview(HostRoute()), "HST-010")
    expect(0, "a preview")
    plan = planned(host.plan(preview.plan_id), "HST-010")
    expect(0, "a plan")
    host.abort_plan(plan.plan_id)
    host.prefill_busy(HostRoute(), 0.5)
    expect(0, "an aborted plan and a busy probe")
    host.route(HostRoute())
    expect(1, "a completed request")
    target.script_worker(worker, FailBeforeStream(ErrorSpec("Disconnected")))
    host.route(HostRoute())
    expect(2, "a request whose dispatch failed")
    plan = planned(host.plan(planned(host.preview(HostRoute()), "HST-010").plan_id), "HST-010")
    host.dispatch_plan(plan.plan_id, stop_first=True)
    expect(3, "a dispatched plan cancelled before it was sent")


@covers("HST-010")
@requires(HOST, Capability.SCRIPT_FAILURES)
def test_the_started_counter_counts_each_admitted_request_once(target: Target) -> None:
    """The same rule with no stopped caller, only what a client of any host can send. The
    failing request comes last: a failure may inhibit the only worker."""
    (worker,) = workers(target, 1)
    host = host_of(target, "HST-010", HostConfig(policy="kv"))

    def expect(started: int, after: str) -> None:
        require_equal(
            "HST-010",
            host.counters()[0],
            started,
            f"after {after} started should be {started}, is {host.counters()[0]}",
        )

    planned(host.preview(HostRoute()), "HST-010")
    expect(0, "a preview")
    host.route(HostRoute(backend_instance_id=UNKNOWN))
    expect(0, "a request refused before admission (an unknown explicit worker)")
    host.route(HostRoute())
    expect(1, "a completed request")
    target.script_worker(worker, FailBeforeStream(ErrorSpec("Disconnected")))
    host.route(HostRoute())
    expect(2, "a request whose dispatch failed")


@covers("HST-011")
@requires(HOST, Capability.SCRIPT_FAILURES, Capability.SCRIPT_STALL)
def test_the_completed_counter_counts_finished_streams(open_target: OpenTarget) -> None:
    with open_target(STEADY) as target:
        completed_counter_scenario(target)


def completed_counter_scenario(target: Target) -> None:
    (worker,) = workers(target, 1)
    host = host_of(target, "HST-011", HostConfig(policy="round-robin"))
    scripts: list[WorkerScript] = [
        FailBeforeStream(ErrorSpec("Disconnected")),
        FailMidStream(1, ErrorSpec("Backend(EngineShutdown)")),
        TerminalThen(items=1),
    ]
    for script in scripts:
        target.script_worker(worker, script)
        host.route(HostRoute(max_tokens=2))
    target.script_worker(worker, Stall(items=1))
    target.drop(host.route(HostRoute(max_tokens=2)))
    require_equal(
        "HST-011",
        host.counters(),
        (4, 0),
        f"four admitted requests that failed, drained or were dropped: expected counters "
        f"(4, 0), got {host.counters()}",
    )
    target.script_worker(worker, Serve())
    host.route(HostRoute(max_tokens=2))
    require_equal("HST-011", host.counters(), (5, 1), f"one finished: {host.counters()}")


# --- HST-012 to HST-015: cancellation and the cleanup budget ---

PATHS = {
    "round-robin": (HostConfig(policy="round-robin"), False),
    "least-loaded": (HostConfig(policy="least-loaded"), False),
    "explicit-target": (HostConfig(policy="round-robin"), True),
    "direct": (HostConfig(policy="direct"), True),
    "kv": (HostConfig(policy="kv"), False),
}


def stopped_route(pin: int | None, *, phase: str, staged_kv: bool) -> HostRoute:
    return HostRoute(phase=phase, backend_instance_id=pin, staged_kv=staged_kv, stopped=True)


@covers("HST-012")
@requires(HOST)
@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize(
    ("phase", "staged_kv"), [("prefill", False), ("aggregated", False), ("decode", False)]
)
def test_a_stopped_request_reaches_no_worker(
    target: Target, path: str, phase: str, staged_kv: bool
) -> None:
    (worker,) = workers(target, 1)
    config, pinned = PATHS[path]
    host = host_of(target, "HST-012", config)
    route = stopped_route(worker if pinned else None, phase=phase, staged_kv=staged_kv)
    request = host.route(route)
    outcome, attempts = ended(target, request, "HST-012")
    require(
        "HST-012",
        failed_with(outcome, "Cancelled", f"Request {request} was cancelled")
        and not attempts
        and host.bookings() == {},
        f"{path}: a stopped {phase} request without staged KV must fail Cancelled before any "
        f"worker; got {outcome}, reached {attempts}, bookings {host.bookings()}",
    )


@covers("HST-012")
@requires(HOST)
def test_a_plan_stopped_before_dispatch_reaches_no_worker(target: Target) -> None:
    workers(target, 1)
    host = host_of(target, "HST-012", HostConfig(policy="kv"))
    plan = planned(host.plan(planned(host.preview(HostRoute()), "HST-012").plan_id), "HST-012")
    request = host.dispatch_plan(plan.plan_id, stop_first=True)
    outcome, attempts = ended(target, request, "HST-012")
    require(
        "HST-012",
        failed_with(outcome, "Cancelled") and not attempts and host.bookings() == {},
        f"an admitted plan stopped before dispatch: got {outcome}, reached {attempts}, "
        f"bookings {host.bookings()}",
    )


@covers("HST-013")
@requires(HOST)
@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_stopped_decode_with_staged_kv_still_reaches_its_worker(
    target: Target, path: str
) -> None:
    (worker,) = workers(target, 1)
    config, pinned = PATHS[path]
    host = host_of(target, "HST-013", config)
    route = stopped_route(worker if pinned else None, phase="decode", staged_kv=True)
    outcome, attempts = ended(target, host.route(route), "HST-013")
    require(
        "HST-013",
        attempts == [worker] and outcome.error is None and host.bookings() == {},
        f"{path}: the staged-KV decode leg must reach worker {worker} exactly once so it can "
        f"release its KV; reached {attempts}, got {outcome}, bookings {host.bookings()}",
    )


@covers("HST-013", "HST-014")
@requires(HOST, Capability.MOCK_CLOCK)
def test_a_stopped_decode_survives_a_contended_affinity_wait(target: Target) -> None:
    (worker,) = workers(target, 1)
    host = host_of(target, "HST-013", HostConfig(policy="kv", affinity_ttl=10))
    host.hold_session("s")
    request = host.route(HostRoute(phase="decode", staged_kv=True, stopped=True, session="s"))
    target.advance_time(100.0)
    waiting = target.outcome(request) is None and not reached(target, request)
    require("HST-013", waiting, "the decode leg should wait for the session's initialization")
    host.release_session("s")
    outcome, attempts = ended(target, request, "HST-013")
    require(
        "HST-013",
        attempts == [worker] and outcome.error is None,
        f"after the wait the leg must still reach worker {worker}; reached {attempts}, got "
        f"{outcome}",
    )
    exercised_budget = outcome.error is None
    require("HST-014", exercised_budget, "100 s of the 120 s budget spent waiting still left time")


@covers("HST-015", "HST-014")
@requires(HOST, Capability.MOCK_CLOCK)
def test_an_exhausted_budget_cancels_the_request_naming_the_stage(target: Target) -> None:
    workers(target, 1)
    host = host_of(target, "HST-015", HostConfig(policy="round-robin", affinity_ttl=10))
    host.hold_session("s")
    request = host.route(HostRoute(phase="decode", staged_kv=True, stopped=True, session="s"))
    target.advance_time(119.0)
    require_compare("HST-014", target.outcome(request), "is", None, "the budget is 120 s, not less")
    target.advance_time(2.0)
    outcome, attempts = ended(target, request, "HST-015")
    message = f"Request {request} exhausted its decode cleanup budget at affinity"
    require(
        "HST-015",
        failed_with(outcome, "Cancelled", message) and not attempts,
        f"expected Cancelled {message!r} and no worker; got {outcome}, reached {attempts}",
    )
    host.release_session("s")


@covers("HST-012")
@requires(HOST)
def test_a_request_stopped_while_it_waits_is_cancelled(target: Target) -> None:
    workers(target, 1)
    host = host_of(target, "HST-012", HostConfig(policy="round-robin", affinity_ttl=10))
    host.hold_session("s")
    request = host.route(HostRoute(session="s"))
    require_compare(
        "HST-012", target.outcome(request), "is", None, "the request should wait for the session"
    )
    host.stop(request)
    outcome, attempts = ended(target, request, "HST-012")
    require(
        "HST-012",
        failed_with(outcome, "Cancelled", f"Request {request} was cancelled") and not attempts,
        f"stopped while waiting for its session: got {outcome}, reached {attempts}",
    )
    host.release_session("s")


@covers("HST-014", "HST-015")
@requires(HOST, Capability.MOCK_CLOCK)
def test_the_budget_starts_when_a_stage_first_sees_the_stop(target: Target) -> None:
    workers(target, 1)
    host = host_of(target, "HST-014", HostConfig(policy="kv", affinity_ttl=1_000))
    host.hold_session("s")
    request = host.route(HostRoute(phase="decode", staged_kv=True, session="s"))
    target.advance_time(50.0)  # not stopped yet: no budget is spent
    host.stop(request)
    target.advance_time(119.0)
    require_compare(
        "HST-014",
        target.outcome(request),
        "is",
        None,
        f"stopped 119 s ago: the 120 s budget is not spent yet, got {target.outcome(request)}",
    )
    target.advance_time(2.0)
    outcome, attempts = ended(target, request, "HST-015")
    require(
        "HST-015",
        failed_with(
            outcome,
            "Cancelled",
            f"Request {request} exhausted its decode cleanup budget at affinity",
        )
        and not attempts,
        f"expected the budget to run out at the affinity stage; got {outcome}, reached {attempts}",
    )
    host.release_session("s")


@covers("HST-014", "HST-015")
@requires(HOST, Capability.MOCK_CLOCK)
@pytest.mark.parametrize("elapsed", [119.5, 120.0, 121.0])
def test_a_planned_route_spends_its_preview_budget(target: Target, elapsed: float) -> None:
    """The budget is 120 s from the preview: half a second short of it the stopped dispatch
    still reaches its worker; at it, or past it, nothing is left."""
    (worker,) = workers(target, 1)
    host = host_of(target, "HST-014", HostConfig(policy="kv"))
    staged = HostRoute(phase="decode", staged_kv=True)
    preview = planned(host.preview(staged), "HST-014")
    target.advance_time(elapsed)
    plan = planned(host.plan(preview.plan_id), "HST-014")
    request = host.dispatch_plan(plan.plan_id, stop_first=True)
    outcome, attempts = ended(target, request, "HST-015")
    if elapsed < 120.0:
        require(
            "HST-014",
            plan.budget_remaining == 120.0 - elapsed
            and outcome.error is None
            and attempts == [worker],
            f"the preview started the route's budget {elapsed} s earlier, so the stopped "
            f"dispatch has {120.0 - elapsed} s left and should reach worker {worker}; plan "
            f"reports {plan.budget_remaining} s, got {outcome}, reached {attempts}",
        )
        return
    require(
        "HST-014",
        plan.budget_remaining == 0
        and failed_with(
            outcome, "Cancelled", f"Request {request} exhausted its decode cleanup budget at record"
        )
        and not attempts,
        f"the preview started the route's budget {elapsed} s earlier, so the stopped dispatch "
        f"has none left; plan reports {plan.budget_remaining} s, got {outcome}, reached "
        f"{attempts}",
    )


@covers("HST-015")
@requires(HOST, Capability.MOCK_CLOCK, Capability.SCRIPT_SILENCE)
def test_a_budget_spent_in_dispatch_names_dispatch(target: Target) -> None:
    """The budget runs out while the dispatch waits for its worker's ACK: the stage the
    error names is ``dispatch``, the route's last."""
    (worker,) = workers(target, 1)
    target.script_worker(worker, Silent(SilentStage.ACK))
    host = host_of(target, "HST-015", HostConfig(policy="kv"))
    preview = planned(host.preview(HostRoute(phase="decode", staged_kv=True)), "HST-015")
    target.advance_time(118.0)  # 2 s of the budget left, less than the 5 s ACK deadline
    plan = planned(host.plan(preview.plan_id), "HST-015")
    request = host.dispatch_plan(plan.plan_id, stop_first=True)
    target.advance_time(3.0)
    outcome, _ = ended(target, request, "HST-015")
    message = f"Request {request} exhausted its decode cleanup budget at dispatch"
    require(
        "HST-015",
        failed_with(outcome, "Cancelled", message),
        f"2 s of budget left and worker {worker} silent before its ACK: expected Cancelled "
        f"{message!r} once the budget ran out; got {outcome}",
    )


@covers("HST-013", "HST-014")
@requires(HOST)
def test_a_planned_decode_stopped_before_its_preview_still_reaches_its_worker(
    target: Target,
) -> None:
    """A staged-KV decode leg whose caller stopped before routing began runs its planned
    route (preview, plan, dispatch) inside the budget and reaches its worker."""
    (worker,) = workers(target, 1)
    host = host_of(target, "HST-013", HostConfig(policy="kv"))
    staged = HostRoute(phase="decode", staged_kv=True, stopped=True)
    preview = planned(host.preview(staged), "HST-013")
    plan = planned(host.plan(preview.plan_id), "HST-013")
    outcome, attempts = ended(target, host.dispatch_plan(plan.plan_id), "HST-013")
    require(
        "HST-013",
        outcome.error is None and attempts == [worker],
        f"a stopped staged-KV decode leg must still reach worker {worker} through its plan; "
        f"reached {attempts}, got {outcome}",
    )


@covers("HST-022")
@requires(HOST)
@pytest.mark.parametrize(
    "policy", ["round-robin", "random", "least-loaded", "power-of-two-choices", "kv"]
)
def test_a_request_goes_only_where_its_constraints_allow(target: Target, policy: str) -> None:
    """Three workers, two of them tainted ``pool``: a request requiring the taint, one
    allowed on an untainted and a tainted worker, and one with both constraints, six times
    each."""
    tainted, also_tainted, plain = workers(target, 3)
    host = host_of(target, "HST-022", HostConfig(policy=policy))
    for worker in (tainted, also_tainted):
        host.configure_worker(worker, taints=frozenset({"pool"}))
    pool = frozenset({"pool"})
    cases = [
        (HostRoute(required_taints=pool), {tainted, also_tainted}),
        (HostRoute(allowed=frozenset({also_tainted, plain})), {also_tainted, plain}),
        (HostRoute(allowed=frozenset({also_tainted, plain}), required_taints=pool), {also_tainted}),
    ]
    for route, where in cases:
        for n in range(6):
            outcome, attempts = ended(
                target, host.route(attrs.evolve(route, tokens=(n,))), "HST-022"
            )
            require(
                "HST-022",
                outcome.error is None and len(attempts) == 1 and attempts[0] in where,
                f"{policy}: a request allowed on {route.allowed} requiring taints "
                f"{set(route.required_taints)} may go only to {sorted(where)}; it reached "
                f"{attempts} ({outcome.error and outcome.error.describe()})",
            )


@covers("DSP-006")
@requires(HOST, Capability.VANISH_WORKER)
def test_a_host_route_falls_back_only_inside_its_allowed_set(target: Target) -> None:
    """The host selects among the request's allowed workers; when its pick has no transport
    record, the fallback stays inside that set (round-robin over two allowed workers picks
    the vanished one at least once in four requests)."""
    outside, vanished, spare = workers(target, 3)
    host = host_of(target, "DSP-006", HostConfig(policy="round-robin"))
    target.vanish_worker(vanished)
    allowed = frozenset({vanished, spare})
    for _ in range(4):
        outcome, attempts = ended(target, host.route(HostRoute(allowed=allowed)), "DSP-006")
        require(
            "DSP-006",
            outcome.error is None and attempts == [spare],
            f"allowed workers {sorted(allowed)}, {vanished} without a transport record: every "
            f"request should reach {spare}, never {outside}; it reached {attempts} "
            f"({outcome.error and outcome.error.describe()})",
        )


# --- HST-016 to HST-019: LoRA filtering ---


def lora_host(target: Target, requirement: str, replicas: int) -> tuple[RoutingHostTarget, int]:
    """A round-robin LoRA host over three workers whose adapter ``ad`` lives on ``replicas``."""
    pool = workers(target, 3)
    host = host_of(target, requirement, HostConfig(policy="round-robin", lora=True))
    host.set_lora_replicas("ad", frozenset({pool[replicas]}))
    return host, pool[replicas]


@covers("HST-016")
@requires(HOST)
@pytest.mark.parametrize(
    "hint", [None, -1, 0, UNKNOWN], ids=["no-hint", "outside-hint", "inside-hint", "unknown"]
)
def test_a_lora_request_goes_to_its_replica_set(target: Target, hint: int | None) -> None:
    host, replica = lora_host(target, "HST-016", replicas=1)
    pinned = None if hint is None else (hint if hint == UNKNOWN else replica + hint)
    lora_requests_reach(target, host, pinned, replica, f"adapter ad lives only on {replica}")


def lora_requests_reach(
    target: Target, host: RoutingHostTarget, hint: int | None, worker: int, why: str
) -> None:
    """Three requests for adapter ``ad`` with ``hint`` each reach ``worker`` alone (HST-016)."""
    for _ in range(3):
        outcome, attempts = ended(
            target, host.route(HostRoute(lora="ad", backend_instance_id=hint)), "HST-016"
        )
        require(
            "HST-016",
            outcome.error is None and attempts == [worker],
            f"{why}; with hint {hint} the request should reach {worker}, it reached "
            f"{attempts} ({outcome.error and outcome.error.describe()})",
        )


@covers("HST-016")
@requires(HOST)
def test_a_lora_hint_inside_the_set_is_followed(target: Target) -> None:
    """Two replicas of three workers: a hint naming one of them is where every request goes
    (a hint is overridden only when it is outside the set)."""
    _outside, first, second = workers(target, 3)
    host = host_of(target, "HST-016", HostConfig(policy="round-robin", lora=True))
    host.set_lora_replicas("ad", frozenset({first, second}))
    why = f"adapter ad lives on {first} and {second}, and the hint names {second}"
    lora_requests_reach(target, host, second, second, why)


@covers("HST-016")
@requires(HOST)
def test_without_lora_filtering_a_lora_name_restricts_nothing(target: Target) -> None:
    """A round-robin host without LoRA filtering spreads requests naming an adapter over
    every worker, as it does any other request."""
    pool = workers(target, 2)
    host = host_of(target, "HST-016", HostConfig(policy="round-robin"))
    went = [w for _ in range(4) for w in reached(target, host.route(HostRoute(lora="ad")))]
    require_equal(
        "HST-016",
        sorted(set(went)),
        sorted(pool),
        f"without LoRA filtering, requests naming adapter ad should go round-robin over "
        f"{pool}; they reached {went}",
    )


@covers("HST-016")
@requires(HOST, Capability.VANISH_WORKER)
def test_a_lora_hint_whose_replica_vanished_falls_back_within_the_set(target: Target) -> None:
    """Two replicas of three workers, the hint naming a replica whose transport record is
    gone: the request reaches the other replica, never the worker outside the set."""
    outside, first, second = workers(target, 3)
    host = host_of(target, "HST-016", HostConfig(policy="round-robin", lora=True))
    host.set_lora_replicas("ad", frozenset({first, second}))
    target.vanish_worker(second)
    why = (
        f"adapter ad lives on {first} and {second} (not {outside}), and hinted replica "
        f"{second} has no transport record"
    )
    lora_requests_reach(target, host, second, first, why)


@covers("HST-017")
@requires(HOST, Capability.SCRIPT_STALL, Capability.SCRIPT_FAILURES)
def test_lora_inflight_lasts_from_admission_to_the_end(open_target: OpenTarget) -> None:
    with open_target(STEADY) as target:
        lora_inflight_scenario(target)


def lora_inflight_scenario(target: Target) -> None:
    host, replica = lora_host(target, "HST-017", replicas=0)
    target.script_worker(replica, Stall(items=1))
    open_request = host.route(HostRoute(lora="ad", max_tokens=2))
    require_equal("HST-017", host.lora_inflight(), {"ad": 1}, f"open: {host.lora_inflight()}")
    second = host.route(HostRoute(lora="ad", max_tokens=2))
    require_equal("HST-017", host.lora_inflight(), {"ad": 2}, f"two open: {host.lora_inflight()}")
    target.release_stalled(replica)
    require_compare(
        "HST-017", target.outcome(second), "is not", None, "the second request should have ended"
    )
    require_equal("HST-017", host.lora_inflight(), {}, f"completed: {host.lora_inflight()}")
    require_compare(
        "HST-017", target.outcome(open_request), "is not", None, "the request should have ended"
    )
    target.script_worker(replica, FailMidStream(1, ErrorSpec("Disconnected")))
    host.route(HostRoute(lora="ad", max_tokens=2))
    require_equal("HST-017", host.lora_inflight(), {}, f"failed: {host.lora_inflight()}")
    target.script_worker(replica, Stall(items=1))
    target.drop(host.route(HostRoute(lora="ad", max_tokens=2)))
    require_equal("HST-017", host.lora_inflight(), {}, f"dropped: {host.lora_inflight()}")


@covers("HST-017")
@requires(HOST, Capability.SCRIPT_STALL)
@pytest.mark.parametrize("items", [0, 1], ids=["before-the-first-item", "mid-stream"])
def test_lora_inflight_ends_when_the_client_stops(target: Target, items: int) -> None:
    """The end HST-017 counts to includes the caller's context stopping under an open
    stream, before the replica's first token or after one."""
    host, replica = lora_host(target, "HST-017", replicas=0)
    target.script_worker(replica, Stall(items=items))
    request = host.route(HostRoute(lora="ad", max_tokens=2))
    require_equal(
        "HST-017",
        host.lora_inflight(),
        {"ad": 1},
        f"a request for adapter ad open on replica {replica} should count; inflight "
        f"{host.lora_inflight()}",
    )
    host.stop(request)
    outcome, _ = ended(target, request, "HST-017")
    require_equal(
        "HST-017",
        host.lora_inflight(),
        {},
        f"the caller stopped its request on replica {replica} after {items} tokens (it ended "
        f"{outcome}); adapter ad's inflight count should be released, it is "
        f"{host.lora_inflight()}",
    )
    target.release_stalled(replica)


@covers("HST-018")
@requires(HOST)
@pytest.mark.parametrize(
    "case",
    [
        "no-replicas",
        pytest.param("overloaded", marks=pytest.mark.requires(Capability.MARK_OVERLOADED)),
        pytest.param("inhibited", marks=pytest.mark.requires(Capability.REPORT_DOWN)),
    ],
)
def test_lora_filtering_failures_are_typed(target: Target, case: str) -> None:
    host, replica = lora_host(target, "HST-018", replicas=2)
    adapter, label, message = "ad", "Unavailable", "No workers available after LoRA filtering"
    if case == "no-replicas":
        adapter, what = "none", "an adapter with no replicas"
    elif case == "overloaded":
        target.mark_overloaded(replica, True)
        label, message = "ResourceExhausted", "All eligible LoRA workers are overloaded"
        what = "its only replica overloaded"
    else:
        target.report_down(replica)
        what = "its only replica inhibited"
    outcome, attempts = ended(target, host.route(HostRoute(lora=adapter)), "HST-018")
    require(
        "HST-018",
        failed_with(outcome, label, message) and not attempts,
        f"{what}: expected {label} {message!r} before any worker is reached, got {outcome}, "
        f"reached {attempts}",
    )


@covers("HST-019")
@requires(HOST)
@pytest.mark.parametrize(
    "config",
    [
        HostConfig(policy="round-robin", lora=True, affinity_ttl=10),
        HostConfig(policy="least-loaded", lora=True),
        HostConfig(policy="kv", lora=True),
        HostConfig(policy="direct", lora=True),
        HostConfig(policy="power-of-two-choices", lora=True),
        HostConfig(policy="device-aware-weighted", lora=True),
    ],
    ids=[
        "with-affinity",
        "least-loaded",
        "kv",
        "direct",
        "power-of-two-choices",
        "device-aware-weighted",
    ],
)
def test_lora_filtering_conflicts_are_refused_at_construction(
    target: Target, config: HostConfig
) -> None:
    refused_at_construction(target, "HST-019", config, "LoRA filtering cannot work with it")


@covers("HST-019")
@requires(HOST)
@pytest.mark.parametrize("policy", ["round-robin", "random"])
def test_lora_filtering_works_with_round_robin_and_random(target: Target, policy: str) -> None:
    built = target.open_host(HostConfig(policy=policy, lora=True))
    require_false("HST-019", isinstance(built, ObservedError), f"{policy} + LoRA refused: {built}")


# --- DSP-012 through the host ---


@covers("DSP-012", "DSP-010")
@requires(HOST, Capability.VANISH_WORKER, Capability.SCRIPT_STALL, Capability.PRESELECTED)
def test_a_host_fallback_moves_the_booking(target: Target, adapter: Adapter) -> None:
    """Worker ``serving`` holds one booked request, so least-loaded picks the idle
    ``vanished``, which has lost its transport record. A host that falls back to ``serving``
    (the reference does, within its candidates) moves the booking there and prepares the
    request for it; one that dispatches its pick exactly fails the request without reaching
    a worker. Either way no booking stays on ``vanished``."""
    vanished, serving = workers(target, 2, Stall())
    target.submit(Preselected(serving))
    target.vanish_worker(vanished)
    host = host_of(target, "DSP-012", HostConfig(policy="least-loaded"))
    request = host.route(HostRoute(tokens=(0, 0), max_tokens=4))
    bookings = {w: n for w, n in host.bookings().items() if n}
    if reached(target, request) == [serving]:
        require_equal(
            "DSP-012",
            bookings,
            {serving: 2},
            f"the request fell back from {vanished} to {serving}: the booking should move with it",
        )
        if Capability.OBSERVE_PREPARED_TARGET in adapter.capabilities:
            prepared = [d.prepared_for for d in target.dispatch_log() if d.request_id == request]
            require_equal(
                "DSP-010", prepared, [serving], f"the request was prepared for {prepared}"
            )
    else:
        outcome, attempts = ended(target, request, "DSP-012")
        require(
            "DSP-012",
            not attempts and outcome.error is not None and bookings == {serving: 1},
            f"the request neither fell back to {serving} nor failed cleanly: reached "
            f"{attempts}, ended {outcome}, bookings {bookings}",
        )
    target.release_stalled(serving)


# --- HST-020: migration over the host ---


@covers("HST-020")
@requires(HOST, Capability.SCRIPT_FAILURES, Capability.MIGRATION)
@pytest.mark.parametrize("failure", ["overloaded-item", "cancel-then-shutdown", "shutdown-item"])
def test_a_host_dispatch_migrates_cleanly(target: Target, failure: str) -> None:
    script: WorkerScript = FailMidStream(1, ErrorSpec("WorkerOverloaded"))
    if failure == "cancel-then-shutdown":
        script = CancelThenFail(1, ErrorSpec("Backend(EngineShutdown)"))
    elif failure == "shutdown-item":
        script = FailMidStream(1, ErrorSpec("Backend(EngineShutdown)"))
    failing = workers(target, 1, script)[0]
    spare = workers(target, 1)[0]
    host = host_of(target, "HST-020", HostConfig(policy="least-loaded"))
    # Least-loaded may break the tie between two idle workers either way: a request served
    # by the spare alone did not fail, so it is not a case; send another.
    for _ in range(6):
        request = host.route(HostRoute(tokens=(0, 0), max_tokens=4, migration_limit=1))
        outcome, attempts = ended(target, request, "HST-020")
        if attempts != [spare]:
            break
    cancelled_frames = [
        item
        for item in outcome.items
        if isinstance(item, dict) and item.get("finish_reason") == "cancelled"
    ]
    # The stream first, then the bookings: a target that cannot show bookings is still
    # judged on the stream it delivered.
    require(
        "HST-020",
        attempts == [failing, spare]
        and outcome.error is None
        and tokens(outcome) == [2, 3, 4, 5]
        and not cancelled_frames,
        f"worker {failing} failed ({failure}); expected one clean stream [2, 3, 4, 5] from "
        f"{failing} then {spare}; reached {attempts}, got {outcome}",
    )
    require_equal(
        "HST-020", host.bookings(), {}, f"bookings after the migrated request: {host.bookings()}"
    )
