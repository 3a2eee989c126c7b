"""Transport (TRN): the final hop's envelope, ACKs, response streams, tombstones and gauges.

Checks that need Dynamo's wire (wire faults, raw bytes, tombstones) ask for
``Capability.WIRE_TRANSPORT``; the others hold for any transport.
"""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    MODE_CAPABILITY,
    finished,
    reached,
    shows,
    shows_outer,
    spec_of,
)
from routespec.testing.target import (
    Adapter,
    Bidirectional,
    Capability,
    Direct,
    ErrorSpec,
    FailBeforeStream,
    FailMidStream,
    Misbehave,
    Outcome,
    Reject,
    Serve,
    Stall,
    Target,
    WireFault,
    WorkerScript,
)

PRE_STREAM_PREFIX = "Worker generate() failed before response stream: "
STREAM_ENDED_EARLY = "Stream ended before generation completed"
CONTROL_LIMIT = 128 * 1024
LABELS: tuple[str | None, ...] = (None, *oracle.TYPE_LABELS)


def indices(outcome: Outcome) -> list[object]:
    return [item.get("index") if isinstance(item, dict) else item for item in outcome.items]


def ends_with_error(outcome: Outcome, requirement: str, message: str, items: int) -> None:
    require(
        requirement,
        outcome.error is not None
        and not outcome.error.pre_stream
        and message in outcome.error.links[0][1]
        and indices(outcome) == list(range(items)),
        f"expected {items} items then an error item containing {message!r}; got {outcome}",
    )


def serves_again(target: Target, worker: int, requirement: str) -> None:
    target.script_worker(worker, Serve(2))
    outcome = finished(target, target.submit(Direct(worker)), requirement)
    require(
        requirement,
        outcome.error is None and indices(outcome) == [0, 1],
        f"worker {worker} no longer serves a plain request: {outcome}",
    )


# --- TRN-001, TRN-003 ---


@covers("TRN-001", "TRN-003")
@requires(Capability.DIRECT)
@pytest.mark.parametrize("items", [0, 1, 5])
def test_an_accepted_request_streams_its_items(
    target: Target, adapter: Adapter, items: int
) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Serve(items))
    request = target.submit(Direct(worker), metadata={"trace": "t" * 300})
    outcome = finished(target, request, "TRN-003")
    deliveries = [d for d in target.dispatch_log() if d.request_id == request]
    require_equal("TRN-003", len(deliveries), 1, f"{request} reached workers {deliveries}")
    if Capability.OBSERVE_PREPARED_TARGET in adapter.capabilities:
        require_equal(
            "TRN-001",
            deliveries[0].prepared_for,
            worker,
            f"the request's metadata should reach worker {worker} with it: {deliveries}",
        )
    require(
        "TRN-003",
        outcome.error is None
        and indices(outcome) == list(range(items))
        and all(isinstance(i, dict) and i.get("request") == request for i in outcome.items),
        f"an accepted request should deliver its {items} items in order; got {outcome}",
    )


# --- TRN-002 ---


