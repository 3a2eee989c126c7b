"""A stateful machine for migration: random worker failures under random limits.

Each request is a token request, so its expected answer is known without a model: a request
that completes reads exactly the tokens of one uninterrupted generation. The machine checks,
for every request, the invariants of MIG against the dispatch log and the workers' scripts.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
    precondition,
    rule,
)

from routespec.conformance import oracle
from routespec.conformance.checks import covers, require, require_compare, require_equal, requires
from routespec.conformance.machine import TargetMachine
from routespec.conformance.scenario import MODE_CAPABILITY, tokens
from routespec.testing.target import (
    Adapter,
    CancelThenFail,
    Capability,
    ErrorSpec,
    FailBeforeStream,
    FailMidStream,
    Migrate,
    Reject,
    Serve,
    TargetConfig,
    WorkerScript,
)

MAX_WORKERS = 5
MODES = ("round-robin", "random", "least-loaded", "power-of-two-choices")
LABELS: tuple[str | None, ...] = (None, *oracle.TYPE_LABELS)
# Half the links come from the two sets that decide migration, so the rare cases (a blocking
# type under a migratable one, and the reverse) turn up within the default budget.
labels = st.one_of(
    st.sampled_from(sorted(oracle.MIGRATION_SENSITIVE_TYPES | oracle.MIGRATABLE_TYPES)),
    st.sampled_from(LABELS),
)
errors = st.builds(ErrorSpec, labels, st.just("injected"), st.none() | st.builds(ErrorSpec, labels))
scripts: st.SearchStrategy[WorkerScript] = st.one_of(
    st.just(Serve()),
    st.builds(FailBeforeStream, errors),
    st.builds(FailMidStream, st.integers(0, 4), errors),
    st.builds(CancelThenFail, st.integers(0, 3), errors),
    st.builds(Reject, st.booleans()),
)


def visible_failure(script: WorkerScript) -> tuple[str | None, ...] | None:
    """The chain a caller sees from a worker under ``script``, or None if it succeeds."""
    if isinstance(script, Reject):
        return (oracle.REJECTION_TYPES[script.overloaded],)
    if isinstance(script, FailBeforeStream):
        return oracle.pre_stream_chain([link.type for link in script.error.chain()])
    if isinstance(script, FailMidStream | CancelThenFail):
        return tuple(link.type for link in script.error.chain())
    return None


class MigrationMachine(TargetMachine):
    def __init__(self, adapter: Adapter) -> None:
        super().__init__(adapter)
        self.scripts: dict[int, WorkerScript] = {}

    @initialize(seed=st.integers(0, 2**32 - 1), workers=st.integers(1, 3))
    def open_target(self, seed: int, workers: int) -> None:
        self.open(TargetConfig(seed))
        for _ in range(workers):
            self.add_worker()

    @precondition(lambda self: len(self.scripts) < MAX_WORKERS)
    @rule()
    def add_worker(self) -> None:
        self.scripts[self.target.add_worker()] = Serve()

    @rule(pick=st.integers(0, MAX_WORKERS), script=scripts)
    def script_worker(self, pick: int, script: WorkerScript) -> None:
        if isinstance(script, Reject) and Capability.SCRIPT_REJECTION not in self.caps:
            return
        worker = sorted(self.scripts)[pick % len(self.scripts)]
        self.target.script_worker(worker, script)
        self.scripts[worker] = script

    @precondition(lambda self: Capability.MOCK_CLOCK in self.caps)
    @rule(seconds=st.sampled_from([0.5, 1.0, 5.0, 10.0]))
    def advance_time(self, seconds: float) -> None:
        self.target.advance_time(seconds)

    @rule(
        mode=st.sampled_from(MODES),
        limit=st.integers(0, 4),
        prompt=st.integers(0, 4),
        max_tokens=st.integers(0, 6),
        min_tokens=st.integers(0, 3),
        pin=st.sampled_from([None, None, None, 0, 1, 2, 3, 4]),
    )
    def submit(
        self, mode: str, limit: int, prompt: int, max_tokens: int, min_tokens: int, pin: int | None
    ) -> None:
        if MODE_CAPABILITY[mode] not in self.caps:
            mode = "round-robin"
        pinned = None if pin is None else sorted(self.scripts)[pin % len(self.scripts)]
        call = Migrate(mode, limit, prompt, max_tokens, min_tokens, pin=pinned)
        request = self.target.submit(call)
        outcome = self.target.outcome(request)
        require_compare(
            "MIG-008", outcome, "is not", None, f"{call} is still open; no worker stalls here"
        )
        assert outcome is not None
        attempts = [d.worker_id for d in self.target.dispatch_log() if d.request_id == request]
        said = f"{call} reached {attempts} and ended {outcome}"
        require_compare(
            "MIG-004", len(attempts), "<=", limit + 1, f"more than limit + 1 attempts: {said}"
        )
        require("MIG-011", pinned is None or attempts in ([], [pinned]), f"pin moved: {said}")
        require_equal("MIG-010", len(set(attempts)), len(attempts), f"a worker was retried: {said}")
        for worker in attempts[:-1]:
            chain = visible_failure(self.scripts[worker])
            require(
                "MIG-001" if chain and set(chain) & oracle.MIGRATION_SENSITIVE_TYPES else "MIG-003",
                chain is not None and oracle.migratable(chain),
                f"worker {worker} under {self.scripts[worker]} should end the request "
                f"(chain {chain}), yet it was retried: {said}",
            )
        expected = list(range(prompt, prompt + max_tokens))
        got = tokens(outcome)
        require(
            "MIG-009",
            got == expected if outcome.error is None else got == expected[: len(got)],
            f"the client's tokens {got} are not one uninterrupted generation {expected}: {said}",
        )
        reasons = [i.get("finish_reason") for i in outcome.items if isinstance(i, dict)]
        require(
            "MIG-013",
            "cancelled" not in reasons[:-1]
            and (reasons[-1:] != ["cancelled"] or outcome.error is not None),
            f"an aborted attempt's terminal frame reached the client: {said}",
        )
        if Capability.OBSERVE_OCCUPANCY in self.caps and Capability.OBSERVE_INFLIGHT in self.caps:
            booked = {w: n for w, n in self.target.occupancy().items() if n}
            inflight = self.target.transport_inflight()
            require(
                "MIG-014",
                not booked and inflight == 0,
                f"after {said}: bookings {booked}, inflight {inflight}",
            )


@covers(
    "MIG-001", "MIG-003", "MIG-004", "MIG-008", "MIG-009", "MIG-010", "MIG-011", "MIG-013",
    "MIG-014",
)  # fmt: skip
@requires(Capability.MIGRATION, Capability.SCRIPT_FAILURES)
def test_migration_machine(adapter: Adapter) -> None:
    MigrationMachine.run(adapter)
