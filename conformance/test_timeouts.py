"""Timeouts (TMO): every stage of a dispatch has a deadline with a finite default, and each
expiry is a typed failure that inhibits the worker and lets migration move on.

A worker goes silent at one stage: at the connect, after reading the request (no ACK), after
the ACK (no dial-back), after the handshake (no prologue) — those need Dynamo's wire and
``Silent`` scripts — or after its prologue or some items (``Stall``), which any transport
has. The suite's clock then moves to just under the stage's deadline, where the request must
still be open, and just past it. Deadlines are whole seconds and the margin a binary
fraction, so the boundaries are exact on the mock clock.
"""

from __future__ import annotations

import math
import re
import sys
import time

import attrs
import pytest

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
    built,
    finished,
    reached,
    refusal,
    shows,
    shows_outer,
    tokens,
)
from routespec.testing.target import (
    Adapter,
    Capability,
    Direct,
    ErrorSpec,
    FailBeforeStream,
    Migrate,
    Misbehave,
    Outcome,
    Reject,
    Serve,
    Silent,
    SilentStage,
    Stall,
    Target,
    TargetConfig,
    Timeouts,
    Trickle,
    WireFault,
    WorkerScript,
)

# The defaults the spec states (spec/timeouts.md).
CONNECT, ACK, ESTABLISH, FIRST_ITEM, INACTIVITY = 5.0, 5.0, 30.0, 600.0, 300.0
EARLY = 0.125  # how long before its deadline a request must still be open
TIMEOUT_TYPES = ("ConnectionTimeout", "ResponseTimeout")
PROMPT, MAX_TOKENS = 4, 6
EXPECTED = list(range(PROMPT, PROMPT + MAX_TOKENS))


@attrs.frozen
class Stage:
    """A worker silent at one stage of a dispatch, and what the caller must see."""

    name: str
    script: WorkerScript
    requirement: str
    deadline: float  # the spec's default
    field: str  # the ``Timeouts`` field that sets it
    custom: float  # a value TMO-010 sets it to
    error: str
    pre_stream: bool
    items: int  # data items the worker sent before its silence
    capability: Capability

    @property
    def reaches_worker(self) -> bool:
        """Whether the request's bytes reach the silent worker at all."""
        return not (isinstance(self.script, Silent) and self.script.stage is SilentStage.CONNECT)

    @property
    def releasable(self) -> bool:
        return self.reaches_worker

    def param(self) -> object:
        return pytest.param(self, marks=pytest.mark.requires(self.capability), id=self.name)


WIRE = Capability.SCRIPT_SILENCE
CONN, RESP = "ConnectionTimeout", "ResponseTimeout"
STAGES = (
    Stage("connect", Silent(SilentStage.CONNECT), "TMO-001", CONNECT, "connect", 1.5, CONN,
          True, 0, WIRE),
    Stage("ack", Silent(SilentStage.ACK), "TMO-002", ACK, "ack", 2.5, CONN, True, 0, WIRE),
    Stage("dial-back", Silent(SilentStage.DIAL_BACK), "TMO-003", ESTABLISH, "establish", 4.0,
          CONN, True, 0, WIRE),
    Stage("handshake", Silent(SilentStage.HANDSHAKE), "TMO-003", ESTABLISH, "establish", 4.0,
          CONN, True, 0, WIRE),
    Stage("first-item", Stall(0, 1), "TMO-004", FIRST_ITEM, "first_item", 7.0, RESP, False, 0,
          Capability.SCRIPT_STALL),
    Stage("mid-stream", Stall(2, 1), "TMO-005", INACTIVITY, "inactivity", 3.0, RESP, False, 2,
          Capability.SCRIPT_STALL),
)  # fmt: skip
STAGE_PARAMS = [stage.param() for stage in STAGES]
RELEASABLE_PARAMS = [stage.param() for stage in STAGES if stage.releasable]


def indices(outcome: Outcome) -> list[object]:
    return [item.get("index") if isinstance(item, dict) else item for item in outcome.items]


def silent_worker(target: Target, stage: Stage) -> int:
    worker = target.add_worker()
    target.script_worker(worker, stage.script)
    return worker


