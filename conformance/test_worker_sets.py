"""Worker sets (SET): one small scenario per rule.

The sets are read through the target's WorkerSetsView; a *vanished* worker has lost its
transport record while discovery still lists it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from routespec.conformance.checks import (
    covers,
    require,
    require_compare,
    require_equal,
    require_false,
    requires,
)
from routespec.conformance.plugin import OpenTarget
from routespec.conformance.scenario import (
    finished,
    reached,
    shows_outer,
)
from routespec.testing.target import (
    Capability,
    Direct,
    Generate,
    LoadReport,
    LoadThresholds,
    Reject,
    Target,
    TargetConfig,
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


# --- SET-005, SET-006: busy thresholds ---

DECODE = LoadThresholds(active_decode_blocks_threshold=0.5)
PREFILL = LoadThresholds(active_prefill_tokens_threshold=100)
PREFILL_FRAC = LoadThresholds(active_prefill_tokens_threshold_frac=0.5)
ALL_THREE = LoadThresholds(0.5, 100, 0.5)
DEFAULT_MAX_NUM_BATCHED_TOKENS = 10_000_000


def decode(active: int, total: int = 10) -> LoadReport:
    return LoadReport(active_decode_blocks=active, kv_total_blocks=total)


def prefill(active: int, max_batched: int | None = None) -> LoadReport:
    return LoadReport(active_prefill_tokens=active, max_num_batched_tokens=max_batched)


def judged(
    open_target: OpenTarget, thresholds: LoadThresholds, reports: Sequence[LoadReport | None]
) -> tuple[list[int], frozenset[int]]:
    """One worker per report (None: it never reports), each report delivered once; the
    workers and the overloaded set read afterwards."""
    with open_target(TargetConfig(load_thresholds=thresholds)) as target:
        workers = [target.add_worker() for _ in reports]
        for worker, report in zip(workers, reports, strict=True):
            if report is not None:
                target.report_load(worker, report)
        return workers, target.worker_sets().overloaded


def require_overloaded(
    workers: Sequence[int],
    overloaded: frozenset[int],
    expected: Sequence[bool],
    thresholds: LoadThresholds,
    reports: Sequence[LoadReport | None],
) -> None:
    want = {worker for worker, busy in zip(workers, expected, strict=True) if busy}
    require_equal(
        "SET-005",
        set(overloaded),
        want,
        f"under {thresholds}, workers {workers} reported {list(reports)}: overloaded is "
        f"{sorted(overloaded)}, expected {sorted(want)} (each comparison is strict)",
    )


# Each threshold alone, its load just under, at and just over it: only over marks.
EACH_THRESHOLD = [
    pytest.param(DECODE, [decode(4), decode(5), decode(6)], id="decode"),
    pytest.param(PREFILL, [prefill(99), prefill(100), prefill(101)], id="prefill"),
    # 0.5 x 201 = 100.5, floored to 100
    pytest.param(
        PREFILL_FRAC, [prefill(99, 201), prefill(100, 201), prefill(101, 201)], id="prefill-frac"
    ),
    pytest.param(
        PREFILL_FRAC,
        [prefill(n) for n in (4_999_999, 5_000_000, 5_000_001)],
        id="prefill-frac-default-max-batched",
    ),
]


@covers("SET-005")
@requires(Capability.REPORT_LOAD, Capability.OBSERVE_WORKER_SETS)
@pytest.mark.parametrize(("thresholds", "reports"), EACH_THRESHOLD)
def test_a_threshold_marks_only_loads_above_it(
    open_target: OpenTarget, thresholds: LoadThresholds, reports: list[LoadReport]
) -> None:
    loads = [*reports, None]  # and a worker with no report
    workers, overloaded = judged(open_target, thresholds, loads)
    require_overloaded(workers, overloaded, [False, False, True, False], thresholds, loads)


# Each threshold alone, with loads far over the other two: unset checks never mark.
UNSET_OTHERS = [
    pytest.param(DECODE, id="decode-only"),
    pytest.param(PREFILL, id="prefill-only"),
    pytest.param(PREFILL_FRAC, id="prefill-frac-only"),
    pytest.param(LoadThresholds(), id="none-set"),
]


@covers("SET-005")
@requires(Capability.REPORT_LOAD, Capability.OBSERVE_WORKER_SETS)
@pytest.mark.parametrize("thresholds", UNSET_OTHERS)
def test_unset_thresholds_never_mark(open_target: OpenTarget, thresholds: LoadThresholds) -> None:
    full = decode(10)
    flooded = prefill(DEFAULT_MAX_NUM_BATCHED_TOKENS, 1_000)
    loads: list[LoadReport | None] = [full, flooded]
    expected = [
        thresholds.active_decode_blocks_threshold is not None,
        thresholds.active_prefill_tokens_threshold is not None
        or thresholds.active_prefill_tokens_threshold_frac is not None,
    ]
    workers, overloaded = judged(open_target, thresholds, loads)
    require_overloaded(workers, overloaded, expected, thresholds, loads)


@covers("SET-005")
@requires(Capability.REPORT_LOAD, Capability.OBSERVE_WORKER_SETS)
def test_any_configured_check_marks(open_target: OpenTarget) -> None:
    loads: list[LoadReport | None] = [
        LoadReport(6, 10, 0, 10_000),  # decode only
        LoadReport(0, 10, 101, 10_000),  # prefill only (frac limit 5,000)
        LoadReport(0, 10, 60, 100),  # frac only (limit 50)
        LoadReport(5, 10, 100, 200),  # every check at its threshold
        None,
    ]
    workers, overloaded = judged(open_target, ALL_THREE, loads)
    require_overloaded(workers, overloaded, [True, True, True, False, False], ALL_THREE, loads)


@covers("SET-005")
@requires(Capability.REPORT_LOAD, Capability.OBSERVE_WORKER_SETS)
def test_decode_needs_known_total_blocks(open_target: OpenTarget) -> None:
    zero = LoadThresholds(active_decode_blocks_threshold=0.0)
    loads: list[LoadReport | None] = [
        decode(5, total=0),
        decode(0),
        decode(1),
        decode(1, total=1),  # the smallest known total counts
    ]
    workers, overloaded = judged(open_target, zero, loads)
    require_overloaded(workers, overloaded, [False, False, True, True], zero, loads)


@covers("SET-005", "SET-004")
@requires(Capability.REPORT_LOAD, Capability.OBSERVE_WORKER_SETS)
def test_the_latest_report_decides(open_target: OpenTarget) -> None:
    with open_target(TargetConfig(load_thresholds=DECODE)) as target:
        worker, other = target.add_worker(), target.add_worker()
        steps = [
            (decode(6), {worker}),
            (decode(5), set()),
            (decode(10), {worker}),
            (decode(0), set()),
        ]
        for report, expected in steps:
            target.report_load(worker, report)
            view = target.worker_sets()
            require_equal(
                "SET-005",
                set(view.overloaded),
                expected,
                f"after worker {worker} reported {report} under {DECODE}, overloaded is "
                f"{sorted(view.overloaded)}",
            )
            require_equal(
                "SET-004",
                set(view.free),
                {worker, other} - expected,
                f"free must follow the load monitor's verdicts: {view}",
            )


@covers("SET-005", "SEL-004")
@requires(Capability.REPORT_LOAD, Capability.ROUND_ROBIN)
def test_overloaded_by_load_is_not_selected(open_target: OpenTarget) -> None:
    with open_target(TargetConfig(load_thresholds=PREFILL)) as target:
        busy, idle = target.add_worker(), target.add_worker()
        target.report_load(busy, prefill(101))
        target.report_load(idle, prefill(100))
        requests = [target.submit(Generate("round-robin")) for _ in range(4)]
        picks = [worker for request in requests for worker in reached(target, request)]
        require_equal(
            "SET-005",
            picks,
            [idle] * 4,
            f"worker {busy} is over its prefill threshold, {idle} at it: round-robin reached "
            f"{picks}",
        )
        target.report_load(idle, prefill(101))
        before = len(target.dispatch_log())
        outcome = finished(target, target.submit(Generate("round-robin")), "SEL-004")
        require(
            "SEL-004",
            shows_outer(outcome.error, "ResourceExhausted"),
            f"with both workers over their prefill threshold, round-robin ended {outcome}, "
            "expected ResourceExhausted",
        )
        require_false(
            "SEL-004",
            target.dispatch_log()[before:],
            f"a request reached a worker while all are overloaded by load: "
            f"{list(target.dispatch_log()[before:])}",
        )


def only(field: str, value: float) -> LoadThresholds:
    """The thresholds with just ``field`` set (plain data: the target judges the value)."""
    settings: dict[str, Any] = {field: value}
    return LoadThresholds(**settings)


REFUSED = (
    [
        pytest.param("active_decode_blocks_threshold", value, id=f"decode-{name}")
        for name, value in [
            ("below-0", -0.1),
            ("above-1", 1.000001),
            ("nan", math.nan),
            ("inf", math.inf),
            ("minus-inf", -math.inf),
        ]
    ]
    + [
        pytest.param("active_prefill_tokens_threshold", value, id=f"prefill-{name}")
        for name, value in [("below-0", -1), ("above-u64", 2**64)]
    ]
    + [
        pytest.param("active_prefill_tokens_threshold_frac", value, id=f"prefill-frac-{name}")
        for name, value in [
            ("below-0", -0.000001),
            ("nan", math.nan),
            ("inf", math.inf),
            ("minus-inf", -math.inf),
        ]
    ]
)

ACCEPTED = [
    pytest.param("active_decode_blocks_threshold", 0.0, id="decode-0"),
    pytest.param("active_decode_blocks_threshold", 1.0, id="decode-1"),
    pytest.param("active_prefill_tokens_threshold", 0, id="prefill-0"),
    pytest.param("active_prefill_tokens_threshold", 2**64 - 1, id="prefill-u64-max"),
    pytest.param("active_prefill_tokens_threshold_frac", 0.0, id="prefill-frac-0"),
    pytest.param("active_prefill_tokens_threshold_frac", 1e6, id="prefill-frac-large"),
]


@covers("SET-006")
@requires(Capability.CHECK_LOAD_THRESHOLDS)
@pytest.mark.parametrize(("field", "value"), REFUSED)
def test_bad_thresholds_are_refused_naming_the_field(
    target: Target, field: str, value: float
) -> None:
    thresholds = only(field, value)
    error = target.check_load_thresholds(thresholds)
    require(
        "SET-006",
        shows_outer(error, "InvalidArgument"),
        f"a router with {field}={value} should be refused at construction with "
        f"InvalidArgument, got {error if error is None else error.describe()}",
    )
    assert error is not None
    require(
        "SET-006",
        any(field in message for _, message in error.links),
        f"the refusal of {field}={value} does not name the field: {error.describe()}",
    )


@covers("SET-006")
@requires(Capability.CHECK_LOAD_THRESHOLDS)
@pytest.mark.parametrize(("field", "value"), ACCEPTED)
def test_thresholds_in_range_are_accepted(target: Target, field: str, value: float) -> None:
    thresholds = only(field, value)
    error = target.check_load_thresholds(thresholds)
    require(
        "SET-006",
        error is None,
        f"a router with {field}={value} (in range) was refused: "
        f"{error if error is None else error.describe()}",
    )
