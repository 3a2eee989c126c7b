"""Session affinity of the routing host (AFF): bind once, wait, expire, pin or prefer.

Every check builds a host with session affinity (``HostConfig.affinity_ttl``) over a few
scripted workers and reads a session's binding through ``host.session``: ``unbound``,
``initializing``, ``bound`` (with its worker and dp rank) or, without affinity, ``disabled``.
"""

from __future__ import annotations

import re

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
from routespec.conformance.scenario import MODE_CAPABILITY, finished, reached, shows, shows_outer
from routespec.testing.target import (
    Capability,
    ErrorSpec,
    FailBeforeStream,
    FailMidStream,
    HostConfig,
    HostRoute,
    ObservedError,
    Outcome,
    RoutingHostTarget,
    Serve,
    SessionView,
    Silent,
    SilentStage,
    Stall,
    Target,
    WorkerScript,
)

TTL = 10.0
MAX_TTL = 31_536_000
MAX_SESSION_BYTES = 256
DEFAULT_CAP = 65_536  # AFF-004: the affinity table's sessions unless configured lower


def hard(
    policy: str = "round-robin", max_entries: int | None = None, mode: str | None = "hard"
) -> HostConfig:
    """Hard affinity, named (``mode`` None: the host's default, which AFF-006 says is hard);
    the cap the host's own unless ``max_entries`` is given (AFF-004: 65,536)."""
    return HostConfig(
        policy=policy, affinity_ttl=TTL, affinity_mode=mode, max_affinity_entries=max_entries
    )


HARD_MODES = [pytest.param(None, id="default-mode"), pytest.param("hard", id="hard")]


def soft(policy: str = "round-robin") -> HostConfig:
    return HostConfig(policy=policy, affinity_ttl=TTL, affinity_mode="soft")


def text(error: ObservedError | None) -> str:
    return "" if error is None else " | ".join(message for _, message in error.links)


def served(target: Target, request: str, requirement: str, detail: str) -> list[int]:
    """The request completed without an error; the workers it reached."""
    outcome, deliveries = ended(target, request, requirement)
    require(
        requirement,
        outcome.error is None and len(deliveries) == 1,
        f"{detail}: expected one delivery and a clean stream; reached {deliveries}, got {outcome}",
    )
    return deliveries


def refused(target: Target, request: str, requirement: str, detail: str) -> Outcome:
    """The request failed before reaching any worker, with a typed error where the target
    shows types (spec/conventions.md: every failure is typed)."""
    outcome, deliveries = ended(target, request, requirement)
    error = outcome.error
    require(
        requirement,
        error is not None
        and not deliveries
        and (error.type is not None or not error.types_observed),
        f"{detail}: expected a typed error and no delivery; reached {deliveries}, got {outcome}",
    )
    return outcome


def bound_to(
    host: RoutingHostTarget, session: str, worker: int, requirement: str, detail: str
) -> SessionView:
    view = host.session(session)
    require(
        requirement,
        view.state == "bound" and view.worker_id == worker,
        f"{detail}: session {session!r} should be bound to worker {worker}, but is {view}",
    )
    return view


def unbound(host: RoutingHostTarget, session: str, requirement: str, detail: str) -> None:
    view = host.session(session)
    require_equal(
        requirement,
        view,
        SessionView("unbound"),
        f"{detail}: session {session!r} should be unbound, but is {view}",
    )


def other_than(pool: list[int], worker: int) -> int:
    return next(w for w in pool if w != worker)


# --- AFF-001 ---


@covers("AFF-001")
@requires(Capability.ROUTING_HOST)
def test_the_first_request_initializes_and_later_requests_read_the_target(
    target: Target,
) -> None:
    pool = workers(target, 3, Serve())
    host = host_of(target, "AFF-001", hard())
    unbound(host, "first", "AFF-001", "before any request")
    worker = served(target, host.route(HostRoute(session="first")), "AFF-001", "first request")[0]
    bound_to(host, "first", worker, "AFF-001", "the first request committed its worker")
    for n in range(3):  # round-robin alone would rotate to the other workers
        again = served(target, host.route(HostRoute(session="first")), "AFF-001", f"request {n}")
        require_equal(
            "AFF-001",
            again,
            [worker],
            f"request {n + 2} of a session bound to {worker} went to {again}",
        )
    chosen = pool[2]
    host.bind_session("preset", chosen)
    bound_to(host, "preset", chosen, "AFF-001", "bind_session commits its target")
    for n in range(3):
        went = served(target, host.route(HostRoute(session="preset")), "AFF-001", "preset")
        require_equal(
            "AFF-001",
            went,
            [chosen],
            f"request {n + 1} of a session initialized to worker {chosen} went to {went}",
        )


# --- AFF-002 ---


@covers("AFF-002")
@requires(Capability.ROUTING_HOST)
def test_a_contended_session_waits_for_the_initialization(target: Target) -> None:
    workers(target, 2, Serve())
    host = host_of(target, "AFF-002", hard())
    host.hold_session("s")
    require_equal(
        "AFF-002",
        host.session("s").state,
        "initializing",
        f"hold_session should leave the session initializing: {host.session('s')}",
    )
    waiting = host.route(HostRoute(session="s"))
    require(
        "AFF-002",
        target.outcome(waiting) is None and not reached(target, waiting),
        f"a request for a session another request initializes must wait; it reached "
        f"{reached(target, waiting)} with outcome {target.outcome(waiting)}",
    )
    host.release_session("s")
    worker = served(target, waiting, "AFF-002", "after the initialization was dropped")[0]
    bound_to(host, "s", worker, "AFF-002", "the waiting request initialized the session")


@covers("AFF-002")
@requires(Capability.ROUTING_HOST)
def test_a_dropped_initialization_leaves_the_session_unbound(target: Target) -> None:
    workers(target, 2, Serve())
    host = host_of(target, "AFF-002", hard())
    host.hold_session("s")
    host.release_session("s")
    unbound(host, "s", "AFF-002", "the only initialization was dropped")
    stopped = host.route(HostRoute(session="s", stopped=True))
    refused(target, stopped, "AFF-002", "a stopped first request")
    unbound(host, "s", "AFF-002", "the first request was cancelled before it bound anything")
    later = host.route(HostRoute(session="s"))
    require_compare(
        "AFF-002",
        target.outcome(later),
        "is not",
        None,
        "a request after dropped initializations must not wait for them: it is still open",
    )
    worker = served(target, later, "AFF-002", "after dropped initializations")[0]
    bound_to(host, "s", worker, "AFF-002", "the next request initialized the session")


