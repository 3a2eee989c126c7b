"""Migration (MIG): which failures are retried, how often, where, and what the client reads.

Every check sends token requests (``Migrate``): a completed request must read exactly the
tokens ``prompt .. prompt + max_tokens - 1``, whichever workers produced them.
"""

from __future__ import annotations

from typing import Literal

import pytest

from routespec.conformance import oracle
from routespec.conformance.checks import covers, require, require_compare, require_equal, requires
from routespec.conformance.scenario import finished, loads, reached, shows, spec_of, tokens
from routespec.testing.target import (
    CancelThenFail,
    Capability,
    ErrorSpec,
    FailBeforeStream,
    FailMidStream,
    Migrate,
    Outcome,
    Preselected,
    Reject,
    Serve,
    Stall,
    Target,
    TerminalThen,
    WorkerScript,
)

PROMPT, MAX_TOKENS = 4, 6
EXPECTED = list(range(PROMPT, PROMPT + MAX_TOKENS))
OTHER_TYPES = sorted(
    label
    for label in oracle.TYPE_LABELS
    if label not in oracle.MIGRATABLE_TYPES and label not in oracle.MIGRATION_SENSITIVE_TYPES
)


def deliveries(target: Target, request: str) -> list[int]:
    return reached(target, request)


def cluster(target: Target, *scripts: WorkerScript) -> list[int]:
    workers = []
    for script in scripts:
        worker = target.add_worker()
        target.script_worker(worker, script)
        workers.append(worker)
    return workers


def completes(target: Target, request: str, requirement: str, detail: str) -> Outcome:
    outcome = finished(target, request, requirement)
    require(
        requirement,
        outcome.error is None and tokens(outcome) == EXPECTED,
        f"{detail}: expected the tokens {EXPECTED} and no error, got {outcome}",
    )
    return outcome


# --- MIG-001 ---

BLOCKED_CHAINS = [
    pytest.param(chain, id="-".join(map(str, chain)))
    for label in sorted(oracle.MIGRATION_SENSITIVE_TYPES)
    for chain in ((label,), ("Disconnected", label), (label, "Backend(EngineShutdown)"))
]


@covers("MIG-001")
@requires(Capability.MIGRATION, Capability.SCRIPT_FAILURES, Capability.DIRECT)
@pytest.mark.parametrize("chain", BLOCKED_CHAINS)
def test_blocking_types_veto_migration(target: Target, chain: tuple[str, ...]) -> None:
    failing, _ = cluster(target, FailMidStream(2, spec_of(chain)), Serve())
    request = target.submit(Migrate(mode="round-robin", limit=3, pin=None))
    outcome = finished(target, request, "MIG-001")
    require(
        "MIG-001",
        deliveries(target, request) == [failing]
        and shows(outcome.error, chain)
        and tokens(outcome) == EXPECTED[:2],
        f"worker {failing} failed with {chain} after 2 tokens; the request should end with "
        f"that error, unretried; reached {deliveries(target, request)}, got {outcome}",
    )


# --- MIG-002 ---


