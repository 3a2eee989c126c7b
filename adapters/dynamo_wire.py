"""Adapter ``dynamo-wire``: the real Dynamo 1.6.1 client against the reference's scripted
workers, over Dynamo's own wire.

The client (its Rust PushRouter and AddressedPushRouter, through the Python bindings) runs in
a subprocess; the workers are reference ``DrillWorkerServer``s on 127.0.0.1, registered in a
temporary file-discovery directory, so they can misbehave on the wire in ways a Python
handler cannot (rejection ACKs, typed prologue errors, error items with a cause chain or a
type Python has no class for, broken frames).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from routespec.adapters.dynamo.client_target import (
    DynamoClientTarget,
    DynamoRuntimeAdapter,
    with_request_ids,
)
from routespec.adapters.dynamo.expectations import load_expectations
from routespec.discovery.file_store import FileRegistration, random_instance_id, transport_path
from routespec.discovery.instances import Instance
from routespec.testing.drill_server import DrillWorkerServer, serve_black_hole
from routespec.testing.portal import TrioPortal
from routespec.testing.scripted import ScriptedWorker
from routespec.testing.target import (
    Capability,
    Delivery,
    Outcome,
    Silent,
    SilentStage,
    WorkerScript,
)

ENDPOINT = "routespec/conformance/generate"
EXPECTATIONS = Path(__file__).with_name("dynamo_wire_expectations.toml")


@attrs.define
class WireWorker:
    scripted: ScriptedWorker
    server: DrillWorkerServer
    registration: FileRegistration
    instance_id: int
    own_address: str | None = None  # set while listed at a black hole (silent at CONNECT)


class DynamoWireTarget(DynamoClientTarget):
    """Reference workers in a trio run on real time; the Dynamo client in a subprocess."""

    def __init__(self, store: Path) -> None:
        super().__init__(ENDPOINT.replace("/", "."), store)
        self._store = store
        self._portal = TrioPortal(mock_clock=False)
        self._workers: dict[int, WireWorker] = {}
        self._log: list[Delivery] = []  # as the workers saw them: Dynamo's request ids
        self._ids = itertools.count(1)
        self._instance_base = random_instance_id() >> 2
        self._black_hole: str | None = None

    def close(self) -> None:
        try:
            self.driver.close()
        finally:
            self._portal.close()

    # workers

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
        self.driver.await_instances({instance_id})
        return worker_id

    def remove_worker(self, worker_id: int) -> None:
        worker = self._workers[worker_id]
        worker.registration.deregister()
        self.driver.await_instances(set(), {worker.instance_id})

    def kill_worker(self, worker_id: int) -> None:
        self._portal.call_sync(self._workers[worker_id].server.kill)
        self.unstall(worker_id)
        self.settle()

    def script_worker(self, worker_id: int, script: WorkerScript) -> None:
        worker = self._workers[worker_id]

        def assign() -> None:
            worker.scripted.script = script

        self._portal.call_sync(assign)
        unreachable = isinstance(script, Silent) and script.stage is SilentStage.CONNECT
        if unreachable != (worker.own_address is not None):
            self._portal.call(lambda: self._relist(worker, unreachable))
            self.driver.await_address(worker.instance_id, worker.registration.instance.address)

    async def _relist(self, worker: WireWorker, unreachable: bool) -> None:
        """A worker silent at CONNECT is listed at an address whose connections never
        complete (the client reads the changed record); scripted otherwise, at its own."""
        instance = worker.registration.instance
        if unreachable:
            if self._black_hole is None:
                self._black_hole = await self._portal.nursery.start(serve_black_hole)
            worker.own_address = instance.address
            address = f"{self._black_hole}/{instance.address.partition('/')[2]}"
        else:
            assert worker.own_address is not None
            address, worker.own_address = worker.own_address, None
        worker.registration.instance = attrs.evolve(instance, address=address)
        worker.registration.register()

    def release_stalled(self, worker_id: int) -> None:
        self._portal.call_sync(self._workers[worker_id].scripted.release_stalled)
        self.unstall(worker_id)
        self.settle()

    def worker_bytes(self, worker_id: int) -> int:
        return sum(self._workers[worker_id].server.bytes_received.values())

    def control_message(self, request_id: str) -> Mapping[str, object] | None:
        """As the real client wrote it, under Dynamo's own request id."""
        for dynamo_id, suite_id in self._suite_ids().items():
            if suite_id != request_id or not isinstance(dynamo_id, str):
                continue
            for worker in self._workers.values():
                if (control := worker.server.control_messages.get(dynamo_id)) is not None:
                    return control
        return None

    def control_words(self, request_id: str) -> Sequence[object]:
        """As the real client wrote them, on the stream of Dynamo's own request id."""
        for dynamo_id, suite_id in self._suite_ids().items():
            if suite_id != request_id or not isinstance(dynamo_id, str):
                continue
            for worker in self._workers.values():
                if (words := worker.server.control_words.get(dynamo_id)) is not None:
                    return tuple(words)
        return ()

    # what the suite sees

    def deliveries(self) -> Sequence[Delivery]:
        return tuple(
            attrs.evolve(d, request_id=self._suite_ids().get(d.request_id, d.request_id))
            for d in tuple(self._log)
        )

    def instance_id(self, worker_id: int) -> int:
        worker = self._workers.get(worker_id)
        return worker.instance_id if worker is not None else worker_id  # unknown ids pass as is

    def outcome(self, request_id: str) -> Outcome | None:
        outcome = super().outcome(request_id)
        if outcome is None:
            return None
        return attrs.evolve(outcome, items=with_request_ids(outcome.items, self._suite_ids()))

    def _suite_ids(self) -> dict[object, str]:
        """Dynamo's request id -> the suite's, which travels in the payload."""
        ids: dict[object, str] = {}
        for delivery in tuple(self._log):
            rid = delivery.payload.get("rid") if isinstance(delivery.payload, dict) else None
            if isinstance(rid, str):
                ids[delivery.request_id] = rid
        return ids

    def _on_stall(self, dynamo_request_id: str) -> None:
        for delivery in reversed(self._log):
            if delivery.request_id == dynamo_request_id:
                script = self._workers[delivery.worker_id].scripted.script
                suite_id = self._suite_ids().get(dynamo_request_id, dynamo_request_id)
                self.mark_stalled(suite_id, delivery.worker_id, getattr(script, "items", 0))
                return


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
        Capability.OBSERVE_CONTROL_MESSAGE,
        Capability.SCRIPT_SILENCE,  # silent at CONNECT: listed at a black hole
        Capability.REAL_CLOCK,
    }
)


ADAPTER = DynamoRuntimeAdapter(
    "dynamo-wire", CAPABILITIES, DynamoWireTarget, load_expectations(EXPECTATIONS)
)
