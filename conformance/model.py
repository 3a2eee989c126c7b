"""An executable model of the SET, SEL, DSP and FLT rules: what a conforming router may do.

The model is independent of the reference: it is the spec restated as code. For a call it
returns every outcome the spec allows (Random, PowerOfTwoChoices and ties leave a choice),
each with the model state that would follow, and the IDs of the rules that decided it.
"""

from __future__ import annotations

import copy
import math

import attrs

from routespec.conformance import oracle
from routespec.testing.target import (
    Call,
    Direct,
    DirectWithin,
    FailBeforeStream,
    FailMidStream,
    Generate,
    Preselected,
    Reject,
    Serve,
    Stall,
    TargetConfig,
    WorkerScript,
)

INHIBITING = oracle.INHIBITING_TYPES
OVERLOAD_LEASE = 1.0
OCCUPANCY_MODES = frozenset({"power-of-two-choices", "least-loaded", "device-aware-weighted"})
BUILTIN_MODES = ("round-robin", "random", *sorted(OCCUPANCY_MODES))
REFUSED_MODES = ("kv", "direct")


@attrs.define
class WorkerModel:
    device: str
    listed: bool = True  # discovery lists it
    record: bool = True  # its transport record resolves
    alive: bool = True  # its process serves
    script: WorkerScript = attrs.field(factory=Serve)
    monitor_overloaded: bool = False
    inhibited_until: float = -math.inf
    lease_until: float = -math.inf


@attrs.frozen
class Expected:
    """One allowed outcome of a call.

    ``reached`` is the worker the request reaches (None: none); ``error`` the observed error
    type of the outermost link, ``"untyped"`` for an untyped error, or None; ``chain`` the
    full expected type chain when the spec fixes it; ``open`` when the stream stays open.
    """

    reached: int | None
    error: str | None
    pre_stream: bool
    items: int
    open: bool
    chain: tuple[str | None, ...] | None
    because: tuple[str, ...]


@attrs.define
class OpenRequest:
    worker: int
    script: Stall
    booked: bool


SPEC_INHIBITED_DURATION = 5.0  # FLT-001's default
SPEC_DEVICE_RATIO = 8  # SEL-010's default


