"""Adapter ``dynamo-wire``: the real Dynamo 1.6.1 client against the reference's scripted
workers, over Dynamo's own wire.

The client (its Rust PushRouter and AddressedPushRouter, through the Python bindings) runs in
a subprocess; the workers are reference ``DrillWorkerServer``s on 127.0.0.1, registered in a
temporary file-discovery directory, so they can misbehave on the wire in ways a Python
handler cannot (rejection ACKs, prologue errors, broken frames, stalls, deaths).
"""

from __future__ import annotations

import contextlib
import itertools
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import attrs

from adapters.dynamo.driver import ClientDriver
from adapters.dynamo.expectations import load_expectations
from routespec.discovery import Instance
from routespec.file_discovery import FileRegistration, random_instance_id, transport_path
from routespec.portal import TrioPortal
from routespec.scripted import ScriptedWorker
from routespec.target import (
    Call,
    Capability,
    Delivery,
    Direct,
    ErrorSpec,
    Generate,
    Outcome,
    Target,
    TargetConfig,
    WorkerScript,
    WorkerSetsView,
)
from routespec.transport.drill_server import DrillWorkerServer

ENDPOINT = "routespec/conformance/generate"
DOTTED_ENDPOINT = ENDPOINT.replace("/", ".")
MODES = {"round-robin": "round_robin", "random": "random"}
SETTLE_LIMIT = 10.0


@attrs.define
class WireWorker:
    scripted: ScriptedWorker
    server: DrillWorkerServer
    registration: FileRegistration
    instance_id: int


