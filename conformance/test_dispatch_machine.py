"""A stateful machine that interleaves discovery changes, inhibition, overload marks, scripted
workers, time and every dispatch call, and compares the target with the executable model."""

from __future__ import annotations

import sys

from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
    invariant,
    precondition,
    rule,
)

from routespec.conformance import oracle
from routespec.conformance.checks import (
    covers,
    exercised,
    require,
    require_compare,
    require_equal,
    require_false,
)
from routespec.conformance.machine import TargetMachine
from routespec.conformance.model import (
    BUILTIN_MODES,
    REFUSED_MODES,
    Expected,
    RouterModel,
    WorkerModel,
)
from routespec.testing.target import (
    Adapter,
    Bidirectional,
    Call,
    Capability,
    Direct,
    DirectWithin,
    ErrorSpec,
    FailBeforeStream,
    FailMidStream,
    Generate,
    HostRoute,
    Migrate,
    Outcome,
    Preselected,
    Reject,
    Serve,
    Stall,
    TargetConfig,
    WorkerScript,
)

ERROR_LABELS: tuple[str | None, ...] = (None, *oracle.TYPE_LABELS)
UNKNOWN_WORKER = 999_999
SEL_002_CHECK = "conformance/test_selection.py::test_kv_and_direct_are_refused"
TIMED_CAUSES = frozenset(
    {
        Capability.SCRIPT_FAILURES,
        Capability.SCRIPT_REJECTION,
        Capability.MARK_OVERLOADED,
        Capability.REPORT_DOWN,
        Capability.KILL_WORKER,  # dispatches to a dead worker inhibit it
    }
)
MAX_WORKERS = 6

error_specs = st.builds(
    ErrorSpec,
    st.sampled_from(ERROR_LABELS),
    st.just("injected"),
    st.none() | st.builds(ErrorSpec, st.sampled_from(ERROR_LABELS)),
)
scripts: st.SearchStrategy[WorkerScript] = st.one_of(
    st.builds(Serve, st.integers(0, 3)),
    st.builds(FailBeforeStream, error_specs),
    st.builds(FailMidStream, st.integers(0, 2), error_specs),
    st.builds(Stall, st.integers(0, 2), st.integers(0, 2)),
    st.builds(Reject, st.booleans()),
)


def _script_capability(script: WorkerScript) -> Capability | None:
    if isinstance(script, Stall):
        return Capability.SCRIPT_STALL
    if isinstance(script, FailBeforeStream | FailMidStream):
        return Capability.SCRIPT_FAILURES
    if isinstance(script, Reject):
        return Capability.SCRIPT_REJECTION
    return None


def _labels(outcome: Outcome) -> tuple[str | None, ...]:
    assert outcome.error is not None
    return tuple(label for label, _ in outcome.error.links)