@covers("AFF-002", "AFF-001", "AFF-012")
@requires(Capability.ROUTING_HOST)
def test_waiting_requests_take_the_committed_target(target: Target) -> None:
    pool = workers(target, 2, Stall())  # the planned request stays open, and booked
    host = host_of(target, "AFF-002", hard("kv"))
    preview = planned(host.preview(HostRoute(session="s")), "AFF-002")
    unbound(host, "s", "AFF-012", "after a preview")  # else the plan would wait for it
    plan = planned(host.plan(preview.plan_id), "AFF-002")
    require_equal(
        "AFF-002",
        host.session("s").state,
        "initializing",
        f"an open plan holds the session's initialization: {host.session('s')}",
    )
    waiting = host.route(HostRoute(session="s"))
    require(
        "AFF-002",
        target.outcome(waiting) is None and not reached(target, waiting),
        f"a request must wait while a plan initializes its session; it reached "
        f"{reached(target, waiting)} with outcome {target.outcome(waiting)}",
    )
    first = host.dispatch_plan(plan.plan_id)
    require_equal(
        "AFF-001",
        reached(target, first),
        [plan.worker_id],
        f"the plan chose worker {plan.worker_id} but reached {reached(target, first)}",
    )
    bound_to(host, "s", plan.worker_id, "AFF-001", "the plan's dispatch committed its worker")
    require_equal(
        "AFF-002",
        reached(target, waiting),
        [plan.worker_id],
        f"the waiting request should take the target the plan committed ({plan.worker_id}), "
        f"not select again (the other worker is the less loaded one); it reached "
        f"{reached(target, waiting)}",
    )
    for worker in pool:
        target.release_stalled(worker)
    served(target, first, "AFF-001", "the planned request, released")
    served(target, waiting, "AFF-002", "the waiting request, released")


# --- AFF-003 ---


@covers("AFF-003")
@requires(Capability.ROUTING_HOST, Capability.MOCK_CLOCK)
def test_a_binding_expires_a_ttl_after_its_last_use(target: Target) -> None:
    pool = workers(target, 3, Serve())
    host = host_of(target, "AFF-003", hard())
    worker = served(target, host.route(HostRoute(session="s")), "AFF-003", "first request")[0]
    target.advance_time(TTL - 1)
    went = served(target, host.route(HostRoute(session="s")), "AFF-003", "a use within the TTL")
    require_equal(
        "AFF-003", went, [worker], f"{TTL - 1} s after binding {worker} it went to {went}"
    )
    target.advance_time(TTL - 1)
    bound_to(
        host,
        "s",
        worker,
        "AFF-003",
        f"{2 * TTL - 2} s after binding but {TTL - 1} s after its last use (TTL {TTL} s)",
    )
    target.advance_time(1.0)
    unbound(host, "s", "AFF-003", f"exactly its TTL ({TTL} s) after its last use")
    fresh = other_than(pool, worker)
    host.bind_session("s", fresh)
    went = served(target, host.route(HostRoute(session="s")), "AFF-003", "after expiry")
    require_equal(
        "AFF-003",
        went,
        [fresh],
        f"the expired session was initialized again to {fresh}, but went to {went}",
    )


@covers("AFF-003")
@requires(Capability.ROUTING_HOST)
@pytest.mark.parametrize("ttl", [0, -1, MAX_TTL + 1, MAX_TTL + 0.5])
def test_a_ttl_out_of_range_is_refused_at_construction(target: Target, ttl: float) -> None:
    workers(target, 1, Serve())
    config = HostConfig(affinity_ttl=ttl)
    refused_at_construction(target, "AFF-003", config, f"a TTL of {ttl} s is out of range")


@covers("AFF-003")
@requires(Capability.ROUTING_HOST)
@pytest.mark.parametrize("ttl", [0.001, 1, MAX_TTL])
def test_a_ttl_in_range_is_accepted(target: Target, ttl: float) -> None:
    workers(target, 1, Serve())
    built = target.open_host(HostConfig(affinity_ttl=ttl))
    require_false(
        "AFF-003",
        isinstance(built, ObservedError),
        f"a host with affinity TTL {ttl} s should be built, but was refused: {built}",
    )


# --- AFF-004 ---


@covers("AFF-004")
@requires(Capability.ROUTING_HOST)
@pytest.mark.parametrize("cap", [0, 65_537])
def test_a_cap_out_of_range_is_refused_at_construction(target: Target, cap: int) -> None:
    config = hard(max_entries=cap)
    refused_at_construction(target, "AFF-004", config, f"a cap of {cap} is outside 1 to 65,536")


@covers("AFF-004")
@requires(Capability.ROUTING_HOST)
def test_a_cap_of_one_is_accepted_and_binds_one_session(target: Target) -> None:
    """The lower end of the cap's range: 1 is a cap like any other (65,536, the upper end,
    is the default every other check's host is built with)."""
    workers(target, 2, Serve())
    built = target.open_host(hard(max_entries=1))
    require(
        "AFF-004",
        not isinstance(built, ObservedError),
        f"a cap of 1 is inside 1 to 65,536, yet the host was refused: {built}",
    )
    assert not isinstance(built, ObservedError)
    host = built
    worker = served(target, host.route(HostRoute(session="a")), "AFF-004", "session a")[0]
    bound_to(host, "a", worker, "AFF-004", "the first session under a cap of 1")
    outcome = refused(
        target, host.route(HostRoute(session="b")), "AFF-004", "session b beyond a cap of 1"
    )
    require(
        "AFF-004",
        shows(outcome.error, ["ResourceExhausted"]),
        f"with session a bound and a cap of 1, new session b should fail with "
        f"ResourceExhausted, got {outcome.error}",
    )
    unbound(host, "b", "AFF-004", "the refused session b")
    went = served(target, host.route(HostRoute(session="a")), "AFF-004", "session a again")
    require_equal("AFF-004", went, [worker], f"session a is bound to {worker}, went to {went}")


@covers("AFF-004")
@requires(Capability.ROUTING_HOST, Capability.AFFINITY_CAP)
def test_the_default_cap_binds_65536_sessions_and_refuses_the_next(target: Target) -> None:
    """The host's own cap, which no check sets: 65,536 sessions bind, a new one is refused
    with ResourceExhausted, and a bound one is still served."""
    pool = workers(target, 2, Serve())
    host = host_of(target, "AFF-004", hard())
    for n in range(DEFAULT_CAP):
        host.bind_session(f"s{n}", pool[n % 2])
    outcome = refused(target, host.route(HostRoute(session="new")), "AFF-004", "beyond the cap")
    require(
        "AFF-004",
        shows(outcome.error, ["ResourceExhausted"]),
        f"with {DEFAULT_CAP} sessions bound (the default cap), a new session should fail "
        f"with ResourceExhausted, got {outcome.error}",
    )
    unbound(host, "new", "AFF-004", "the session refused beyond the default cap")
    last = f"s{DEFAULT_CAP - 1}"
    went = served(target, host.route(HostRoute(session=last)), "AFF-004", "a bound session")
    require_equal("AFF-004", went, [pool[(DEFAULT_CAP - 1) % 2]], f"{last} went to {went}")