@covers("TRN-002")
@requires(Capability.DIRECT, Capability.WIRE_TRANSPORT, Capability.OBSERVE_WORKER_BYTES)
def test_an_oversized_control_message_is_refused_before_sending(target: Target) -> None:
    worker = target.add_worker()
    before = target.worker_bytes(worker)
    huge = {"pad": "x" * (CONTROL_LIMIT + 1)}
    outcome = finished(target, target.submit(Direct(worker), metadata=huge), "TRN-002")
    require(
        "TRN-002",
        outcome.error is not None
        and outcome.error.pre_stream
        and "too large" in outcome.error.links[0][1],
        f"a control message over 128 KiB should fail before the stream naming the limit: {outcome}",
    )
    require(
        "TRN-002",
        target.worker_bytes(worker) == before and not reached(target, "req-1"),
        f"worker {worker} received {target.worker_bytes(worker) - before} bytes of it",
    )
    fits = {"pad": "x" * (CONTROL_LIMIT // 2)}
    outcome = finished(target, target.submit(Direct(worker), metadata=fits), "TRN-002")
    require_compare(
        "TRN-002", outcome.error, "is", None, f"a 64 KiB control message failed: {outcome}"
    )


# --- TRN-004 ---


@covers("TRN-004")
@requires(Capability.DIRECT, Capability.SCRIPT_REJECTION)
@pytest.mark.parametrize("overloaded", [True, False], ids=["overloaded", "unavailable"])
def test_a_rejection_ack_is_a_typed_worker_failure(target: Target, overloaded: bool) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Reject(overloaded=overloaded, message="queue full"))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-004")
    expected = oracle.REJECTION_TYPES[overloaded]
    require(
        "TRN-004",
        outcome.error is not None
        and outcome.error.pre_stream
        and shows(outcome.error, (expected,))
        and "queue full" in outcome.error.links[0][1],
        f"a {'Server overloaded' if overloaded else 'Server unavailable'} ACK should fail "
        f"before the stream with {expected} carrying the worker's text; got {outcome}",
    )


# --- TRN-005, TRN-006 ---

PRE_STREAM_CHAINS = [
    ("InvalidArgument",),
    ("Backend(EngineShutdown)",),
    (None, "Disconnected"),
    ("Cancelled",),
    ("ResourceExhausted",),
    ("Backend(Cancelled)",),
    ("WorkerOverloaded", None, "Cancelled"),
    (None,),
]


@covers("TRN-005", "TRN-006")
@requires(Capability.DIRECT, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("labels", PRE_STREAM_CHAINS, ids=lambda c: "-".join(map(str, c)))
def test_a_failure_before_the_first_item_is_cannot_connect(
    target: Target, labels: tuple[str | None, ...]
) -> None:
    worker = target.add_worker()
    target.script_worker(worker, FailBeforeStream(spec_of(labels)))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-005")
    seen = outcome.error
    require("TRN-005", seen is not None and seen.pre_stream, f"expected a failure: {outcome}")
    assert seen is not None
    if seen.types_observed:
        require_false(
            "TRN-006",
            set(seen.typed_chain) & oracle.MIGRATION_SENSITIVE_TYPES,
            f"the worker failed with {labels}; the caller's chain {seen.describe()} carries a "
            "migration-sensitive type",
        )
    expected = oracle.pre_stream_chain(labels)
    require(
        "TRN-005",
        (tuple(label for label, _ in seen.links) == expected or not seen.types_observed)
        and shows(seen, expected)
        and seen.links[0][1].startswith(PRE_STREAM_PREFIX),
        f"the worker failed with {labels}; expected CannotConnect {PRE_STREAM_PREFIX!r}… "
        f"over {expected[1:] or 'no cause'}; got {seen.describe()}",
    )


@covers("TRN-006")
@requires(
    Capability.DIRECT,
    Capability.SCRIPT_FAILURES,
    Capability.MOCK_CLOCK,
    Capability.OBSERVE_ERROR_TYPES,
)
def test_no_pre_stream_failure_carries_a_sensitive_type(target: Target) -> None:
    """Every chain of one or two links, each link any type or untyped."""
    worker = target.add_worker()
    for labels in itertools.chain(
        ((label,) for label in LABELS), itertools.product(LABELS, repeat=2)
    ):
        target.script_worker(worker, FailBeforeStream(spec_of(labels)))
        outcome = finished(target, target.submit(Direct(worker)), "TRN-006")
        typed = set() if outcome.error is None else set(outcome.error.typed_chain)
        require(
            "TRN-006",
            outcome.error is not None and not typed & oracle.MIGRATION_SENSITIVE_TYPES,
            f"the worker failed with {labels} before the stream; the caller saw {outcome}",
        )


# --- TRN-007 ---


@covers("TRN-007")
@requires(Capability.DIRECT, Capability.SCRIPT_FAILURES, Capability.SCRIPT_STALL)
def test_every_stream_ends_in_completion_or_one_error(target: Target) -> None:
    worker = target.add_worker()
    for items in range(4):
        target.script_worker(worker, Serve(items))
        outcome = finished(target, target.submit(Direct(worker)), "TRN-007")
        require(
            "TRN-007",
            outcome.error is None and indices(outcome) == list(range(items)),
            f"Serve({items}) ended {outcome}",
        )
        target.script_worker(worker, FailMidStream(items, ErrorSpec("InvalidArgument")))
        outcome = finished(target, target.submit(Direct(worker)), "TRN-007")
        ends_with_error(outcome, "TRN-007", "injected", items)
    target.script_worker(worker, Stall(items=1, items_after=2))
    request = target.submit(Direct(worker))
    require_compare("TRN-007", target.outcome(request), "is", None, "a stalled stream ended early")
    target.release_stalled(worker)
    outcome = finished(target, request, "TRN-007")
    require(
        "TRN-007",
        outcome.error is None and indices(outcome) == [0, 1, 2],
        f"a released stall should complete with 3 items: {outcome}",
    )


# --- TRN-008, TRN-009, TRN-010 (wire faults) ---


@covers("TRN-008")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
@pytest.mark.parametrize("items", [0, 2])
def test_end_of_stream_before_final_is_disconnected(target: Target, items: int) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Misbehave(items, WireFault.EOF_BEFORE_FINAL))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-008")
    ends_with_error(outcome, "TRN-008", "Stream ended before generation completed", items)
    require(
        "TRN-008",
        shows_outer(outcome.error, "Disconnected"),
        f"expected Disconnected: {outcome}",
    )


@covers("TRN-009")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
def test_a_frame_after_final_is_an_error_item(target: Target) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Misbehave(2, WireFault.FRAME_AFTER_FINAL))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-009")
    ends_with_error(outcome, "TRN-009", "Response received after generation ended", 2)


