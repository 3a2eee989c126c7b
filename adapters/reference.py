"""Adapter ``reference``: the trio reference router and scripted in-process workers."""

from __future__ import annotations

import contextlib
import itertools
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Protocol

import attrs
import trio

from routespec.adapters.reference_discovery import ReferenceDiscovery
from routespec.adapters.reference_host import ReferenceHost, build_host, set_only
from routespec.discovery.instances import Instance, MemoryDiscovery
from routespec.errors import RoutingError, bound_message, error_chain, parse_type_label, type_label
from routespec.errors import match_error_chain as reference_match_error_chain
from routespec.host.routing_host import RoutingHost
from routespec.migration import Migration
from routespec.routing.deadlines import DeadlineAware, Deadlines, with_deadlines
from routespec.routing.load_thresholds import LoadReport as ReferenceLoadReport
from routespec.routing.load_thresholds import LoadThresholds as ReferenceLoadThresholds
from routespec.routing.push_router import PushRouter
from routespec.routing.selection import RouterMode
from routespec.routing.streaming import (
    InflightGauge,
    ItemStream,
    Request,
    RequestStream,
    StreamingDispatch,
)
from routespec.testing.portal import TrioPortal
from routespec.testing.scripted import PREPARED_FOR, ScriptedWorker, build_error
from routespec.testing.target import (
    Bidirectional,
    Call,
    Capability,
    Delivery,
    Direct,
    DirectWithin,
    DiscoveryTarget,
    ErrorSpec,
    Generate,
    HeldConnection,
    HostConfig,
    HostRoute,
    LoadReport,
    LoadThresholds,
    Migrate,
    ObservedError,
    Outcome,
    RoutingHostTarget,
    Silent,
    SilentStage,
    Target,
    TargetConfig,
    Timeouts,
    WorkerBounds,
    WorkerScript,
    WorkerSetsView,
)
from routespec.transport.first_response_guard import FirstResponseGuardedDispatch
from routespec.transport.in_process import InProcessDispatch

ENDPOINT = "routespec/conformance/generate"


def observe(error: BaseException, *, pre_stream: bool) -> ObservedError:
    """The spec-vocabulary view of a reference error chain."""
    links = tuple(
        (None, str(link))
        if not isinstance(link, RoutingError)
        else (None if link.error_type is None else type_label(link.error_type), link.message)
        for link in error_chain(error)
    )
    error_class = error.error_class.value if isinstance(error, RoutingError) else None
    return ObservedError(links, pre_stream, error_class)


async def _count_to(count: int, more: bool = False) -> AsyncIterator[object]:
    """A caller that streams its inputs, yielding to the scheduler between them; with
    ``more``, one whose next input never comes (``Bidirectional.more``)."""
    for value in range(count):
        await trio.lowlevel.checkpoint()
        yield value
    if more:
        await trio.sleep_forever()


@attrs.define(eq=False)
class CountingGuard:
    """A first-response guard that is held while it is in ``held``."""

    held: set[CountingGuard]

    def __attrs_post_init__(self) -> None:
        self.held.add(self)

    def release(self) -> None:
        self.held.discard(self)


def stamp_prepared_target(request: Request, worker_id: int) -> Request:
    return attrs.evolve(request, annotations={**request.annotations, PREPARED_FOR: str(worker_id)})


def chain_from_labels(labels: Sequence[str | None]) -> RoutingError:
    cause: RoutingError | None = None
    for label in reversed(labels):
        error_type = None if label is None else parse_type_label(label)
        cause = RoutingError(error_type, "link", cause=cause)
    assert cause is not None, "a chain has at least one link"
    return cause


