"""Dispatch (DSP): one small scenario per rule.

Workers are numbered by the adapter in the order they are added. A *vanished* worker has lost
its transport record while discovery still lists it; dispatch to it fails at resolution.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import pytest

from routespec.conformance import oracle
from routespec.conformance.checks import (
    covers,
    require,
    require_compare,
    require_equal,
    require_false,
    requires,
)
from routespec.conformance.scenario import (
    BUILTIN_MODES,
    MODE_CAPABILITY,
    OCCUPANCY_MODES,
    finished,
    loads,
    reached,
    shows,
    shows_outer,
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
    Migrate,
    Outcome,
    Preselected,
    Reject,
    Serve,
    Stall,
    Target,
)


def indexes(items: Sequence[object]) -> list[object]:
    """The ``index`` of each data item (the adapters' item convention), in arrival order."""
    return [item.get("index") if isinstance(item, Mapping) else item for item in items]


def fails_untouched(
    target: Target, call: Call, requirement: str, expected_type: str | None
) -> Outcome:
    """Submit ``call``; it must fail before any stream, reaching no worker, with
    ``expected_type`` as its first typed link (None: an untyped error with no typed link)."""
    request = target.submit(call)
    outcome = finished(target, request, requirement)
    error = outcome.error
    if expected_type is None:
        require(
            requirement,
            shows(error, (None,)),
            f"{call} ended {outcome}; expected an untyped error (no typed link)",
        )
    else:
        require(
            requirement,
            shows_outer(outcome.error, expected_type),
            f"{call} ended {outcome}; expected {expected_type}",
        )
    require(
        requirement,
        error is not None and error.pre_stream and not outcome.items,
        f"{call} ended {outcome}; expected a failure before any stream",
    )
    require_false(
        requirement,
        reached(target, request),
        f"{call} failed but reached workers {reached(target, request)}",
    )
    return outcome


def succeeds_on(target: Target, call: Call, workers: set[int], requirement: str) -> int:
    """Submit ``call``; it must be served, reaching exactly one worker, a member of ``workers``."""
    request = target.submit(call)
    outcome = finished(target, request, requirement)
    delivered = reached(target, request)
    require(
        requirement,
        len(delivered) == 1 and delivered[0] in workers and outcome.error is None,
        f"{call} reached {delivered} and ended {outcome}; expected it served by one of "
        f"{sorted(workers)}",
    )
    return delivered[0]


# --- DSP-001 ---


@covers("DSP-001")
@requires(Capability.DIRECT)
def test_direct_reaches_its_target(target: Target) -> None:
    workers = [target.add_worker() for _ in range(3)]
    for worker in [*workers, *reversed(workers)]:
        succeeds_on(target, Direct(worker), {worker}, "DSP-001")


@covers("DSP-001")
@requires(
    Capability.DIRECT,
    Capability.SCRIPT_FAILURES,
    Capability.MARK_OVERLOADED,
    Capability.VANISH_WORKER,
)
def test_direct_never_reaches_another_worker(target: Target) -> None:
    """The target fails in every way that might tempt a router to reselect."""
    chosen, *_ = workers = [target.add_worker() for _ in range(3)]
    requests: list[tuple[str, str]] = []

    def attempt(situation: str) -> None:
        requests.append((situation, target.submit(Direct(chosen))))

    for label in ("CannotConnect", "Disconnected", "WorkerOverloaded"):
        target.script_worker(chosen, FailBeforeStream(ErrorSpec(label)))
        attempt(f"the target fails with {label}")
    target.script_worker(chosen, Serve())
    target.mark_overloaded(chosen, True)
    attempt("the target is overloaded")
    target.vanish_worker(chosen)
    attempt("the target vanished")
    for situation, request in requests:
        delivered = reached(target, request)
        require_compare(
            "DSP-001",
            set(delivered),
            "<=",
            {chosen},
            f"direct({chosen}) when {situation} reached {delivered} (workers {workers})",
        )


# --- DSP-002, DSP-003, DSP-004 ---


@covers("DSP-002")
@requires(Capability.DIRECT, Capability.VANISH_WORKER)
def test_direct_to_a_vanished_worker_is_cannot_connect(target: Target) -> None:
    vanished, _ = target.add_worker(), target.add_worker()
    target.vanish_worker(vanished)
    fails_untouched(target, Direct(vanished), "DSP-002", "CannotConnect")
    require_false(
        "DSP-002",
        target.dispatch_log(),
        f"no worker may be reached, the log is {list(target.dispatch_log())}",
    )


@covers("DSP-003")
@requires(Capability.DIRECT, Capability.VANISH_WORKER, Capability.MARK_OVERLOADED)
def test_resolution_precedes_the_overload_check_for_direct(target: Target) -> None:
    vanished, _ = target.add_worker(), target.add_worker()
    target.mark_overloaded(vanished, True)
    target.vanish_worker(vanished)
    fails_untouched(target, Direct(vanished), "DSP-003", "CannotConnect")


@covers("DSP-003")
@requires(Capability.PRESELECTED, Capability.VANISH_WORKER, Capability.MARK_OVERLOADED)
def test_resolution_precedes_the_overload_check_for_preselected(target: Target) -> None:
    vanished, _ = target.add_worker(), target.add_worker()
    target.mark_overloaded(vanished, True)
    target.vanish_worker(vanished)
    fails_untouched(target, Preselected(vanished), "DSP-003", "CannotConnect")


@covers("DSP-003")
@requires(Capability.DIRECT_WITHIN, Capability.VANISH_WORKER, Capability.MARK_OVERLOADED)
def test_resolution_precedes_the_overload_check_for_fallback(target: Target) -> None:
    """An overloaded, vanished target falls back (to a free worker) or fails Unavailable:
    never WorkerOverloaded for the worker that is gone."""
    vanished, other = target.add_worker(), target.add_worker()
    target.mark_overloaded(vanished, True)
    target.vanish_worker(vanished)
    succeeds_on(target, DirectWithin(vanished, frozenset({other})), {other}, "DSP-003")
    fails_untouched(target, DirectWithin(vanished, frozenset()), "DSP-003", "Unavailable")


@covers("DSP-004")
@requires(Capability.DIRECT, Capability.DIRECT_WITHIN, Capability.MARK_OVERLOADED)
def test_an_overloaded_target_is_worker_overloaded(target: Target) -> None:
    overloaded, other = target.add_worker(), target.add_worker()
    target.mark_overloaded(overloaded, True)
    fails_untouched(target, Direct(overloaded), "DSP-004", "WorkerOverloaded")
    fails_untouched(target, DirectWithin(overloaded, None), "DSP-004", "WorkerOverloaded")
    fails_untouched(
        target, DirectWithin(overloaded, frozenset({other})), "DSP-004", "WorkerOverloaded"
    )


@covers("DSP-004")
@requires(
    Capability.DIRECT,
    Capability.SCRIPT_REJECTION,
    Capability.MOCK_CLOCK,
)
def test_a_leased_target_is_worker_overloaded(target: Target) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Reject(overloaded=True))
    target.submit(Direct(worker))
    target.script_worker(worker, Serve())
    target.advance_time(0.5)
    fails_untouched(target, Direct(worker), "DSP-004", "WorkerOverloaded")