def still_open(target: Target, request: str, stage: Stage, deadline: float) -> None:
    outcome = target.outcome(request)
    require_compare(
        stage.requirement,
        outcome,
        "is",
        None,
        f"a worker silent at the {stage.name} stage: the request ended {deadline - EARLY} s "
        f"in, before its {deadline} s deadline",
    )


def timed_out(target: Target, request: str, stage: Stage, deadline: float) -> Outcome:
    outcome = finished(target, request, stage.requirement)
    where = "before any stream" if stage.pre_stream else f"as an error item after {stage.items}"
    require(
        stage.requirement,
        outcome.error is not None
        and outcome.error.pre_stream == stage.pre_stream
        and shows_outer(outcome.error, stage.error)
        and indices(outcome) == list(range(stage.items)),
        f"a worker silent at the {stage.name} stage: {deadline} s on, the request should have "
        f"ended with {stage.error} {where} items; got {outcome}",
        expected=f"{stage.error} {where} items",
        actual=outcome,
    )
    return outcome


def inhibited(target: Target, adapter: Adapter, worker: int, stage: Stage) -> None:
    if Capability.OBSERVE_WORKER_SETS not in adapter.capabilities:
        return
    routable = target.worker_sets().routable
    require_compare(
        "TMO-006",
        worker,
        "not in",
        routable,
        f"worker {worker} went silent at the {stage.name} stage and the deadline fired, yet it "
        "is still routable: the timeout did not report it down",
    )


# --- TMO-001 … TMO-006: each stage, just under and just past its default ---


@covers("TMO-001", "TMO-002", "TMO-003", "TMO-004", "TMO-005", "TMO-006", "TRN-015")
@requires(Capability.DIRECT, Capability.MOCK_CLOCK)
@pytest.mark.parametrize("stage", STAGE_PARAMS)
def test_a_silent_stage_ends_at_its_deadline(
    target: Target, adapter: Adapter, stage: Stage
) -> None:
    worker = silent_worker(target, stage)
    request = target.submit(Direct(worker))
    target.advance_time(stage.deadline - EARLY)
    still_open(target, request, stage, stage.deadline)
    target.advance_time(2 * EARLY)
    timed_out(target, request, stage, stage.deadline)
    inhibited(target, adapter, worker, stage)
    if Capability.OBSERVE_INFLIGHT in adapter.capabilities:
        require_equal(
            "TRN-015",
            target.transport_inflight(),
            0,
            f"the request that timed out at the {stage.name} stage is still counted in flight",
        )


@covers("TMO-002")
@requires(Capability.DIRECT, Capability.MOCK_CLOCK, Capability.SCRIPT_SILENCE)
def test_the_ack_deadline_counts_from_the_latest_ack(target: Target) -> None:
    """A busy worker ACKs late but keeps ACKing: each ACK on the connection restarts the
    count for the requests behind it. Here the worker holds its first request 4.875 s, then
    the second; the second, sent at 3 s, must last until 5 s after the first's ACK."""
    worker = target.add_worker()
    target.script_worker(worker, Silent(SilentStage.ACK))
    first = target.submit(Direct(worker))
    target.advance_time(3.0)
    second = target.submit(Direct(worker))  # written behind the first, on the same connection
    target.advance_time(ACK - EARLY - 3.0)
    target.release_stalled(worker)  # the first is ACKed and served; the second is held
    outcome = finished(target, first, "TMO-002")
    require(
        "TMO-002",
        outcome.error is None and indices(outcome) == [0],
        f"worker {worker} ACKed {first} {ACK - EARLY} s after it was sent and served it; "
        f"got {outcome}",
    )
    acked_at = ACK - EARLY
    target.advance_time(3.0 + ACK - acked_at + EARLY)  # past 5 s after the second was sent
    require_compare(
        "TMO-002",
        target.outcome(second),
        "is",
        None,
        f"{second} was sent at 3 s and an ACK came at {acked_at} s: it must wait until "
        f"{acked_at + ACK} s, but ended at {3.0 + ACK + EARLY} s",
    )
    target.advance_time(acked_at + ACK - (3.0 + ACK + EARLY) - EARLY)
    require_compare(
        "TMO-002",
        target.outcome(second),
        "is",
        None,
        f"{second} ended before {acked_at + ACK} s, {ACK} s after the connection's latest ACK",
    )
    target.advance_time(2 * EARLY)
    timed_out(target, second, STAGES[1], acked_at + ACK)