@covers("AFF-004")
@requires(Capability.ROUTING_HOST)
@pytest.mark.parametrize(
    ("session", "size"),
    [("a" * 257, 257), ("é" * 129, 258), ("a" * 255 + "é", 257)],
    ids=["ascii-257", "two-byte-258", "mixed-257"],
)
def test_an_oversized_session_id_is_an_invalid_argument(
    target: Target, session: str, size: int
) -> None:
    workers(target, 2, Serve())
    host = host_of(target, "AFF-004", hard())
    outcome = refused(target, host.route(HostRoute(session=session)), "AFF-004", f"{size} bytes")
    require(
        "AFF-004",
        outcome.error is not None
        and outcome.error.pre_stream
        and shows(outcome.error, ["InvalidArgument"])
        and re.search(rf"\b{size}\b", text(outcome.error)) is not None,
        f"a {size}-byte session id ({len(session)} characters) should fail with "
        f"InvalidArgument naming {size}, got {outcome.error}",
    )


@covers("AFF-004")
@requires(Capability.ROUTING_HOST)
@pytest.mark.parametrize("session", ["a" * 256, "é" * 128], ids=["ascii-256", "two-byte-256"])
def test_a_session_id_of_256_bytes_is_accepted(target: Target, session: str) -> None:
    workers(target, 2, Serve())
    host = host_of(target, "AFF-004", hard())
    worker = served(target, host.route(HostRoute(session=session)), "AFF-004", "256 bytes")[0]
    bound_to(host, session, worker, "AFF-004", "a 256-byte session id")


@covers("AFF-004")
@requires(Capability.ROUTING_HOST, Capability.MOCK_CLOCK)
def test_new_sessions_beyond_the_cap_are_refused_until_bindings_expire(target: Target) -> None:
    workers(target, 2, Serve())
    host = host_of(target, "AFF-004", hard(max_entries=3))

    def route(session: str) -> str:
        return host.route(HostRoute(session=session))

    def full(session: str, when: str) -> None:
        outcome = refused(target, route(session), "AFF-004", f"new session {session} {when}")
        require(
            "AFF-004",
            shows(outcome.error, ["ResourceExhausted"]),
            f"new session {session} {when} should fail with ResourceExhausted, got {outcome}",
        )
        unbound(host, session, "AFF-004", f"the refused session {session}")

    served(target, route("a"), "AFF-004", "session a at 0 s")
    target.advance_time(TTL / 2)
    served(target, route("b"), "AFF-004", "session b")
    served(target, route("c"), "AFF-004", "session c")
    full("d", "while a, b and c (the cap of 3) are bound")
    served(target, route("c"), "AFF-004", "a bound session while the cap is reached")
    target.advance_time(TTL / 2)  # a has expired (exactly its TTL unused), b and c have not
    served(target, route("d"), "AFF-004", "session d once a has been unused for its TTL")
    full("e", "while b, c and d are bound")
    target.advance_time(TTL / 2)  # b and c have expired
    served(target, route("e"), "AFF-004", "session e once b and c have expired")


# --- AFF-005 ---

POLICIES = [
    *(
        pytest.param(mode, marks=pytest.mark.requires(cap), id=mode)
        for mode, cap in MODE_CAPABILITY.items()
    ),
    pytest.param("direct", id="direct"),
    pytest.param("kv", id="kv"),
]


@covers("AFF-005")
@requires(Capability.ROUTING_HOST, Capability.SCRIPT_STALL)
@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_binds_the_first_dispatch(target: Target, policy: str) -> None:
    pool = workers(target, 3, Stall())
    host = host_of(target, "AFF-005", hard(policy))
    if policy == "direct":
        explicit: int | None = pool[1]
        busy = None
    else:  # one worker busy while the session binds, idle again afterwards
        explicit = None
        busy = host.route(HostRoute())
    for worker in pool:
        target.script_worker(worker, Serve())
    first = host.route(HostRoute(session="s", backend_instance_id=explicit))
    worker = served(target, first, "AFF-005", f"the session's first request under {policy}")[0]
    bound_to(host, "s", worker, "AFF-005", f"after the first request under {policy}")
    if busy is not None:
        for stalled in reached(target, busy):
            target.release_stalled(stalled)
    for n in range(4):
        went = served(target, host.route(HostRoute(session="s")), "AFF-005", f"request {n + 2}")
        require_equal(
            "AFF-005",
            went,
            [worker],
            f"under {policy}, request {n + 2} of a session bound to {worker} went to {went}",
        )


@covers("AFF-005")
@requires(Capability.ROUTING_HOST)
def test_a_planned_route_follows_the_binding(target: Target) -> None:
    pool = workers(target, 3)
    host = host_of(target, "AFF-005", hard("kv"))
    for bound in pool:
        session = f"s{bound}"
        host.bind_session(session, bound)
        preview = planned(host.preview(HostRoute(session=session)), "AFF-005")
        plan = planned(host.plan(preview.plan_id), "AFF-005")
        went = reached(target, host.dispatch_plan(plan.plan_id))
        require(
            "AFF-005",
            preview.worker_id == plan.worker_id == bound and went == [bound],
            f"session {session} is bound to {bound}; its planned route previewed "
            f"{preview.worker_id}, planned {plan.worker_id} and reached {went}",
        )


@covers("AFF-005")
@requires(Capability.ROUTING_HOST, Capability.MOCK_CLOCK)
@pytest.mark.parametrize("rank", [0, 1])
def test_a_plan_whose_binding_lapsed_binds_the_rank_it_was_planned_for(
    target: Target, rank: int
) -> None:
    """A planned route previewed while its session was bound to a worker and rank: the binding
    lapses before the plan, so the plan's dispatch is the session's first again, and it binds
    the worker and the rank the route was planned for."""
    pool = workers(target, 2, Serve())
    host = host_of(target, "AFF-005", hard("kv"))
    for worker in pool:
        host.configure_worker(worker, dp_size=2)
    host.bind_session("s", pool[1], dp_rank=rank)
    preview = planned(host.preview(HostRoute(session="s")), "AFF-005")
    target.advance_time(TTL + 1)  # the binding lapses between the preview and the plan
    plan = planned(host.plan(preview.plan_id), "AFF-005")
    went = served(target, host.dispatch_plan(plan.plan_id), "AFF-005", "the planned route")
    view = host.session("s")
    require(
        "AFF-005",
        went == [pool[1]]
        and view.state == "bound"
        and view.worker_id == pool[1]
        # no rank and rank 0 are the same target (a worker's first rank)
        and (view.dp_rank or 0) == rank,
        f"a route planned for worker {pool[1]} rank {rank}, whose binding lapsed before the "
        f"plan, went to {went} and left the session {view}; it should bind {pool[1]} rank "
        f"{rank}",
    )