@attrs.define
class RouterModel:
    inhibited_duration: float
    fault_detection: bool
    device_ratio: int
    now: float = 0.0
    workers: dict[int, WorkerModel] = attrs.field(factory=dict)
    open: dict[str, OpenRequest] = attrs.field(factory=dict)
    round_robin_selections: int = 0
    # FLT rules this model applied since the last take_applied(); not part of the state.
    applied: set[str] = attrs.field(factory=set, eq=False)

    @classmethod
    def of(cls, config: TargetConfig) -> RouterModel:
        """The router ``config`` builds, its unset settings at the spec's defaults."""
        return cls(
            SPEC_INHIBITED_DURATION
            if config.inhibited_duration is None
            else config.inhibited_duration,
            config.fault_detection is not False,  # FLT-009: on unless turned off
            SPEC_DEVICE_RATIO if config.device_ratio is None else config.device_ratio,
        )

    def take_applied(self) -> set[str]:
        taken, self.applied = self.applied, set()
        return taken

    # --- sets (SET-001..004) ---

    def discovered(self) -> frozenset[int]:
        return frozenset(i for i, w in self.workers.items() if w.listed)

    def routable(self) -> frozenset[int]:
        return frozenset(
            i for i in self.discovered() if self.workers[i].inhibited_until <= self.now
        )

    def overloaded(self) -> frozenset[int]:
        return frozenset(
            i
            for i in self.discovered()
            if self.workers[i].monitor_overloaded or self.workers[i].lease_until > self.now
        )

    def free(self) -> frozenset[int]:
        return self.routable() - self.overloaded()

    def occupancy(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for request in self.open.values():
            if request.booked:
                counts[request.worker] = counts.get(request.worker, 0) + 1
        return counts

    # --- cluster and time ---

    def report_down(self, worker_id: int) -> None:
        if self.inhibited_duration > 0:
            self.workers[worker_id].inhibited_until = self.now + self.inhibited_duration
        else:
            self.applied.add("FLT-003")

    def advance(self, seconds: float) -> None:
        later = self.now + seconds
        for worker in self.workers.values():
            if self.now < worker.inhibited_until <= later:
                self.applied.add("FLT-002")
            if self.now < worker.lease_until <= later:
                self.applied.add("FLT-004")
        self.now = later

    def observe_fault(self, worker_id: int, chain: tuple[str | None, ...]) -> None:
        """FLT-001, FLT-004: fault detection on an error from a resolved worker."""
        if not self.fault_detection:
            return
        if INHIBITING & set(chain):
            self.applied.add("FLT-001")
            self.report_down(worker_id)
        elif "WorkerOverloaded" in chain:
            self.applied.add("FLT-004")
            self.workers[worker_id].lease_until = self.now + OVERLOAD_LEASE
        else:
            self.applied.add("FLT-006")

    def kill(self, worker_id: int) -> list[str]:
        """The worker dies: its open streams end with Disconnected. Returns their ids."""
        self.workers[worker_id].alive = False
        ended = [rid for rid, r in self.open.items() if r.worker == worker_id]
        for rid in ended:
            del self.open[rid]
            self.observe_fault(worker_id, ("Disconnected",))
        return ended

    # --- calls ---

    def branches(self, call: Call, request_id: str) -> list[tuple[Expected, RouterModel]]:
        """Every outcome the spec allows for ``call``, each with the state that follows."""
        results = []
        for plan in self._plans(call):
            successor = copy.deepcopy(self)
            results.append((successor._execute(plan, request_id), successor))
        return results

    def _plans(self, call: Call) -> list[_Plan]:
        if isinstance(call, Generate):
            return self._generate_plans(call.mode)
        if isinstance(call, Direct):
            return [_Plan(call.worker_id, fallback=False, allowed=None, book=False, because=())]
        if isinstance(call, DirectWithin):
            return [_Plan(call.worker_id, True, call.allowed, book=False, because=())]
        assert isinstance(call, Preselected)
        return [_Plan(call.worker_id, False, None, book=True, because=("DSP-009",))]

    def _generate_plans(self, mode: str) -> list[_Plan]:
        if mode in REFUSED_MODES:
            return [_Plan.failing("any", ("SEL-002",))]
        free = sorted(self.free())
        if not free:
            if self.routable():
                return [_Plan.failing("ResourceExhausted", ("SEL-004",))]
            return [_Plan.failing("Unavailable", ("SEL-005",))]
        book = mode in OCCUPANCY_MODES
        because: tuple[str, ...] = ("SEL-001", "SEL-003")
        if mode == "round-robin":
            chosen = free[self.round_robin_selections % len(free)]
            return [_Plan(chosen, True, None, book, (*because, "SEL-006"), counts_rr=True)]
        if mode == "random":
            candidates = free
        elif mode == "power-of-two-choices":
            candidates = self._power_of_two_candidates(free)
            because = (*because, "SEL-008")
        elif mode == "least-loaded":
            candidates = self._least_loaded(free)
            because = (*because, "SEL-009")
        else:
            candidates = self._least_loaded(self._device_group(free))
            because = (*because, "SEL-010")
        return [_Plan(c, True, None, book, because) for c in candidates]

    def _load(self, worker_id: int) -> int:
        return self.occupancy().get(worker_id, 0)

    def _power_of_two_candidates(self, free: list[int]) -> list[int]:
        if len(free) == 1:
            return free
        loads = {i: self._load(i) for i in free}
        top = max(loads.values())
        busiest = [i for i, load in loads.items() if load == top]
        return [i for i in free if not (len(busiest) == 1 and i == busiest[0])]

    def _least_loaded(self, candidates: list[int]) -> list[int]:
        lowest = min(self._load(i) for i in candidates)
        return [i for i in candidates if self._load(i) == lowest]

    def _device_group(self, free: list[int]) -> list[int]:
        cpu = [i for i in free if self.workers[i].device == "cpu"]
        non_cpu = [i for i in free if self.workers[i].device != "cpu"]
        if not cpu or not non_cpu:
            return free
        cpu_load = sum(map(self._load, cpu))
        non_cpu_load = sum(map(self._load, non_cpu))
        allowed = non_cpu_load * len(cpu) // (self.device_ratio * len(non_cpu))
        return cpu if cpu_load < allowed else non_cpu

    def _execute(self, plan: _Plan, request_id: str) -> Expected:
        if plan.fails_with is not None:
            return Expected(None, plan.fails_with, True, 0, False, None, plan.because)
        if plan.counts_rr:
            self.round_robin_selections += 1
        resolved, because = self._resolve(plan)
        if isinstance(resolved, str):
            return Expected(None, resolved, True, 0, False, None, because)
        worker = self.workers[resolved]
        if self.fault_detection and resolved in self.overloaded():
            return Expected(None, "WorkerOverloaded", True, 0, False, None, (*because, "DSP-004"))
        because = (*because, "DSP-013", "DSP-014", "FLT-007")
        if not worker.alive:
            self.observe_fault(resolved, ("CannotConnect",))
            return Expected(None, "CannotConnect", True, 0, False, None, because)
        return self._serve(resolved, worker.script, plan.book, request_id, because)

    def _resolve(self, plan: _Plan) -> tuple[int | str, tuple[str, ...]]:
        target = plan.target
        known = self.workers.get(target)
        if known is not None and known.record:
            return target, (*plan.because, "DSP-001" if not plan.fallback else "DSP-005")
        overload_masked = known is not None and target in self.overloaded()
        if not plan.fallback:
            rule = "DSP-003" if overload_masked else "DSP-002"
            return "CannotConnect", (*plan.because, rule, "FLT-008")
        candidates = [
            i
            for i in sorted(self.free())
            if i != target and (plan.allowed is None or i in plan.allowed)
        ]
        scope = "DSP-005" if plan.allowed is None else "DSP-006"
        if not candidates:
            return "Unavailable", (*plan.because, scope, "DSP-008", "FLT-008")
        fallback = candidates[0]
        if not self.workers[fallback].record:
            return "CannotConnect", (*plan.because, scope, "DSP-007", "FLT-008")
        return fallback, (*plan.because, scope, "DSP-012")

    def _serve(
        self,
        worker_id: int,
        script: WorkerScript,
        booked: bool,
        request_id: str,
        because: tuple[str, ...],
    ) -> Expected:
        if isinstance(script, Reject):
            rejected = (oracle.REJECTION_TYPES[script.overloaded],)
            self.observe_fault(worker_id, rejected)
            return Expected(worker_id, rejected[0], True, 0, False, rejected, (*because, "TRN-004"))
        if isinstance(script, FailBeforeStream):
            chain = oracle.pre_stream_chain([link.type for link in script.error.chain()])
            self.observe_fault(worker_id, chain)
            return Expected(
                worker_id, "CannotConnect", True, 0, False, chain, (*because, "TRN-005")
            )
        if isinstance(script, FailMidStream):
            chain = tuple(link.type for link in script.error.chain())
            self.observe_fault(worker_id, chain)
            error = chain[0] or "untyped"
            return Expected(worker_id, error, False, script.items, False, chain, because)
        if isinstance(script, Stall):
            self.open[request_id] = OpenRequest(worker_id, script, booked)
            return Expected(worker_id, None, False, script.items, True, None, because)
        assert isinstance(script, Serve), "wire faults are checked by scenarios, not the model"
        return Expected(worker_id, None, False, script.items, False, None, because)


@attrs.frozen
class _Plan:
    target: int
    fallback: bool
    allowed: frozenset[int] | None
    book: bool
    because: tuple[str, ...]
    counts_rr: bool = False
    fails_with: str | None = None

    @classmethod
    def failing(cls, error: str, because: tuple[str, ...]) -> _Plan:
        return cls(-1, False, None, False, because, fails_with=error)