# --- DSP-005, DSP-006, DSP-007, DSP-008 ---


@covers("DSP-005")
@requires(Capability.DIRECT_WITHIN, Capability.REPORT_DOWN)
def test_direct_within_reaches_a_live_target(target: Target) -> None:
    chosen, _, inhibited = (target.add_worker() for _ in range(3))
    succeeds_on(target, DirectWithin(chosen, None), {chosen}, "DSP-005")
    target.report_down(inhibited)
    succeeds_on(target, DirectWithin(inhibited, None), {inhibited}, "DSP-005")


@covers("DSP-005")
@requires(
    Capability.DIRECT_WITHIN,
    Capability.VANISH_WORKER,
    Capability.MARK_OVERLOADED,
    Capability.REPORT_DOWN,
)
def test_ordinary_fallback_reaches_only_a_free_worker(target: Target) -> None:
    vanished, overloaded, inhibited, free = (target.add_worker() for _ in range(4))
    target.mark_overloaded(overloaded, True)
    target.report_down(inhibited)
    target.vanish_worker(vanished)
    for _ in range(3):
        succeeds_on(target, DirectWithin(vanished, None), {free}, "DSP-005")


@covers("DSP-006")
@requires(Capability.DIRECT_WITHIN, Capability.VANISH_WORKER, Capability.MARK_OVERLOADED)
def test_constrained_fallback_stays_inside_its_set(target: Target) -> None:
    vanished, second, third, fourth = (target.add_worker() for _ in range(4))
    target.vanish_worker(vanished)
    for allowed in ({third}, {vanished, fourth}, {fourth, third}):
        succeeds_on(target, DirectWithin(vanished, frozenset(allowed)), allowed, "DSP-006")
    target.mark_overloaded(third, True)
    request = target.submit(DirectWithin(vanished, frozenset({third})))
    require_false(
        "DSP-006",
        reached(target, request),
        f"fallback allowed only to overloaded {third} reached {reached(target, request)} "
        f"(free outside the set: {second}, {fourth})",
    )