@covers("AFF-005")
@requires(Capability.ROUTING_HOST)
@pytest.mark.parametrize("mode", ["hard", "soft"])
def test_the_first_dispatch_binds_the_rank_it_was_pinned_to(target: Target, mode: str) -> None:
    """A first request pinned to a worker and a dp rank binds both: the rank is part of the
    target the session's later requests go to."""
    pinned, _ = workers(target, 2, Serve())
    host = host_of(target, "AFF-005", hard() if mode == "hard" else soft())
    host.configure_worker(pinned, dp_size=2)
    route = HostRoute(session="s", backend_instance_id=pinned, dp_rank=1)
    went = served(target, host.route(route), "AFF-005", "a first request pinned to rank 1")
    view = host.session("s")
    require_equal(
        "AFF-005",
        (went, view),
        ([pinned], SessionView("bound", pinned, 1)),
        f"the first request, pinned to worker {pinned} rank 1, went to {went} and left the "
        f"session {view}",
    )
    route = HostRoute(session="plain", backend_instance_id=pinned)
    went = served(target, host.route(route), "AFF-005", "a first request pinned to no rank")
    view = host.session("plain")
    require(
        "AFF-005",
        went == [pinned] and view.worker_id == pinned and not view.dp_rank,
        f"the first request, pinned to worker {pinned} and no rank, went to {went} and left "
        f"the session {view}",
    )


@covers("AFF-005")
@requires(Capability.ROUTING_HOST, Capability.VANISH_WORKER)
def test_a_first_dispatch_that_fell_back_binds_the_worker_that_served_it(
    target: Target,
) -> None:
    """Direct mode falls back from a pin whose transport record is gone (HST-008); the
    session binds the worker that served, without the rank the pin named for another."""
    pinned, spare = workers(target, 2, Serve())
    host = host_of(target, "AFF-005", hard("direct"))
    host.configure_worker(pinned, dp_size=2)
    target.vanish_worker(pinned)
    route = HostRoute(session="s", backend_instance_id=pinned, dp_rank=1)
    went = served(target, host.route(route), "AFF-005", "a pin whose worker vanished")
    view = host.session("s")
    require(
        "AFF-005",
        went == [spare] and view.state == "bound" and view.worker_id == spare and not view.dp_rank,
        f"pinned to vanished worker {pinned} rank 1, the first request should fall back to "
        f"{spare} and bind it with no rank; it went to {went} and the session is {view}",
    )


# --- AFF-006 ---


@covers("AFF-006")
@requires(Capability.ROUTING_HOST, Capability.REPORT_DOWN)
@pytest.mark.parametrize("mode", HARD_MODES)
def test_hard_affinity_dispatches_to_an_inhibited_target(target: Target, mode: str | None) -> None:
    pool = workers(target, 2, Serve())
    host = host_of(target, "AFF-006", hard(mode=mode))
    worker = served(target, host.route(HostRoute(session="s")), "AFF-006", "first request")[0]
    target.report_down(worker)
    others = [served(target, host.route(HostRoute()), "AFF-006", "unpinned") for _ in range(2)]
    require(
        "AFF-006",
        all(went == [other_than(pool, worker)] for went in others),
        f"precondition: worker {worker} reported down should be inhibited for unpinned "
        f"requests, but they went to {others}",
    )
    went = served(target, host.route(HostRoute(session="s")), "AFF-006", "inhibited target")
    require_equal(
        "AFF-006",
        went,
        [worker],
        f"a hard binding to the locally inhibited worker {worker} should still be "
        f"dispatched there, but the request went to {went}",
    )
    bound_to(host, "s", worker, "AFF-006", "after dispatching to the inhibited target")


@covers("AFF-006")
@requires(Capability.ROUTING_HOST, Capability.MARK_OVERLOADED)
@pytest.mark.parametrize("mode", HARD_MODES)
def test_hard_affinity_selects_an_overloaded_target(target: Target, mode: str | None) -> None:
    workers(target, 2, Serve())
    host = host_of(target, "AFF-006", hard(mode=mode))
    worker = served(target, host.route(HostRoute(session="s")), "AFF-006", "first request")[0]
    target.mark_overloaded(worker, True)
    outcome, went = ended(target, host.route(HostRoute(session="s")), "AFF-006")
    require(
        "AFF-006",
        not went
        and outcome.error is not None
        and shows(outcome.error, ["WorkerOverloaded"])
        and re.search(rf"\b{worker}\b", text(outcome.error)) is not None,
        f"a hard binding to the overloaded worker {worker} should be selected and fail the "
        f"dispatch's own overload check (WorkerOverloaded naming {worker}), never go "
        f"elsewhere; reached {went}, got {outcome}",
    )
    bound_to(host, "s", worker, "AFF-006", "after the overload check failed the dispatch")


@covers("AFF-006", "AFF-007")
@requires(Capability.ROUTING_HOST, Capability.VANISH_WORKER)
@pytest.mark.parametrize(
    ("mode", "policy"), [("hard", "round-robin"), ("hard", "direct"), ("soft", "direct")]
)
def test_an_exact_binding_whose_worker_vanished_fails_there(
    target: Target, mode: str, policy: str
) -> None:
    """A hard binding, and any binding in Direct mode, is the request's exact target: when
    the bound worker's transport record is gone, the request fails ``CannotConnect``
    (DSP-002) and reaches no other worker."""
    bound, _ = workers(target, 2, Serve())
    host = host_of(target, "AFF-006", hard(policy) if mode == "hard" else soft(policy))
    host.bind_session("s", bound)
    target.vanish_worker(bound)
    outcome, attempts = ended(target, host.route(HostRoute(session="s")), "AFF-006")
    require(
        "AFF-006" if mode == "hard" else "AFF-007",
        outcome.error is not None and shows_outer(outcome.error, "CannotConnect") and not attempts,
        f"session bound ({mode}, {policy}) to worker {bound}, whose transport record is gone: "
        f"expected CannotConnect and no worker reached; got {outcome}, reached {attempts}",
    )


# --- AFF-007 ---


def unavailable(target: Target, worker: int, how: str) -> None:
    if how == "overloaded":
        target.mark_overloaded(worker, True)
    else:
        target.report_down(worker)


SOFT_CAUSES = [
    pytest.param("overloaded", marks=pytest.mark.requires(Capability.MARK_OVERLOADED)),
    pytest.param("inhibited", marks=pytest.mark.requires(Capability.REPORT_DOWN)),
]