@covers("TMO-002", "TMO-010")
@requires(
    Capability.DIRECT,
    Capability.MOCK_CLOCK,
    Capability.CONFIGURE_TIMEOUTS,
    Capability.SCRIPT_SILENCE,
)
def test_a_reused_connection_keeps_the_routers_ack_deadline(open_target: OpenTarget) -> None:
    """The router's own ACK deadline holds for a request written on a connection an earlier
    request opened, as for one that opens it; the request is open just before the deadline
    and has failed at it (the clock moves in binary fractions, so the instant is exact)."""
    deadline = STAGES[1].custom
    config = TargetConfig(timeouts=Timeouts(ack=deadline))
    with built(open_target, config, "TMO-010") as target:
        worker = target.add_worker()
        served = finished(target, target.submit(Direct(worker)), "TMO-002")
        require(
            "TMO-002",
            served.error is None,
            f"worker {worker} should serve a plain request first: {served}",
        )
        target.script_worker(worker, Silent(SilentStage.ACK))
        request = target.submit(Direct(worker))  # on the connection the first one opened
        target.advance_time(deadline - EARLY)
        still_open(target, request, attrs.evolve(STAGES[1], requirement="TMO-010"), deadline)
        target.advance_time(EARLY)
        timed_out(target, request, STAGES[1], deadline)


@covers("TMO-002", "TRN-015")
@requires(
    Capability.DIRECT, Capability.MOCK_CLOCK, Capability.SCRIPT_SILENCE, Capability.OBSERVE_INFLIGHT
)
@pytest.mark.parametrize("answered", [False, True], ids=["silent", "released"])
def test_requests_queued_behind_a_full_connection_time_out_typed(
    target: Target, answered: bool
) -> None:
    """A worker reads one request and then nothing more: the 120 requests sent behind it
    (15 MiB, more than the sockets between them buffer) are written as far as the connection
    takes them and the rest wait to be written; at the ACK deadline every one of them fails
    with ``ConnectionTimeout``, written or not, and nothing stays counted in flight. If the
    worker is instead released before the deadline, it reads on, and every request, those
    written late in batches included, is served."""
    worker = target.add_worker()
    target.script_worker(worker, Silent(SilentStage.ACK))
    pad = {"pad": "x" * (127 * 1024)}
    requests = [target.submit(Direct(worker), metadata=pad) for _ in range(121)]
    if answered:
        target.script_worker(worker, Serve(1))
        target.advance_time(ACK / 2)
        target.release_stalled(worker)
        for request in requests:
            outcome = finished(target, request, "TMO-002")
            require(
                "TMO-002",
                outcome.error is None and indices(outcome) == [0],
                f"worker {worker} read on before the ACK deadline: {request} should be served",
                expected="item [0], no error",
                actual=outcome.error.describe() if outcome.error else outcome,
            )
        require_equal("TRN-015", target.transport_inflight(), 0, "served requests still count")
        return
    target.advance_time(ACK)
    for request in requests:
        outcome = finished(target, request, "TMO-002")
        require(
            "TMO-002",
            outcome.error is not None
            and outcome.error.pre_stream
            and shows_outer(outcome.error, CONN),
            f"{request}, sent behind a request worker {worker} never answered, should fail "
            f"with {CONN} at the ACK deadline",
            expected=f"{CONN} before the stream",
            actual=outcome.error.describe() if outcome.error else outcome,
        )
    require_equal(
        "TRN-015", target.transport_inflight(), 0, "timed-out requests still count in flight"
    )


