"""PushRouter: selection, exact and constrained dispatch, in the spec's order (spec: DSP, SEL)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import ClassVar

import attrs

from routespec.discovery.instances import Discovery, Instance
from routespec.errors import ErrorKind, RoutingError
from routespec.routing.exclusions import Exclusions
from routespec.routing.fault_detection import observe_fault
from routespec.routing.load_index import LoadIndex
from routespec.routing.load_thresholds import LoadMonitor, LoadReport, LoadThresholds
from routespec.routing.occupancy import OccupancyTracker, Permit
from routespec.routing.selection import DEFAULT_DEVICE_RATIO, RouterMode, Selector
from routespec.routing.streaming import (
    Annotated,
    ItemStream,
    Request,
    RequestStream,
    StreamingDispatch,
    interrupter,
)
from routespec.routing.worker_sets import DEFAULT_INHIBITED_DURATION, WorkerSets

BIDIRECTIONAL_MODES = frozenset({RouterMode.ROUND_ROBIN, RouterMode.RANDOM})

Prepare = Callable[[Request, int], Request]
"""Called with the finally resolved worker id, after the overload check, before sending."""


@attrs.frozen
class TransportFallback:
    """What resolution may do when the target has no transport record.

    ``enabled=False`` is Dynamo's ``Deny``; ``permitted=None`` is ``Allow``; a set is ``Within``.
    """

    enabled: bool
    permitted: frozenset[int] | None = None

    def permits(self, instance_id: int) -> bool:
        return self.permitted is None or instance_id in self.permitted


ALLOW = TransportFallback(enabled=True)
DENY = TransportFallback(enabled=False)


@attrs.define
class PushRouter:
    """Routes requests for one endpoint to its workers through a ``StreamingDispatch``."""

    endpoint: str
    discovery: Discovery
    transport: StreamingDispatch
    worker_sets: WorkerSets
    selector: Selector
    fault_detection: bool = True
    load_monitor: LoadMonitor | None = None  # None: no thresholds, load never overloads
    selector_class: ClassVar[type[Selector]] = Selector

    @classmethod
    def create(
        cls,
        endpoint: str,
        discovery: Discovery,
        transport: StreamingDispatch,
        *,
        inhibited_duration: float = DEFAULT_INHIBITED_DURATION,
        fault_detection: bool = True,
        rng: random.Random | None = None,
        device_ratio: int = DEFAULT_DEVICE_RATIO,
        load_thresholds: LoadThresholds | None = None,
    ) -> PushRouter:
        selector = cls.selector_class(
            OccupancyTracker(), rng or random.Random(), discovery.device_type, device_ratio
        )
        worker_sets = WorkerSets(discovery, inhibited_duration)
        selector.follow(LoadIndex(worker_sets, selector.occupancy, discovery.device_type))
        thresholds = load_thresholds or LoadThresholds()  # SET-006: refused here if invalid
        monitor = LoadMonitor(thresholds, worker_sets.set_monitor_overloaded)
        return cls(endpoint, discovery, transport, worker_sets, selector, fault_detection, monitor)

    def report_load(self, instance_id: int, report: LoadReport) -> None:
        """A worker's load report reaches the load monitor, whose verdicts are the
        overloaded set's monitor part (SET-003, SET-005)."""
        if self.load_monitor is not None:
            self.load_monitor.report(instance_id, report)

    @property
    def occupancy(self) -> OccupancyTracker:
        return self.selector.occupancy

    async def generate(
        self,
        request: Request,
        mode: RouterMode = RouterMode.ROUND_ROBIN,
        prepare: Prepare | None = None,
        exclusions: Exclusions | None = None,
    ) -> RouterStream:
        """Select from the free set (SEL-003) by a builtin ``mode`` (SEL-001), then dispatch
        with ordinary fallback. A ``RequestStream`` payload makes it bidirectional.

        ``exclusions`` (a migrating request's tried workers) are never selected, not even
        by transport fallback, and a failed dispatch records its worker there (MIG-010)."""
        if mode in (RouterMode.KV, RouterMode.DIRECT):
            raise RoutingError(
                ErrorKind.INVALID_ARGUMENT,
                f"router mode {mode.value} is not served by a bare PushRouter; "
                "use the routing host (SEL-002)",
            )
        if isinstance(request.payload, RequestStream) and mode not in BIDIRECTIONAL_MODES:
            raise RoutingError(
                ErrorKind.INVALID_ARGUMENT,
                f"router mode {mode.value} is not yet supported for bidirectional dispatch "
                "(TRN-021)",
            )
        if exclusions and not exclusions.eligible(self.worker_sets.routable_ids()):
            raise exclusions.exhausted()  # MIG-012: every routable worker has failed it
        free: Sequence[int] = self.worker_sets.free()  # read in place, not copied
        if exclusions:
            free = tuple(exclusions.eligible(free))
        if not free:
            if self.worker_sets.routable_ids():
                raise RoutingError(
                    ErrorKind.RESOURCE_EXHAUSTED, "All workers are busy, please retry later"
                )  # SEL-004
            raise RoutingError(
                ErrorKind.UNAVAILABLE, f"No workers available for endpoint {self.endpoint}"
            )  # SEL-005
        fallback = ALLOW if not exclusions else TransportFallback(True, frozenset(free))
        chosen, permit = self.selector.select(mode, free)
        return await self._dispatch(request, chosen, fallback, permit, prepare, exclusions)

    async def direct(
        self, request: Request, instance_id: int, prepare: Prepare | None = None
    ) -> RouterStream:
        """Exact dispatch: that worker or a typed failure, never another worker (DSP-001).

        Local inhibition is not consulted: only resolution and overload decide (FLT-005).
        """
        return await self._dispatch(request, instance_id, DENY, None, prepare)

    async def direct_within(
        self,
        request: Request,
        instance_id: int,
        allowed: frozenset[int] | None,
        prepare: Prepare | None = None,
    ) -> RouterStream:
        """Dispatch to a target, falling back anywhere (``None``) or only inside ``allowed``."""
        fallback = ALLOW if allowed is None else TransportFallback(True, frozenset(allowed))
        return await self._dispatch(request, instance_id, fallback, None, prepare)

    async def dispatch_preselected(
        self,
        request: Request,
        instance_id: int,
        permit: Permit | None = None,
        prepare: Prepare | None = None,
    ) -> RouterStream:
        """Dispatch to a worker the caller already selected (and possibly booked).

        The target must still be discovered; local inhibition does not block it (DSP-009).
        """
        return await self._dispatch(request, instance_id, DENY, permit, prepare)

    async def dispatch_to(
        self,
        request: Request,
        instance_id: int,
        fallback: TransportFallback,
        permit: Permit | None = None,
        prepare: Prepare | None = None,
        exclusions: Exclusions | None = None,
        *,
        admitted: bool,
    ) -> RouterStream:
        """Dispatch to a worker a routing host chose, with the fallback it allows; a failure
        is recorded in ``exclusions`` before it is visible (MIG-010). ``admitted``: the host's
        KV admission already booked the worker, so the dispatch is exact and its overload is
        not checked again (KVS-016)."""
        if admitted:
            fallback = DENY
        return await self._dispatch(
            request, instance_id, fallback, permit, prepare, exclusions, check_overload=not admitted
        )

    async def _dispatch(
        self,
        request: Request,
        target: int,
        fallback: TransportFallback,
        permit: Permit | None,
        prepare: Prepare | None,
        exclusions: Exclusions | None = None,
        *,
        check_overload: bool = True,
    ) -> RouterStream:
        def on_fault(instance_id: int, error: RoutingError) -> None:
            self._observe_fault(instance_id, error)
            if exclusions is not None:
                exclusions.record(instance_id, error)  # MIG-010: before it is visible

        try:
            instance = self._resolve_and_check(target, fallback, check_overload)
            if permit is not None and instance.instance_id != permit.instance_id:
                permit.retarget(instance.instance_id)  # DSP-012
            prepared = request if prepare is None else prepare(request, instance.instance_id)
            try:  # one send per call: the router never re-sends (DSP-014)
                stream = await self.transport.generate(instance, prepared)
            except RoutingError as error:
                on_fault(instance.instance_id, error)
                raise
        except BaseException:
            if permit is not None:
                permit.release()  # DSP-011: released before the failure is visible
            raise
        return self._router_stream(stream, instance.instance_id, permit, on_fault)

    def _router_stream(
        self,
        stream: ItemStream,
        instance_id: int,
        permit: Permit | None,
        on_fault: Callable[[int, RoutingError], None],
    ) -> RouterStream:
        """The caller's view of ``stream``; the permit is now the stream's to release."""
        return RouterStream(stream, instance_id, permit, on_fault)

    def _resolve_and_check(
        self, target: int, fallback: TransportFallback, check_overload: bool
    ) -> Instance:
        """Resolve transport, then check overload on the resolved worker (DSP-003, DSP-004)."""
        instance = self._resolve_transport(target, fallback)
        if check_overload:
            self._check_overload(instance.instance_id)
        return instance

    def _resolve_transport(self, target: int, fallback: TransportFallback) -> Instance:
        """Its failures are raised before fault detection sees anything (FLT-008)."""
        instance = self.discovery.lookup(target)
        if instance is not None:
            return instance
        if not fallback.enabled:
            raise RoutingError(
                ErrorKind.CANNOT_CONNECT,
                f"instance_id={target} not found for endpoint {self.endpoint}",
            )  # DSP-002
        candidate = next(
            (i for i in self.worker_sets.free() if i != target and fallback.permits(i)), None
        )  # DSP-005, DSP-006
        if candidate is None:
            # Pool-level Unavailable: an empty candidate list can mean pool-wide overload,
            # policy exclusion or no worker at all; no worker is to blame (DSP-008).
            raise RoutingError(
                ErrorKind.UNAVAILABLE,
                f"Instance {target} not found and no other instances available "
                f"for endpoint {self.endpoint}",
            )
        instance = self.discovery.lookup(candidate)
        if instance is None:
            raise RoutingError(
                ErrorKind.CANNOT_CONNECT,
                f"Fallback instance_id={candidate} for instance_id={target} also not found",
            )  # DSP-007
        return instance

    def _check_overload(self, instance_id: int) -> None:
        # Without fault detection there is no overload check (FLT-009).
        if self.fault_detection and self.worker_sets.is_overloaded(instance_id):
            raise RoutingError(
                ErrorKind.WORKER_OVERLOADED,
                f"Selected worker instance_id={instance_id} is overloaded, please retry later",
            )  # DSP-004

    def _observe_fault(self, instance_id: int, error: RoutingError) -> None:
        if self.fault_detection:  # off: no report-down, no lease (FLT-009)
            observe_fault(self.worker_sets, instance_id, error)


@attrs.define
class RouterStream:
    """The caller's view of a response stream: every item passes through unchanged (DSP-013).

    The occupancy permit is released exactly once: at end of stream, at the first error
    item before it is returned, or when the caller closes the stream (DSP-011).
    """

    _inner: ItemStream
    instance_id: int
    _permit: Permit | None
    _on_fault: Callable[[int, RoutingError], None]

    def __aiter__(self) -> RouterStream:
        return self

    def interrupter(self) -> Callable[[], None] | None:
        return interrupter(self._inner)

    async def __anext__(self) -> Annotated:
        try:
            item = await self._inner.__anext__()
        except BaseException:
            self._release()
            raise
        if item.error is not None:
            self._release()
            self._on_fault(self.instance_id, item.error)
        return item

    async def aclose(self) -> None:
        self._release()
        await self._inner.aclose()

    def _release(self) -> None:
        if self._permit is not None:
            self._permit.release()