@covers("DSP-007")
@requires(Capability.DIRECT_WITHIN, Capability.VANISH_WORKER, Capability.MARK_OVERLOADED)
def test_a_vanished_fallback_candidate_is_cannot_connect(target: Target) -> None:
    first, second, third = (target.add_worker() for _ in range(3))
    target.vanish_worker(first)
    target.vanish_worker(second)
    fails_untouched(target, DirectWithin(first, frozenset({second})), "DSP-007", "CannotConnect")
    target.mark_overloaded(third, True)  # the only free worker other than the target: second
    fails_untouched(target, DirectWithin(first, None), "DSP-007", "CannotConnect")


def _no_candidate_cases() -> list[object]:
    def empty_set(t: Target, target_id: int, others: list[int]) -> Call:
        return DirectWithin(target_id, frozenset())

    def only_itself(t: Target, target_id: int, others: list[int]) -> Call:
        return DirectWithin(target_id, frozenset({target_id}))

    def unknown_id(t: Target, target_id: int, others: list[int]) -> Call:
        return DirectWithin(target_id, frozenset({max(others) + 1000}))

    def allowed_overloaded(t: Target, target_id: int, others: list[int]) -> Call:
        t.mark_overloaded(others[0], True)
        return DirectWithin(target_id, frozenset({others[0]}))

    def allowed_inhibited(t: Target, target_id: int, others: list[int]) -> Call:
        t.report_down(others[0])
        return DirectWithin(target_id, frozenset({others[0]}))

    def all_others_overloaded(t: Target, target_id: int, others: list[int]) -> Call:
        for other in others:
            t.mark_overloaded(other, True)
        return DirectWithin(target_id, None)

    return [
        pytest.param(empty_set, id="empty-set"),
        pytest.param(only_itself, id="only-the-target"),
        pytest.param(unknown_id, id="unknown-id"),
        pytest.param(
            allowed_overloaded, marks=pytest.mark.requires(Capability.MARK_OVERLOADED),
            id="allowed-overloaded",
        ),
        pytest.param(
            allowed_inhibited, marks=pytest.mark.requires(Capability.REPORT_DOWN),
            id="allowed-inhibited",
        ),
        pytest.param(
            all_others_overloaded, marks=pytest.mark.requires(Capability.MARK_OVERLOADED),
            id="all-others-overloaded",
        ),
    ]  # fmt: skip


@covers("DSP-008")
@requires(Capability.DIRECT_WITHIN, Capability.VANISH_WORKER)
@pytest.mark.parametrize("case", _no_candidate_cases())
def test_no_fallback_candidate_is_unavailable(
    target: Target, case: Callable[[Target, int, list[int]], Call]
) -> None:
    vanished, *others = (target.add_worker() for _ in range(3))
    target.vanish_worker(vanished)
    fails_untouched(target, case(target, vanished, others), "DSP-008", "Unavailable")
    require_false(
        "DSP-008",
        target.dispatch_log(),
        f"no worker may be reached, the log is {list(target.dispatch_log())}",
    )


@covers("DSP-008")
@requires(Capability.VANISH_WORKER)
@pytest.mark.parametrize("mode", BUILTIN_MODES)
def test_generate_without_a_fallback_candidate_is_unavailable(target: Target, mode: str) -> None:
    """The only free worker is selected but has vanished: ordinary fallback finds nobody."""
    only = target.add_worker()
    target.vanish_worker(only)
    fails_untouched(target, Generate(mode), "DSP-008", "Unavailable")


# --- DSP-009 ---