@covers("TMO-005")
@requires(Capability.DIRECT, Capability.MOCK_CLOCK, Capability.SCRIPT_TRICKLE)
def test_inactivity_restarts_with_every_item(target: Target) -> None:
    worker = target.add_worker()
    interval = 0.75 * INACTIVITY
    target.script_worker(worker, Trickle(items=4, interval=interval))
    request = target.submit(Direct(worker))
    for step in range(3):
        require_compare(
            "TMO-005",
            target.outcome(request),
            "is",
            None,
            f"a worker answering every {interval} s ended after {step} intervals",
        )
        target.advance_time(interval)
    outcome = finished(target, request, "TMO-005")
    require(
        "TMO-005",
        outcome.error is None and indices(outcome) == [0, 1, 2, 3],
        f"items {interval} s apart ({3 * interval} s in all, more than the {INACTIVITY} s "
        f"inactivity timeout) must all arrive and end cleanly; got {outcome}",
        expected="items [0, 1, 2, 3], no error",
        actual=outcome,
    )


@covers("TMO-005")
@requires(Capability.DIRECT, Capability.MOCK_CLOCK, Capability.PACED_READS)
def test_an_item_taken_from_the_buffer_starts_the_inactivity_deadline(target: Target) -> None:
    """The first item was already waiting when the caller read it: the caller's next read is
    under the inactivity deadline, not the first item's."""
    worker = target.add_worker()
    target.script_worker(worker, Stall(items=1))
    target.pace_reads(True)
    request = target.submit(Direct(worker))
    target.advance_time(1.0)  # the first item arrives and waits for the caller
    target.read(request, 2)  # the item, then a read that waits for the next
    target.advance_time(INACTIVITY - EARLY)
    require_compare(
        "TMO-005",
        target.outcome(request),
        "is",
        None,
        f"the stream ended {INACTIVITY - EARLY} s after its first item was read",
    )
    target.advance_time(2 * EARLY)
    outcome = finished(target, request, "TMO-005")
    require(
        "TMO-005",
        indices(outcome) == [0] and shows(outcome.error, ("ResponseTimeout",)),
        f"after its first item, taken from the buffer, a worker silent for {INACTIVITY} s "
        f"(the inactivity timeout; the first item's is {FIRST_ITEM} s) must end the stream "
        f"with ResponseTimeout; got {outcome}",
    )


@covers("TMO-005", "TRN-007")
@requires(
    Capability.DIRECT,
    Capability.MOCK_CLOCK,
    Capability.CONFIGURE_TIMEOUTS,
    Capability.SCRIPT_WIRE_FAULTS,
)
def test_a_stream_past_its_final_frame_does_not_time_out(open_target: OpenTarget) -> None:
    """``complete_final`` came, and the sentinel after it comes later than a short
    inactivity deadline: the answer was complete, so the stream completes, by that deadline
    rather than at the late sentinel; a timeout here would make migration repeat a finished
    request."""
    inactivity = 0.0625
    with built(open_target, TargetConfig(timeouts=Timeouts(inactivity=inactivity)), "TMO-005") as (
        target
    ):
        worker = target.add_worker()
        target.script_worker(worker, Misbehave(2, WireFault.LATE_SENTINEL))
        request = target.submit(Direct(worker))
        target.advance_time(0.08)  # past the inactivity deadline; the sentinel comes at 0.1 s
        outcome = target.outcome(request)
        require(
            "TMO-005",
            outcome is not None and outcome.error is None and indices(outcome) == [0, 1],
            f"worker {worker} sent two items and complete_final, its sentinel 0.1 s later, "
            f"past the {inactivity} s inactivity deadline: 0.08 s in, the stream should have "
            f"completed with the two items; got {outcome or 'a stream still open'}",
        )
        target.advance_time(0.02)  # the late sentinel comes and changes nothing
        require_equal("TMO-005", target.outcome(request), outcome, "after the late sentinel")


# --- TMO-006, TMO-007: the timed-out attempt migrates ---


