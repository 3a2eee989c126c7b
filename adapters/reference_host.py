"""The routing host of the reference adapters: ``RoutingHostTarget`` over a ``RoutingHost``."""

from __future__ import annotations

import itertools
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs

from routespec.errors import ErrorKind, RoutingError
from routespec.host.affinity import AffinityCoordinator, AffinityMode, AffinityTarget, Initialize
from routespec.host.kv import KV_INDEX_BLOCKS, KvScheduler
from routespec.host.lora import LoraFilter
from routespec.host.request import HostRequest, Phase, RequestContext, RoutingHints
from routespec.host.routing_host import (
    RoutePlan,
    RoutePreview,
    RoutingHost,
    WorkerConfig,
    WorkerInput,
)
from routespec.migration import Migration
from routespec.routing.exclusions import Exclusions
from routespec.routing.push_router import Prepare, PushRouter
from routespec.routing.selection import RouterMode
from routespec.routing.streaming import ItemStream, Request
from routespec.testing.portal import TrioPortal
from routespec.testing.target import (
    HostConfig,
    HostRoute,
    HostView,
    ObservedError,
    PlanView,
    SessionView,
)

Observe = Callable[[BaseException], ObservedError]
Start = Callable[[Callable[[Request], Awaitable[ItemStream]]], str]
"""Starts a request whose stream the given opener returns; returns its id once settled."""


def host_request(request: Request, route: HostRoute) -> HostRequest:
    payload = {"token_ids": list(route.tokens), "max_tokens": route.max_tokens}
    hints = RoutingHints(
        route.backend_instance_id,
        route.decode_worker_id,
        route.prefill_worker_id,
        route.dp_rank,
        route.lora,
        route.allowed,
        route.required_taints,
    )
    return HostRequest(
        attrs.evolve(request, payload=payload),
        Phase(route.phase),
        hints,
        route.session,
        route.staged_kv,
        RequestContext(stopped=route.stopped),
    )


def set_only(**settings: Any) -> dict[str, Any]:
    """The settings a check set; the others keep the reference's own defaults."""
    return {name: value for name, value in settings.items() if value is not None}


def build_host(
    host_class: type[RoutingHost],
    router: PushRouter,
    config: HostConfig,
    seed: int | None,
    prepare: Prepare,
    workers: tuple[int, ...],
) -> RoutingHost:
    affinity = None
    if config.affinity_ttl is not None:
        affinity = AffinityCoordinator(
            config.affinity_ttl, **set_only(max_entries=config.max_affinity_entries)
        )
    mode = None if config.affinity_mode is None else AffinityMode(config.affinity_mode)
    host = host_class.create(
        router,
        RouterMode(config.policy),
        affinity=affinity,
        **set_only(affinity_mode=mode),
        lora=LoraFilter() if config.lora else None,
        kv=lambda: KvScheduler(
            config.block_size,
            config.temperature,
            random.Random(seed),
            kv_index_blocks=(
                KV_INDEX_BLOCKS if config.kv_index_blocks is None else config.kv_index_blocks
            ),
        ),
        prepare=prepare,
    )
    host.worker_configs.update({worker: WorkerConfig() for worker in workers})
    return host


