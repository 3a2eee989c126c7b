"""The routing host's response-stream monitor (MON): which frames it withholds, how long it
drains for a typed error, and when a stream's booking is released.

Workers answer token requests (``HostRoute``): a data item carries one token; a terminal
frame carries no token and a ``finish_reason``. Checks that read bookings run a policy that
books (least-loaded, KV); the others run round-robin. Time is the target's mock clock.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from routespec.conformance.checks import (
    covers,
    require,
    require_compare,
    require_equal,
    require_false,
    requires,
)
from routespec.conformance.host import ended, host_of, workers
from routespec.conformance.plugin import OpenTarget
from routespec.conformance.scenario import reached, shows, tokens
from routespec.testing.target import (
    CancelThenFail,
    Capability,
    ErrorSpec,
    FailMidStream,
    HostConfig,
    HostRoute,
    Outcome,
    RoutingHostTarget,
    Serve,
    Stall,
    Target,
    TargetConfig,
    TerminalFlood,
    TerminalThen,
    WorkerScript,
    WriteFrame,
)

HOST = Capability.ROUTING_HOST
SHUTDOWN = "Backend(EngineShutdown)"
SHUTDOWN_ERROR = ErrorSpec(SHUTDOWN, "engine is shutting down")
DRAIN_WINDOW = 5.0
DRAINABLE = frozenset({"cancelled", "error"})
PROMPT = (1, 2, 3, 4)
MAX_TOKENS = 4
ROUTE = HostRoute(tokens=PROMPT, max_tokens=MAX_TOKENS)
EXPECTED = list(range(len(PROMPT), len(PROMPT) + MAX_TOKENS))
BOOKING_POLICIES = ["least-loaded", "kv"]
STEADY = TargetConfig(fault_detection=False)
"""No fault detection: only the monitor's exclusion, not inhibition, keeps a retry away."""


def finishes(outcome: Outcome) -> list[object]:
    """Each item's finish reason, in order (None for a plain data item)."""
    return [item.get("finish_reason") if isinstance(item, dict) else item for item in outcome.items]


def booked(host: RoutingHostTarget) -> dict[int, int]:
    return {worker: count for worker, count in host.bookings().items() if count}


def hold_one(target: Target, host: RoutingHostTarget, pool: list[int]) -> int:
    """Park one request (a different prompt) on a worker of ``pool`` and return that worker:
    it stays booked until ``release_stalled``, so a booking policy prefers the others."""
    for worker in pool:
        target.script_worker(worker, Stall(0))
    request = host.route(HostRoute(tokens=(7, 7, 7, 7), max_tokens=1))
    found = reached(target, request)
    if len(found) != 1 or target.outcome(request) is not None:
        pytest.fail(f"setup: the held request reached {found} and ended {target.outcome(request)}")
    return found[0]


def other(pool: list[int], worker: int) -> int:
    return next(w for w in pool if w != worker)


# --- MON-001 ---