@covers("TMO-006", "TMO-007")
@requires(Capability.MIGRATION, Capability.MOCK_CLOCK)
@pytest.mark.parametrize("stage", STAGE_PARAMS)
def test_a_timed_out_attempt_migrates(target: Target, adapter: Adapter, stage: Stage) -> None:
    silent = silent_worker(target, stage)
    spare = target.add_worker()
    target.script_worker(spare, Serve())
    request = target.submit(Migrate(limit=1, prompt=PROMPT, max_tokens=MAX_TOKENS))
    target.advance_time(stage.deadline - EARLY)
    require(
        "TMO-007",
        target.outcome(request) is None and spare not in reached(target, request),
        f"worker {silent} is silent at the {stage.name} stage: before the {stage.deadline} s "
        f"deadline the request must wait for it; reached {reached(target, request)}, "
        f"outcome {target.outcome(request)}",
    )
    target.advance_time(2 * EARLY)
    outcome = finished(target, request, "TMO-007")
    attempts = [silent, spare] if stage.reaches_worker else [spare]
    require(
        "TMO-007",
        outcome.error is None
        and tokens(outcome) == EXPECTED
        and reached(target, request) == attempts,
        f"worker {silent} went silent at the {stage.name} stage after {stage.items} tokens: the "
        f"request should finish on {spare} with exactly the tokens {EXPECTED}; reached "
        f"{reached(target, request)}, got {outcome}",
        expected=f"tokens {EXPECTED} from attempts on {attempts}",
        actual=f"tokens {tokens(outcome)}, error {outcome.error}, attempts "
        f"{reached(target, request)}",
    )
    inhibited(target, adapter, silent, stage)


# --- TMO-008 ---


@covers("TMO-008")
@requires(Capability.DIRECT, Capability.MOCK_CLOCK)
@pytest.mark.parametrize("stage", RELEASABLE_PARAMS)
def test_late_answers_are_discarded(target: Target, stage: Stage) -> None:
    """After the deadline, the next request goes out while the worker is still silent (behind
    the abandoned one on the same connection, for a worker silent at its ACK); then the worker
    wakes and answers both, the abandoned request first."""
    worker = silent_worker(target, stage)
    abandoned = target.submit(Direct(worker))
    target.advance_time(stage.deadline + EARLY)
    before = timed_out(target, abandoned, stage, stage.deadline)
    target.script_worker(worker, Serve(2))
    waiting = target.submit(Direct(worker))
    target.release_stalled(worker)  # the late ACK, dial-back, prologue or items now come
    require_equal(
        "TMO-008",
        target.outcome(abandoned),
        before,
        f"worker {worker} answered {abandoned} after the {stage.name} deadline and the "
        "caller saw it",
    )
    for request in (waiting, target.submit(Direct(worker))):
        outcome = finished(target, request, "TMO-008")
        require(
            "TMO-008",
            outcome.error is None
            and indices(outcome) == [0, 1]
            and all(isinstance(i, dict) and i.get("request") == request for i in outcome.items),
            f"after a late answer to {abandoned}, request {request} to worker {worker} should "
            f"get its own 2 items; got {outcome}",
            expected=f"items 0, 1 of {request}",
            actual=outcome,
        )


# --- TMO-009 ---


@covers("TMO-009")
@requires(Capability.DIRECT, Capability.MOCK_CLOCK)
def test_no_request_waits_forever_by_default(target: Target, adapter: Adapter) -> None:
    """On a target opened with the default config, a request to a worker silent at any stage
    the adapter can stage ends with a typed timeout by that stage's stated default."""
    stages = [stage for stage in STAGES if stage.capability in adapter.capabilities]
    if not stages:
        pytest.skip("the adapter can make no worker silent (worker:script-stall)")
    requests: dict[str, str] = {}
    for stage in stages:
        requests[stage.name] = target.submit(Direct(silent_worker(target, stage)))
    now = 0.0
    for deadline in sorted({stage.deadline for stage in stages}):
        target.advance_time(deadline + EARLY - now)
        now = deadline + EARLY
        for stage in stages:
            if stage.deadline > deadline:
                continue
            outcome = target.outcome(requests[stage.name])
            error = None if outcome is None else outcome.error
            require(
                "TMO-009",
                error is not None and any(shows_outer(error, t) for t in TIMEOUT_TYPES),
                f"a worker silent at the {stage.name} stage: {now} s on, past the stage's "
                f"{stage.deadline} s default, the request should have ended with a typed "
                f"timeout; got {outcome}",
                expected=f"{stage.error} within {stage.deadline} s",
                actual=outcome,
            )