@covers("AFF-007")
@requires(Capability.ROUTING_HOST)
@pytest.mark.parametrize("how", SOFT_CAUSES)
def test_soft_affinity_falls_back_and_the_binding_follows(target: Target, how: str) -> None:
    workers(target, 3, Serve())
    host = host_of(target, "AFF-007", soft())
    worker = served(target, host.route(HostRoute(session="s")), "AFF-007", "first request")[0]
    for n in range(2):  # round-robin alone would rotate away from it
        went = served(target, host.route(HostRoute(session="s")), "AFF-007", "while free")
        require_equal(
            "AFF-007",
            went,
            [worker],
            f"request {n + 2} should prefer the free bound worker {worker}, went to {went}",
        )
    unavailable(target, worker, how)
    went = served(target, host.route(HostRoute(session="s")), "AFF-007", f"bound target {how}")
    require(
        "AFF-007",
        len(went) == 1 and went[0] != worker,
        f"with the bound worker {worker} {how}, a soft binding should fall back to another "
        f"worker; the request went to {went}",
    )
    fallback = went[0]
    bound_to(host, "s", fallback, "AFF-007", "the binding follows the dispatch")
    for n in range(2):
        again = served(target, host.route(HostRoute(session="s")), "AFF-007", "after following")
        require_equal(
            "AFF-007",
            again,
            [fallback],
            f"request {n + 1} after the binding followed to {fallback} went to {again}",
        )


@covers("AFF-007")
@requires(Capability.ROUTING_HOST, Capability.VANISH_WORKER)
@pytest.mark.parametrize("allowed", [False, True], ids=["unconstrained", "allowed-set"])
def test_a_soft_binding_whose_worker_vanished_falls_back_and_follows(
    target: Target, allowed: bool
) -> None:
    """A soft binding is a preference: when its worker's transport record is gone (the
    worker still listed, so still free), the request falls back as an unbound one would,
    inside its allowed set if it has one, and the binding follows the worker that served."""
    outside, bound, other = workers(target, 3, Serve())
    host = host_of(target, "AFF-007", soft())
    host.bind_session("s", bound)
    target.vanish_worker(bound)
    route = HostRoute(session="s", allowed=frozenset({bound, other}) if allowed else None)
    outcome, attempts = ended(target, host.route(route), "AFF-007")
    where = [other] if allowed else [outside, other]
    require(
        "AFF-007",
        outcome.error is None and len(attempts) == 1 and attempts[0] in where,
        f"soft binding to worker {bound}, whose transport record is gone ({route.allowed=}): "
        f"the request should fall back to one of {where}; it reached {attempts} "
        f"({outcome.error and outcome.error.describe()})",
    )
    bound_to(host, "s", attempts[0], "AFF-007", "after the dispatch fell back")


@covers("AFF-003", "AFF-007")
@requires(Capability.ROUTING_HOST, Capability.MOCK_CLOCK)
def test_a_planned_soft_dispatch_renews_the_binding_it_follows(target: Target) -> None:
    """Following the dispatch is a use: a soft session's plan dispatched TTL - 1 s after it
    was made keeps the binding for a whole TTL from the dispatch, not from the plan."""
    pool = workers(target, 2, Serve())
    host = host_of(target, "AFF-007", soft("kv"))
    host.bind_session("s", pool[0])
    preview = planned(host.preview(HostRoute(session="s")), "AFF-007")
    plan = planned(host.plan(preview.plan_id), "AFF-007")
    target.advance_time(TTL - 1)
    went = served(target, host.dispatch_plan(plan.plan_id), "AFF-007", "the planned request")
    require_equal("AFF-007", went, [pool[0]], f"bound to {pool[0]}, the plan went to {went}")
    target.advance_time(2.0)
    bound_to(host, "s", pool[0], "AFF-003", f"{TTL + 1} s after the plan, 2 s after its dispatch")


@covers("AFF-003", "AFF-007")
@requires(Capability.ROUTING_HOST, Capability.MOCK_CLOCK)
def test_a_planned_soft_dispatch_after_its_binding_lapsed_is_served(target: Target) -> None:
    """The other side of the renewal: a plan dispatched TTL + 1 s after it was made finds
    its session's binding lapsed; there is nothing left to follow, and the request is served
    all the same."""
    pool = workers(target, 2, Serve())
    host = host_of(target, "AFF-007", soft("kv"))
    host.bind_session("s", pool[0])
    preview = planned(host.preview(HostRoute(session="s")), "AFF-007")
    plan = planned(host.plan(preview.plan_id), "AFF-007")
    target.advance_time(TTL + 1)
    went = served(target, host.dispatch_plan(plan.plan_id), "AFF-007", "a plan past its TTL")
    require_equal("AFF-007", went, [pool[0]], f"planned for {pool[0]}, the request went to {went}")


@covers("AFF-007", "HST-021")
@requires(Capability.ROUTING_HOST, Capability.REPORT_DOWN)
def test_a_soft_session_with_no_worker_routable_fails_typed(target: Target) -> None:
    """With every worker inhibited, a soft session's request routes as if unbound and
    fails as a selection with nothing routable does (HST-021), typed, reaching no one."""
    pool = workers(target, 2, Serve())
    host = host_of(target, "AFF-007", soft())
    host.bind_session("s", pool[0])
    for worker in pool:
        target.report_down(worker)
    refused(target, host.route(HostRoute(session="s")), "AFF-007", "every worker inhibited")


@covers("AFF-007")
@requires(Capability.ROUTING_HOST)
def test_a_soft_binding_served_at_its_worker_keeps_its_rank(target: Target) -> None:
    """The binding follows the dispatch, rank included: a request served by the soft
    binding's own worker leaves the binding's rank as it was (1, or none)."""
    bound, _ = workers(target, 2, Serve())
    host = host_of(target, "AFF-007", soft())
    host.configure_worker(bound, dp_size=2)
    host.bind_session("ranked", bound, dp_rank=1)
    host.bind_session("plain", bound)
    for session, rank in (("ranked", 1), ("plain", 0)):
        went = served(target, host.route(HostRoute(session=session)), "AFF-007", session)
        view = host.session(session)
        require(
            "AFF-007",
            went == [bound] and view.worker_id == bound and (view.dp_rank or 0) == rank,
            f"session {session!r}, soft-bound to worker {bound} rank {rank or None}, should be "
            f"served there and keep its rank; it went to {went} and is {view}",
        )


@covers("AFF-007", "AFF-011")
@requires(Capability.ROUTING_HOST)
def test_an_excluded_soft_target_is_routed_around_and_the_binding_follows(
    target: Target,
) -> None:
    """A migration retry that excludes the soft binding's worker routes as if unbound (a
    soft binding does not pin), and the binding follows the dispatch."""
    bound, other = workers(target, 2, Serve())
    host = host_of(target, "AFF-007", soft())
    host.bind_session("s", bound)
    retry = HostRoute(session="s", excluded=frozenset({bound}))
    went = served(target, host.route(retry), "AFF-007", f"a retry excluding {bound}")
    require_equal(
        "AFF-007", went, [other], f"a retry excluding the soft target {bound} went to {went}"
    )
    bound_to(host, "s", other, "AFF-007", "after a retry that excluded the soft target")