class Cluster(Protocol):
    """How a target's workers are served: in process, or over TCP."""

    @property
    def transport(self) -> StreamingDispatch: ...
    @property
    def inflight(self) -> InflightGauge: ...
    @property
    def response_connections(self) -> int:
        """Response connections the caller holds (none in process)."""
        ...

    async def serve(self, worker_id: int, worker: ScriptedWorker) -> str:
        """Start serving ``worker``; returns its transport address."""
        ...

    async def serve_process(self, worker_id: int, script: WorkerScript, log: list[Delivery]) -> str:
        """Start a worker process serving ``script`` that appends what reaches it to ``log``;
        returns its transport address."""
        ...

    async def settle_process_request(self, request_id: str, ended: Callable[[], bool]) -> None:
        """Return once ``ended()`` holds or a worker process reports ``request_id`` stalled
        or written to its end (bounded in real time: the portal's clock is a mock)."""
        ...

    async def kill(self, worker_id: int) -> None:
        """The worker dies; a worker process is killed (SIGKILL) and has exited on return."""
        ...

    async def drain(self, worker_id: int, grace_period: float) -> None:
        """The worker shuts down gracefully (Capability.DRAIN_WORKER); returns when done."""
        ...

    def announce_removal(self, worker_id: int, removed: bool) -> None: ...
    def worker_bytes(self, worker_id: int) -> int: ...
    def control_message(self, request_id: str) -> Mapping[str, object] | None: ...
    def control_words(self, request_id: str) -> Sequence[object]: ...
    async def send_raw(self, worker_id: int | None, data: bytes) -> None: ...
    def worker_path(self, worker_id: int) -> str: ...
    def reused_streams(self, worker_id: int) -> int:
        """Response streams the worker wrote on a connection a caller released to it."""
        ...

    async def black_hole(self) -> str:
        """An address whose connections never complete (Capability.SCRIPT_SILENCE)."""
        ...

    def resolve_name(self, name: str, addresses: Sequence[str] | None) -> None:
        """The workers' resolver's answer for ``name`` (Capability.SCRIPT_NAMES)."""
        ...

    async def starve_caller(self, spare: int | None) -> None:
        """This process keeps only ``spare`` free descriptors (Capability.STARVE_CALLER)."""
        ...

    # Capability.WORKER_LIMITS
    async def serve_bounded(
        self, worker_id: int, worker: ScriptedWorker, bounds: WorkerBounds
    ) -> str:
        """``serve``, with a request-plane server that keeps ``bounds``."""
        ...

    def open_file_limit(self, worker_id: int) -> int: ...
    def worker_address(self, worker_id: int) -> str: ...
    async def connect(self, worker_id: int) -> int: ...
    async def write(self, connection: int, data: bytes) -> None: ...
    def held(self, connection: int) -> HeldConnection: ...
    async def disconnect(self, connection: int) -> None: ...


@attrs.define
class InProcessCluster:
    transport: InProcessDispatch = attrs.field(factory=InProcessDispatch)

    @property
    def inflight(self) -> InflightGauge:
        return self.transport.inflight

    @property
    def response_connections(self) -> int:
        return 0  # streams are objects here: no connection to hold

    async def serve(self, worker_id: int, worker: ScriptedWorker) -> str:
        address = f"inproc://worker-{worker_id}"
        self.transport.serve(address, worker)
        return address

    async def serve_process(self, worker_id: int, script: WorkerScript, log: list[Delivery]) -> str:
        raise NotImplementedError("in-process workers run in the caller's process")

    async def settle_process_request(self, request_id: str, ended: Callable[[], bool]) -> None:
        return  # no worker processes: the portal's settling is enough

    async def kill(self, worker_id: int) -> None:
        self.transport.kill(f"inproc://worker-{worker_id}")

    async def drain(self, worker_id: int, grace_period: float) -> None:
        raise NotImplementedError("in-process workers have no server to drain")

    def announce_removal(self, worker_id: int, removed: bool) -> None:
        raise NotImplementedError("in-process workers have no removal watcher")

    def worker_bytes(self, worker_id: int) -> int:
        raise NotImplementedError("in-process workers receive objects, not bytes")

    def control_message(self, request_id: str) -> Mapping[str, object] | None:
        raise NotImplementedError("in-process workers read no control message")

    def control_words(self, request_id: str) -> Sequence[object]:
        raise NotImplementedError("in-process workers read no control words")

    async def send_raw(self, worker_id: int | None, data: bytes) -> None:
        raise NotImplementedError("in-process workers have no ports")

    def worker_path(self, worker_id: int) -> str:
        raise NotImplementedError("in-process workers have no request plane")

    def reused_streams(self, worker_id: int) -> int:
        raise NotImplementedError("in-process workers have no response connections")

    async def black_hole(self) -> str:
        raise NotImplementedError("in-process workers are not connected to")

    def resolve_name(self, name: str, addresses: Sequence[str] | None) -> None:
        raise NotImplementedError("in-process workers dial nothing")

    async def starve_caller(self, spare: int | None) -> None:
        raise NotImplementedError("an in-process caller takes no descriptor for a stream")

    async def serve_bounded(
        self, worker_id: int, worker: ScriptedWorker, bounds: WorkerBounds
    ) -> str:
        raise NotImplementedError("in-process workers hold no connections")

    def open_file_limit(self, worker_id: int) -> int:
        raise NotImplementedError("in-process workers hold no connections")

    def worker_address(self, worker_id: int) -> str:
        raise NotImplementedError("in-process workers have no ports")

    async def connect(self, worker_id: int) -> int:
        raise NotImplementedError("in-process workers have no ports")

    async def write(self, connection: int, data: bytes) -> None:
        raise NotImplementedError("in-process workers have no ports")

    def held(self, connection: int) -> HeldConnection:
        raise NotImplementedError("in-process workers have no ports")

    async def disconnect(self, connection: int) -> None:
        raise NotImplementedError("in-process workers have no ports")