@covers("TRN-010")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
@pytest.mark.parametrize(
    ("fault", "message"),
    # The spec fixes the text of the empty-frame item only; any error item will do for garbage.
    [(WireFault.EMPTY_FRAME, "Empty response received"), (WireFault.GARBLED_FRAME, "")],
    ids=["empty", "garbled"],
)
def test_an_empty_or_undecodable_frame_is_an_error_item(
    target: Target, fault: WireFault, message: str
) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Misbehave(1, fault))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-010")
    ends_with_error(outcome, "TRN-010", message, 1)


# --- TRN-011 ---

ITEM_CHAINS = [
    ("Backend(EngineShutdown)",),
    ("Disconnected", None, "Backend(StreamIncomplete)"),
    ("WorkerOverloaded", "ResourceExhausted"),
    (None, "Cancelled"),
    ("Unknown",),
    ("InvalidArgument", "Backend(InvalidArgument)", "Unavailable", "WorkerUnavailable"),
]


@covers("TRN-011")
@requires(Capability.DIRECT, Capability.SCRIPT_FAILURES, Capability.OBSERVE_ERROR_TYPES)
@pytest.mark.parametrize("labels", ITEM_CHAINS, ids=lambda c: "-".join(map(str, c)))
def test_error_items_keep_their_chain(target: Target, labels: tuple[str | None, ...]) -> None:
    worker = target.add_worker()
    target.script_worker(worker, FailMidStream(1, spec_of(labels)))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-011")
    expected = tuple((label, f"link {depth}") for depth, label in enumerate(labels))
    require(
        "TRN-011",
        outcome.error is not None and outcome.error.links == expected,
        f"the worker's error item {expected} reached the caller as "
        f"{outcome.error.describe() if outcome.error else outcome}",
    )


# --- TRN-012 ---

PREFIXES = [
    struct.pack(">H", 0xFFFF),  # a path length with nothing behind it
    struct.pack(">H", 1) + b"p" + struct.pack(">H", 2) + b"{}" + struct.pack(">I", 0xFFFFFFFF),
    struct.pack(">QQQ", 2**63, 2**63, 0),  # a two-part message declaring exabytes
]
raw_bytes = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda p, tail: p + tail, st.sampled_from(PREFIXES), st.binary(max_size=64)),
)