@covers("AFF-007")
@requires(Capability.ROUTING_HOST)
def test_a_request_without_a_session_moves_no_soft_binding(target: Target) -> None:
    """Only a session's own requests move its soft binding: requests without a session are
    routed as if unbound and leave every binding alone."""
    bound, other = workers(target, 2, Serve())
    host = host_of(target, "AFF-007", soft())
    host.bind_session("s", bound)
    went = [w for _ in range(4) for w in served(target, host.route(HostRoute()), "AFF-007", "")]
    require(
        "AFF-007",
        sorted(set(went)) == sorted({bound, other}),
        f"requests without a session should be routed as if unbound (round-robin over "
        f"{bound} and {other}); they went to {went}",
    )
    bound_to(host, "s", bound, "AFF-007", "after requests without a session went elsewhere")


@covers("AFF-004", "AFF-007")
@requires(Capability.ROUTING_HOST)
@pytest.mark.parametrize("mode", ["hard", "soft"])
def test_an_empty_session_id_is_no_session(target: Target, mode: str) -> None:
    """Requests whose session id is empty are routed as requests without a session: they
    bind nothing, follow nothing and move no other session's binding."""
    bound, other = workers(target, 2, Serve())
    host = host_of(target, "AFF-004", hard() if mode == "hard" else soft())
    host.bind_session("s", bound)
    empty = HostRoute(session="")
    went = [w for _ in range(4) for w in served(target, host.route(empty), "AFF-004", "")]
    require(
        "AFF-004",
        sorted(set(went)) == sorted({bound, other}),
        f"requests with an empty session id should be routed as if unbound (round-robin over "
        f"{bound} and {other}), not pinned to one worker; they went to {went}",
    )
    bound_to(host, "s", bound, "AFF-007", "after requests with an empty session id")


@covers("AFF-007")
@requires(Capability.ROUTING_HOST, Capability.REPORT_DOWN)
def test_direct_mode_dispatches_a_soft_binding_exactly(target: Target) -> None:
    pool = workers(target, 2, Serve())
    host = host_of(target, "AFF-007", soft("direct"))
    worker = pool[1]
    host.bind_session("s", worker)
    went = served(target, host.route(HostRoute(session="s")), "AFF-007", "Direct, soft binding")
    require_equal("AFF-007", went, [worker], f"Direct mode should target {worker}, went to {went}")
    target.report_down(worker)
    went = served(target, host.route(HostRoute(session="s")), "AFF-007", "Direct, inhibited")
    require_equal(
        "AFF-007",
        went,
        [worker],
        f"in Direct mode a soft binding is the exact target even when {worker} is inhibited; "
        f"the request went to {went}",
    )
    bound_to(host, "s", worker, "AFF-007", "a Direct dispatch to the soft binding")


@covers("AFF-003", "AFF-007")
@requires(Capability.ROUTING_HOST, Capability.MOCK_CLOCK, Capability.SCRIPT_SILENCE)
def test_a_soft_binding_that_lapses_during_its_dispatch_stays_lapsed(target: Target) -> None:
    """The binding's TTL runs out while its request waits for the worker's ACK: the request
    is still served there, and following the dispatch does not bring the binding back."""
    ttl = 1.0
    workers(target, 2, Serve())
    host = host_of(target, "AFF-007", HostConfig(affinity_ttl=ttl, affinity_mode="soft"))
    worker = served(target, host.route(HostRoute(session="s")), "AFF-007", "first request")[0]
    target.script_worker(worker, Silent(SilentStage.ACK))
    request = host.route(HostRoute(session="s"))
    target.advance_time(ttl + 0.5)  # past the TTL, well before the ACK deadline
    target.release_stalled(worker)
    went = served(target, request, "AFF-007", "a request whose binding lapsed before its ACK")
    require_equal(
        "AFF-007", went, [worker], f"the session was bound to {worker} when routed; went {went}"
    )
    unbound(host, "s", "AFF-003", f"{ttl + 0.5} s after its last use (TTL {ttl} s)")


# --- AFF-008 ---

MODES = ["hard", "soft"]


@covers("AFF-008")
@requires(Capability.ROUTING_HOST, Capability.SCRIPT_STALL)
@pytest.mark.parametrize("mode", MODES)
def test_cancelled_requests_keep_the_binding(target: Target, mode: str) -> None:
    workers(target, 3, Serve())
    host = host_of(target, "AFF-008", hard() if mode == "hard" else soft())
    worker = served(target, host.route(HostRoute(session="s")), "AFF-008", "first request")[0]
    stopped = host.route(HostRoute(session="s", stopped=True))
    refused(target, stopped, "AFF-008", "a request stopped before routing")
    bound_to(host, "s", worker, "AFF-008", "after a request of the session was cancelled")
    target.script_worker(worker, Stall())
    open_request = host.route(HostRoute(session="s"))
    require(
        "AFF-008",
        reached(target, open_request) == [worker] and target.outcome(open_request) is None,
        f"precondition: the session's request should be open at {worker}; reached "
        f"{reached(target, open_request)}, outcome {target.outcome(open_request)}",
    )
    target.drop(open_request)
    bound_to(host, "s", worker, "AFF-008", "after the caller dropped a dispatched request")
    target.script_worker(worker, Serve())
    went = served(target, host.route(HostRoute(session="s")), "AFF-008", "after cancellations")
    require_equal("AFF-008", went, [worker], f"bound to {worker}, the next request went to {went}")


FAILURES: list[WorkerScript] = [
    FailBeforeStream(ErrorSpec("Disconnected")),
    FailMidStream(1, ErrorSpec("Disconnected")),
    FailMidStream(1, ErrorSpec("Backend(EngineShutdown)")),
]


@covers("AFF-008")
@requires(Capability.ROUTING_HOST, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "failure", FAILURES, ids=["before-stream", "mid-stream", "mid-stream-shutdown"]
)
def test_failures_after_selection_keep_the_binding(
    target: Target, mode: str, failure: WorkerScript
) -> None:
    workers(target, 3, Serve())
    host = host_of(target, "AFF-008", hard() if mode == "hard" else soft())
    worker = served(target, host.route(HostRoute(session="s")), "AFF-008", "first request")[0]
    target.script_worker(worker, failure)
    outcome, went = ended(target, host.route(HostRoute(session="s", max_tokens=3)), "AFF-008")
    require(
        "AFF-008",
        went == [worker] and outcome.error is not None,
        f"precondition: the session's request should fail at {worker} with {failure}; "
        f"reached {went}, got {outcome}",
    )
    bound_to(host, "s", worker, "AFF-008", f"after the bound worker failed ({failure})")
    if mode == "hard":
        target.script_worker(worker, Serve())
        went = served(target, host.route(HostRoute(session="s")), "AFF-008", "after a failure")
        require_equal("AFF-008", went, [worker], f"bound to {worker}, the request went to {went}")