@covers("DSP-009")
@requires(Capability.PRESELECTED, Capability.REPORT_DOWN)
def test_preselected_reaches_a_live_target_even_inhibited(target: Target) -> None:
    chosen, inhibited = target.add_worker(), target.add_worker()
    succeeds_on(target, Preselected(chosen), {chosen}, "DSP-009")
    target.report_down(inhibited)
    succeeds_on(target, Preselected(inhibited), {inhibited}, "DSP-009")


@covers("DSP-009")
@requires(Capability.PRESELECTED, Capability.VANISH_WORKER)
def test_preselected_to_a_vanished_target_is_cannot_connect(target: Target) -> None:
    vanished, _ = target.add_worker(), target.add_worker()
    target.vanish_worker(vanished)
    fails_untouched(target, Preselected(vanished), "DSP-009", "CannotConnect")


@covers("DSP-009")
@requires(Capability.PRESELECTED, Capability.MARK_OVERLOADED)
def test_preselected_to_an_overloaded_target_is_worker_overloaded(target: Target) -> None:
    overloaded, _ = target.add_worker(), target.add_worker()
    target.mark_overloaded(overloaded, True)
    fails_untouched(target, Preselected(overloaded), "DSP-009", "WorkerOverloaded")


# --- DSP-010 ---


def _require_prepared_for_reached(target: Target, context: str) -> None:
    for delivery in target.dispatch_log():
        require_equal(
            "DSP-010",
            delivery.prepared_for,
            delivery.worker_id,
            f"{context}: {delivery.request_id} reached worker {delivery.worker_id} but was "
            f"prepared for {delivery.prepared_for}",
        )


@covers("DSP-010")
@requires(Capability.OBSERVE_PREPARED_TARGET, Capability.DIRECT, Capability.PRESELECTED)
def test_prepare_sees_the_exact_target(target: Target) -> None:
    workers = [target.add_worker() for _ in range(3)]
    for worker in workers:
        target.submit(Direct(worker))
        target.submit(Preselected(worker))
    require_equal("DSP-010", len(target.dispatch_log()), 6, f"log {list(target.dispatch_log())}")
    _require_prepared_for_reached(target, "direct and preselected")


@covers("DSP-010")
@requires(Capability.OBSERVE_PREPARED_TARGET, Capability.DIRECT)
def test_a_dispatch_without_prepare_reaches_its_worker_as_passed(target: Target) -> None:
    """Prepare is the caller's to give: a direct dispatch given none reaches its worker as the
    caller passed it, prepared for no worker, and is served whole."""
    worker, _other = target.add_worker(), target.add_worker()
    request = target.submit(Direct(worker, prepared=False))
    outcome = finished(target, request, "DSP-010")
    deliveries = [(d.worker_id, d.prepared_for) for d in target.dispatch_log()]
    require(
        "DSP-010",
        deliveries == [(worker, None)] and outcome.error is None and bool(outcome.items),
        f"a direct dispatch to {worker} with no prepare step was delivered as {deliveries} "
        f"(worker, prepared for) and ended with {outcome}; expected [({worker}, None)], "
        "served whole",
    )


@covers("DSP-010")
@requires(Capability.OBSERVE_PREPARED_TARGET, Capability.DIRECT_WITHIN, Capability.VANISH_WORKER)
def test_prepare_sees_the_fallback_worker(target: Target) -> None:
    vanished, second, third = (target.add_worker() for _ in range(3))
    target.vanish_worker(vanished)
    target.submit(DirectWithin(vanished, None))
    target.submit(DirectWithin(vanished, frozenset({third})))
    target.submit(DirectWithin(second, None))
    targets = [d.worker_id for d in target.dispatch_log()]
    require(
        "DSP-010",
        len(targets) == 3 and vanished not in targets,
        f"expected three deliveries, none to vanished {vanished}: {list(target.dispatch_log())}",
    )
    _require_prepared_for_reached(target, "direct_within with fallback")