class ReferenceHost:
    def __init__(
        self,
        portal: TrioPortal,
        host: RoutingHost,
        start: Start,
        observe: Observe,
        migration_class: type[Migration],
    ) -> None:
        self._portal = portal
        self.host = host
        self._start = start
        self._observe = observe
        self._migration_class = migration_class
        self._plans: dict[int, RoutePreview | RoutePlan] = {}
        self._plan_ids = itertools.count(1)
        self._held: dict[str, Initialize] = {}
        self._contexts: dict[str, RequestContext] = {}

    # requests

    def route(self, route: HostRoute) -> str:
        return self._start(lambda request: self.open_stream(request, route))

    async def open_stream(self, request: Request, route: HostRoute) -> ItemStream:
        routed = host_request(request, route)
        self._contexts[request.request_id] = routed.context
        if route.migration_limit is None:
            exclusions = Exclusions()
            for worker in route.excluded:
                exclusions.record(
                    worker,
                    RoutingError(ErrorKind.WORKER_OVERLOADED, f"worker {worker} overloaded"),
                )
            return await self.host.generate(routed, exclusions if route.excluded else None)
        migration = self._migration_class(self.host.router, route.migration_limit)
        explicit = routed.hints.explicit_worker(routed.phase)

        async def attempt(request: Request, exclusions: Exclusions) -> ItemStream:
            return await self.host.generate(attrs.evolve(routed, request=request), exclusions)

        return await migration.stream(
            routed.request,
            attempt,
            pinned=explicit is not None and route.lora is None,
            is_stopped=lambda: routed.context.stopped,
        )

    def stop(self, request_id: str) -> None:
        self._portal.call_sync(self._contexts[request_id].stop)

    # planned routes

    def preview(self, route: HostRoute) -> PlanView | ObservedError:
        async def preview() -> RoutePreview:
            return await self.host.preview(host_request(Request("preview", None), route))

        return self._plan_view(preview)

    def plan(self, preview_id: int) -> PlanView | ObservedError:
        preview = self._plans[preview_id]
        assert isinstance(preview, RoutePreview), f"plan {preview_id} is not a preview"

        async def plan() -> RoutePlan:
            return await self.host.plan(preview)

        return self._plan_view(plan)

    def _plan_view(
        self, make: Callable[[], Awaitable[RoutePreview | RoutePlan]]
    ) -> PlanView | ObservedError:
        async def run() -> PlanView | ObservedError:
            try:
                made = await make()
            except RoutingError as failure:
                return self._observe(failure)
            plan_id = next(self._plan_ids)
            self._plans[plan_id] = made
            return PlanView(plan_id, made.route.worker_id, made.budget.remaining())

        return self._portal.call(run)

    def dispatch_plan(self, plan_id: int, *, stop_first: bool = False) -> str:
        plan = self._plans[plan_id]
        assert isinstance(plan, RoutePlan), f"plan {plan_id} is a preview, not a plan"

        async def dispatch(request: Request) -> ItemStream:
            planned = plan.request.request  # the plan's request, under the id the caller sees
            plan.request = attrs.evolve(
                plan.request, request=attrs.evolve(planned, request_id=request.request_id)
            )
            self._contexts[request.request_id] = plan.request.context  # for ``stop``
            if stop_first:
                plan.request.context.stop()
            return await self.host.dispatch_plan(plan)

        return self._start(dispatch)

    def abort_plan(self, plan_id: int) -> ObservedError | None:
        plan = self._plans[plan_id]
        assert isinstance(plan, RoutePlan), f"plan {plan_id} is a preview, not a plan"

        async def abort() -> ObservedError | None:
            try:
                self.host.abort_plan(plan)
            except RoutingError as failure:
                return self._observe(failure)
            return None

        return self._portal.call(abort)

    def prefill_busy(self, route: HostRoute, threshold: float) -> bool:
        async def probe() -> bool:
            return self.host.prefill_busy(host_request(Request("probe", None), route), threshold)

        return self._portal.call(probe)

    # sessions

    def _coordinator(self) -> AffinityCoordinator:
        assert self.host.affinity is not None, "the host was built without session affinity"
        return self.host.affinity

    def bind_session(self, session: str, worker_id: int, dp_rank: int | None = None) -> None:
        async def bind() -> None:
            acquired = await self._coordinator().acquire(session)
            assert isinstance(acquired, Initialize), f"session {session} is already bound"
            acquired.commit(AffinityTarget(worker_id, dp_rank))

        self._portal.call(bind)

    def hold_session(self, session: str) -> None:
        async def hold() -> None:
            acquired = await self._coordinator().acquire(session)
            assert isinstance(acquired, Initialize), f"session {session} is already bound"
            self._held[session] = acquired

        self._portal.call(hold)

    def release_session(self, session: str) -> None:
        self._portal.call_sync(self._held.pop(session).abandon)

    def session(self, session: str) -> SessionView:
        async def read() -> SessionView:
            coordinator = self.host.affinity
            if coordinator is None:
                return SessionView("disabled")
            if coordinator.is_initializing(session):
                return SessionView("initializing")
            target = coordinator.query_target(session)
            if target is None:
                return SessionView("unbound")
            return SessionView("bound", target.worker_id, target.dp_rank)

        return self._portal.call(read)

    # workers and observations

    def configure_worker(
        self, worker_id: int, *, taints: frozenset[str] = frozenset(), dp_size: int = 1
    ) -> None:
        self.host.worker_configs[worker_id] = WorkerConfig(taints, dp_size)

    def forget_worker_config(self, worker_id: int) -> None:
        self.host.worker_configs.pop(worker_id, None)

    def set_lora_replicas(self, adapter: str, workers: frozenset[int]) -> None:
        assert self.host.lora is not None, "the host was built without LoRA filtering"
        self.host.lora.replicas[adapter] = workers

    def bookings(self) -> Mapping[int, int]:
        return {worker: count for worker, count in self.host.bookings().items() if count}

    def counters(self) -> tuple[int, int]:
        return self.host.counters.started, self.host.counters.completed

    def lora_inflight(self) -> Mapping[str, int]:
        return {} if self.host.lora is None else self.host.lora.inflight()

    def inputs(self) -> HostView:
        return HostView(
            input_names(self.host.required_inputs()), input_names(self.host.constructed_inputs())
        )


def input_names(inputs: WorkerInput) -> frozenset[str]:
    return frozenset(flag.name.lower() for flag in WorkerInput if flag.name and flag in inputs)
