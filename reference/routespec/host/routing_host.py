"""The routing host: one entry point that validates, selects, admits, dispatches and
monitors a request under a policy (spec: HST, AFF, MON, KVS)."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import ClassVar

import attrs
import trio

from routespec.errors import ErrorKind, RoutingError
from routespec.host.admission import HostAdmission, RequestCounters
from routespec.host.affinity import (
    Acquired,
    AffinityCoordinator,
    AffinityMode,
    AffinityTarget,
    Bound,
    Initialize,
)
from routespec.host.budget import CleanupBudget, StopScope, run_stage
from routespec.host.kv import KvBooking, KvScheduler
from routespec.host.lora import LoraFilter
from routespec.host.monitor import MonitoredStream
from routespec.host.request import HostRequest
from routespec.routing.exclusions import Exclusions
from routespec.routing.occupancy import OccupancyTracker, Permit
from routespec.routing.push_router import ALLOW, DENY, Prepare, PushRouter, TransportFallback
from routespec.routing.selection import RouterMode


class WorkerInput(enum.Flag):
    """Per-worker state a policy reads, built by the host only when declared (HST-001)."""

    NONE = 0
    OCCUPANCY = enum.auto()
    CACHE = enum.auto()
    LOAD = enum.auto()


POLICY_INPUTS: Mapping[RouterMode, WorkerInput] = {
    RouterMode.ROUND_ROBIN: WorkerInput.NONE,
    RouterMode.RANDOM: WorkerInput.NONE,
    RouterMode.DIRECT: WorkerInput.NONE,
    RouterMode.POWER_OF_TWO_CHOICES: WorkerInput.OCCUPANCY,
    RouterMode.LEAST_LOADED: WorkerInput.OCCUPANCY,
    RouterMode.DEVICE_AWARE_WEIGHTED: WorkerInput.OCCUPANCY,
    RouterMode.KV: WorkerInput.CACHE | WorkerInput.LOAD,
}
LORA_POLICIES = frozenset({RouterMode.ROUND_ROBIN, RouterMode.RANDOM})


@attrs.frozen
class WorkerConfig:
    """What a worker's runtime configuration tells the selector."""

    taints: frozenset[str] = frozenset()
    dp_size: int = 1


@attrs.define
class Route:
    """Where a request goes and how: a chosen worker, the transport fallback it may use,
    the occupancy permit booked while choosing, and the affinity work left for dispatch."""

    worker_id: int
    dp_rank: int
    fallback: TransportFallback
    permit: Permit | None = None
    pending: Initialize | None = None
    follow_session: str | None = None  # soft affinity follows the dispatch (AFF-007)
    booking: KvBooking | None = None  # set at admission under the KV policy


@attrs.define
class RoutePreview:
    request: HostRequest
    route: Route
    budget: CleanupBudget


@attrs.define
class RoutePlan:
    request: HostRequest
    route: Route
    budget: CleanupBudget
    admission: HostAdmission
    settled: bool = False  # dispatched or aborted: a plan is used once (KVS-015)

    def settle(self, operation: str) -> None:
        if self.settled:
            raise RoutingError(
                ErrorKind.INVALID_ARGUMENT,
                f"cannot {operation} the route plan of request {self.request.request_id}: "
                "it was already dispatched or aborted",
            )
        self.settled = True