@covers("DSP-010")
@requires(Capability.OBSERVE_PREPARED_TARGET, Capability.MIGRATION, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("pinned", [False, True], ids=["routed", "pinned"])
def test_prepare_sees_every_attempt_of_a_migrating_request(target: Target, pinned: bool) -> None:
    """Each attempt is prepared for the worker it reaches: the first and its replacement,
    and a pinned request's only attempt."""
    failing = target.add_worker()
    target.script_worker(failing, FailBeforeStream(ErrorSpec("Disconnected")))
    spare = target.add_worker()
    target.submit(Migrate(limit=1, pin=spare if pinned else None))
    reached = [d.worker_id for d in target.dispatch_log()]
    require_equal(
        "DSP-010",
        reached,
        [spare] if pinned else [failing, spare],
        f"a {'pinned' if pinned else 'routed'} migrating request reached {reached}",
    )
    _require_prepared_for_reached(target, f"a {'pinned' if pinned else 'routed'} migration")


@covers("DSP-010")
@requires(Capability.OBSERVE_PREPARED_TARGET, Capability.VANISH_WORKER)
@pytest.mark.parametrize("mode", BUILTIN_MODES)
def test_prepare_sees_the_selected_worker(target: Target, mode: str) -> None:
    """One worker has vanished, so some selections land on it and fall back."""
    vanished, *_ = (target.add_worker() for _ in range(3))
    target.vanish_worker(vanished)
    for _ in range(8):
        target.submit(Generate(mode))
    require_equal(
        "DSP-010",
        len(target.dispatch_log()),
        8,
        f"8 generate({mode}) calls with two live workers gave log {list(target.dispatch_log())}",
    )
    _require_prepared_for_reached(target, f"generate({mode})")


# --- DSP-011, DSP-012 ---


@covers("DSP-011")
@requires(
    Capability.SCRIPT_STALL,
    Capability.SCRIPT_FAILURES,
    Capability.OBSERVE_OCCUPANCY,
    Capability.MARK_OVERLOADED,
    Capability.VANISH_WORKER,
    Capability.MOCK_CLOCK,
)
@pytest.mark.parametrize(
    "call_kind",
    [
        pytest.param("preselected", marks=pytest.mark.requires(Capability.PRESELECTED)),
        pytest.param("least-loaded", marks=pytest.mark.requires(Capability.LEAST_LOADED)),
    ],
)
def test_permits_are_released_exactly_once(target: Target, call_kind: str) -> None:
    """A witness request stays open on the worker throughout, so a double release shows as a
    count below one and a leak as a count above one."""
    worker = target.add_worker()

    def call(to: int) -> Call:
        return Preselected(to) if call_kind == "preselected" else Generate("least-loaded")

    def after(ending: str, expected: dict[int, int]) -> None:
        require_equal(
            "DSP-011",
            loads(target),
            expected,
            f"{call_kind}: after a request ended by {ending}, occupancy is {loads(target)}; "
            f"expected {expected} (the witness only)",
        )

    target.script_worker(worker, Stall())
    witness = target.submit(call(worker))
    after("nothing yet (the witness is open)", {worker: 1})

    target.script_worker(worker, Serve(2))
    target.submit(call(worker))
    after("the end of its stream", {worker: 1})

    target.script_worker(worker, FailMidStream(1, ErrorSpec("InvalidArgument")))
    target.submit(call(worker))
    after("an error item", {worker: 1})

    target.script_worker(worker, FailBeforeStream(ErrorSpec("Cancelled")))
    target.submit(call(worker))
    after("a failure before the stream", {worker: 1})
    target.advance_time(5.0)  # the failure inhibited the worker (TRN-005: CannotConnect)

    target.script_worker(worker, Stall(items=1))
    dropped = target.submit(call(worker))
    target.drop(dropped)
    after("the caller dropping it", {worker: 1})

    target.script_worker(worker, Serve())
    target.mark_overloaded(worker, True)
    target.submit(call(worker))
    target.mark_overloaded(worker, False)
    after("an overload refusal", {worker: 1})

    gone = target.add_worker()
    target.vanish_worker(gone)
    target.submit(call(gone))  # preselected: CannotConnect; least-loaded: falls back
    after("a vanished target", {worker: 1})

    target.release_stalled(worker)
    outcome = finished(target, witness, "DSP-011")
    require_compare("DSP-011", outcome.error, "is", None, f"the witness ended {outcome}")
    after("the end of every stream", {})


@covers("DSP-011")
@requires(
    Capability.SCRIPT_STALL,
    Capability.OBSERVE_OCCUPANCY,
    Capability.FIRST_RESPONSE_GUARD,
)
@pytest.mark.parametrize(
    "call_kind",
    [
        pytest.param("preselected", marks=pytest.mark.requires(Capability.PRESELECTED)),
        pytest.param("least-loaded", marks=pytest.mark.requires(Capability.LEAST_LOADED)),
    ],
)
def test_a_permit_is_released_when_the_caller_leaves_before_the_stream(
    target: Target, call_kind: str
) -> None:
    """The cancellation path before any stream exists: a guarded request's dispatch waits
    for the worker's first item (TRN-018), and its caller drops it meanwhile. The dispatch
    failed for the caller, so its permit goes at once, and only once: a witness request stays
    open on the worker throughout, so a leak shows as a count above one and a double release
    as a count below one."""
    worker = target.add_worker()
    call: Call = Preselected(worker) if call_kind == "preselected" else Generate("least-loaded")
    target.script_worker(worker, Stall(items=1))
    witness = target.submit(call)
    target.script_worker(worker, Stall(items=0))
    left = target.submit(call, guarded=True)
    require_equal(
        "DSP-011",
        loads(target),
        {worker: 2},
        f"{call_kind}: the witness and a guarded request waiting for its first item are open "
        f"on worker {worker}; occupancy is {loads(target)}",
    )
    target.drop(left)
    require_equal(
        "DSP-011",
        loads(target),
        {worker: 1},
        f"{call_kind}: the caller dropped {left} before its stream existed; occupancy is "
        f"{loads(target)}, expected {{{worker}: 1}} (the witness only)",
    )
    target.release_stalled(worker)
    require_equal(
        "DSP-011",
        loads(target),
        {},
        f"{call_kind}: every stream ended (the dropped dispatch's first item came too); "
        f"occupancy is {loads(target)}, expected none",
    )
    outcome = finished(target, witness, "DSP-011")
    require_compare("DSP-011", outcome.error, "is", None, f"the witness ended {outcome}")


@covers("DSP-011")
@requires(Capability.SCRIPT_STALL, Capability.SCRIPT_FAILURES, Capability.OBSERVE_OCCUPANCY)
@pytest.mark.parametrize(
    "call_kind",
    [
        pytest.param("preselected", marks=pytest.mark.requires(Capability.PRESELECTED)),
        pytest.param("least-loaded", marks=pytest.mark.requires(Capability.LEAST_LOADED)),
    ],
)
@pytest.mark.parametrize("after", [0, 2], ids=["first-item", "after-2"])
def test_a_permit_is_gone_when_the_caller_receives_an_error_item(
    target: Target, call_kind: str, after: int
) -> None:
    """Observed at the moment of receipt (``Outcome.occupancy_at_error``), before the caller
    reads on or closes the stream: a permit released only at the stream's end or close shows
    here. A witness stays open on the worker, so a double release shows as well."""
    worker = target.add_worker()
    call: Call = Preselected(worker) if call_kind == "preselected" else Generate("least-loaded")
    target.script_worker(worker, Stall(items=1))
    witness = target.submit(call)
    target.script_worker(worker, FailMidStream(after, ErrorSpec("InvalidArgument")))
    outcome = finished(target, target.submit(call), "DSP-011")
    require(
        "DSP-011",
        len(outcome.items) == after and shows(outcome.error, ("InvalidArgument",)),
        f"{call_kind}: expected {after} items then an InvalidArgument error item; got {outcome}",
    )
    at_error = outcome.occupancy_at_error
    require_equal(
        "DSP-011",
        None if at_error is None else {w: n for w, n in at_error.items() if n},
        {worker: 1},
        f"{call_kind}: when the caller received the error item, the failed request's permit "
        f"should already be released (the witness's only); occupancy was {at_error}",
    )
    target.release_stalled(worker)
    finished(target, witness, "DSP-011")
    require_equal("DSP-011", loads(target), {}, f"occupancy at the end: {loads(target)}")


@covers("DSP-012")
@requires(
    Capability.PRESELECTED,
    Capability.SCRIPT_STALL,
    Capability.VANISH_WORKER,
    Capability.OBSERVE_OCCUPANCY,
)
@pytest.mark.parametrize("mode", OCCUPANCY_MODES)
def test_a_fallback_moves_the_permit(target: Target, mode: str) -> None:
    """The vanished worker is the unique least loaded, so every occupancy mode selects it and
    ordinary fallback sends the request to the other worker."""
    vanished, other = target.add_worker(), target.add_worker()
    target.script_worker(other, Stall())
    target.submit(Preselected(other))
    target.vanish_worker(vanished)
    request = target.submit(Generate(mode))
    delivered = reached(target, request)
    require_equal(
        "DSP-012",
        delivered,
        [other],
        f"generate({mode}) with {vanished} vanished reached {delivered}, expected [{other}]",
    )
    require_equal(
        "DSP-012",
        loads(target),
        {other: 2},
        f"after falling back from {vanished} to {other}, occupancy is {loads(target)}; "
        f"expected {{{other}: 2}}",
    )
    target.release_stalled(other)
    require_equal(
        "DSP-012",
        loads(target),
        {},
        f"after every stream ended, occupancy is {loads(target)}, expected none",
    )


# --- DSP-013 ---

CALLS = [
    pytest.param("direct", marks=pytest.mark.requires(Capability.DIRECT)),
    pytest.param("round-robin", marks=pytest.mark.requires(Capability.ROUND_ROBIN)),
    pytest.param("least-loaded", marks=pytest.mark.requires(Capability.LEAST_LOADED)),
]


def _call(kind: str, worker: int) -> Call:
    return Direct(worker) if kind == "direct" else Generate(kind)


@covers("DSP-013")
@pytest.mark.parametrize("kind", CALLS)
@pytest.mark.parametrize("count", [0, 1, 7])
def test_items_arrive_whole_and_in_order(target: Target, kind: str, count: int) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Serve(count))
    outcome = finished(target, target.submit(_call(kind, worker)), "DSP-013")
    require(
        "DSP-013",
        outcome.error is None and indexes(outcome.items) == list(range(count)),
        f"{kind}: the worker yielded items 0..{count - 1} and ended; the caller got "
        f"{indexes(outcome.items)} then {outcome.error}",
    )