class DispatchMachine(TargetMachine):
    model: RouterModel

    def timed(self, capability: Capability) -> bool:
        """Steps that start leases or inhibitions need the suite's clock: on a target that
        runs on real time they would lapse between steps and the model would race them."""
        return self.has(capability) and (
            capability not in TIMED_CAUSES or self.has(Capability.MOCK_CLOCK)
        )

    def worker(self, pick: int, *, where: str = "any") -> int:
        ids = self.candidates(where)
        return ids[pick % len(ids)]

    def candidates(self, where: str) -> list[int]:
        workers = self.model.workers
        return sorted(
            i
            for i, w in workers.items()
            if where == "any"
            or (where == "listed" and w.listed)
            or (where == "alive" and w.alive and w.listed)
            or (where == "record" and w.record)
        )

    @initialize(
        seed=st.integers(0, 2**32 - 1),
        inhibited_duration=st.sampled_from([None, 0.0, 2.0]),  # None: the target's own
        fault_detection=st.booleans(),
        devices=st.lists(st.sampled_from(["cuda", "cpu"]), max_size=4),
    )
    def open_target(
        self,
        seed: int,
        inhibited_duration: float | None,
        fault_detection: bool,
        devices: list[str],
    ) -> None:
        if not self.has(Capability.CONFIGURE_INHIBITION):
            inhibited_duration, fault_detection = None, True
        config = TargetConfig(seed, inhibited_duration, fault_detection)
        self.model = RouterModel.of(config)
        self.open(config)
        for device in devices:
            self.add_worker(device)

    def teardown(self) -> None:
        if self.context is None:
            return
        try:
            for request_id in list(self.model.open):
                self.target.drop(request_id)
            if sys.exc_info()[1] is None and self.has(Capability.OBSERVE_OCCUPANCY):
                occupancy = dict(self.target.occupancy())
                require_false("DSP-011", occupancy, f"occupancy {occupancy} with no stream open")
        finally:
            super().teardown()

    # --- cluster control ---

    @precondition(lambda self: len(self.model.workers) < MAX_WORKERS)
    @rule(device=st.sampled_from(["cuda", "cpu"]))
    def add_worker(self, device: str) -> None:
        if not self.has(Capability.DEVICE_TYPES):
            device = "cuda"
        worker_id = self.target.add_worker(device=device)
        self.model.workers[worker_id] = WorkerModel(device)

    @precondition(lambda self: self.has(Capability.REMOVE_WORKER) and self.candidates("listed"))
    @rule(pick=st.integers(0, MAX_WORKERS))
    def remove_worker(self, pick: int) -> None:
        worker_id = self.worker(pick, where="listed")
        self.target.remove_worker(worker_id)
        self.model.workers[worker_id].listed = False
        self.model.workers[worker_id].record = False

    @precondition(lambda self: self.timed(Capability.KILL_WORKER) and self.candidates("alive"))
    @rule(pick=st.integers(0, MAX_WORKERS))
    def kill_worker(self, pick: int) -> None:
        worker_id = self.worker(pick, where="alive")
        stalled = {rid: r.script for rid, r in self.model.open.items() if r.worker == worker_id}
        self.target.kill_worker(worker_id)
        self.model.kill(worker_id)
        for request_id, script in stalled.items():
            outcome = self.target.outcome(request_id)
            require_compare(
                "DSP-015", outcome, "is not", None, f"{request_id} still open after its worker died"
            )
            assert outcome is not None
            require(
                "DSP-015",
                outcome.error is not None
                and outcome.error.type == "Disconnected"
                and len(outcome.items) == script.items,
                f"{request_id}: expected {script.items} items then Disconnected, got {outcome}",
            )

    @precondition(lambda self: self.has(Capability.VANISH_WORKER) and self.candidates("record"))
    @rule(pick=st.integers(0, MAX_WORKERS))
    def vanish_worker(self, pick: int) -> None:
        worker_id = self.worker(pick, where="record")
        self.target.vanish_worker(worker_id)
        self.model.workers[worker_id].record = False

    @precondition(lambda self: self.model.workers)
    @rule(pick=st.integers(0, MAX_WORKERS), script=scripts)
    def script_worker(self, pick: int, script: WorkerScript) -> None:
        needed = _script_capability(script)
        if needed is not None and not (self.has(needed) and self.timed(needed)):
            return
        worker_id = self.worker(pick)
        self.target.script_worker(worker_id, script)
        self.model.workers[worker_id].script = script

    @precondition(lambda self: self.timed(Capability.MARK_OVERLOADED) and self.model.workers)
    @rule(pick=st.integers(0, MAX_WORKERS), overloaded=st.booleans())
    def mark_overloaded(self, pick: int, overloaded: bool) -> None:
        worker_id = self.worker(pick)
        self.target.mark_overloaded(worker_id, overloaded)
        self.model.workers[worker_id].monitor_overloaded = overloaded

    @precondition(lambda self: self.timed(Capability.REPORT_DOWN) and self.model.workers)
    @rule(pick=st.integers(0, MAX_WORKERS))
    def report_down(self, pick: int) -> None:
        worker_id = self.worker(pick)
        self.target.report_down(worker_id)
        self.model.report_down(worker_id)

    @precondition(lambda self: self.has(Capability.MOCK_CLOCK))
    @rule(seconds=st.sampled_from([0.25, 0.5, 1.0, 2.0, 5.0]))
    def advance_time(self, seconds: float) -> None:
        self.target.advance_time(seconds)
        self.model.advance(seconds)

    @precondition(lambda self: self.has(Capability.SCRIPT_STALL) and self.model.open)
    @rule(pick=st.integers(0, MAX_WORKERS))
    def release_stalled(self, pick: int) -> None:
        workers = sorted({r.worker for r in self.model.open.values()})
        worker_id = workers[pick % len(workers)]
        released = {rid: r for rid, r in self.model.open.items() if r.worker == worker_id}
        self.target.release_stalled(worker_id)
        for request_id, request in released.items():
            del self.model.open[request_id]
            outcome = self.target.outcome(request_id)
            expected = request.script.items + request.script.items_after
            require(
                "DSP-013",
                outcome is not None and outcome.error is None and len(outcome.items) == expected,
                f"{request_id} released on worker {worker_id}: expected {expected} items and a "
                f"clean end, got {outcome}",
            )

    @precondition(lambda self: self.model.open)
    @rule(pick=st.integers(0, 16))
    def drop(self, pick: int) -> None:
        request_ids = sorted(self.model.open)
        request_id = request_ids[pick % len(request_ids)]
        self.target.drop(request_id)
        del self.model.open[request_id]

    # --- router calls ---

    @rule(mode=st.sampled_from(BUILTIN_MODES + REFUSED_MODES))
    def generate(self, mode: str) -> None:
        if mode in REFUSED_MODES:
            if not self.has(Capability.REFUSES_KV_AND_DIRECT) or self.diverges(SEL_002_CHECK):
                return
        elif Capability(f"mode:{mode}") not in self.caps:
            return
        free_before = self.model.free()
        reached = self.dispatch(Generate(mode))
        require(
            "SEL-003",
            reached is None or reached in free_before,
            f"generate({mode}) reached worker {reached}, not in the free set {sorted(free_before)}",
        )

    @precondition(lambda self: self.has(Capability.DIRECT))
    @rule(pick=st.integers(0, MAX_WORKERS), unknown=st.booleans())
    def direct(self, pick: int, unknown: bool) -> None:
        target = UNKNOWN_WORKER if unknown or not self.model.workers else self.worker(pick)
        reached = self.dispatch(Direct(target))
        require_compare(
            "DSP-001",
            reached,
            "in",
            (None, target),
            f"direct({target}) reached worker {reached}",
        )

    @precondition(lambda self: self.has(Capability.DIRECT_WITHIN) and self.model.workers)
    @rule(pick=st.integers(0, MAX_WORKERS), mask=st.none() | st.integers(0, 2**MAX_WORKERS - 1))
    def direct_within(self, pick: int, mask: int | None) -> None:
        target = self.worker(pick)
        ids = sorted(self.model.workers)
        allowed = None if mask is None else frozenset(i for n, i in enumerate(ids) if mask >> n & 1)
        target_resolves = self.model.workers[target].record
        reached = self.dispatch(DirectWithin(target, allowed))
        if allowed is not None and not target_resolves:
            require(
                "DSP-006",
                reached is None or reached in allowed,
                f"direct_within({target}, {sorted(allowed)}) fell back to worker {reached}",
            )

    @precondition(lambda self: self.has(Capability.PRESELECTED) and self.model.workers)
    @rule(pick=st.integers(0, MAX_WORKERS))
    def preselected(self, pick: int) -> None:
        target = self.worker(pick)
        reached = self.dispatch(Preselected(target))
        require_compare(
            "DSP-009", reached, "in", (None, target), f"preselected {target} reached {reached}"
        )

    def dispatch(self, call: Call) -> int | None:
        """Submit ``call``, check the outcome against the model's branches, adopt the state."""
        request_id = self.target.submit(call)
        deliveries = [d for d in self.target.dispatch_log() if d.request_id == request_id]
        require_compare(
            "DSP-014", len(deliveries), "<=", 1, f"{call} was delivered {len(deliveries)} times"
        )
        reached = deliveries[0].worker_id if deliveries else None
        outcome = self.target.outcome(request_id)
        if outcome is not None and outcome.items:
            self.check_items(call, reached, outcome)
        self.check_overload_masking(call, outcome)
        branches = self.model.branches(call, request_id)
        matching = [(e, m) for e, m in branches if self.matches(e, reached, outcome)]
        if not matching:
            because = sorted({rid for e, _ in branches for rid in e.because})
            allowed = "; ".join(self.describe(e) for e, _ in branches)
            observed = f"reached={reached} outcome={outcome}"
            for requirement_id in because:
                require(requirement_id, False, f"{call}: allowed [{allowed}], observed {observed}")
        for expected, _ in matching:
            exercised(*expected.because)
        self.model = self.adopt([m for _, m in matching])
        return reached

    def check_overload_masking(self, call: Call, outcome: Outcome | None) -> None:
        """A target without a transport record must not fail as overloaded (DSP-003)."""
        if (
            isinstance(call, Generate | Bidirectional | Migrate | HostRoute)
            or not outcome
            or not outcome.error
        ):
            return
        target = self.model.workers.get(call.worker_id)
        if isinstance(call, DirectWithin) and self._a_fallback_may_refuse_as_overloaded(call):
            return  # the fallback worker's own refusal, not the gone target's overload mark
        if target is not None and not target.record and call.worker_id in self.model.overloaded():
            require_compare(
                "DSP-003",
                outcome.error.type,
                "!=",
                "WorkerOverloaded",
                f"{call}: the target has no transport record but the dispatch failed as "
                f"overloaded: {outcome.error.describe()}",
            )

    def _a_fallback_may_refuse_as_overloaded(self, call: DirectWithin) -> bool:
        """A DirectWithin whose target has no record falls back; a candidate scripted to
        refuse with ``Server overloaded`` fails it WorkerOverloaded on its own account."""
        return any(
            isinstance(worker.script, Reject) and worker.script.overloaded
            for worker_id, worker in self.model.workers.items()
            if worker_id != call.worker_id and (call.allowed is None or worker_id in call.allowed)
        )

    def check_items(self, call: Call, reached: int | None, outcome: Outcome) -> None:
        indexes = [item.get("index") if isinstance(item, dict) else None for item in outcome.items]
        require_equal(
            "DSP-013",
            indexes,
            list(range(len(outcome.items))),
            f"{call}: items out of order or lost: indexes {indexes}",
        )
        sources = {item.get("worker") for item in outcome.items if isinstance(item, dict)}
        require_equal(
            "DSP-014", sources, {reached}, f"{call}: items from {sources}, reached {reached}"
        )

    @staticmethod
    def matches(expected: Expected, reached: int | None, outcome: Outcome | None) -> bool:
        if expected.reached != reached:
            return False
        if expected.open or outcome is None:
            return expected.open and outcome is None
        if len(outcome.items) != expected.items:
            return False
        if expected.error is None or outcome.error is None:
            return expected.error is None and outcome.error is None
        if not outcome.error.types_observed:  # the target shows only the normalised class
            chain = expected.chain or (
                (None,) if expected.error == "untyped" else (expected.error,)
            )
            return outcome.error.pre_stream == expected.pre_stream and (
                expected.error == "any" or outcome.error.error_class == oracle.classify(chain)[0]
            )
        observed_type = outcome.error.type or "untyped"
        return (
            expected.error in ("any", observed_type)
            and outcome.error.pre_stream == expected.pre_stream
            and (expected.chain is None or _labels(outcome) == expected.chain)
        )

    @staticmethod
    def describe(expected: Expected) -> str:
        if expected.open:
            return f"open stream on worker {expected.reached}"
        end = f"error {expected.error}" if expected.error else "clean end"
        if expected.chain:
            end += f" chain {expected.chain}"
        return f"worker {expected.reached}, {expected.items} items, {end}"

    def adopt(self, successors: list[RouterModel]) -> RouterModel:
        """One successor state; when several are allowed, the one the target's sets agree with."""
        distinct = [m for n, m in enumerate(successors) if m not in successors[:n]]
        if len(distinct) > 1 and self.has(Capability.OBSERVE_WORKER_SETS):
            sets = self.target.worker_sets()
            for candidate in distinct:
                if (candidate.routable(), candidate.overloaded()) == (
                    sets.routable,
                    sets.overloaded,
                ):
                    return candidate
        return distinct[0] if distinct else self.model

    # --- invariants ---

    @invariant()
    def worker_sets_match(self) -> None:
        if self.context is None or not self.has(Capability.OBSERVE_WORKER_SETS):
            return
        sets, model = self.target.worker_sets(), self.model
        require_equal(
            "SET-001",
            sets.discovered,
            model.discovered(),
            self.diff("discovered", sets.discovered, model.discovered()),
        )
        # Compared below (a mismatch names the rule at fault), with the FLT rules the model
        # applied since the last comparison.
        exercised("SET-002", "SET-003", *model.take_applied())
        routable = model.routable()
        if sets.routable != routable:
            require(
                self.blame_routable(sets.routable, routable),
                False,
                self.diff("routable", sets.routable, routable),
            )
        overloaded = model.overloaded()
        if sets.overloaded != overloaded:
            require(
                self.blame_overloaded(sets.overloaded, overloaded),
                False,
                self.diff("overloaded", sets.overloaded, overloaded),
            )
        require_equal(
            "SET-004",
            sets.free,
            sets.routable - sets.overloaded,
            self.diff("free", sets.free, sets.routable - sets.overloaded),
        )

    def blame_routable(self, observed: frozenset[int], expected: frozenset[int]) -> str:
        for worker_id in observed ^ expected:
            inhibited_until = self.model.workers[worker_id].inhibited_until
            if worker_id in observed:  # target routable, model says inhibited
                return "FLT-001"
            if inhibited_until > float("-inf"):  # model says expired
                return "FLT-002"
            return "FLT-003" if self.model.inhibited_duration == 0 else "FLT-006"
        return "SET-002"

    def blame_overloaded(self, observed: frozenset[int], expected: frozenset[int]) -> str:
        for worker_id in observed - expected:
            lapsed = self.model.workers[worker_id].lease_until > float("-inf")
            return "FLT-004" if lapsed else "FLT-006"
        return "SET-003"

    @staticmethod
    def diff(name: str, observed: frozenset[int], expected: frozenset[int]) -> str:
        return f"{name} set is {sorted(observed)}, expected {sorted(expected)}"

    @invariant()
    def occupancy_matches(self) -> None:
        if self.context is None or not self.has(Capability.OBSERVE_OCCUPANCY):
            return
        observed, expected = dict(self.target.occupancy()), self.model.occupancy()
        exercised("DSP-011", "SEL-011")
        rule_id = "SEL-011" if sum(observed.values()) < sum(expected.values()) else "DSP-011"
        require_equal(rule_id, observed, expected, f"occupancy {observed}, expected {expected}")

    @invariant()
    def inflight_matches_open_streams(self) -> None:
        if self.context is None or not self.has(Capability.OBSERVE_INFLIGHT):
            return
        inflight, still_open = self.target.transport_inflight(), len(self.model.open)
        require_equal(
            "TRN-015",
            inflight,
            still_open,
            f"the transport counts {inflight} dispatches in flight; {still_open} streams are open",
        )

    @invariant()
    def prepared_for_reached_worker(self) -> None:
        if self.context is None or not self.has(Capability.OBSERVE_PREPARED_TARGET):
            return
        for delivery in self.target.dispatch_log():
            require_equal(
                "DSP-010",
                delivery.prepared_for,
                delivery.worker_id,
                f"{delivery.request_id} reached {delivery.worker_id}, "
                f"prepared for {delivery.prepared_for}",
            )


@covers(
    "SET-001", "SET-002", "SET-003", "SET-004",
    "SEL-001", "SEL-002", "SEL-003", "SEL-004", "SEL-005", "SEL-006", "SEL-008", "SEL-009",
    "SEL-010", "SEL-011",
    "DSP-001", "DSP-002", "DSP-003", "DSP-004", "DSP-005", "DSP-006", "DSP-007", "DSP-008",
    "DSP-009", "DSP-010", "DSP-011", "DSP-012", "DSP-013", "DSP-014", "DSP-015",
    "FLT-001", "FLT-002", "FLT-003", "FLT-004", "FLT-006", "FLT-007", "FLT-008",
    "TRN-004", "TRN-005", "TRN-006", "TRN-015",
)  # fmt: skip
def test_dispatch_machine(adapter: Adapter) -> None:
    DispatchMachine.run(adapter)