@covers("TRN-012")
@requires(Capability.DIRECT, Capability.WIRE_TRANSPORT)
@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=raw_bytes, to_worker=st.booleans())
def test_bad_bytes_close_only_their_connection(
    target: Target, data: bytes, to_worker: bool
) -> None:
    workers = [d.worker_id for d in target.dispatch_log()]
    worker = workers[0] if workers else target.add_worker()
    target.send_raw(worker if to_worker else None, data)
    serves_again(target, worker, "TRN-012")


# --- TRN-013, TRN-014 ---


@covers("TRN-013")
@requires(
    Capability.DIRECT,
    Capability.ANNOUNCE_REMOVAL,
    Capability.OBSERVE_WORKER_BYTES,
)
def test_a_tombstoned_instance_is_never_written_to(target: Target) -> None:
    worker = target.add_worker()
    target.announce_removal(worker, True)
    before = target.worker_bytes(worker)
    outcome = finished(target, target.submit(Direct(worker)), "TRN-013")
    require(
        "TRN-013",
        outcome.error is not None
        and outcome.error.pre_stream
        and shows_outer(outcome.error, "Disconnected")
        and "tombstoned" in outcome.error.links[0][1],
        f"a dispatch to tombstoned worker {worker} should fail with Disconnected: {outcome}",
    )
    require_equal(
        "TRN-013",
        target.worker_bytes(worker),
        before,
        f"tombstoned worker {worker} received {target.worker_bytes(worker) - before} bytes",
    )
    target.announce_removal(worker, False)
    serves_again(target, worker, "TRN-013")


@covers("TRN-014")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
@pytest.mark.parametrize(
    "how",
    [
        pytest.param("removed", marks=pytest.mark.requires(Capability.ANNOUNCE_REMOVAL)),
        pytest.param("killed", marks=pytest.mark.requires(Capability.KILL_WORKER)),
    ],
)
def test_removal_fails_pending_registrations(target: Target, how: str) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Misbehave(0, WireFault.NO_CALL_HOME))
    request = target.submit(Direct(worker))
    require_compare(
        "TRN-014", target.outcome(request), "is", None, "the request ended before the test"
    )
    if how == "removed":
        target.announce_removal(worker, True)
    else:
        target.kill_worker(worker)
    outcome = finished(target, request, "TRN-014")
    require(
        "TRN-014",
        outcome.error is not None
        and outcome.error.pre_stream
        and shows_outer(outcome.error, "Disconnected")
        and "before response stream was established" in outcome.error.links[0][1],
        f"a request waiting for worker {worker}'s stream should fail with Disconnected when "
        f"the worker is {how}: {outcome}",
    )


# --- TRN-015, TRN-016, TRN-017 ---


@covers("TRN-015")
@requires(
    Capability.DIRECT,
    Capability.OBSERVE_INFLIGHT,
    Capability.SCRIPT_FAILURES,
    Capability.SCRIPT_STALL,
    Capability.SCRIPT_REJECTION,
    Capability.KILL_WORKER,
)
def test_the_inflight_gauge_returns_to_zero_on_every_path(target: Target) -> None:
    worker, spare = target.add_worker(), target.add_worker()
    paths: dict[str, WorkerScript] = {
        "completion": Serve(2),
        "an error item": FailMidStream(1, ErrorSpec("InvalidArgument")),
        "a pre-stream failure": FailBeforeStream(ErrorSpec("InvalidArgument")),
        "a rejection": Reject(overloaded=False),
    }
    for path, script in paths.items():
        target.script_worker(spare, script)
        finished(target, target.submit(Direct(spare)), "TRN-015")
        require_equal("TRN-015", target.transport_inflight(), 0, f"after {path}: gauge not zero")
    target.script_worker(worker, Stall(items=1))
    dropped, killed = target.submit(Direct(worker)), target.submit(Direct(worker))
    require_equal("TRN-015", target.transport_inflight(), 2, "two open streams should count 2")
    target.drop(dropped)
    require_equal("TRN-015", target.transport_inflight(), 1, "a dropped stream still counts")
    target.kill_worker(worker)
    finished(target, killed, "TRN-015")
    require_equal(
        "TRN-015", target.transport_inflight(), 0, "a killed worker's stream still counts"
    )