# --- TMO-010 ---

SUB_SECOND = 0.25  # a setting under 1 s must be applied too, not only whole seconds
DEADLINE_FIELDS = tuple(attrs.fields_dict(Timeouts))
TINY = 2.0**-20  # just over the lower bound 0
# Both sides of each bound: (0, inf) open, so 0 and inf are refused, the values next to them
# accepted; NaN is no number of seconds at all.
REFUSED_DEADLINES = {
    "zero": 0.0,
    "just-under-zero": -TINY,
    "negative": -1.0,
    "inf": math.inf,
    "minus-inf": -math.inf,
    "nan": math.nan,
}
ACCEPTED_DEADLINES = {"tiny": TINY, "half": 0.5, "one": 1.0, "largest-finite": sys.float_info.max}


@covers("TMO-010")
@requires(Capability.DIRECT, Capability.MOCK_CLOCK, Capability.CONFIGURE_TIMEOUTS)
@pytest.mark.parametrize("seconds", ["custom", SUB_SECOND])
@pytest.mark.parametrize("stage", STAGE_PARAMS)
def test_deadlines_are_set_per_router(
    open_target: OpenTarget, stage: Stage, seconds: float | str
) -> None:
    deadline = stage.custom if seconds == "custom" else float(seconds)
    timeouts = Timeouts(**{stage.field: deadline})
    with built(open_target, TargetConfig(timeouts=timeouts), "TMO-010") as target:
        request = target.submit(Direct(silent_worker(target, stage)))
        target.advance_time(deadline - EARLY)
        require_compare(
            "TMO-010",
            target.outcome(request),
            "is",
            None,
            f"{stage.field} set to {deadline} s: the request ended before that",
        )
        target.advance_time(2 * EARLY)
        outcome = target.outcome(request)
        require(
            "TMO-010",
            outcome is not None
            and outcome.error is not None
            and shows_outer(outcome.error, stage.error),
            f"{stage.field} set to {deadline} s: a worker silent at the {stage.name} stage "
            f"should have timed out {EARLY} s after it; got {outcome}",
            expected=f"{stage.error} after {deadline} s",
            actual=outcome,
        )


@covers("TMO-010")
@requires(Capability.CONFIGURE_TIMEOUTS)
@pytest.mark.parametrize("value", REFUSED_DEADLINES.values(), ids=REFUSED_DEADLINES.keys())
def test_a_deadline_out_of_range_is_refused(open_target: OpenTarget, value: float) -> None:
    built_with = [
        field
        for field in DEADLINE_FIELDS
        if refusal(open_target, TargetConfig(timeouts=Timeouts(**{field: value}))) is None
    ]
    require(
        "TMO-010",
        not built_with,
        f"a deadline of {value} s is not a positive finite number of seconds, yet a router "
        f"with it as {built_with} was built",
        expected=f"every deadline of {value} s refused when the router is built",
        actual=f"built with it as {built_with}",
    )


@covers("TMO-010")
@requires(Capability.CONFIGURE_TIMEOUTS)
@pytest.mark.parametrize("value", ACCEPTED_DEADLINES.values(), ids=ACCEPTED_DEADLINES.keys())
def test_a_deadline_in_range_is_accepted(open_target: OpenTarget, value: float) -> None:
    refused = {
        field: error
        for field in DEADLINE_FIELDS
        if (error := refusal(open_target, TargetConfig(timeouts=Timeouts(**{field: value}))))
    }
    require(
        "TMO-010",
        not refused,
        f"a deadline of {value} s is positive and finite, yet a router with it was refused: "
        f"{refused}",
        expected=f"every deadline of {value} s accepted",
        actual=refused,
    )


# --- TMO-011 ---


def named_in_links(outcome: Outcome, marker: str, worker: int) -> bool:
    """Some link after the first names ``worker`` (``worker 3``, ``instance_id=3``, in decimal
    or hex) and carries ``marker``."""
    assert outcome.error is not None
    names = re.compile(rf"(?i)\b(worker|instance)\D{{0,12}}\b({worker}|0x{worker:x}|{worker:x})\b")
    return any(
        marker in message and names.search(message) is not None
        for _, message in outcome.error.links[1:]
    )