@covers("MIG-002")
@requires(Capability.MIGRATION, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("label", sorted(oracle.MIGRATABLE_TYPES))
@pytest.mark.parametrize("where", ["before-stream", "mid-stream"])
def test_migratable_failures_are_retried(target: Target, label: str, where: str) -> None:
    script: WorkerScript = FailMidStream(3, ErrorSpec(label))
    if where == "before-stream":
        script = FailBeforeStream(ErrorSpec(label))
    failing, spare = cluster(target, script, Serve())
    request = target.submit(Migrate(limit=1))
    completes(target, request, "MIG-002", f"worker {failing} failed {where} with {label}")
    require_equal(
        "MIG-002",
        deliveries(target, request),
        [failing, spare],
        f"expected attempts on {failing} then {spare}, got {deliveries(target, request)}",
    )


@covers("MIG-002")
@requires(Capability.MIGRATION, Capability.SCRIPT_REJECTION)
@pytest.mark.parametrize("overloaded", [True, False], ids=["overloaded", "unavailable"])
def test_rejections_are_retried(target: Target, overloaded: bool) -> None:
    failing, spare = cluster(target, Reject(overloaded=overloaded), Serve())
    request = target.submit(Migrate(limit=1))
    completes(target, request, "MIG-002", f"worker {failing} rejected the request")
    require_equal("MIG-002", deliveries(target, request), [failing, spare], "not retried")


# --- MIG-003 ---


@covers("MIG-003")
@requires(Capability.MIGRATION, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("label", [None, *OTHER_TYPES])
def test_other_failures_pass_through(target: Target, label: str | None) -> None:
    failing, _ = cluster(target, FailMidStream(1, ErrorSpec(label, "as is")), Serve())
    request = target.submit(Migrate(limit=3))
    outcome = finished(target, request, "MIG-003")
    require(
        "MIG-003",
        deliveries(target, request) == [failing]
        and outcome.error is not None
        and (
            outcome.error.links == ((label, "as is"),)
            if outcome.error.types_observed
            else shows(outcome.error, [label]) and outcome.error.links[0][1] == "as is"
        )
        and tokens(outcome) == EXPECTED[:1],
        f"a {label or 'untyped'} error item should reach the client unchanged after one "
        f"attempt; reached {deliveries(target, request)}, got {outcome}",
    )


# --- MIG-004, MIG-010, MIG-012 ---


@covers("MIG-004", "MIG-010")
@requires(Capability.MIGRATION, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("limit", [0, 1, 2, 2**32 - 1])  # MIG-004: a u32, as Dynamo's
def test_attempts_are_bounded_and_never_repeat_a_worker(target: Target, limit: int) -> None:
    workers = cluster(target, *(FailBeforeStream(ErrorSpec("Disconnected")) for _ in range(4)))
    request = target.submit(Migrate(limit=limit))
    outcome = finished(target, request, "MIG-004")
    attempts = deliveries(target, request)
    require(
        "MIG-004",
        outcome.error is not None and len(attempts) == min(limit + 1, len(workers)),
        f"limit {limit}, {len(workers)} failing workers: {len(attempts)} attempts, {outcome}",
    )
    require_equal(
        "MIG-010",
        len(set(attempts)),
        len(attempts),
        f"an attempt went back to a worker that had failed the request: {attempts}",
    )


# A migratable failure that neither inhibits nor marks its worker overloaded (FLT-001,
# FLT-004; before the stream it would be wrapped in an inhibiting CannotConnect, TRN-005):
# the failed worker stays free, so only the exclusion keeps attempts off it.
MIGRATES_WITHOUT_INHIBITING = FailMidStream(1, ErrorSpec("Backend(Disconnected)"))


@covers("MIG-010", "MIG-008")
@requires(Capability.MIGRATION, Capability.SCRIPT_FAILURES, Capability.VANISH_WORKER)
def test_a_migrating_fallback_never_returns_to_a_failed_worker(target: Target) -> None:
    """The only untried worker has lost its transport record: a transport fallback for a
    migrating request stays inside its untried workers, so none qualifies (DSP-008) and the
    original error item stands (MIG-008)."""
    (failing,) = cluster(target, MIGRATES_WITHOUT_INHIBITING)
    vanished = target.add_worker()
    target.vanish_worker(vanished)
    request = target.submit(Migrate(mode="round-robin", limit=3))
    outcome = finished(target, request, "MIG-010")
    require(
        "MIG-010",
        deliveries(target, request) == [failing]
        and tokens(outcome) == EXPECTED[:1]
        and outcome.error is not None
        and not outcome.error.pre_stream
        and shows(outcome.error, ("Backend(Disconnected)",)),
        f"worker {failing} failed the request after a token and {vanished} vanished: "
        f"expected one attempt, on {failing}, and its error item; reached "
        f"{deliveries(target, request)}, got {outcome}",
    )


@covers("DSP-005", "MIG-010")
@requires(Capability.MIGRATION, Capability.SCRIPT_FAILURES, Capability.VANISH_WORKER)
def test_a_migrating_attempt_falls_back_to_an_untried_worker(target: Target) -> None:
    """Whichever worker round-robin picks, a vanished one falls back to an untried worker:
    every request completes with at most one retry, never back on the failed worker."""
    failing, serving = cluster(target, MIGRATES_WITHOUT_INHIBITING, Serve())
    vanished = target.add_worker()
    target.vanish_worker(vanished)
    for _ in range(6):
        request = target.submit(Migrate(mode="round-robin", limit=1))
        outcome = finished(target, request, "DSP-005")
        attempts = deliveries(target, request)
        require_compare(
            "MIG-010", failing, "not in", attempts[1:], f"the retries went back: {attempts}"
        )
        require(
            "DSP-005",
            outcome.error is None and tokens(outcome) == EXPECTED and attempts[-1:] == [serving],
            f"workers: {failing} fails, {vanished} vanished, {serving} serves; a request with "
            f"one retry reached {attempts} and ended {outcome}",
        )


@covers("MIG-012")
@requires(Capability.MIGRATION, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize(
    ("script", "expected", "message"),
    [
        pytest.param(
            Reject(overloaded=True),
            "ResourceExhausted",
            "rejected the request as overloaded",
            id="overloaded",
            marks=pytest.mark.requires(Capability.SCRIPT_REJECTION),
        ),
        pytest.param(
            FailBeforeStream(ErrorSpec("Disconnected")),
            "Unavailable",
            "no untried eligible",
            id="failed",
        ),
    ],
)
def test_an_exhausted_eligible_set_ends_migration(
    target: Target, script: WorkerScript, expected: str, message: str
) -> None:
    workers = cluster(target, script, script, script)
    request = target.submit(Migrate(limit=10))
    outcome = finished(target, request, "MIG-012")
    require(
        "MIG-012",
        sorted(deliveries(target, request)) == workers
        and outcome.error is not None
        and outcome.error.pre_stream
        and shows(outcome.error, (expected,))
        and message in outcome.error.links[0][1],
        f"every worker failed with {script}; expected {expected} '{message}…' after one "
        f"attempt each; reached {deliveries(target, request)}, got {outcome}",
    )


# --- MIG-005 ---


@covers("MIG-005")
@requires(Capability.MIGRATION, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize(
    ("call", "migrates"),
    [
        (Migrate(limit=2, n=2), False),
        (Migrate(limit=2, guided=True), False),
        (Migrate(limit=2, max_seq_len=PROMPT + 1), False),
        (Migrate(limit=2, max_seq_len=PROMPT + 2), True),
    ],
    ids=["n=2", "guided", "past-max-seq-len", "at-max-seq-len"],
)
def test_migration_is_off_where_it_would_change_the_answer(
    target: Target, call: Migrate, migrates: bool
) -> None:
    failing, _ = cluster(target, FailMidStream(2, ErrorSpec("Disconnected")), Serve())
    request = target.submit(call)
    outcome = finished(target, request, "MIG-005")
    attempts = deliveries(target, request)
    require(
        "MIG-005",
        len(attempts) == (2 if migrates else 1)
        and (outcome.error is None) == migrates
        and attempts[0] == failing,
        f"{call} after 2 tokens failed on {failing}: expected "
        f"{'a migration' if migrates else 'one attempt'}; reached {attempts}, got {outcome}",
    )


# --- the router mode of each attempt (SEL-006) ---


@covers("SEL-006")
@requires(Capability.MIGRATION)
def test_migrating_requests_are_selected_by_their_mode(target: Target) -> None:
    """Three round-robin token requests through migration, over three idle workers, each
    reach a different worker: the attempt is selected round-robin, not by load."""
    pool = cluster(target, Serve(), Serve(), Serve())
    reached_by: list[int] = []
    for _ in pool:
        request = target.submit(Migrate(mode="round-robin", limit=1))
        completes(target, request, "SEL-006", "a round-robin request over idle workers")
        reached_by += deliveries(target, request)
    require_equal(
        "SEL-006",
        sorted(reached_by),
        sorted(pool),
        f"three round-robin requests over the idle workers {pool} should reach each once; "
        f"they reached {reached_by}",
    )


# --- requests that are not token requests (MIG-002, MIG-005, MIG-008) ---

Form = Literal["map", "text"]
FORMS: list[Form] = ["map", "text"]


def items_of(form: str, worker: int, request: str, count: int) -> list[object]:
    """What ``Serve`` on ``worker`` yields for a request of ``form`` (see ``Migrate``)."""
    if form == "text":
        return [f"worker {worker} request {request} item {n}" for n in range(count)]
    return [{"worker": worker, "request": request, "index": n} for n in range(count)]


@covers("MIG-002", "MIG-005")
@requires(Capability.MIGRATION, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("form", FORMS)
def test_a_request_without_tokens_migrates_before_its_stream(target: Target, form: Form) -> None:
    """Before its stream any request migrates; one that is not a token request has no length,
    so ``max_seq_len`` does not hold it back (MIG-005 bounds token requests)."""
    failing, spare = cluster(target, FailBeforeStream(ErrorSpec("Disconnected")), Serve(3))
    request = target.submit(Migrate(limit=1, form=form, max_seq_len=1))
    outcome = finished(target, request, "MIG-002")
    require(
        "MIG-002",
        deliveries(target, request) == [failing, spare]
        and outcome.error is None
        and list(outcome.items) == items_of(form, spare, request, 3),
        f"a {form} request (not a token request) failed before its stream on {failing} with "
        f"Disconnected; it should migrate to {spare} and read its 3 items; reached "
        f"{deliveries(target, request)}, got {outcome}",
    )


@covers("MIG-008")
@requires(Capability.MIGRATION, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("form", FORMS)
def test_a_request_without_tokens_ends_at_a_mid_stream_failure(target: Target, form: Form) -> None:
    failing, _spare = cluster(target, FailMidStream(2, ErrorSpec("Disconnected")), Serve(3))
    request = target.submit(Migrate(limit=3, form=form))
    outcome = finished(target, request, "MIG-008")
    require(
        "MIG-008",
        deliveries(target, request) == [failing]
        and shows(outcome.error, ["Disconnected"])
        and list(outcome.items) == items_of(form, failing, request, 2),
        f"a {form} request (not a token request) cannot continue where it stopped: after 2 "
        f"items from {failing}, its Disconnected error item should end the stream, with no "
        f"other attempt; reached {deliveries(target, request)}, got {outcome}",
    )


# --- MIG-006, MIG-007 ---


@covers("MIG-006")
@requires(Capability.MIGRATION)
def test_a_stopped_request_makes_no_attempt(target: Target) -> None:
    cluster(target, Serve())
    request = target.submit(Migrate(stopped=True))
    outcome = finished(target, request, "MIG-006")
    require(
        "MIG-006",
        not deliveries(target, request) and shows(outcome.error, ("Cancelled",)),
        f"a stopped request reached {deliveries(target, request)} and ended {outcome}",
    )


@covers("MIG-006")
@requires(Capability.MIGRATION, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("where", ["before-stream", "mid-stream"])
def test_a_request_stopped_after_a_failed_attempt_makes_no_other(
    target: Target, where: str
) -> None:
    """The caller's context stops once the first attempt has reached its worker, which then
    fails with a migratable error and leaves attempts to spare: the next attempt meets the
    stopped context, so no second worker is reached."""
    failure = ErrorSpec("Disconnected")
    script: WorkerScript = (
        FailBeforeStream(failure) if where == "before-stream" else FailMidStream(2, failure)
    )
    failing, _spare = cluster(target, script, Serve())
    request = target.submit(Migrate(limit=3, stop_after=1))
    outcome = finished(target, request, "MIG-006")
    if where == "before-stream":
        ended_as_spec = (
            not outcome.items
            and outcome.error is not None
            and outcome.error.pre_stream
            and shows(outcome.error, ("Cancelled",))
        )
        expected = "Cancelled before any stream"
    else:
        ended_as_spec = tokens(outcome) == EXPECTED[:2] and shows(outcome.error, ("Disconnected",))
        expected = f"the tokens {EXPECTED[:2]}, then the Disconnected error item"
    require(
        "MIG-006",
        deliveries(target, request) == [failing] and ended_as_spec,
        f"{failing} failed {where} with Disconnected and the caller's context stopped then: "
        f"expected no other attempt and {expected}; reached {deliveries(target, request)}, "
        f"got {outcome}",
    )


@covers("MIG-007", "MIG-009")
@requires(Capability.MIGRATION, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("min_tokens", [0, 1, 5])
def test_a_replacement_continues_where_the_stream_stopped(target: Target, min_tokens: int) -> None:
    failing, spare = cluster(target, FailMidStream(2, ErrorSpec("Disconnected")), Serve())
    request = target.submit(Migrate(limit=1, min_tokens=min_tokens))
    completes(target, request, "MIG-009", "a worker failed after 2 tokens")
    log = [d for d in target.dispatch_log() if d.request_id == request]
    require_equal(
        "MIG-007",
        [d.worker_id for d in log],
        [failing, spare],
        f"both attempts should carry the id {request}: {log}",
    )
    follow_up = log[1].payload
    expected = {
        "token_ids": list(range(PROMPT + 2)),
        "max_tokens": MAX_TOKENS - 2,
        "min_tokens": max(0, min_tokens - 2),
    }
    seen = {key: follow_up.get(key) for key in expected} if isinstance(follow_up, dict) else {}
    require_equal(
        "MIG-009",
        seen,
        expected,
        f"the replacement should continue with {expected}, got {seen}",
    )


# --- MIG-008 ---


@covers("MIG-008")
@requires(Capability.MIGRATION, Capability.SCRIPT_FAILURES)
def test_without_a_replacement_the_original_error_item_stands(target: Target) -> None:
    original = ("Backend(EngineShutdown)",)
    failing, other = cluster(
        target,
        FailMidStream(2, spec_of(original)),
        FailBeforeStream(ErrorSpec("InvalidArgument")),
    )
    request = target.submit(Migrate(limit=1))
    outcome = finished(target, request, "MIG-008")
    require(
        "MIG-008",
        deliveries(target, request) == [failing, other]
        and outcome.error is not None
        and not outcome.error.pre_stream
        and shows(outcome.error, original)
        and tokens(outcome) == EXPECTED[:2],
        f"the replacement on {other} failed; the client should get the original error item "
        f"{original} after 2 tokens; got {outcome}",
    )


# --- MIG-011 ---


@covers("MIG-011")
@requires(Capability.MIGRATION, Capability.SCRIPT_FAILURES)
def test_an_explicit_pin_blocks_migration(target: Target) -> None:
    pinned, _ = cluster(target, FailMidStream(2, ErrorSpec("Disconnected")), Serve())
    request = target.submit(Migrate(limit=3, pin=pinned))
    outcome = finished(target, request, "MIG-011")
    require(
        "MIG-011",
        deliveries(target, request) == [pinned] and shows(outcome.error, ("Disconnected",)),
        f"a request pinned to {pinned} reached {deliveries(target, request)}: {outcome}",
    )


# --- MIG-013 ---


@covers("MIG-013")
@requires(Capability.MIGRATION, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("before", [0, 3])
def test_a_migrated_request_reads_as_one_clean_stream(target: Target, before: int) -> None:
    cluster(target, CancelThenFail(before, ErrorSpec("Backend(EngineShutdown)")), Serve())
    request = target.submit(Migrate(limit=1))
    outcome = completes(target, request, "MIG-013", "an engine shut down after a cancel frame")
    reasons = [i.get("finish_reason") for i in outcome.items if isinstance(i, dict)]
    require(
        "MIG-013",
        "cancelled" not in reasons and reasons[-1] == "stop",
        f"the aborted attempt's terminal frame reached the client: {reasons}",
    )


@covers("MIG-013", "MIG-003", "MIG-004")
@requires(Capability.MIGRATION, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("why", ["other-failure", "no-attempt-left"])
def test_a_terminal_frame_no_migration_follows_reaches_the_client(target: Target, why: str) -> None:
    """Only a migration hides the terminal frame: when the error after it is not migratable,
    or no attempt is left, the client reads the frame, then the error."""
    label = "InvalidArgument" if why == "other-failure" else "Backend(EngineShutdown)"
    failing, _ = cluster(target, CancelThenFail(2, ErrorSpec(label)), Serve())
    request = target.submit(Migrate(limit=3 if why == "other-failure" else 0))
    outcome = finished(target, request, "MIG-013")
    reasons = [i.get("finish_reason") for i in outcome.items if isinstance(i, dict)]
    require(
        "MIG-013",
        deliveries(target, request) == [failing]
        and tokens(outcome) == EXPECTED[:2]
        and reasons[-1:] == ["cancelled"]
        and shows(outcome.error, [label]),
        f"worker {failing} sent 2 tokens, a cancelled terminal frame and {label}, and "
        f"{'the error is not migratable' if why == 'other-failure' else 'the limit is 0'}: "
        f"the client should read the tokens, the frame and the error; reached "
        f"{deliveries(target, request)}, got finish reasons {reasons} and {outcome}",
    )


@covers("MIG-013")
@requires(Capability.MIGRATION, Capability.SCRIPT_FAILURES)
def test_a_terminal_frame_followed_by_tokens_is_shown_once(target: Target) -> None:
    """Only tokens follow the cancelled frame, no error: nothing migrates, so the client
    reads the frame where the worker sent it, once, and every item around it."""
    (worker,) = cluster(target, TerminalThen(items=2, finish="cancelled", items_after=2))
    request = target.submit(Migrate(limit=1))
    outcome = finished(target, request, "MIG-013")
    reasons = [i.get("finish_reason") if isinstance(i, dict) else i for i in outcome.items]
    require(
        "MIG-013",
        deliveries(target, request) == [worker]
        and outcome.error is None
        and tokens(outcome) == EXPECTED[:4]
        and reasons == [None, None, "cancelled", None, None],
        f"worker {worker} sent 2 tokens, a cancelled frame, then 2 tokens: the client should "
        f"read those five items as sent; reached {deliveries(target, request)}, got finish "
        f"reasons {reasons} and {outcome}",
    )


# --- MIG-014 ---


@covers("MIG-014")
@requires(
    Capability.MIGRATION,
    Capability.SCRIPT_FAILURES,
    Capability.SCRIPT_REJECTION,
    Capability.OBSERVE_OCCUPANCY,
    Capability.OBSERVE_INFLIGHT,
    Capability.LEAST_LOADED,
)
def test_bookings_return_to_zero_after_migration(target: Target) -> None:
    cluster(
        target,
        FailMidStream(1, ErrorSpec("Disconnected")),
        Reject(overloaded=True),
        CancelThenFail(2, ErrorSpec("Backend(EngineShutdown)")),
        FailBeforeStream(ErrorSpec("Cancelled")),
        Serve(),
    )
    for limit in (0, 1, 4):
        target.submit(Migrate(mode="least-loaded", limit=limit))
        require(
            "MIG-014",
            not loads(target) and target.transport_inflight() == 0,
            f"after a request with limit {limit}: bookings {loads(target)}, "
            f"inflight {target.transport_inflight()}",
        )


@covers("MIG-014")
@requires(
    Capability.MIGRATION,
    Capability.SCRIPT_FAILURES,
    Capability.SCRIPT_STALL,
    Capability.OBSERVE_OCCUPANCY,
    Capability.OBSERVE_INFLIGHT,
    Capability.LEAST_LOADED,
    Capability.PRESELECTED,
)
@pytest.mark.parametrize("attempt", ["first", "replacement"])
def test_a_dropped_migrating_request_releases_its_bookings(target: Target, attempt: str) -> None:
    """The cancellation path of MIG-014: the caller drops the request while an attempt's
    stream is open, the first one or the replacement after a migration. A witness request
    stays open on the spare worker throughout (so least-loaded sends the request to the other
    worker first); a leak shows as a count above the witness's, a double release below it."""
    first_script: WorkerScript = Stall(items=1)
    if attempt == "replacement":
        first_script = FailMidStream(1, ErrorSpec("Disconnected"))
    first, spare = cluster(target, first_script, Stall(items=1))
    witness = target.submit(Preselected(spare))
    request = target.submit(Migrate(mode="least-loaded", limit=1))
    path = [first] if attempt == "first" else [first, spare]
    open_loads = {first: 1, spare: 1} if attempt == "first" else {spare: 2}
    require(
        "MIG-014",
        deliveries(target, request) == path
        and target.outcome(request) is None
        and loads(target) == open_loads
        and target.transport_inflight() == 2,
        f"the request should be open on its {attempt} attempt after {path}, booked with the "
        f"witness as {open_loads}, two dispatches in flight; reached "
        f"{deliveries(target, request)}, outcome {target.outcome(request)}, bookings "
        f"{loads(target)}, inflight {target.transport_inflight()}",
    )
    target.drop(request)
    finished(target, request, "MIG-014")
    require(
        "MIG-014",
        loads(target) == {spare: 1} and target.transport_inflight() == 1,
        f"the caller dropped the request during its {attempt} attempt (on "
        f"{deliveries(target, request)[-1]}); only the witness on {spare} should stay booked "
        f"and in flight: bookings {loads(target)} (expected {{{spare}: 1}}), inflight "
        f"{target.transport_inflight()} (expected 1)",
    )
    target.release_stalled(spare)
    target.release_stalled(first)
    finished(target, witness, "MIG-014")
    require(
        "MIG-014",
        not loads(target) and target.transport_inflight() == 0,
        f"every stream ended: bookings {loads(target)}, inflight {target.transport_inflight()}",
    )


# --- MIG-015 ---


@covers("MIG-015")
@requires(Capability.MIGRATION, Capability.SCRIPT_FAILURES, Capability.MOCK_CLOCK)
@pytest.mark.parametrize("label", oracle.TYPE_LABELS)
def test_one_set_decides_transport_and_migration(target: Target, label: str) -> None:
    worker, _ = cluster(target, FailBeforeStream(ErrorSpec(label)), Serve())
    pre_stream = finished(target, target.submit(Migrate(limit=0, pin=worker)), "MIG-015")
    withheld = pre_stream.error is not None and label not in pre_stream.error.typed_chain
    target.advance_time(60.0)  # let the pre-stream failure's inhibition lapse
    target.script_worker(worker, FailMidStream(0, spec_of(("Disconnected", label))))
    request = target.submit(Migrate(limit=1))
    blocked = deliveries(target, request) == [worker]
    require_equal(
        "MIG-015",
        withheld,
        blocked,
        f"{label}: the transport {'withholds' if withheld else 'keeps'} it as a pre-stream "
        f"cause, but migration {'refuses' if blocked else 'retries'} an error item carrying it",
    )


# --- MIG-016 ---

BLOCKING_REASONS = ("request.cancelled", "backend.cancelled", "capacity.pool_exhausted",
                    "capacity.exhausted")  # fmt: skip


@covers("MIG-016")
@requires(
    Capability.MIGRATION, Capability.SCRIPT_FAILURES, Capability.SCRIPT_REASONS, Capability.DIRECT
)
@pytest.mark.parametrize("wrapped", [False, True], ids=["alone", "under-Disconnected"])
@pytest.mark.parametrize("reason", BLOCKING_REASONS)
@pytest.mark.parametrize("label", ["Disconnected", "WorkerOverloaded", "Backend(EngineShutdown)"])
def test_a_blocking_reason_vetoes_migration(
    target: Target, label: str, reason: str, wrapped: bool
) -> None:
    """A migratable type carrying a blocking reason, on the only link or under a migratable
    wrapper: the request ends with it, unretried."""
    error = ErrorSpec(label, reason=reason)
    if wrapped:
        error = ErrorSpec("Disconnected", cause=error)
    failing, _ = cluster(target, FailMidStream(2, error), Serve())
    request = target.submit(Migrate(mode="round-robin", limit=3, pin=None))
    outcome = finished(target, request, "MIG-016")
    require(
        "MIG-016",
        deliveries(target, request) == [failing]
        and outcome.error is not None
        and tokens(outcome) == EXPECTED[:2],
        f"worker {failing} failed after 2 tokens with {error}; the blocking reason {reason} "
        f"should end the request unretried; reached {deliveries(target, request)}, got {outcome}",
    )