@covers("MON-001")
@requires(HOST, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("finish", ["cancelled", "error", "stop", "length"])
def test_each_finish_reason_is_classified(target: Target, finish: str) -> None:
    workers(target, 1, TerminalThen(items=2, finish=finish, error=SHUTDOWN_ERROR))
    host = host_of(target, "MON-001", HostConfig())
    outcome, _ = ended(target, host.route(ROUTE), "MON-001")
    drainable = finish in DRAINABLE
    expected: list[object] = [None, None] if drainable else [None, None, finish]
    require(
        "MON-001",
        finishes(outcome) == expected and shows(outcome.error, (SHUTDOWN,)),
        f"a worker sent 2 tokens, a {finish!r} terminal frame, then {SHUTDOWN}: "
        + (
            "a drainable terminal is withheld and the error replaces it"
            if drainable
            else "a healthy terminal passes through before the error"
        )
        + f", so the caller should read finish reasons {expected} then the error; "
        f"got {finishes(outcome)} and {outcome.error}",
    )


NOT_MAPS = {"text": '"plain"', "list": "[1, 2]", "number": "5", "null": "null"}


@covers("MON-001")
@requires(HOST, Capability.SCRIPT_WIRE_FAULTS)
@pytest.mark.parametrize("data", list(NOT_MAPS.values()), ids=list(NOT_MAPS))
def test_a_data_item_that_is_no_map_is_healthy(target: Target, data: str) -> None:
    """An item's data need not be a map: one that is not, so has no finish reason, is
    Healthy and reaches the caller like any other."""
    body = f'{{"data": {{"data": {data}}}, "complete_final": false}}'
    workers(target, 1, WriteFrame(1, body=body))
    host = host_of(target, "MON-001", HostConfig())
    outcome, _ = ended(target, host.route(ROUTE), "MON-001")
    require(
        "MON-001",
        outcome.error is None and len(outcome.items) == 2 and outcome.items[1] == json.loads(data),
        f"a worker sent a token, then an item whose data is {data}: the caller should read "
        f"both and no error; got {outcome}",
    )


# --- MON-002 ---


@covers("MON-002", "HST-011")
@requires(HOST, Capability.SCRIPT_FAILURES, Capability.SCRIPT_STALL)
@pytest.mark.parametrize("policy", BOOKING_POLICIES)
def test_a_failure_releases_its_booking_before_the_caller_sees_it(
    target: Target, policy: str
) -> None:
    pool = workers(target, 2)
    host = host_of(target, "MON-002", HostConfig(policy=policy))
    held = hold_one(target, host, pool)
    failing = other(pool, held)
    target.script_worker(failing, FailMidStream(2, ErrorSpec("Disconnected")))
    started, completed = host.counters()
    request = host.route(ROUTE)
    outcome, found = ended(target, request, "MON-002")
    require(
        "MON-002",
        found == [failing] and outcome.error is not None and not outcome.error.pre_stream,
        f"{policy} should send the request to idle worker {failing} (worker {held} holds a "
        f"request), which fails after 2 tokens; it reached {found} and ended {outcome}",
    )
    require(
        "MON-002",
        outcome.bookings_at_error is not None
        and {w: n for w, n in outcome.bookings_at_error.items() if n} == {held: 1},
        f"when the caller received the error item the failed request's booking on {failing} "
        f"should already be released (bookings {{{held}: 1}}); they were "
        f"{outcome.bookings_at_error}",
    )
    require_equal(
        "HST-011",
        host.counters(),
        (started + 1, completed),
        f"a stream that failed is not a finished stream: counters went from "
        f"{(started, completed)} to {host.counters()}, expected {(started + 1, completed)}",
    )
    target.release_stalled(held)
    require_false("MON-002", booked(host), f"bookings left at the end: {booked(host)}")


@covers("MON-002")
@requires(HOST, Capability.SCRIPT_FAILURES, Capability.SCRIPT_STALL, Capability.MIGRATION)
@pytest.mark.parametrize("policy", BOOKING_POLICIES)
def test_a_failed_worker_is_excluded_before_the_retry(open_target: OpenTarget, policy: str) -> None:
    with open_target(STEADY) as target:
        pool = workers(target, 2)
        host = host_of(target, "MON-002", HostConfig(policy=policy))
        held = hold_one(target, host, pool)
        failing = other(pool, held)
        target.script_worker(held, Serve())  # the held request keeps its stall
        target.script_worker(failing, FailMidStream(2, ErrorSpec("Disconnected")))
        request = host.route(HostRoute(tokens=PROMPT, max_tokens=MAX_TOKENS, migration_limit=1))
        outcome, found = ended(target, request, "MON-002")
        require(
            "MON-002",
            found == [failing, held] and outcome.error is None and tokens(outcome) == EXPECTED,
            f"{policy} prefers idle worker {failing}, which fails after 2 tokens; the failure "
            f"must be recorded before migration sees it, so the retry goes to {held} (busy) "
            f"and the caller reads {EXPECTED}; reached {found}, got {outcome}",
        )
        target.release_stalled(held)
        require_false("MON-002", booked(host), f"bookings left at the end: {booked(host)}")


# --- MON-003 ---

WITHHELD_THEN_ERROR: list[WorkerScript] = [
    CancelThenFail(2, SHUTDOWN_ERROR),
    TerminalThen(items=2, finish="cancelled", stall=True, error=SHUTDOWN_ERROR),
    TerminalThen(items=2, finish="error", stall=True, error=SHUTDOWN_ERROR),
]


@covers("MON-003")
@requires(HOST, Capability.SCRIPT_FAILURES, Capability.SCRIPT_STALL)
@pytest.mark.parametrize(
    "script", WITHHELD_THEN_ERROR, ids=["cancel-then-fail", "cancelled-stall", "error-stall"]
)
def test_a_trailing_error_replaces_the_withheld_terminal(
    target: Target, script: WorkerScript
) -> None:
    (worker,) = workers(target, 1, script)
    host = host_of(target, "MON-003", HostConfig())
    request = host.route(ROUTE)
    if isinstance(script, TerminalThen) and script.stall:
        require_compare(
            "MON-003",
            target.outcome(request),
            "is",
            None,
            f"after a {script.finish!r} terminal frame the monitor should keep reading the "
            f"stalled stream; it ended {target.outcome(request)}",
        )
        target.release_stalled(worker)
    outcome, _ = ended(target, request, "MON-003")
    require(
        "MON-003",
        tokens(outcome) == EXPECTED[:2]
        and not DRAINABLE & set(finishes(outcome))
        and shows(outcome.error, (SHUTDOWN,)),
        f"{script}: the caller should read 2 tokens and then {SHUTDOWN}, never the terminal "
        f"frame; got {outcome.items} and {outcome.error}",
    )


@covers("MON-003")
@requires(HOST, Capability.SCRIPT_FAILURES, Capability.SCRIPT_STALL, Capability.MIGRATION)
@pytest.mark.parametrize("policy", BOOKING_POLICIES)
def test_a_shutdown_after_a_cancel_frame_migrates(open_target: OpenTarget, policy: str) -> None:
    with open_target(STEADY) as target:
        pool = workers(target, 2)
        host = host_of(target, "MON-003", HostConfig(policy=policy))
        held = hold_one(target, host, pool)
        failing = other(pool, held)
        target.script_worker(held, Serve())
        target.script_worker(failing, CancelThenFail(2, SHUTDOWN_ERROR))
        request = host.route(HostRoute(tokens=PROMPT, max_tokens=MAX_TOKENS, migration_limit=1))
        outcome, found = ended(target, request, "MON-003")
        require(
            "MON-003",
            found == [failing, held]
            and outcome.error is None
            and tokens(outcome) == EXPECTED
            and "cancelled" not in finishes(outcome),
            f"worker {failing} sent 2 tokens, a cancelled frame and {SHUTDOWN}: the error must "
            f"replace the frame and reach migration, so the retry on {held} completes "
            f"{EXPECTED} with no cancelled frame; reached {found}, got {outcome}",
        )
        target.release_stalled(held)


# --- MON-004, MON-005 ---


@covers("MON-004", "MON-005", "HST-011")
@requires(HOST, Capability.SCRIPT_STALL, Capability.MOCK_CLOCK)
@pytest.mark.parametrize("policy", BOOKING_POLICIES)
def test_the_drain_deadline_delivers_the_withheld_terminal(target: Target, policy: str) -> None:
    (worker,) = workers(target, 1, TerminalThen(items=2, finish="cancelled", stall=True))
    host = host_of(target, "MON-004", HostConfig(policy=policy))
    started, completed = host.counters()
    request = host.route(ROUTE)
    target.advance_time(DRAIN_WINDOW - 0.1)
    require(
        "MON-004",
        target.outcome(request) is None and booked(host) == {worker: 1},
        f"4.9 s after a withheld cancelled frame the drain should still be open and booked; "
        f"outcome {target.outcome(request)}, bookings {booked(host)}",
    )
    target.advance_time(0.2)
    outcome, _ = ended(target, request, "MON-005")
    require(
        "MON-005",
        finishes(outcome) == [None, None, "cancelled"] and outcome.error is None,
        f"at the 5 s deadline the withheld cancelled frame should be delivered and the stream "
        f"end cleanly; got finish reasons {finishes(outcome)} and {outcome.error}",
    )
    require_false(
        "MON-005",
        booked(host),
        f"the drain ended at its deadline; bookings left: {booked(host)}",
    )
    require_equal(
        "HST-011",
        host.counters(),
        (started + 1, completed),
        f"a stream drained to its deadline did not finish: counters went from "
        f"{(started, completed)} to {host.counters()}",
    )
    target.release_stalled(worker)


@covers("MON-001", "MON-004", "MON-006", "MON-007")
@requires(HOST, Capability.SCRIPT_STALL, Capability.MOCK_CLOCK)
@pytest.mark.parametrize("end", ["released", "stopped"])
@pytest.mark.parametrize("policy", BOOKING_POLICIES)
def test_a_healthy_item_ends_the_drain(target: Target, policy: str, end: str) -> None:
    """A healthy item after a withheld terminal releases it ahead of itself and ends the
    drain: the window bounds a drain only, so a later silence keeps the stream open, and
    the stream ends when the worker does or when the client stops it."""
    script = TerminalThen(items=1, finish="cancelled", items_after=2, stall=True)
    (worker,) = workers(target, 1, script)
    host = host_of(target, "MON-001", HostConfig(policy=policy))
    request = host.route(ROUTE)
    target.advance_time(DRAIN_WINDOW * 2)
    require(
        "MON-004",
        target.outcome(request) is None and booked(host) == {worker: 1},
        f"the items after the cancelled frame ended its drain: {2 * DRAIN_WINDOW} s of "
        f"silence later the stream should still be open and booked; outcome "
        f"{target.outcome(request)}, bookings {booked(host)}",
    )
    if end == "stopped":
        host.stop(request)
    else:
        target.release_stalled(worker)
    outcome, _ = ended(target, request, "MON-001")
    if end == "stopped":
        target.release_stalled(worker)
    require(
        "MON-001",
        finishes(outcome) == [None, "cancelled", None, None]
        and tokens(outcome) == EXPECTED[:3]
        and outcome.error is None,
        f"a cancelled frame, then two healthy items: the caller should read one item, the "
        f"frame, then the two items, in order; got {outcome}",
    )
    require_false(
        "MON-007" if end == "stopped" else "MON-006",
        booked(host),
        f"bookings left once {end}: {booked(host)}",
    )


@covers("MON-004")
@requires(HOST, Capability.SCRIPT_FAILURES, Capability.SCRIPT_STALL, Capability.MOCK_CLOCK)
def test_an_error_inside_the_drain_window_reaches_the_caller(target: Target) -> None:
    script = TerminalThen(items=2, finish="cancelled", stall=True, error=SHUTDOWN_ERROR)
    (worker,) = workers(target, 1, script)
    host = host_of(target, "MON-004", HostConfig())
    request = host.route(ROUTE)
    target.advance_time(DRAIN_WINDOW / 2)
    require_compare(
        "MON-004",
        target.outcome(request),
        "is",
        None,
        f"2.5 s after a withheld cancelled frame the drain should still be open; the stream "
        f"ended {target.outcome(request)}",
    )
    target.release_stalled(worker)
    outcome, _ = ended(target, request, "MON-004")
    require(
        "MON-004",
        finishes(outcome) == [None, None] and shows(outcome.error, (SHUTDOWN,)),
        f"{SHUTDOWN} arrived 2.5 s into the drain window, so the caller should see it and not "
        f"the cancelled frame; got finish reasons {finishes(outcome)} and {outcome.error}",
    )


@covers("MON-004")
@requires(
    HOST,
    Capability.SCRIPT_FAILURES,
    Capability.SCRIPT_STALL,
    Capability.MOCK_CLOCK,
    Capability.MIGRATION,
)
def test_an_error_inside_the_drain_window_reaches_migration(open_target: OpenTarget) -> None:
    with open_target(STEADY) as target:
        pool = workers(target, 2)
        host = host_of(target, "MON-004", HostConfig(policy="least-loaded"))
        held = hold_one(target, host, pool)
        failing = other(pool, held)
        target.script_worker(held, Serve())
        script = TerminalThen(items=2, finish="cancelled", stall=True, error=SHUTDOWN_ERROR)
        target.script_worker(failing, script)
        request = host.route(HostRoute(tokens=PROMPT, max_tokens=MAX_TOKENS, migration_limit=1))
        target.advance_time(DRAIN_WINDOW / 2)
        target.release_stalled(failing)
        outcome, found = ended(target, request, "MON-004")
        require(
            "MON-004",
            found == [failing, held]
            and outcome.error is None
            and tokens(outcome) == EXPECTED
            and "cancelled" not in finishes(outcome),
            f"worker {failing} sent a cancelled frame and, 2.5 s later, {SHUTDOWN}: migration "
            f"should retry on {held} and the caller read {EXPECTED} with no cancelled frame; "
            f"reached {found}, got {outcome}",
        )
        target.release_stalled(held)


@covers("MON-004", "MON-005")
@requires(HOST, Capability.MOCK_CLOCK)
def test_a_terminal_flood_cannot_extend_the_drain(target: Target) -> None:
    workers(target, 1, TerminalFlood(interval=1.0))
    host = host_of(target, "MON-004", HostConfig(policy="kv"))
    request = host.route(ROUTE)
    for second in range(1, 5):
        target.advance_time(1.0)
        require_compare(
            "MON-004",
            target.outcome(request),
            "is",
            None,
            f"the worker sends a cancelled frame every second; {second} s after the first the "
            f"5 s drain should still be open, yet the stream ended {target.outcome(request)}",
        )
    target.advance_time(1.0)
    target.advance_time(0.1)
    outcome = target.outcome(request)
    require_compare(
        "MON-004",
        outcome,
        "is not",
        None,
        "5.1 s after the first cancelled frame the stream is still open: the drain deadline "
        "must be armed once, not pushed back by every later frame",
    )
    assert outcome is not None
    require(
        "MON-005",
        outcome.error is None
        and bool(outcome.items)
        and set(finishes(outcome)) == {"cancelled"}
        and not booked(host),
        f"the deadline should deliver cancelled frames only, with no error, and release the "
        f"booking; got {outcome}, bookings {booked(host)}",
    )


@covers("MON-005", "HST-011")
@requires(HOST)
@pytest.mark.parametrize("policy", BOOKING_POLICIES)
def test_end_of_stream_ends_the_drain(target: Target, policy: str) -> None:
    workers(target, 1, TerminalThen(items=2, finish="cancelled", stall=False))
    host = host_of(target, "MON-005", HostConfig(policy=policy))
    started, completed = host.counters()
    outcome, _ = ended(target, host.route(ROUTE), "MON-005")
    require(
        "MON-005",
        finishes(outcome) == [None, None, "cancelled"] and outcome.error is None,
        f"the transport ended right after a cancelled frame: with no time passing the caller "
        f"should read 2 tokens and the cancelled frame, no error; got {outcome}",
    )
    require_false("MON-005", booked(host), f"bookings left after EOF: {booked(host)}")
    require_equal(
        "HST-011",
        host.counters(),
        (started + 1, completed),
        f"a stream that ended cancelled did not finish: counters went from "
        f"{(started, completed)} to {host.counters()}",
    )


# --- MON-006 ---


@covers("MON-006", "MON-001", "HST-011")
@requires(HOST, Capability.SCRIPT_STALL)
@pytest.mark.parametrize("finish", ["stop", "length"])
def test_a_healthy_terminal_does_not_end_the_stream(target: Target, finish: str) -> None:
    (worker,) = workers(target, 1, TerminalThen(items=2, finish=finish, stall=True))
    host = host_of(target, "MON-006", HostConfig())
    started, completed = host.counters()
    request = host.route(ROUTE)
    require_compare(
        "MON-006",
        target.outcome(request),
        "is",
        None,
        f"the worker sent a {finish!r} frame but has not closed its stream; the monitor "
        f"should read on to end of stream, yet the stream ended {target.outcome(request)}",
    )
    target.release_stalled(worker)
    outcome, _ = ended(target, request, "MON-006")
    require(
        "MON-001",
        finishes(outcome) == [None, None, finish] and outcome.error is None,
        f"a {finish!r} frame is healthy and passes through; got {outcome}",
    )
    require_equal(
        "HST-011",
        host.counters(),
        (started + 1, completed + 1),
        f"the stream ended cleanly: counters went from {(started, completed)} to "
        f"{host.counters()}, expected {(started + 1, completed + 1)}",
    )


# --- MON-007 ---


@covers("MON-007")
@requires(HOST, Capability.SCRIPT_STALL, Capability.PACED_READS)
def test_a_stop_between_reads_ends_the_stream_at_the_next_read(target: Target) -> None:
    """The caller took one item and stopped before reading again: its next read ends the
    stream, though the worker's next item is already there."""
    workers(target, 1, Stall(items=2))
    host = host_of(target, "MON-007", HostConfig())
    target.pace_reads(True)
    request = host.route(ROUTE)
    target.read(request)
    host.stop(request)
    target.read(request, 2)
    outcome = target.outcome(request)
    require(
        "MON-007",
        outcome is not None and len(outcome.items) == 1,
        f"the caller read one item, stopped, then read again: the stream should end there "
        f"with the one item; got {outcome if outcome is not None else 'a stream still open'}",
    )


@covers("MON-007", "HST-011")
@requires(HOST, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("policy", BOOKING_POLICIES)
def test_a_client_stop_preempts_the_monitor(target: Target, policy: str) -> None:
    (worker,) = workers(target, 1, CancelThenFail(2, SHUTDOWN_ERROR))
    host = host_of(target, "MON-007", HostConfig(policy=policy))
    started, completed = host.counters()
    route = HostRoute(
        phase="decode", tokens=PROMPT, max_tokens=MAX_TOKENS, staged_kv=True, stopped=True
    )
    outcome, found = ended(target, host.route(route), "MON-007")
    if found != [worker]:
        pytest.fail(f"setup: a stopped decode leg with staged KV should reach {worker}: {found}")
    require(
        "MON-007",
        not outcome.items and outcome.error is None,
        f"the caller had stopped: the stream should end without reading the worker's frames "
        f"(tokens, a cancelled frame, {SHUTDOWN}); got {outcome}",
    )
    require_false("MON-007", booked(host), f"bookings left after the stop: {booked(host)}")
    require_equal(
        "HST-011",
        host.counters()[1],
        completed,
        f"a stream the client stopped did not finish: counters went from "
        f"{(started, completed)} to {host.counters()}",
    )


@covers("MON-007", "HST-011")
@requires(HOST, Capability.SCRIPT_STALL, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("policy", BOOKING_POLICIES)
def test_a_client_stop_during_a_drain_drops_the_withheld_terminal(
    target: Target, policy: str
) -> None:
    (worker,) = workers(
        target, 1, TerminalThen(items=2, finish="cancelled", stall=True, error=SHUTDOWN_ERROR)
    )
    host = host_of(target, "MON-007", HostConfig(policy=policy))
    request = host.route(ROUTE)
    if target.outcome(request) is not None or booked(host) != {worker: 1}:
        pytest.fail(f"setup: the drain should be open and booked: {target.outcome(request)}")
    _, completed = host.counters()
    host.stop(request)
    outcome, _ = ended(target, request, "MON-007")
    target.release_stalled(worker)
    require(
        "MON-007",
        "cancelled" not in finishes(outcome) and outcome.error is None and not outcome.dropped,
        f"the caller's context stopped while a cancelled frame was withheld: the stream should "
        f"end with neither that frame nor the worker's later error; got {outcome}",
    )
    require_false("MON-007", booked(host), f"bookings left after the stop: {booked(host)}")
    require_equal("HST-011", host.counters()[1], completed, f"counted: {host.counters()}")


@covers("MON-007")
@requires(HOST, Capability.SCRIPT_STALL)
@pytest.mark.parametrize("policy", BOOKING_POLICIES)
def test_dropping_a_draining_stream_releases_its_booking(target: Target, policy: str) -> None:
    (worker,) = workers(target, 1, TerminalThen(items=2, finish="cancelled", stall=True))
    host = host_of(target, "MON-007", HostConfig(policy=policy))
    request = host.route(ROUTE)
    if target.outcome(request) is not None or booked(host) != {worker: 1}:
        pytest.fail(f"setup: the drain should be open and booked: {target.outcome(request)}")
    target.drop(request)
    outcome, _ = ended(target, request, "MON-007")
    require(
        "MON-007",
        "cancelled" not in finishes(outcome) and outcome.error is None,
        f"the caller dropped the stream while a cancelled frame was withheld: the frame "
        f"should be dropped with it; got {outcome}",
    )
    bookings: Mapping[int, int] = booked(host)
    require_false("MON-007", bookings, f"bookings left after the drop: {bookings}")
    target.release_stalled(worker)