@attrs.define
class RoutingHost:
    router: PushRouter
    policy: RouterMode
    affinity: AffinityCoordinator | None = None
    affinity_mode: AffinityMode = AffinityMode.HARD
    lora: LoraFilter | None = None
    kv: KvScheduler | None = None
    occupancy: OccupancyTracker | None = None
    worker_configs: dict[int, WorkerConfig] = attrs.field(factory=dict)
    counters: RequestCounters = attrs.field(factory=RequestCounters)
    prepare: Prepare | None = None
    clock: Callable[[], float] = trio.current_time
    monitor_class: ClassVar[type[MonitoredStream]] = MonitoredStream

    @classmethod
    def create(
        cls,
        router: PushRouter,
        policy: RouterMode,
        *,
        affinity: AffinityCoordinator | None = None,
        affinity_mode: AffinityMode = AffinityMode.HARD,
        lora: LoraFilter | None = None,
        kv: Callable[[], KvScheduler] = KvScheduler,
        prepare: Prepare | None = None,
    ) -> RoutingHost:
        if lora is not None and affinity is not None:
            raise RoutingError(
                ErrorKind.INVALID_ARGUMENT,
                "LoRA filtering and session affinity are mutually exclusive (HST-019)",
            )
        if lora is not None and policy not in LORA_POLICIES:
            raise RoutingError(
                ErrorKind.INVALID_ARGUMENT,
                f"LoRA filtering needs round-robin or random routing, not {policy.value} (HST-019)",
            )
        inputs = POLICY_INPUTS[policy]
        return cls(
            router,
            policy,
            affinity,
            affinity_mode,
            lora,
            kv=kv() if WorkerInput.CACHE in inputs else None,
            occupancy=router.occupancy if WorkerInput.OCCUPANCY in inputs else None,
            prepare=prepare,
        )

    # --- what the host is and holds ---

    def required_inputs(self) -> WorkerInput:
        return POLICY_INPUTS[self.policy]

    def constructed_inputs(self) -> WorkerInput:
        built = WorkerInput.OCCUPANCY if self.occupancy is not None else WorkerInput.NONE
        return built | (
            WorkerInput.CACHE | WorkerInput.LOAD if self.kv is not None else WorkerInput.NONE
        )

    def bookings(self) -> Mapping[int, int]:
        """Admitted requests per worker, by whichever load input the policy books."""
        if self.kv is not None:
            return self.kv.active_requests()
        return {} if self.occupancy is None else self.occupancy.snapshot()

    # --- the one-shot route ---

    async def generate(
        self, request: HostRequest, exclusions: Exclusions | None = None
    ) -> MonitoredStream:
        """Route one request; a migrating request's ``exclusions`` are never selected, and a
        failed dispatch records its worker there before the failure is visible (HST-020)."""
        budget = CleanupBudget(clock=self.clock)
        with StopScope(request, budget):
            route = await self._select(
                request, budget, exclusions, lambda: self._acquire(request, budget)
            )
            admission = self._admit(request, route)
            admission.count_started()  # HST-010
            return await self._dispatch(request, route, admission, budget, exclusions)

    # --- planned routes: preview, plan, dispatch or abort (KV) ---

    async def preview(self, request: HostRequest) -> RoutePreview:
        """Select without admitting anything; a binding is read, never acquired (KVS-005,
        AFF-012)."""
        self._require_kv("preview")
        budget = CleanupBudget(clock=self.clock)
        budget.deadline()  # a planned route's budget runs from its preview (HST-014)
        with StopScope(request, budget):
            route = await self._select(request, budget, None, lambda: self._read_binding(request))
        return RoutePreview(request, route, budget)

    async def plan(self, preview: RoutePreview) -> RoutePlan:
        """Admit exactly the previewed worker (KVS-006); the preview's budget carries on."""
        request, route = preview.request, preview.route
        with StopScope(request, preview.budget):
            acquired = await self._acquire(request, preview.budget)
        if isinstance(acquired, Initialize):
            route.pending = acquired
        return RoutePlan(request, route, preview.budget, self._admit(request, route))

    async def dispatch_plan(self, plan: RoutePlan) -> MonitoredStream:
        """The plan's booking becomes the request's (KVS-007)."""
        plan.settle("dispatch")
        plan.admission.count_started()
        with StopScope(plan.request, plan.budget):
            return await self._dispatch(plan.request, plan.route, plan.admission, plan.budget, None)

    def abort_plan(self, plan: RoutePlan) -> None:
        """Release the booking and any pending affinity initialization (KVS-008)."""
        plan.settle("abort")
        plan.admission.release(completed=False)
        if plan.route.pending is not None:
            plan.route.pending.abandon()

    def prefill_busy(self, request: HostRequest, threshold: float) -> bool:
        """Busy when no candidate is free or every one already holds ``threshold`` admitted
        requests (KVS-012); admits nothing (KVS-009)."""
        loads = self.bookings()
        candidates = self._candidates(request, None)
        return all(loads.get(w, 0) >= threshold for w in candidates)

    # --- stages ---

    async def _acquire(self, request: HostRequest, budget: CleanupBudget) -> Acquired | None:
        if self.affinity is None or request.session_id is None:
            return None  # AFF-013: no coordinator, no binding
        coordinator, session_id = self.affinity, request.session_id
        coordinator.validate_session_id(session_id)
        return await run_stage(request, budget, "affinity", lambda: coordinator.acquire(session_id))

    async def _read_binding(self, request: HostRequest) -> Bound | None:
        if self.affinity is None or request.session_id is None:
            return None
        target = self.affinity.query_target(request.session_id)
        return None if target is None else Bound(request.session_id, target)

    async def _select(
        self,
        request: HostRequest,
        budget: CleanupBudget,
        exclusions: Exclusions | None,
        affinity: Callable[[], Awaitable[Acquired | None]],
    ) -> Route:
        """Validate the explicit worker first, then consult affinity, then choose."""
        explicit = self._explicit_worker(request)
        acquired = await affinity()

        async def choose() -> Route:
            return await self._choose(request, explicit, acquired, exclusions)

        try:
            return await run_stage(request, budget, "selection", choose)
        except BaseException:
            if isinstance(acquired, Initialize):
                acquired.abandon()
            raise

    def _explicit_worker(self, request: HostRequest) -> int | None:
        """The phase's explicit worker (HST-003), validated once (HST-006) against discovery
        membership, not routability (HST-004, HST-005); for a LoRA request it is only a hint
        (HST-016)."""
        explicit = request.hints.explicit_worker(request.phase)
        if explicit is None:
            return None
        field, worker_id = explicit
        if self._lora_set(request) is not None:
            return worker_id
        if not self.router.worker_sets.is_discovered(worker_id):
            raise RoutingError(
                ErrorKind.INVALID_ARGUMENT,
                f"nvext.{field}={worker_id} does not identify a known worker",
            )
        return worker_id

    async def _choose(
        self,
        request: HostRequest,
        explicit: int | None,
        acquired: Acquired | None,
        exclusions: Exclusions | None,
    ) -> Route:
        pending = acquired if isinstance(acquired, Initialize) else None
        lora_set = self._lora_set(request)
        if explicit is not None and (lora_set is None or explicit in lora_set):
            rank = request.hints.dp_rank or 0
            if lora_set is not None:
                return Route(explicit, rank, TransportFallback(True, lora_set), pending=pending)
            direct_fallback = self.policy is RouterMode.DIRECT and not isinstance(acquired, Bound)
            # HST-008: an explicit pin is exact, except Direct mode's own target; exclusions
            # never override it (AFF-011)
            return Route(explicit, rank, ALLOW if direct_fallback else DENY, pending=pending)
        if isinstance(acquired, Bound):
            route = await self._bound_route(request, acquired, exclusions)
            if route is not None:
                return route
            if self.affinity_mode is AffinityMode.HARD and self.affinity is not None:
                pending = self.affinity.initialize(acquired.session_id)  # AFF-009: select anew
        try:
            return self._select_unpinned(request, acquired, pending, exclusions)
        except BaseException:
            if pending is not None and pending is not acquired:
                pending.abandon()  # the re-acquired initialization is this stage's own
            raise

    def _select_unpinned(
        self,
        request: HostRequest,
        acquired: Acquired | None,
        pending: Initialize | None,
        exclusions: Exclusions | None,
    ) -> Route:
        if self.policy is RouterMode.DIRECT:
            raise RoutingError(
                ErrorKind.INVALID_ARGUMENT,
                f"worker ID required for {request.phase.value} request in Direct routing mode",
            )  # HST-007
        candidates = self._candidates(request, exclusions)
        self._require_candidates(request, candidates, exclusions)
        worker_id, permit = self._pick(request, candidates)
        follow = None
        if isinstance(acquired, Bound) and self.affinity_mode is AffinityMode.SOFT:
            follow = acquired.session_id
        fallback = TransportFallback(True, frozenset(candidates))
        return Route(worker_id, 0, fallback, permit, pending, follow)

    async def _bound_route(
        self, request: HostRequest, bound: Bound, exclusions: Exclusions | None
    ) -> Route | None:
        """The route a binding dictates, or None to select as if unbound."""
        assert self.affinity is not None
        target = bound.target
        discovered = self.router.worker_sets.is_discovered(target.worker_id)
        if self.policy is RouterMode.DIRECT:
            if not discovered:  # HST-009: stale, not invalid input; forget it
                self.affinity.invalidate(bound.session_id, target)
                raise RoutingError(
                    ErrorKind.CANNOT_CONNECT,
                    f"session affinity target instance_id={target.worker_id} not found for "
                    f"endpoint {self.router.endpoint}",
                )
            return Route(target.worker_id, target.dp_rank or 0, DENY)
        if self.affinity_mode is AffinityMode.SOFT:
            candidates = self._candidates(request, exclusions)
            if target.worker_id not in candidates:
                return None
            # AFF-007: preferred, not pinned; a target whose transport is gone falls back
            # like an unbound route, and the binding follows the worker that served
            fallback = TransportFallback(True, frozenset(candidates))
            return Route(
                target.worker_id,
                target.dp_rank or 0,
                fallback,
                follow_session=bound.session_id,
            )
        if not discovered or not self._rank_in_range(target):
            self.affinity.invalidate(bound.session_id, target)  # AFF-009: select once more
            return None
        self._check_hard_target(request, target, exclusions)
        return Route(target.worker_id, target.dp_rank or 0, DENY)  # AFF-006

    def _check_hard_target(
        self, request: HostRequest, target: AffinityTarget, exclusions: Exclusions | None
    ) -> None:
        """A valid hard target the request may not use fails it, binding kept (AFF-010,
        AFF-011)."""
        worker_id = target.worker_id
        if exclusions is not None and worker_id in exclusions.failed:
            raise RoutingError(
                ErrorKind.UNAVAILABLE,
                f"session affinity pins worker {worker_id}, which already failed this request",
            )
        if self.kv is not None and worker_id not in self.worker_configs:
            raise RoutingError(
                ErrorKind.UNAVAILABLE,
                f"session affinity pins worker {worker_id}, which the selector does not know yet",
            )
        if not self._eligible(request, worker_id):
            raise RoutingError(
                ErrorKind.INVALID_ARGUMENT,
                f"session affinity pins worker {worker_id}, which this request's allowed "
                "workers or routing constraints exclude",
            )

    def _rank_in_range(self, target: AffinityTarget) -> bool:
        """An unknown configuration cannot judge the rank: that gap is AFF-010's, not stale."""
        config = self.worker_configs.get(target.worker_id)
        return config is None or target.dp_rank is None or 0 <= target.dp_rank < config.dp_size

    def _lora_set(self, request: HostRequest) -> frozenset[int] | None:
        name = request.hints.lora_name
        return None if self.lora is None or name is None else self.lora.replica_set(name)

    def _eligible(self, request: HostRequest, worker_id: int) -> bool:
        """The request's allowed set and taints (HST-022); for KV, a worker the selector
        knows."""
        allowed = request.hints.allowed_worker_ids
        config = self.worker_configs.get(worker_id)
        if self.kv is not None and config is None:
            return False  # KVS-014
        taints = WorkerConfig().taints if config is None else config.taints
        return (allowed is None or worker_id in allowed) and request.hints.required_taints <= taints

    def _usable(self, request: HostRequest, worker_ids: Sequence[int]) -> list[int]:
        """The workers of ``worker_ids`` the request's constraints and LoRA set allow."""
        lora_set = self._lora_set(request)
        hints = request.hints
        if lora_set is None and hints.allowed_worker_ids is None and not hints.required_taints:
            # unconstrained: one membership test per worker at most (KVS-014)
            if self.kv is None:
                return list(worker_ids)
            return list(filter(self.worker_configs.__contains__, worker_ids))
        return [
            w
            for w in worker_ids
            if self._eligible(request, w) and (lora_set is None or w in lora_set)
        ]

    def _candidates(self, request: HostRequest, exclusions: Exclusions | None) -> list[int]:
        """Free workers the request may use (constraints are never widened: AFF-011)."""
        found = self._usable(request, self.router.worker_sets.free_ids())
        return found if exclusions is None else exclusions.eligible(found)

    def _require_candidates(
        self, request: HostRequest, candidates: Sequence[int], exclusions: Exclusions | None
    ) -> None:
        if candidates:
            return
        routable = self._usable(request, self.router.worker_sets.routable_ids())
        if exclusions and not exclusions.eligible(routable):
            raise exclusions.exhausted()  # MIG-012, AFF-011
        if self._lora_set(request) is not None:
            if not routable:
                raise RoutingError(
                    ErrorKind.UNAVAILABLE, "No workers available after LoRA filtering"
                )  # HST-018
            raise RoutingError(
                ErrorKind.RESOURCE_EXHAUSTED, "All eligible LoRA workers are overloaded"
            )
        if routable:
            raise RoutingError(
                ErrorKind.RESOURCE_EXHAUSTED, "All workers are busy, please retry later"
            )  # HST-021
        raise RoutingError(
            ErrorKind.UNAVAILABLE, f"No workers available for endpoint {self.router.endpoint}"
        )

    def _pick(self, request: HostRequest, candidates: list[int]) -> tuple[int, Permit | None]:
        if self.kv is not None:
            return self.kv.select(request.tokens(), candidates), None
        return self.router.selector.select(self.policy, candidates)  # HST-002: books

    def _admit(self, request: HostRequest, route: Route) -> HostAdmission:
        admission = HostAdmission(self.counters)
        if route.permit is not None:
            admission.releases.append(route.permit.release)
        if self.kv is not None:
            route.booking = self.kv.book(route.worker_id, request.tokens())
            admission.releases.append(route.booking.release)
        lora_name = request.hints.lora_name
        if self.lora is not None and lora_name is not None:
            admission.releases.append(self.lora.track(lora_name))  # HST-017
        return admission

    async def _dispatch(
        self,
        request: HostRequest,
        route: Route,
        admission: HostAdmission,
        budget: CleanupBudget,
        exclusions: Exclusions | None,
    ) -> MonitoredStream:
        kv = self.kv

        async def record() -> None:
            if kv is not None:  # routing decisions stand in for KV events (KVS-001)
                kv.index.record(route.worker_id, kv.hashes(request.tokens()))

        # A KV-admitted route is exact: the booking and the index entry stay true (KVS-016).
        admitted = kv is not None and route.booking is not None

        async def send() -> MonitoredStream:
            stream = await self.router.dispatch_to(
                request.request,
                route.worker_id,
                route.fallback,
                route.permit,
                self.prepare,
                exclusions,
                admitted=admitted,
            )
            admission.dispatched = True
            self._settle_affinity(route, stream.instance_id)  # only a dispatch that happened
            return self.monitor_class(stream, admission, request.context, self.clock)

        try:
            await run_stage(request, budget, "record", record)
            return await run_stage(request, budget, "dispatch", send)
        except BaseException:
            admission.release(completed=False)
            if route.pending is not None:  # an existing binding is never touched (AFF-008)
                route.pending.abandon()
            raise

    def _settle_affinity(self, route: Route, worker_id: int) -> None:
        target = AffinityTarget(worker_id, route.dp_rank if worker_id == route.worker_id else 0)
        if route.pending is not None:
            route.pending.commit(target)  # AFF-005
        if route.follow_session is not None and self.affinity is not None:
            self.affinity.rebind(route.follow_session, target)

    def _require_kv(self, operation: str) -> None:
        if self.kv is None:
            raise RoutingError(
                ErrorKind.INVALID_ARGUMENT,
                f"route {operation} needs the kv policy, not {self.policy.value} (KVS-011)",
            )