class DynamoWireTarget:
    """Reference workers in a trio run on real time; the Dynamo client in a subprocess."""

    def __init__(self, store: Path) -> None:
        self._store = store
        self._portal = TrioPortal(mock_clock=False)
        self._workers: dict[int, WireWorker] = {}
        self._log: list[Delivery] = []
        # Dynamo request id -> (worker, items it sent) for requests a Stall script holds
        self._stalled: dict[str, tuple[int, int]] = {}
        self._ids = itertools.count(1)
        self._instance_base = random_instance_id() >> 2
        self._requests = itertools.count(1)
        self._driver = ClientDriver(DOTTED_ENDPOINT, store)

    def close(self) -> None:
        try:
            self._driver.close()
        finally:
            self._portal.close()

    # cluster control

    def add_worker(self, *, device: str = "cuda") -> int:
        worker_id = next(self._ids)
        scripted = ScriptedWorker(worker_id, self._log, on_stall=self._on_stall)
        instance_id = self._instance_base + worker_id  # Dynamo orders workers by id

        async def start() -> WireWorker:
            server = DrillWorkerServer()
            await self._portal.nursery.start(server.run)
            address = server.serve(transport_path(ENDPOINT, instance_id), scripted)
            registration = FileRegistration(
                Instance(instance_id, ENDPOINT, address, device), self._store
            )
            registration.register()
            self._portal.nursery.start_soon(registration.heartbeat)
            return WireWorker(scripted, server, registration, instance_id)

        self._workers[worker_id] = self._portal.call(start)
        self._driver.await_instances({instance_id})
        return worker_id

    def remove_worker(self, worker_id: int) -> None:
        worker = self._workers[worker_id]
        worker.registration.deregister()
        self._driver.await_instances(set(), {worker.instance_id})

    def kill_worker(self, worker_id: int) -> None:
        self._sync(self._workers[worker_id].server.kill)
        self._unstall(worker_id)
        self._settle()

    def script_worker(self, worker_id: int, script: WorkerScript) -> None:
        def assign() -> None:
            self._workers[worker_id].scripted.script = script

        self._sync(assign)

    def release_stalled(self, worker_id: int) -> None:
        self._sync(self._workers[worker_id].scripted.release_stalled)
        self._unstall(worker_id)
        self._settle()

    # router operations

    def submit(
        self, call: Call, metadata: Mapping[str, str] | None = None, guarded: bool = False
    ) -> str:
        request_id = f"req-{next(self._requests)}"
        command: dict[str, object] = {"op": "submit", "id": request_id}
        command["payload"] = {"rid": request_id, "call": repr(call)}
        if isinstance(call, Generate):
            command["mode"] = MODES[call.mode]
        elif isinstance(call, Direct):
            command["mode"] = "direct"
            command["instance_id"] = self._instance_id(call.worker_id)
        else:
            raise NotImplementedError(f"{call} through Dynamo's Python bindings")
        self._driver.send(command)
        self._driver.wait_for(
            lambda: request_id in self._driver.outcomes or self._is_stalled(request_id),
            f"{request_id} to settle",
            SETTLE_LIMIT,
        )
        return request_id

    def outcome(self, request_id: str) -> Outcome | None:
        outcome = self._driver.outcome(request_id)
        if outcome is None:
            return None
        return attrs.evolve(outcome, items=tuple(self._own_ids(i) for i in outcome.items))

    def drop(self, request_id: str) -> None:
        self._driver.send({"op": "drop", "id": request_id})
        self._driver.wait_for(lambda: request_id in self._driver.outcomes, "the drop")

    # observations

    def dispatch_log(self) -> Sequence[Delivery]:
        return tuple(
            attrs.evolve(d, request_id=self._request_of(d.payload) or d.request_id)
            for d in tuple(self._log)
        )

    def worker_bytes(self, worker_id: int) -> int:
        return sum(self._workers[worker_id].server.bytes_received.values())

    # not reachable through the bindings: declared absent in the capabilities

    def vanish_worker(self, worker_id: int) -> None:
        raise NotImplementedError(Capability.VANISH_WORKER.value)

    def add_worker_process(self, script: WorkerScript) -> int:
        raise NotImplementedError(Capability.KILL_WORKER_PROCESS.value)

    def announce_removal(self, worker_id: int, removed: bool) -> None:
        raise NotImplementedError(Capability.ANNOUNCE_REMOVAL.value)

    def mark_overloaded(self, worker_id: int, overloaded: bool) -> None:
        raise NotImplementedError(Capability.MARK_OVERLOADED.value)

    def report_down(self, worker_id: int) -> None:
        raise NotImplementedError(Capability.REPORT_DOWN.value)

    def advance_time(self, seconds: float) -> None:
        raise NotImplementedError(Capability.MOCK_CLOCK.value)

    def worker_sets(self) -> WorkerSetsView:
        raise NotImplementedError(Capability.OBSERVE_WORKER_SETS.value)

    def occupancy(self) -> Mapping[int, int]:
        raise NotImplementedError(Capability.OBSERVE_OCCUPANCY.value)

    def held_guards(self) -> int:
        raise NotImplementedError(Capability.FIRST_RESPONSE_GUARD.value)

    def transport_inflight(self) -> int:
        raise NotImplementedError(Capability.OBSERVE_INFLIGHT.value)

    def send_raw(self, worker_id: int | None, data: bytes) -> None:
        raise NotImplementedError(Capability.WIRE_TRANSPORT.value)

    def match_error_chain(
        self, chain: Sequence[str | None], include: Sequence[str], exclude: Sequence[str]
    ) -> bool:
        raise NotImplementedError(Capability.ERROR_MODEL.value)

    def classify(self, error: ErrorSpec) -> tuple[str, str]:
        raise NotImplementedError(Capability.ERROR_MODEL.value)

    def bounded_message(self, message: str) -> str:
        raise NotImplementedError(Capability.ERROR_MODEL.value)

    # helpers

    def _instance_id(self, worker_id: int) -> int:
        worker = self._workers.get(worker_id)
        return worker.instance_id if worker is not None else worker_id  # unknown ids pass as is

    def _on_stall(self, dynamo_request_id: str) -> None:
        worker = next(
            (d.worker_id for d in reversed(self._log) if d.request_id == dynamo_request_id), 0
        )
        sent = getattr(self._workers[worker].scripted.script, "items", 0) if worker else 0
        with self._driver.changed:
            self._stalled[dynamo_request_id] = (worker, sent)
            self._driver.changed.notify_all()

    def _unstall(self, worker_id: int) -> None:
        with self._driver.changed:
            for request_id in [r for r, (w, _) in self._stalled.items() if w == worker_id]:
                del self._stalled[request_id]

    def _is_stalled(self, request_id: str) -> bool:
        """Held by a Stall script, and the client has read every item sent before it."""
        received = self._driver.received.get(request_id, 0)
        return any(
            d.request_id in self._stalled and received >= self._stalled[d.request_id][1]
            for d in tuple(self._log)
            if self._request_of(d.payload) == request_id
        )

    @staticmethod
    def _request_of(payload: object) -> str | None:
        rid = payload.get("rid") if isinstance(payload, dict) else None
        return rid if isinstance(rid, str) else None

    def _own_ids(self, item: object) -> object:
        """Items carry the worker's view of the request id (Dynamo's); show the suite's."""
        if not isinstance(item, dict):
            return item
        for delivery in tuple(self._log):
            if delivery.request_id == item.get("request"):
                return {**item, "request": self._request_of(delivery.payload)}
        return item

    def _settle(self) -> None:
        """Wait (bounded) until every request that reached a worker has an outcome or stalls."""
        self._driver.wait_for(
            lambda: all(
                rid in self._driver.outcomes or self._is_stalled(rid)
                for rid in {self._request_of(d.payload) for d in tuple(self._log)} - {None}
                if rid is not None
            ),
            "open requests to settle",
            SETTLE_LIMIT,
        )

    def _sync(self, fn: object) -> None:
        async def run() -> None:
            assert callable(fn)
            fn()

        self._portal.call(run)


CAPABILITIES = frozenset(
    {
        Capability.ROUND_ROBIN,
        Capability.RANDOM,
        Capability.DIRECT,
        Capability.REMOVE_WORKER,
        Capability.KILL_WORKER,
        Capability.SCRIPT_FAILURES,
        Capability.SCRIPT_STALL,
        Capability.SCRIPT_REJECTION,
        Capability.SCRIPT_WIRE_FAULTS,
        Capability.OBSERVE_WORKER_BYTES,
    }
)


EXPECTATIONS = Path(__file__).with_name("dynamo_wire_expectations.toml")


@attrs.frozen
class DynamoWireAdapter:
    name: str = "dynamo-wire"
    capabilities: frozenset[Capability] = CAPABILITIES
    expected_failures: Mapping[str, str] = attrs.field(
        factory=lambda: load_expectations(EXPECTATIONS)
    )

    @contextlib.contextmanager
    def open(self, config: TargetConfig) -> Iterator[Target]:
        with tempfile.TemporaryDirectory(prefix="routespec-dynamo-") as store:
            target = DynamoWireTarget(Path(store))
            try:
                yield target
            finally:
                target.close()


ADAPTER = DynamoWireAdapter()