ClusterFactory = Callable[[TrioPortal], Cluster]


def thresholds_of(thresholds: LoadThresholds) -> ReferenceLoadThresholds:
    """The reference's busy thresholds; invalid values raise ``InvalidArgument`` (SET-006)."""
    return ReferenceLoadThresholds(
        thresholds.active_decode_blocks_threshold,
        thresholds.active_prefill_tokens_threshold,
        thresholds.active_prefill_tokens_threshold_frac,
    )


def deadlines_of(timeouts: Timeouts) -> Deadlines:
    """The router's deadlines: the config's where it sets them, else the defaults (TMO)."""
    fields = {
        "connect_timeout": timeouts.connect,
        "ack_timeout": timeouts.ack,
        "establish_timeout": timeouts.establish,
        "first_item_timeout": timeouts.first_item,
        "inactivity_timeout": timeouts.inactivity,
    }
    return Deadlines(**{name: value for name, value in fields.items() if value is not None})


class ReferenceTarget:
    """The reference PushRouter over scripted workers, inside a ``TrioPortal``."""

    def __init__(
        self,
        portal: TrioPortal,
        config: TargetConfig,
        router_class: type[PushRouter],
        cluster: Cluster,
        migration_class: type[Migration] = Migration,
        host_class: type[RoutingHost] = RoutingHost,
    ):
        self._portal = portal
        self._host_class = host_class
        self._config = config
        self._host: ReferenceHost | None = None
        self._migration_class = migration_class
        self._discovery = MemoryDiscovery()
        self._cluster = cluster
        self._workers: dict[int, ScriptedWorker] = {}
        self._processes: set[int] = set()  # workers that are separate OS processes
        self._own_addresses: dict[int, str] = {}  # of workers silent at CONNECT
        self._log: list[Delivery] = []
        self._outcomes: dict[str, Outcome] = {}
        self._scopes: dict[str, trio.CancelScope] = {}
        self._ids = itertools.count(1)
        self._request_numbers = itertools.count(1)
        self._paced = False  # pace_reads
        self._reads: dict[str, trio.Semaphore] = {}  # a paced request's reads allowed so far

        self._guards: set[CountingGuard] = set()

        transport: StreamingDispatch = cluster.transport
        if config.timeouts != Timeouts() or not isinstance(transport, DeadlineAware):
            # Derived from the transport as every router of the process shares it, with
            # this router's deadlines (TMO-010), as a deployment's router gets them.
            transport = with_deadlines(transport, deadlines_of(config.timeouts))
        # else as a deployment sends: through a wire transport left at its own defaults

        async def build() -> PushRouter:
            return router_class.create(
                ENDPOINT,
                self._discovery,
                FirstResponseGuardedDispatch(transport, portal.nursery),
                load_thresholds=thresholds_of(config.load_thresholds),
                **set_only(
                    rng=None if config.seed is None else random.Random(config.seed),
                    fault_detection=config.fault_detection,
                    inhibited_duration=config.inhibited_duration,
                    device_ratio=config.device_ratio,
                ),
            )

        self._router = portal.call(build)

    # cluster control

    def add_worker(self, *, device: str = "cuda") -> int:
        return self._add_worker(device, None)

    def add_bounded_worker(self, bounds: WorkerBounds) -> int:
        return self._add_worker("cuda", bounds)

    def _add_worker(self, device: str, bounds: WorkerBounds | None) -> int:
        worker_id = next(self._ids)
        worker = ScriptedWorker(worker_id, self._log)
        self._workers[worker_id] = worker

        async def register() -> None:
            if bounds is None:
                address = await self._cluster.serve(worker_id, worker)
            else:
                address = await self._cluster.serve_bounded(worker_id, worker, bounds)
            self._discovery.register(Instance(worker_id, ENDPOINT, address, device))

        self._portal.call(register)
        if self._host is not None:
            self._host.configure_worker(worker_id)
        return worker_id

    def add_worker_process(self, script: WorkerScript) -> int:
        worker_id = next(self._ids)

        async def register() -> None:
            address = await self._cluster.serve_process(worker_id, script, self._log)
            self._discovery.register(Instance(worker_id, ENDPOINT, address, "cuda"))

        self._portal.call(register)
        self._processes.add(worker_id)
        return worker_id

    def set_device(self, worker_id: int, device: str) -> None:
        def rewrite() -> None:
            listed = self._discovery.lookup(worker_id)
            assert listed is not None, f"worker {worker_id} is not listed"
            self._discovery.register(attrs.evolve(listed, device_type=device))

        self._portal.call_sync(rewrite)

    def remove_worker(self, worker_id: int) -> None:
        def remove() -> None:
            self._discovery.deregister(worker_id)
            with contextlib.suppress(NotImplementedError):
                self._cluster.announce_removal(worker_id, True)

        self._portal.call_sync(remove)

    def kill_worker(self, worker_id: int) -> None:
        self._portal.call(lambda: self._cluster.kill(worker_id))

    def drain_worker(self, worker_id: int, grace_period: float) -> None:
        self._portal.start_soon(lambda: self._cluster.drain(worker_id, grace_period))

    def vanish_worker(self, worker_id: int) -> None:
        self._portal.call_sync(lambda: self._discovery.withdraw(worker_id))

    def announce_removal(self, worker_id: int, removed: bool) -> None:
        self._portal.call_sync(lambda: self._cluster.announce_removal(worker_id, removed))

    def script_worker(self, worker_id: int, script: WorkerScript) -> None:
        def assign() -> None:
            self._scripted(worker_id).script = script

        self._portal.call_sync(assign)
        unreachable = isinstance(script, Silent) and script.stage is SilentStage.CONNECT
        if unreachable != (worker_id in self._own_addresses):
            self._portal.call(lambda: self._list_unreachable(worker_id, unreachable))

    async def _list_unreachable(self, worker_id: int, unreachable: bool) -> None:
        """A worker silent at CONNECT is listed at an address whose connections never
        complete; scripted otherwise, at its own address again."""
        instance = self._discovery.lookup(worker_id)
        if instance is None:
            return
        if unreachable:
            self._own_addresses[worker_id] = instance.address
            path = instance.address.partition("/")[2]
            address = f"{await self._cluster.black_hole()}/{path}"
        else:
            address = self._own_addresses.pop(worker_id)
        self._discovery.register(attrs.evolve(instance, address=address))

    def release_stalled(self, worker_id: int) -> None:
        self._portal.call_sync(self._scripted(worker_id).release_stalled)

    def mark_overloaded(self, worker_id: int, overloaded: bool) -> None:
        self._portal.call_sync(
            lambda: self._router.worker_sets.set_monitor_overloaded(worker_id, overloaded)
        )

    def report_down(self, worker_id: int) -> None:
        self._portal.call_sync(lambda: self._router.worker_sets.report_instance_down(worker_id))

    def report_load(self, worker_id: int, report: LoadReport) -> None:
        load = ReferenceLoadReport(
            report.active_decode_blocks,
            report.kv_total_blocks,
            report.active_prefill_tokens,
            report.max_num_batched_tokens,
        )
        self._portal.call_sync(lambda: self._router.report_load(worker_id, load))

    def check_load_thresholds(self, thresholds: LoadThresholds) -> ObservedError | None:
        """Build a second router over the same discovery with ``thresholds`` (SET-006)."""

        async def build() -> ObservedError | None:
            try:
                type(self._router).create(
                    ENDPOINT,
                    self._discovery,
                    self._router.transport,
                    load_thresholds=thresholds_of(thresholds),
                )
            except RoutingError as failure:
                return observe(failure, pre_stream=True)
            return None

        return self._portal.call(build)

    def advance_time(self, seconds: float) -> None:
        self._portal.advance(seconds)

    # router operations

    def submit(
        self, call: Call, metadata: Mapping[str, str] | None = None, guarded: bool = False
    ) -> str:
        if isinstance(call, HostRoute):
            return self._require_host().route(call)
        return self._start(lambda request: self._open_stream(request, call), metadata, guarded)

    def _start(
        self,
        open_stream: Callable[[Request], Awaitable[ItemStream]],
        metadata: Mapping[str, str] | None = None,
        guarded: bool = False,
    ) -> str:
        request_id = f"req-{next(self._request_numbers)}"
        guard = CountingGuard(self._guards) if guarded else None
        request = Request(request_id, {}, dict(metadata or {}), guard)
        if self._paced:
            self._reads[request_id] = trio.Semaphore(0)
        self._portal.start_soon(lambda: self._run(request, open_stream))
        if self._in_a_process(request_id):
            self._portal.call(
                lambda: self._cluster.settle_process_request(
                    request_id, lambda: request_id in self._outcomes
                )
            )
        return request_id

    def _in_a_process(self, request_id: str) -> bool:
        """Whether the open request may be at a worker process, which the portal's settling
        does not wait for (it was not delivered to an in-process worker)."""
        if not self._processes or request_id in self._outcomes:
            return False
        reached = {d.worker_id for d in self._log if d.request_id == request_id}
        return not reached or bool(reached & self._processes)

    def _scripted(self, worker_id: int) -> ScriptedWorker:
        if worker_id in self._processes:
            raise NotImplementedError("a worker process serves the script it was started with")
        return self._workers[worker_id]

    def outcome(self, request_id: str) -> Outcome | None:
        return self._outcomes.get(request_id)

    def pace_reads(self, paced: bool) -> None:
        self._paced = paced

    def read(self, request_id: str, items: int = 1) -> None:
        reads = self._reads[request_id]
        self._portal.call_sync(lambda: [reads.release() for _ in range(items)])

    def drop(self, request_id: str) -> None:
        self._portal.call_sync(self._scopes[request_id].cancel)

    async def _run(
        self, request: Request, open_stream: Callable[[Request], Awaitable[ItemStream]]
    ) -> None:
        items: list[object] = []
        error_item: ObservedError | None = None
        bookings: Mapping[int, int] | None = None
        occupancy: Mapping[int, int] | None = None
        stream: ItemStream | None = None
        with trio.CancelScope() as scope:  # drop() cancels it, before or after the stream
            self._scopes[request.request_id] = scope
            try:
                stream = await open_stream(request)
            except RoutingError as failure:
                del self._scopes[request.request_id]
                self._outcomes[request.request_id] = Outcome((), observe(failure, pre_stream=True))
                return
            reads = self._reads.get(request.request_id)
            try:
                while True:
                    if reads is not None:
                        await reads.acquire()  # a paced caller reads when the check says
                    try:
                        item = await stream.__anext__()
                    except StopAsyncIteration:
                        break
                    if item.error is not None:
                        error_item = observe(item.error, pre_stream=False)
                        occupancy = self._router.occupancy.snapshot()  # as the caller sees it
                        if self._host is not None:
                            bookings = self._host.bookings()
                        break  # a caller stops reading at the first error item
                    items.append(item.data)
            finally:
                # Inside the scope drop() cancels, unshielded: a caller closes its stream
                # from a cancelled scope, and closing must still release everything.
                await stream.aclose()
        del self._scopes[request.request_id]
        self._outcomes[request.request_id] = Outcome(
            tuple(items), error_item, scope.cancel_called, bookings, occupancy
        )

    async def _open_stream(self, request: Request, call: Call) -> ItemStream:
        router, prepare = self._router, stamp_prepared_target
        given = call.payload if isinstance(call, Direct) else None
        request = attrs.evolve(request, payload={"call": repr(call)} if given is None else given)
        if isinstance(call, HostRoute):
            return await self._require_host().open_stream(request, call)
        if isinstance(call, Migrate):
            return await self._migrate(request, call)
        if isinstance(call, Generate):
            return await router.generate(request, RouterMode(call.mode), prepare)
        if isinstance(call, Direct):
            return await router.direct(request, call.worker_id, prepare if call.prepared else None)
        if isinstance(call, DirectWithin):
            return await router.direct_within(request, call.worker_id, call.allowed, prepare)
        if isinstance(call, Bidirectional):
            inputs = RequestStream(_count_to(call.inputs, call.more))
            streamed = attrs.evolve(request, payload=inputs)
            return await router.generate(streamed, RouterMode(call.mode), prepare)
        permit = router.occupancy.book(call.worker_id)
        return await router.dispatch_preselected(request, call.worker_id, permit, prepare)

    async def _migrate(self, request: Request, call: Migrate) -> ItemStream:
        prompt = list(range(call.prompt))
        text = " ".join(map(str, prompt))
        budgets = {
            "max_tokens": call.max_tokens,
            "min_tokens": call.min_tokens,
            "n": call.n,
            "guided_decoding": call.guided,
        }
        payload = {
            "tokens": {"token_ids": prompt, **budgets},
            "map": {"prompt": text, **budgets},
            "text": text,
        }[call.form]
        migration = self._migration_class(self._router, call.limit, call.max_seq_len)
        return await migration.generate(
            attrs.evolve(request, payload=payload),
            RouterMode(call.mode),
            pin=call.pin,
            prepare=stamp_prepared_target,
            is_stopped=lambda: call.stopped or self._reached_enough(request, call.stop_after),
        )

    def _reached_enough(self, request: Request, stop_after: int | None) -> bool:
        """Whether ``request`` has reached ``stop_after`` workers (``Migrate.stop_after``)."""
        if stop_after is None:
            return False
        return sum(d.request_id == request.request_id for d in self._log) >= stop_after

    # discovery stores

    def open_discovery(self) -> DiscoveryTarget:
        seed = self._config.seed  # its instance ids are the adapter's draws, not the router's
        return ReferenceDiscovery(self._portal, 0 if seed is None else seed)

    # the routing host

    def open_host(self, config: HostConfig) -> RoutingHostTarget | ObservedError:
        async def build() -> RoutingHost | ObservedError:
            try:
                return build_host(
                    self._host_class,
                    self._router,
                    config,
                    self._config.seed,
                    stamp_prepared_target,
                    self._router.worker_sets.discovered_ids(),
                )
            except RoutingError as failure:
                return observe(failure, pre_stream=True)

        built = self._portal.call(build)
        if isinstance(built, ObservedError):
            return built
        self._host = ReferenceHost(
            self._portal,
            built,
            self._start,
            lambda failure: observe(failure, pre_stream=True),
            self._migration_class,
        )
        return self._host

    def _require_host(self) -> ReferenceHost:
        assert self._host is not None, "open_host() first"
        return self._host

    # observations

    def dispatch_log(self) -> Sequence[Delivery]:
        return tuple(self._log)

    def worker_sets(self) -> WorkerSetsView:
        async def read() -> WorkerSetsView:
            sets = self._router.worker_sets
            return WorkerSetsView(
                frozenset(sets.discovered_ids()),
                frozenset(sets.routable_ids()),
                frozenset(sets.overloaded_ids()),
                frozenset(sets.free_ids()),
            )

        return self._portal.call(read)

    def occupancy(self) -> Mapping[int, int]:
        return self._router.occupancy.snapshot()

    def held_guards(self) -> int:
        return len(self._guards)

    def transport_inflight(self) -> int:
        return self._cluster.inflight.count

    def response_connections(self) -> int:
        return self._cluster.response_connections

    def worker_bytes(self, worker_id: int) -> int:
        return self._cluster.worker_bytes(worker_id)

    def control_message(self, request_id: str) -> Mapping[str, object] | None:
        async def read() -> Mapping[str, object] | None:
            return self._cluster.control_message(request_id)

        return self._portal.call(read)

    def control_words(self, request_id: str) -> Sequence[object]:
        async def read() -> Sequence[object]:
            return self._cluster.control_words(request_id)

        return self._portal.call(read)

    def send_raw(self, worker_id: int | None, data: bytes) -> None:
        self._portal.call(lambda: self._cluster.send_raw(worker_id, data))

    def worker_path(self, worker_id: int) -> str:
        return self._cluster.worker_path(worker_id)

    def reused_streams(self, worker_id: int) -> int:
        return self._cluster.reused_streams(worker_id)

    def resolve_name(self, name: str, addresses: Sequence[str] | None) -> None:
        self._portal.call_sync(lambda: self._cluster.resolve_name(name, addresses))

    def starve_caller(self, spare: int | None) -> None:
        self._portal.call(lambda: self._cluster.starve_caller(spare))

    # raw connections held open to a worker

    def open_file_limit(self, worker_id: int) -> int:
        return self._cluster.open_file_limit(worker_id)

    def worker_address(self, worker_id: int) -> str:
        return self._cluster.worker_address(worker_id)

    def connect(self, worker_id: int) -> int:
        return self._portal.call(lambda: self._cluster.connect(worker_id))

    def write(self, connection: int, data: bytes) -> HeldConnection:
        self._portal.call(lambda: self._cluster.write(connection, data))
        return self._cluster.held(connection)

    def held(self, connection: int) -> HeldConnection:
        self._portal.call(trio.lowlevel.checkpoint)  # what fell due has been answered
        return self._cluster.held(connection)

    def disconnect(self, connection: int) -> None:
        self._portal.call(lambda: self._cluster.disconnect(connection))

    # the error model

    def match_error_chain(
        self, chain: Sequence[str | None], include: Sequence[str], exclude: Sequence[str]
    ) -> bool:
        return reference_match_error_chain(
            chain_from_labels(chain),
            [parse_type_label(label) for label in include],
            [parse_type_label(label) for label in exclude],
        )

    def classify(self, error: ErrorSpec) -> tuple[str, str]:
        built = build_error(error)
        return built.error_class.value, built.reason

    def bounded_message(self, message: str) -> str:
        return bound_message(message)