@covers("DSP-013")
@requires(Capability.SCRIPT_STALL)
@pytest.mark.parametrize("kind", CALLS)
def test_a_stalled_stream_is_delivered_whole(target: Target, kind: str) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Stall(items=2, items_after=3))
    request = target.submit(_call(kind, worker))
    require_compare(
        "DSP-013",
        target.outcome(request),
        "is",
        None,
        f"{kind}: the stream ended while the worker was stalled: {target.outcome(request)}",
    )
    target.release_stalled(worker)
    outcome = finished(target, request, "DSP-013")
    require(
        "DSP-013",
        outcome.error is None and indexes(outcome.items) == [0, 1, 2, 3, 4],
        f"{kind}: the worker yielded items 0..4 around a stall; the caller got "
        f"{indexes(outcome.items)} then {outcome.error}",
    )


@covers("DSP-013")
@requires(Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("kind", CALLS)
@pytest.mark.parametrize(
    "labels",
    [("Backend(EngineShutdown)",), ("Disconnected", None, "Cancelled"), (None, "InvalidArgument")],
    ids=["engine-shutdown", "wrapped-cancel", "untyped-outer"],
)
def test_an_error_item_follows_the_items_unchanged(
    target: Target, kind: str, labels: tuple[str | None, ...]
) -> None:
    worker = target.add_worker()
    error: ErrorSpec | None = None
    for label in reversed(labels):
        error = ErrorSpec(label, "injected", error)
    assert error is not None
    target.script_worker(worker, FailMidStream(3, error))
    outcome = finished(target, target.submit(_call(kind, worker)), "DSP-013")
    expected = tuple(oracle.typed(labels))
    require(
        "DSP-013",
        indexes(outcome.items) == [0, 1, 2]
        and outcome.error is not None
        and not outcome.error.pre_stream
        and shows(outcome.error, labels),
        f"{kind}: the worker yielded items 0..2 then an error item {expected}; the caller got "
        f"{indexes(outcome.items)} then "
        f"{outcome.error.describe() if outcome.error else 'a clean end'}",
    )


# --- DSP-014 ---

ONE_DELIVERY_CALLS = [
    pytest.param(mode, marks=pytest.mark.requires(cap), id=mode)
    for mode, cap in MODE_CAPABILITY.items()
] + [
    pytest.param(kind, marks=pytest.mark.requires(cap), id=kind)
    for kind, cap in (
        ("direct", Capability.DIRECT),
        ("direct-within", Capability.DIRECT_WITHIN),
        ("preselected", Capability.PRESELECTED),
    )
]


@covers("DSP-014")
@requires(Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("kind", ONE_DELIVERY_CALLS)
@pytest.mark.parametrize(
    "label", ["CannotConnect", "Disconnected", "WorkerOverloaded", "ResourceExhausted"]
)
def test_a_failed_dispatch_is_not_resent(target: Target, kind: str, label: str) -> None:
    """Every worker fails before the stream with an error that invites a retry elsewhere.

    The caller sees the transport's pre-stream failure (TRN-005), whose outer type is
    CannotConnect whatever the worker's error was."""
    workers = [target.add_worker() for _ in range(3)]
    for worker in workers:
        target.script_worker(worker, FailBeforeStream(ErrorSpec(label)))
    call: Call
    if kind == "direct":
        call = Direct(workers[0])
    elif kind == "direct-within":
        call = DirectWithin(workers[0], None)
    elif kind == "preselected":
        call = Preselected(workers[0])
    else:
        call = Generate(kind)
    request = target.submit(call)
    outcome = finished(target, request, "DSP-014")
    delivered = reached(target, request)
    require(
        "DSP-014",
        len(delivered) == 1 and shows_outer(outcome.error, "CannotConnect"),
        f"{call} with every worker failing {label} reached {delivered} and ended {outcome}; "
        "expected exactly one delivery and that failure",
    )


@covers("DSP-014")
@requires(
    Capability.ROUND_ROBIN,
    Capability.DIRECT,
    Capability.DIRECT_WITHIN,
    Capability.PRESELECTED,
    Capability.VANISH_WORKER,
)
def test_each_call_delivers_at_most_once(target: Target) -> None:
    vanished, *live = (target.add_worker() for _ in range(4))
    target.vanish_worker(vanished)
    calls: list[Call] = [
        *(Generate("round-robin") for _ in range(8)),
        *(Direct(w) for w in live),
        Direct(vanished),
        DirectWithin(vanished, None),
        DirectWithin(vanished, frozenset(live[1:])),
        *(Preselected(w) for w in live),
    ]
    submitted = [target.submit(call) for call in calls]
    counts = Counter(d.request_id for d in target.dispatch_log())
    repeated = {rid: n for rid, n in counts.items() if n > 1}
    require_false("DSP-014", repeated, f"requests delivered more than once: {repeated}")
    require(
        "DSP-014",
        set(counts) <= set(submitted) and len(counts) == len(submitted) - 1,
        f"expected every call but direct({vanished}) to be delivered once: {dict(counts)}",
    )


# --- DSP-015 ---


@covers("DSP-015")
@requires(Capability.SCRIPT_STALL, Capability.KILL_WORKER)
@pytest.mark.parametrize("kind", CALLS)
def test_a_dead_workers_stream_ends_with_disconnected(target: Target, kind: str) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Stall(items=2))
    request = target.submit(_call(kind, worker))
    target.kill_worker(worker)
    outcome = finished(target, request, "DSP-015")
    require(
        "DSP-015",
        indexes(outcome.items) == [0, 1]
        and outcome.error is not None
        and not outcome.error.pre_stream
        and shows_outer(outcome.error, "Disconnected"),
        f"{kind}: the worker died after items 0..1; the caller got {indexes(outcome.items)} "
        f"then {outcome.error.describe() if outcome.error else 'a clean end'}, expected a "
        "Disconnected error item",
    )


@covers("DSP-015")
@requires(
    Capability.DIRECT, Capability.SCRIPT_STALL, Capability.KILL_WORKER, Capability.PACED_READS
)
def test_a_worker_dying_between_reads_ends_the_next_read_with_disconnected(
    target: Target,
) -> None:
    """The caller has read one item and is not reading when the worker dies: its next read
    ends the stream with ``Disconnected`` (after item 1, if that had already arrived)."""
    worker = target.add_worker()
    target.script_worker(worker, Stall(items=2))
    target.pace_reads(True)
    request = target.submit(Direct(worker))
    target.read(request, 1)
    target.kill_worker(worker)
    target.read(request, 3)  # what is left of the stream, and its end
    outcome = finished(target, request, "DSP-015")
    require(
        "DSP-015",
        indexes(outcome.items) in ([0], [0, 1])
        and outcome.error is not None
        and not outcome.error.pre_stream
        and shows_outer(outcome.error, "Disconnected"),
        f"worker {worker} died while its caller, having read item 0, was not reading: the "
        f"caller got {indexes(outcome.items)} then "
        f"{outcome.error.describe() if outcome.error else 'a clean end'}, expected a "
        "Disconnected error item",
    )