@covers("TMO-011")
@requires(
    Capability.MIGRATION,
    Capability.SCRIPT_FAILURES,
    Capability.SCRIPT_REJECTION,
    Capability.OBSERVE_ERROR_TYPES,
)
@pytest.mark.parametrize(
    ("overloaded", "expected"),
    [(False, "Unavailable"), (True, "ResourceExhausted")],
    ids=["failed", "overloaded"],
)
def test_an_exhausted_migration_names_its_attempts_failures(
    target: Target, overloaded: bool, expected: str
) -> None:
    markers = ("cause-alpha", "cause-beta", "cause-gamma")
    scripts: list[tuple[WorkerScript, str]] = [
        (Reject(overloaded=True, message=marker), marker) for marker in markers
    ]
    if not overloaded:
        scripts = [
            (FailBeforeStream(ErrorSpec("Disconnected", markers[0])), markers[0]),
            (FailBeforeStream(ErrorSpec("Backend(EngineShutdown)", markers[1])), markers[1]),
            (Reject(overloaded=False, message=markers[2]), markers[2]),
        ]
    workers = []
    for script, _ in scripts:
        worker = target.add_worker()
        target.script_worker(worker, script)
        workers.append(worker)
    request = target.submit(Migrate(limit=10))
    outcome = finished(target, request, "TMO-011")
    require_equal(
        "TMO-011",
        outcome.error.typed_chain if outcome.error else None,
        (expected,),
        f"every worker failed the request; its error's typed chain must be {expected} alone "
        "(MIG-012), the attempts' failures riding on untyped links",
    )
    missing = [
        (worker, marker)
        for worker, (_, marker) in zip(workers, scripts, strict=True)
        if not named_in_links(outcome, marker, worker)
    ]
    require(
        "TMO-011",
        not missing,
        f"the error that ended migration should name each failed worker and its failure; "
        f"these are missing: {missing}",
        expected="one link per failed worker naming it and its failure",
        actual=outcome.error.describe() if outcome.error else outcome,
    )


@covers("TMO-011")
@requires(
    Capability.MIGRATION,
    Capability.SCRIPT_FAILURES,
    Capability.SCRIPT_SILENCE,
    Capability.OBSERVE_ERROR_TYPES,
    Capability.MOCK_CLOCK,
)
def test_an_exhausted_migration_names_a_timeout(target: Target) -> None:
    failing, silent = target.add_worker(), target.add_worker()
    target.script_worker(failing, FailBeforeStream(ErrorSpec("Disconnected", "cause-alpha")))
    target.script_worker(silent, Silent(SilentStage.ACK))
    request = target.submit(Migrate(limit=10))
    target.advance_time(ACK + EARLY)
    outcome = finished(target, request, "TMO-011")
    require(
        "TMO-011",
        outcome.error is not None
        and outcome.error.typed_chain == ("Unavailable",)
        and named_in_links(outcome, "cause-alpha", failing)
        and named_in_links(outcome, "ConnectionTimeout", silent),
        f"worker {failing} failed and worker {silent} never ACKed: the error that ended "
        f"migration should name both failures, the timeout included; got {outcome}",
        expected=f"Unavailable, then links naming {failing} (Disconnected) and {silent} "
        "(ConnectionTimeout)",
        actual=outcome.error.describe() if outcome.error else outcome,
    )


# --- TMO-001 … TMO-003, TMO-009 on real time ---
#
# A target whose clock the suite cannot move (real processes: Capability.REAL_CLOCK) is held
# to the spec's defaults in real time, for the stages whose default is short enough to wait
# out: each request must end with its stage's typed timeout no earlier than a margin before
# the stage's deadline and no later than a margin after it. A request is timed from just
# before ``submit`` to the first moment its outcome is seen (``submit`` itself returns once
# the request has ended or stalls).