# --- AFF-009 ---


@covers("AFF-009")
@requires(Capability.ROUTING_HOST, Capability.REMOVE_WORKER)
def test_a_binding_to_a_removed_worker_is_rebound_within_the_request(target: Target) -> None:
    pool = workers(target, 2, Serve())
    host = host_of(target, "AFF-009", hard())
    worker = served(target, host.route(HostRoute(session="s")), "AFF-009", "first request")[0]
    target.remove_worker(worker)
    went = served(target, host.route(HostRoute(session="s")), "AFF-009", "stale binding")
    survivor = other_than(pool, worker)
    require_equal(
        "AFF-009",
        went,
        [survivor],
        f"the binding to the removed worker {worker} should be replaced within the request "
        f"by {survivor}; the request went to {went}",
    )
    bound_to(host, "s", survivor, "AFF-009", "the request bound its new target")
    again = served(target, host.route(HostRoute(session="s")), "AFF-009", "after rebinding")
    require_equal("AFF-009", again, [survivor], f"rebound to {survivor}, next went to {again}")


@covers("AFF-009")
@requires(Capability.ROUTING_HOST, Capability.REMOVE_WORKER, Capability.MARK_OVERLOADED)
def test_a_failed_reselection_leaves_the_session_unbound(target: Target) -> None:
    bound, spare = workers(target, 2, Serve())
    host = host_of(target, "AFF-009", hard())
    host.bind_session("s", bound)
    target.remove_worker(bound)
    target.mark_overloaded(spare, True)
    refused(target, host.route(HostRoute(session="s")), "AFF-009", "no free worker to rebind")
    unbound(host, "s", "AFF-009", "the stale binding went and no new target was chosen")
    target.mark_overloaded(spare, False)
    went = served(target, host.route(HostRoute(session="s")), "AFF-009", "a worker is free")
    require_equal("AFF-009", went, [spare], f"the session's next request went to {went}")


@covers("AFF-009")
@requires(Capability.ROUTING_HOST)
@pytest.mark.parametrize("policy", ["round-robin", "kv"])
def test_a_binding_to_a_stale_dp_rank_is_rebound_within_the_request(
    target: Target, policy: str
) -> None:
    (worker,) = workers(target, 1, Serve())
    host = host_of(target, "AFF-009", hard(policy))
    host.configure_worker(worker, dp_size=2)
    host.bind_session("valid", worker, dp_rank=1)
    served(target, host.route(HostRoute(session="valid")), "AFF-009", "a rank in range")
    view = host.session("valid")
    require_equal(
        "AFF-009",
        view,
        SessionView("bound", worker, 1),
        f"rank 1 of a worker with dp_size 2 is valid and must be kept; the session is {view}",
    )
    host.configure_worker(worker, dp_size=1)
    host.bind_session("stale", worker, dp_rank=1)
    went = served(target, host.route(HostRoute(session="stale")), "AFF-009", "rank 1 of 1")
    view = host.session("stale")
    require(
        "AFF-009",
        went == [worker]
        and view.state == "bound"
        and view.worker_id == worker
        and view.dp_rank in (None, 0),
        f"a binding to dp rank 1 of a worker with dp_size 1 should be replaced within the "
        f"request by a valid target; reached {went}, the session is {view}",
    )


# --- AFF-010 ---


@covers("AFF-010")
@requires(Capability.ROUTING_HOST)
@pytest.mark.parametrize("conflict", ["allowed", "taints"])
def test_a_binding_the_request_rules_out_fails_without_rebinding(
    target: Target, conflict: str
) -> None:
    bound, other = workers(target, 2, Serve())
    host = host_of(target, "AFF-010", hard())
    host.configure_worker(other, taints=frozenset({"pool"}))
    host.bind_session("s", bound)
    route = HostRoute(session="s", allowed=frozenset({other}))
    if conflict == "taints":
        route = HostRoute(session="s", required_taints=frozenset({"pool"}))
    outcome = refused(
        target, host.route(route), "AFF-010", f"a request whose {conflict} excludes {bound}"
    )
    require(
        "AFF-010",
        shows_outer(outcome.error, "InvalidArgument"),
        f"a request that rules out its own hard binding is invalid; got {outcome.error}",
    )
    bound_to(host, "s", bound, "AFF-010", f"after a request whose {conflict} ruled it out")
    went = served(target, host.route(HostRoute(session="s")), "AFF-010", "unconstrained")
    require_equal("AFF-010", went, [bound], f"bound to {bound}, the next request went to {went}")


@covers("AFF-010")
@requires(Capability.ROUTING_HOST)
def test_a_config_watch_gap_fails_without_rebinding(target: Target) -> None:
    known, gap = workers(target, 2, Serve())
    host = host_of(target, "AFF-010", hard("kv"))
    host.configure_worker(gap, dp_size=4)
    host.bind_session("s", gap, dp_rank=2)  # a rank only the missing configuration vouches for
    host.forget_worker_config(gap)
    outcome = refused(target, host.route(HostRoute(session="s")), "AFF-010", "config not yet seen")
    require(
        "AFF-010",
        shows_outer(outcome.error, "Unavailable"),
        f"the selector does not know the bound worker yet: expected Unavailable, got "
        f"{outcome.error}",
    )
    bound_to(host, "s", gap, "AFF-010", "after the selector did not know the bound worker")
    host.configure_worker(gap, dp_size=4)
    went = served(target, host.route(HostRoute(session="s")), "AFF-010", "config seen")
    require_equal(
        "AFF-010", went, [gap], f"bound to {gap} (not {known}), the request went to {went}"
    )


# --- AFF-011 ---


@covers("AFF-011")
@requires(Capability.ROUTING_HOST)
def test_an_exclusion_never_rebinds_a_hard_affinity(target: Target) -> None:
    bound, other = workers(target, 2, Serve())
    host = host_of(target, "AFF-011", hard())
    host.bind_session("s", bound)
    retry = HostRoute(session="s", allowed=frozenset({bound, other}), excluded=frozenset({bound}))
    outcome = refused(target, host.route(retry), "AFF-011", f"a retry excluding {bound}")
    require_compare(
        "AFF-011",
        re.search(rf"\b{bound}\b", text(outcome.error)),
        "is not",
        None,
        f"the retry should fail naming the excluded bound worker {bound}, got {outcome.error}",
    )
    bound_to(host, "s", bound, "AFF-011", "after a retry that excluded the bound worker")