WIRE_ONLY = frozenset(
    {
        Capability.SCRIPT_SILENCE,
        Capability.SCRIPT_WIRE_FAULTS,
        Capability.ANNOUNCE_REMOVAL,
        Capability.KILL_WORKER_PROCESS,
        Capability.OBSERVE_WORKER_BYTES,
        Capability.OBSERVE_CONTROL_MESSAGE,
        Capability.WIRE_TRANSPORT,
        Capability.RESPONSE_REUSE,
        Capability.WORKER_LIMITS,
        Capability.DRAIN_WORKER,
        Capability.OBSERVE_WORKER_LOG,
        Capability.SCRIPT_NAMES,
        Capability.STARVE_CALLER,
    }
)


def in_process_cluster(portal: TrioPortal) -> Cluster:
    return InProcessCluster()


@attrs.frozen
class ReferenceAdapter:
    """Opens ``ReferenceTarget``s; mutants pass a broken ``router_class``."""

    name: str = "reference"
    router_class: type[PushRouter] = PushRouter
    capabilities: frozenset[Capability] = (
        frozenset(Capability) - WIRE_ONLY - {Capability.REAL_CLOCK}  # its clock is a MockClock
    )
    expected_failures: Mapping[str, str] = attrs.field(factory=dict)
    cluster: ClusterFactory = in_process_cluster
    migration_class: type[Migration] = Migration
    host_class: type[RoutingHost] = RoutingHost

    @contextmanager
    def open(self, config: TargetConfig) -> Iterator[Target]:
        portal = TrioPortal()
        try:
            yield ReferenceTarget(
                portal,
                config,
                self.router_class,
                self.cluster(portal),
                self.migration_class,
                self.host_class,
            )
        finally:
            portal.close()


ADAPTER = ReferenceAdapter()