REAL_MARGIN = 1.0  # real seconds either side of a deadline: two processes, a loaded machine
REAL_SHORT = 10.0  # stages whose default is at most this are checked one by one
REAL_LONG = 30.0  # TMO-009's real-time check waits out stages whose default is at most this
REAL_POLL = 0.1


@attrs.define
class Timed:
    """A request to a worker silent at ``stage``, sent at ``sent`` (monotonic seconds)."""

    stage: Stage
    request: str
    sent: float
    took: float | None = None  # seconds until its outcome was first seen


def send_timed(target: Target, stage: Stage) -> Timed:
    worker = silent_worker(target, stage)
    sent = time.monotonic()
    timed = Timed(stage, target.submit(Direct(worker)), sent)
    if target.outcome(timed.request) is not None:
        timed.took = time.monotonic() - sent
    return timed


def watch(target: Target, requests: list[Timed]) -> None:
    """Poll every open request until it ends or a margin past its stage's deadline."""
    while True:
        now = time.monotonic()
        waiting = [
            t for t in requests if t.took is None and now < t.sent + t.stage.deadline + REAL_MARGIN
        ]
        if not waiting:
            return
        for timed in waiting:
            if target.outcome(timed.request) is not None:
                timed.took = time.monotonic() - timed.sent
        time.sleep(REAL_POLL)


def deviation(target: Target, timed: Timed) -> str | None:
    """How the request missed its stage's typed timeout at the deadline, or None."""
    stage, took = timed.stage, timed.took
    outcome = target.outcome(timed.request)
    if took is None or outcome is None:
        return f"still open {stage.deadline + REAL_MARGIN} s on"
    error = outcome.error
    if error is None or error.pre_stream != stage.pre_stream or not shows_outer(error, stage.error):
        shown = error.describe() if error is not None else f"{len(outcome.items)} items, no error"
        return f"{shown} after {took:.2f} s"
    if abs(took - stage.deadline) > REAL_MARGIN:
        return f"{stage.error} after {took:.2f} s"
    return None


@covers("TMO-001", "TMO-002")
@requires(Capability.DIRECT, Capability.REAL_CLOCK)
@pytest.mark.parametrize("stage", [s.param() for s in STAGES if s.deadline <= REAL_SHORT])
def test_a_silent_stage_ends_at_its_deadline_in_real_time(target: Target, stage: Stage) -> None:
    timed = send_timed(target, stage)
    watch(target, [timed])
    missed = deviation(target, timed)
    require(
        stage.requirement,
        missed is None,
        f"a worker silent at the {stage.name} stage: the request should have ended with "
        f"{stage.error} at its {stage.deadline} s default (± {REAL_MARGIN} s); {missed}",
        expected=f"{stage.error} after {stage.deadline} s",
        actual=missed,
    )


@covers("TMO-003", "TMO-009")
@requires(Capability.DIRECT, Capability.REAL_CLOCK, Capability.SCRIPT_SILENCE)
def test_no_request_waits_forever_in_real_time(target: Target, adapter: Adapter) -> None:
    """Workers silent at every stage the adapter can stage whose default is at most
    ``REAL_LONG``, all at once: each request ends with its stage's typed timeout at its
    deadline."""
    stages = [s for s in STAGES if s.capability in adapter.capabilities and s.deadline <= REAL_LONG]
    requests = [send_timed(target, stage) for stage in stages]
    watch(target, requests)
    missed = {t.stage.name: deviation(target, t) for t in requests}
    violations: list[RequirementViolation] = []  # each requirement judged, both reported
    for requirement in ("TMO-003", "TMO-009"):  # the establish stages, then every stage
        judged = [s for s in stages if requirement == "TMO-009" or s.requirement == requirement]
        failed = "; ".join(f"{s.name}: {missed[s.name]}" for s in judged if missed[s.name])
        try:
            require(
                requirement,
                not failed,
                "each request should end with its stage's typed timeout at its default "
                f"deadline: {failed}",
                expected=", ".join(f"{s.name}: {s.error} at {s.deadline} s" for s in judged),
                actual=failed,
            )
        except RequirementViolation as violation:
            violations.append(violation)
    if violations:
        raise ExceptionGroup("requests that missed their stage's deadline", violations)