@covers("TRN-016")
@requires(Capability.DIRECT, Capability.SCRIPT_STALL, Capability.KILL_WORKER)
def test_a_killed_worker_is_detected_without_a_timeout(target: Target) -> None:
    """No time passes (the mock clock is never advanced): the connection's end is the signal."""
    worker = target.add_worker()
    target.script_worker(worker, Stall(items=2))
    request = target.submit(Direct(worker))
    target.kill_worker(worker)
    outcome = finished(target, request, "TRN-016")
    ends_with_error(outcome, "TRN-016", "", 2)
    require(
        "TRN-016",
        shows_outer(outcome.error, "Disconnected"),
        f"a killed worker's stream should end with Disconnected: {outcome}",
    )


@covers("TRN-016")
@requires(Capability.DIRECT, Capability.KILL_WORKER_PROCESS)
def test_a_killed_worker_process_is_detected_without_a_timeout(
    target: Target, adapter: Adapter
) -> None:
    """The worker is a separate OS process killed with SIGKILL: nothing in it runs to say
    goodbye, and the mock clock is never advanced; the kernel closing its sockets is the signal."""
    worker = target.add_worker_process(Stall(items=2))
    request = target.submit(Direct(worker))
    require_compare(
        "TRN-016",
        target.outcome(request),
        "is",
        None,
        f"the stalled stream ended before the kill: {target.outcome(request)}",
    )
    target.kill_worker(worker)
    outcome = finished(target, request, "TRN-016")
    ends_with_error(outcome, "TRN-016", STREAM_ENDED_EARLY, 2)
    require(
        "TRN-016",
        shows_outer(outcome.error, "Disconnected"),
        f"a killed worker process's stream should end with Disconnected: {outcome}",
    )
    if Capability.OBSERVE_INFLIGHT in adapter.capabilities:
        require_equal(
            "TRN-016",
            target.transport_inflight(),
            0,
            "the killed worker process's stream is still counted in flight",
        )


@covers("TRN-017")
@requires(Capability.DIRECT, Capability.SCRIPT_STALL)
def test_a_dropped_stream_stops_the_worker(target: Target, adapter: Adapter) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Stall(items=1, items_after=3))
    request = target.submit(Direct(worker))
    target.drop(request)
    target.release_stalled(worker)
    outcome = finished(target, request, "TRN-017")
    require(
        "TRN-017",
        outcome.dropped and outcome.error is None and indices(outcome) == [0],
        f"a dropped stream should end for the caller without an error: {outcome}",
    )
    if Capability.OBSERVE_INFLIGHT in adapter.capabilities:
        require_equal(
            "TRN-017",
            target.transport_inflight(),
            0,
            "the dropped stream is still in flight after the worker was released",
        )
    serves_again(target, worker, "TRN-017")


# --- TRN-018, TRN-019 ---

RETAINED_LIMIT = 1024


@covers("TRN-018")
@requires(
    Capability.DIRECT,
    Capability.FIRST_RESPONSE_GUARD,
    Capability.SCRIPT_STALL,
    Capability.SCRIPT_FAILURES,
)
def test_the_guard_is_held_until_the_first_item(target: Target) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Stall(items=0, items_after=2))
    request = target.submit(Direct(worker), guarded=True)
    require_equal("TRN-018", target.held_guards(), 1, "the guard was released before any item")
    target.drop(request)
    require_equal(
        "TRN-018",
        target.held_guards(),
        1,
        "the caller abandoned the request and the guard was released before the first item",
    )
    target.release_stalled(worker)
    require_equal("TRN-018", target.held_guards(), 0, "the first item came; the guard is held")
    outcome = finished(target, request, "TRN-018")
    require("TRN-018", outcome.dropped and not outcome.items, f"dropped request: {outcome}")
    for script in (Serve(3), FailBeforeStream(ErrorSpec("InvalidArgument")), Serve(0)):
        target.script_worker(worker, script)
        outcome = finished(target, target.submit(Direct(worker), guarded=True), "TRN-018")
        require(
            "TRN-018",
            target.held_guards() == 0 and len(outcome.items) == getattr(script, "items", 0),
            f"after a guarded request under {script} ended ({outcome}), "
            f"{target.held_guards()} guards are held",
        )


