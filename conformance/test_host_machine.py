"""A stateful machine for the routing host: random routes, sessions, stops, failures and time.

Each step routes one token request (or drops, releases or advances time) and then checks the
host's books against what the caller saw: bookings and LoRA counts at rest are zero, the
completed counter matches the clean outcomes, every delivery was admitted, stopped requests
reach a worker only to release staged KV, and a hard-bound session goes to its worker.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
    invariant,
    precondition,
    rule,
)

from routespec.conformance.checks import (
    covers,
    require,
    require_compare,
    require_equal,
    require_false,
    requires,
)
from routespec.conformance.machine import TargetMachine
from routespec.conformance.scenario import MODE_CAPABILITY
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
    RoutingHostTarget,
    Serve,
    Stall,
    TargetConfig,
    TerminalThen,
    WorkerScript,
)

MAX_WORKERS = 4
POLICIES = ("round-robin", "random", "least-loaded", "power-of-two-choices", "kv")
SESSIONS = ("a", "b", "c")
errors = st.builds(
    ErrorSpec,
    st.sampled_from(["Disconnected", "WorkerOverloaded", "Backend(EngineShutdown)", "Unknown"]),
)
scripts: st.SearchStrategy[WorkerScript] = st.one_of(
    st.just(Serve()),
    st.builds(FailBeforeStream, errors),
    st.builds(FailMidStream, st.integers(0, 2), errors),
    st.builds(CancelThenFail, st.integers(0, 2), errors),
    st.builds(Stall, st.integers(0, 2)),
    st.builds(
        TerminalThen,
        st.integers(0, 2),
        st.sampled_from(["cancelled", "error", "stop"]),
        st.booleans(),
        st.none() | errors,
    ),
)
DRAINED = frozenset({"cancelled", "error"})


def finished_cleanly(outcome: Outcome) -> bool:
    """Ended at end of stream with no error and no drained terminal frame (HST-011)."""
    last = outcome.items[-1] if outcome.items else None
    reason = last.get("finish_reason") if isinstance(last, dict) else None
    return outcome.error is None and not outcome.dropped and reason not in DRAINED


class HostMachine(TargetMachine):
    def __init__(self, adapter: Adapter) -> None:
        super().__init__(adapter)
        self.host: RoutingHostTarget
        self.workers: list[int] = []
        self.requests: dict[str, HostRoute] = {}
        self.hard_affinity = False

    @initialize(
        seed=st.integers(0, 2**32 - 1),
        policy=st.sampled_from(POLICIES),
        affinity=st.sampled_from([None, "hard", "soft"]),
        workers=st.integers(1, 3),
    )
    def open_host(self, seed: int, policy: str, affinity: str | None, workers: int) -> None:
        self.open(TargetConfig(seed))
        for _ in range(workers):
            self.add_worker()
        if policy in MODE_CAPABILITY and MODE_CAPABILITY[policy] not in self.caps:
            policy = "round-robin"
        config = HostConfig(policy, None if affinity is None else 30.0, affinity or "hard")
        built = self.target.open_host(config)
        assert not isinstance(built, ObservedError), built
        self.host = built
        self.hard_affinity = affinity == "hard"

    @precondition(lambda self: len(self.workers) < MAX_WORKERS)
    @rule()
    def add_worker(self) -> None:
        self.workers.append(self.target.add_worker())

    @rule(pick=st.integers(0, MAX_WORKERS), script=scripts)
    def script_worker(self, pick: int, script: WorkerScript) -> None:
        self.target.script_worker(self.workers[pick % len(self.workers)], script)

    @precondition(lambda self: Capability.MARK_OVERLOADED in self.caps)
    @rule(pick=st.integers(0, MAX_WORKERS), overloaded=st.booleans())
    def mark_overloaded(self, pick: int, overloaded: bool) -> None:
        self.target.mark_overloaded(self.workers[pick % len(self.workers)], overloaded)

    @precondition(lambda self: Capability.REPORT_DOWN in self.caps)
    @rule(pick=st.integers(0, MAX_WORKERS))
    def report_down(self, pick: int) -> None:
        self.target.report_down(self.workers[pick % len(self.workers)])

    @precondition(lambda self: Capability.VANISH_WORKER in self.caps)
    @rule(pick=st.integers(0, MAX_WORKERS))
    def vanish_worker(self, pick: int) -> None:
        """The worker's transport record goes; transport fallback may then move requests."""
        self.target.vanish_worker(self.workers[pick % len(self.workers)])

    @rule(pick=st.integers(0, MAX_WORKERS))
    def release_stalled(self, pick: int) -> None:
        self.target.release_stalled(self.workers[pick % len(self.workers)])

    @precondition(lambda self: Capability.MOCK_CLOCK in self.caps)
    @rule(seconds=st.sampled_from([1.0, 2.5, 6.0, 40.0]))
    def advance_time(self, seconds: float) -> None:
        self.target.advance_time(seconds)

    @precondition(lambda self: any(self.target.outcome(r) is None for r in self.requests))
    @rule(pick=st.integers(0, 100))
    def drop(self, pick: int) -> None:
        open_requests = sorted(r for r in self.requests if self.target.outcome(r) is None)
        self.target.drop(open_requests[pick % len(open_requests)])

    @rule(
        session=st.sampled_from([None, *SESSIONS]),
        phase=st.sampled_from(["aggregated", "prefill", "decode"]),
        stopped=st.booleans(),
        staged_kv=st.booleans(),
        pin=st.sampled_from([None, None, None, 0, 1]),
        limit=st.sampled_from([None, None, 0, 2]),
        prompt=st.lists(st.integers(0, 1), min_size=1, max_size=40),
        max_tokens=st.integers(1, 3),
    )
    def route(
        self,
        session: str | None,
        phase: str,
        stopped: bool,
        staged_kv: bool,
        pin: int | None,
        limit: int | None,
        prompt: list[int],
        max_tokens: int,
    ) -> None:
        pinned = None if pin is None else self.workers[pin % len(self.workers)]
        bound = self.host.session(session) if session is not None else None
        route = HostRoute(
            phase,
            backend_instance_id=pinned,
            session=session,
            tokens=tuple(prompt),
            max_tokens=max_tokens,
            staged_kv=staged_kv,
            stopped=stopped,
            migration_limit=limit,
        )
        request = self.host.route(route)
        self.requests[request] = route
        attempts = [d.worker_id for d in self.target.dispatch_log() if d.request_id == request]
        outcome = self.target.outcome(request)
        said = f"{route} reached {attempts}, outcome {outcome}"
        must_reach = phase == "decode" and staged_kv
        if stopped and not must_reach:
            require(
                "HST-012",
                not attempts and outcome is not None and outcome.error is not None
                and outcome.error.type == "Cancelled",
                f"a stopped request without staged KV must be cancelled unseen: {said}",
            )  # fmt: skip
        if stopped and must_reach:
            require_compare(
                "HST-013", len(attempts), "<=", 1, f"the staged-KV leg went out twice: {said}"
            )
        if (
            self.hard_affinity
            and bound is not None
            and bound.state == "bound"
            and pinned is None
            and attempts
        ):
            require_equal(
                "AFF-006",
                attempts[0],
                bound.worker_id,
                f"session {session} is hard-bound to {bound.worker_id}: {said}",
            )

    @invariant()
    def books_balance(self) -> None:
        if not hasattr(self, "host"):
            return
        outcomes = {r: self.target.outcome(r) for r in self.requests}
        open_count = sum(1 for o in outcomes.values() if o is None)
        bookings = self.host.bookings()
        require_compare(
            "HST-002",
            sum(bookings.values()),
            "<=",
            open_count,
            f"{open_count} requests open, bookings {bookings}",
        )
        if not open_count:
            require_false("MON-005", bookings, f"bookings at rest: {bookings}")
            initializing = [s for s in SESSIONS if self.host.session(s).state == "initializing"]
            require_false(
                "AFF-002",
                initializing,
                f"no request is in flight, yet sessions {initializing} are still initializing",
            )
        clean = sum(
            1
            for request, outcome in outcomes.items()
            if outcome is not None
            and finished_cleanly(outcome)
            and not self.requests[request].stopped
        )
        started, completed = self.host.counters()
        require_equal(
            "HST-011",
            completed,
            clean,
            f"completed {completed}, but {clean} requests finished cleanly",
        )
        delivered = sum(1 for d in self.target.dispatch_log() if d.request_id in self.requests)
        require_compare(
            "HST-010",
            started,
            ">=",
            delivered,
            f"{delivered} deliveries but only {started} admissions counted",
        )


@covers("HST-002", "HST-010", "HST-011", "HST-012", "HST-013", "AFF-002", "AFF-006", "MON-005")
@requires(Capability.ROUTING_HOST, Capability.SCRIPT_FAILURES, Capability.SCRIPT_STALL)
def test_host_machine(adapter: Adapter) -> None:
    HostMachine.run(adapter)