@covers("AFF-011")
@requires(Capability.ROUTING_HOST, Capability.MIGRATION, Capability.SCRIPT_FAILURES)
def test_migration_never_moves_a_hard_affinity(target: Target) -> None:
    bound, _ = workers(target, 2, Serve())
    host = host_of(target, "AFF-011", hard())
    host.bind_session("s", bound)
    target.script_worker(bound, FailBeforeStream(ErrorSpec("Disconnected")))
    outcome, went = ended(target, host.route(HostRoute(session="s", migration_limit=3)), "AFF-011")
    require(
        "AFF-011",
        outcome.error is not None and went == [bound],
        f"a migratable failure at the hard-bound worker {bound} must not send the retry "
        f"elsewhere; reached {went}, got {outcome}",
    )
    bound_to(host, "s", bound, "AFF-011", "after migration gave up on the bound worker")


@covers("AFF-011", "MIG-012")
@requires(Capability.ROUTING_HOST)
@pytest.mark.parametrize("constraint", ["allowed", "taints"])
def test_an_exclusion_never_widens_the_eligible_set(target: Target, constraint: str) -> None:
    eligible, _, _ = workers(target, 3, Serve())
    host = host_of(target, "AFF-011", HostConfig())
    host.configure_worker(eligible, taints=frozenset({"retry-pool"}))
    if constraint == "allowed":
        retry = HostRoute(allowed=frozenset({eligible, 999}), excluded=frozenset({eligible}))
    else:
        retry = HostRoute(required_taints=frozenset({"retry-pool"}), excluded=frozenset({eligible}))
    outcome = refused(target, host.route(retry), "AFF-011", f"{constraint} exhausted")
    require(
        "AFF-011",
        outcome.error is not None
        and outcome.error.pre_stream
        and shows(outcome.error, ["ResourceExhausted"]),
        f"with the only {constraint}-eligible worker {eligible} excluded, the retry should "
        f"fail with ResourceExhausted, got {outcome.error}",
    )
    exhausted = "all eligible workers rejected the request as overloaded"
    require(
        "MIG-012",
        exhausted in text(outcome.error),
        f"every eligible worker failed the request as overloaded (the exclusions): the error "
        f"should say {exhausted!r}, not that the pool is busy; got {outcome.error}",
    )


@covers("AFF-011")
@requires(Capability.ROUTING_HOST)
@pytest.mark.parametrize("policy", ["round-robin", "least-loaded", "kv"])
def test_an_exclusion_never_overrides_an_explicit_pin(target: Target, policy: str) -> None:
    pinned, _ = workers(target, 2, Serve())
    host = host_of(target, "AFF-011", HostConfig(policy=policy))
    retry = HostRoute(backend_instance_id=pinned, excluded=frozenset({pinned}))
    went = served(target, host.route(retry), "AFF-011", f"pinned to {pinned}, excluded")
    require_equal(
        "AFF-011",
        went,
        [pinned],
        f"a request pinned to {pinned} must go there even when excluded; it went to {went}",
    )


# --- AFF-012 ---


@covers("AFF-012")
@requires(Capability.ROUTING_HOST)
def test_a_preview_does_not_acquire_the_session(target: Target) -> None:
    workers(target, 2, Serve())
    host = host_of(target, "AFF-012", hard("kv"))
    planned(host.preview(HostRoute(session="s")), "AFF-012")
    unbound(host, "s", "AFF-012", "after a preview")
    request = host.route(HostRoute(session="s"))
    require_compare(
        "AFF-012",
        target.outcome(request),
        "is not",
        None,
        "a request after a preview of its session must not wait: it is still open",
    )
    worker = served(target, request, "AFF-012", "after a preview")[0]
    bound_to(host, "s", worker, "AFF-012", "the request, not the preview, binds the session")


@covers("AFF-012")
@requires(Capability.ROUTING_HOST)
def test_an_aborted_plan_leaves_the_session_unbound(target: Target) -> None:
    workers(target, 2, Serve())
    host = host_of(target, "AFF-012", hard("kv"))
    preview = planned(host.preview(HostRoute(session="s")), "AFF-012")
    unbound(host, "s", "AFF-012", "after a preview")  # else the plan would wait for it
    plan = planned(host.plan(preview.plan_id), "AFF-012")
    require_equal(
        "AFF-012",
        host.session("s").state,
        "initializing",
        f"an open plan holds the session's initialization: {host.session('s')}",
    )
    host.abort_plan(plan.plan_id)
    unbound(host, "s", "AFF-012", "after the plan was aborted")
    request = host.route(HostRoute(session="s"))
    require_compare(
        "AFF-012",
        target.outcome(request),
        "is not",
        None,
        "a request after an aborted plan of its session must not wait: it is still open",
    )
    outcome = finished(target, request, "AFF-012")
    require_compare(
        "AFF-012", outcome.error, "is", None, f"the request after the abort failed: {outcome}"
    )


# --- AFF-013 ---


@covers("AFF-013")
@requires(Capability.ROUTING_HOST)
def test_without_affinity_a_planned_route_ignores_its_session(target: Target) -> None:
    """A KV host without affinity previews, plans and dispatches a request that carries a
    session id as if it carried none, and binds nothing."""
    workers(target, 2, Serve())
    host = host_of(target, "AFF-013", HostConfig(policy="kv"))
    preview = planned(host.preview(HostRoute(session="s")), "AFF-013")
    plan = planned(host.plan(preview.plan_id), "AFF-013")
    went = served(target, host.dispatch_plan(plan.plan_id), "AFF-013", "a planned session route")
    require(
        "AFF-013",
        went == [plan.worker_id] and host.session("s") == SessionView("disabled"),
        f"planned on worker {plan.worker_id}, the request went to {went}; the session is "
        f"{host.session('s')} (a host without affinity binds nothing)",
    )


@covers("AFF-013")
@requires(Capability.ROUTING_HOST)
def test_without_affinity_session_ids_are_ignored(target: Target) -> None:
    pool = workers(target, 2, Serve())
    host = host_of(target, "AFF-013", HostConfig(policy="round-robin"))
    require_equal(
        "AFF-013",
        host.session("s"),
        SessionView("disabled"),
        f"a host without affinity should report the session disabled: {host.session('s')}",
    )
    went = [
        served(target, host.route(HostRoute(session="s")), "AFF-013", "session id")[0]
        for _ in range(4)
    ]
    require_equal(
        "AFF-013",
        set(went),
        set(pool),
        f"without affinity, round-robin should spread one session's requests over {pool}; "
        f"they went to {went}",
    )
    long_id = "x" * (MAX_SESSION_BYTES + 44)
    served(target, host.route(HostRoute(session=long_id)), "AFF-013", "a 300-byte session id")
    for session in ("s", long_id):
        require_equal(
            "AFF-013",
            host.session(session),
            SessionView("disabled"),
            f"nothing is bound without affinity: {host.session(session)}",
        )