@covers("TRN-019")
@requires(Capability.DIRECT, Capability.FIRST_RESPONSE_GUARD, Capability.SCRIPT_STALL)
def test_retained_dispatches_are_bounded(target: Target) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Stall(items=0, items_after=1))
    retained = [target.submit(Direct(worker), guarded=True) for _ in range(RETAINED_LIMIT)]
    require_equal(
        "TRN-019",
        target.held_guards(),
        RETAINED_LIMIT,
        f"{RETAINED_LIMIT} stalled guarded requests hold {target.held_guards()} guards",
    )
    outcome = finished(target, target.submit(Direct(worker), guarded=True), "TRN-019")
    require(
        "TRN-019",
        outcome.error is not None
        and outcome.error.pre_stream
        and shows(outcome.error, ("ResourceExhausted",))
        and "retained request dispatch limit reached" in outcome.error.links[0][1],
        f"guarded request {RETAINED_LIMIT + 1} should fail with ResourceExhausted: {outcome}",
    )
    require_equal("TRN-019", target.held_guards(), RETAINED_LIMIT, "the refused guard is held")
    target.release_stalled(worker)
    ended = [target.outcome(request) for request in retained]
    require(
        "TRN-019",
        target.held_guards() == 0 and all(o is not None and o.error is None for o in ended),
        f"after release, {target.held_guards()} guards held; "
        f"{sum(o is None for o in ended)} requests still open",
    )
    target.script_worker(worker, Serve(1))
    outcome = finished(target, target.submit(Direct(worker), guarded=True), "TRN-019")
    require_compare(
        "TRN-019", outcome.error, "is", None, f"the bound did not free its slots: {outcome}"
    )


# --- TRN-020, TRN-021 ---


@covers("TRN-020")
@requires(Capability.BIDIRECTIONAL, Capability.ROUND_ROBIN, Capability.RANDOM)
@pytest.mark.parametrize("mode", ["round-robin", "random"])
@pytest.mark.parametrize("inputs", [0, 1, 4])
def test_a_bidirectional_request_streams_its_items_to_one_worker(
    target: Target, mode: str, inputs: int
) -> None:
    workers = [target.add_worker() for _ in range(3)]
    for worker in workers:
        target.script_worker(worker, Serve(2))
    request = target.submit(Bidirectional(mode, inputs))
    outcome = finished(target, request, "TRN-020")
    delivered = reached(target, request)
    require_equal("TRN-020", len(delivered), 1, f"the request reached {delivered}, not one worker")
    echoed = [i.get("input") for i in outcome.items if isinstance(i, dict) and "input" in i]
    answering = {i.get("worker") for i in outcome.items if isinstance(i, dict)}
    require(
        "TRN-020",
        outcome.error is None
        and echoed == list(range(inputs))
        and indices(outcome)[inputs:] == [0, 1]
        and answering <= set(delivered),
        f"worker {delivered} should have received inputs 0..{inputs - 1} in order and answered "
        f"them, then its 2 items; the caller saw {outcome}",
    )


@covers("TRN-021")
@requires(Capability.BIDIRECTIONAL)
@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(mode, marks=pytest.mark.requires(MODE_CAPABILITY[mode]), id=mode)
        for mode in ("power-of-two-choices", "least-loaded", "device-aware-weighted")
    ],
)
def test_bidirectional_dispatch_refuses_other_modes(target: Target, mode: str) -> None:
    target.add_worker()
    request = target.submit(Bidirectional(mode, 2))
    outcome = finished(target, request, "TRN-021")
    require(
        "TRN-021",
        outcome.error is not None
        and outcome.error.pre_stream
        and shows(outcome.error, ("InvalidArgument",))
        and "not yet supported for bidirectional dispatch" in outcome.error.links[0][1]
        and not reached(target, request),
        f"a streamed request in mode {mode} should be refused with InvalidArgument before "
        f"reaching a worker; got {outcome}",
    )
