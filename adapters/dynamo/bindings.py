"""Adapter ``dynamo``: the real Dynamo 1.6.1 runtime through its Python bindings only.

Workers are real Dynamo endpoints in separate processes (``worker_process``: a Python
handler that follows the suite's serve, stall and failure scripts); the caller is a real
Dynamo client (``client_driver``). Discovery is the file store in a temporary directory, every
socket on 127.0.0.1.

A worker's number in the suite is its Dynamo instance id, so the suite's order of workers is
the order Dynamo's round-robin cycles through (the sorted instance ids). Failure scripts are
played by raising the runtime's typed exceptions, as far as a Python handler can express them
(``rendering``). Dynamo's wire is reached from outside (``wire_access``): raw bytes at the
real worker's request-plane address from its discovery record, or at the real client's
response-stream port, and the bytes a worker's request plane received. Not reachable through
the bindings: time control, worker sets and occupancy, the caller's inflight count, overload
marks and report-down, streamed requests, first-response guards, and the error chain itself
(errors are normalised classes only). Expected failures: ``dynamo_expectations.toml``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from routespec.adapters.dynamo.client_target import DynamoClientTarget, DynamoRuntimeAdapter
from routespec.adapters.dynamo.driver import WAIT_LIMIT, dynamo_environment
from routespec.adapters.dynamo.expectations import load_expectations
from routespec.adapters.dynamo.load_thresholds import check_load_thresholds
from routespec.adapters.dynamo.rendering import render
from routespec.adapters.dynamo.wire_access import (
    ReceivedBytes,
    listening_ports,
    record_address,
    send_raw,
)
from routespec.testing.target import (
    Capability,
    Crash,
    Delivery,
    FailBeforeStream,
    FailMidStream,
    Serve,
    Stall,
    WorkerScript,
)

ENDPOINT = "routespec.conformance.generate"
EXPECTATIONS = Path(__file__).parents[1] / "dynamo_expectations.toml"


class WorkerProcess:
    """One ``routespec.adapters.dynamo.worker_process`` and what it reports."""

    def __init__(self, target: DynamoTarget, number: int, store: Path) -> None:
        self._target = target
        self._log = (store / f"worker-{number}.log").open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "routespec.adapters.dynamo.worker_process", ENDPOINT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=dynamo_environment(store),
        )
        self.instance_id: int | None = None
        self.script: WorkerScript = Serve()
        self.scripts_sent = 0
        self.scripts_applied = 0
        threading.Thread(target=self._read, name=f"dynamo-worker-{number}", daemon=True).start()

    @property
    def worker_id(self) -> int:
        """The suite's number for this worker: its instance id."""
        assert self.instance_id is not None
        return self.instance_id

    def _read(self) -> None:
        assert self.process.stdout is not None
        changed = self._target.driver.changed
        for line in self.process.stdout:
            message = json.loads(line)
            with changed:
                if message["op"] == "ready":
                    self.instance_id = int(message["instance_id"])
                elif message["op"] == "scripted":
                    self.scripts_applied = int(message["seq"])
                elif message["op"] == "delivered":
                    self._target.log.append(Delivery(str(message["rid"]), self.worker_id))
                elif message["op"] == "stalled":
                    sent = self.script.items if isinstance(self.script, Stall) else 0
                    self._target.stalled[str(message["rid"])] = (self.worker_id, sent)
                changed.notify_all()

    def send(self, command: Mapping[str, object]) -> None:
        if self.process.poll() is None and self.process.stdin is not None:
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(WAIT_LIMIT)

    def close(self) -> None:
        self.kill()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(BrokenPipeError):
                    stream.close()
        self._log.close()


class DynamoTarget(DynamoClientTarget):
    check_load_thresholds = staticmethod(check_load_thresholds)

    def __init__(self, store: Path) -> None:
        super().__init__(ENDPOINT, store)
        self._store = store
        self.log: list[Delivery] = []
        self._workers: dict[int, WorkerProcess] = {}
        self._started = 0
        self._received: dict[int, ReceivedBytes] = {}

    def close(self) -> None:
        try:
            for worker in self._workers.values():
                worker.close()
        finally:
            self.driver.close()

    def add_worker(self, *, device: str = "cuda") -> int:
        self._started += 1
        worker = WorkerProcess(self, self._started, self._store)
        if not self.driver.wait_for(lambda: worker.instance_id is not None, "a worker to start"):
            worker.close()
            raise TimeoutError(f"Dynamo worker process {self._started} did not start")
        self._workers[worker.worker_id] = worker
        self.driver.await_instances({worker.worker_id})
        return worker.worker_id

    def add_worker_process(self, script: WorkerScript) -> int:
        worker_id = self.add_worker()  # every worker is an OS process of its own
        self.script_worker(worker_id, script)
        return worker_id

    def remove_worker(self, worker_id: int) -> None:
        self._workers[worker_id].send({"op": "remove"})
        self.driver.await_instances(set(), {worker_id})

    def kill_worker(self, worker_id: int) -> None:
        self._workers[worker_id].kill()
        self.unstall(worker_id)
        self.settle()

    def script_worker(self, worker_id: int, script: WorkerScript) -> None:
        encoded: dict[str, object]
        if isinstance(script, Serve):
            encoded = {"kind": "serve", "items": script.items}
        elif isinstance(script, Stall):
            encoded = {"kind": "stall", "items": script.items, "items_after": script.items_after}
        elif isinstance(script, Crash):
            encoded = {
                "kind": "crash",
                "items": script.items,
                "messages": list(script.messages),
                "at_start": script.at_start,
            }
        elif isinstance(script, FailBeforeStream | FailMidStream):
            raised = render(script)  # or SKIP: a script no Python handler can play
            encoded = {"raise": raised.name, "message": raised.message}
            if isinstance(script, FailBeforeStream):
                encoded["kind"] = "fail_before"
            else:
                encoded.update(kind="fail_mid", items=script.items)
        else:
            raise NotImplementedError(f"{script}: a Python handler cannot play it")
        worker = self._workers[worker_id]
        worker.script = script
        worker.scripts_sent += 1
        sent = worker.scripts_sent
        worker.send({"op": "script", "seq": sent, "script": encoded})
        # The next request may reach the worker before it reads its stdin: wait until it has.
        applied = self.driver.wait_for(
            lambda: worker.scripts_applied >= sent or worker.process.poll() is not None,
            "the script",
        )
        if not applied:
            raise TimeoutError(f"Dynamo worker {worker_id} did not take its script")

    def release_stalled(self, worker_id: int) -> None:
        self._workers[worker_id].send({"op": "release"})
        self.unstall(worker_id)
        self.settle()

    def deliveries(self) -> Sequence[Delivery]:
        return tuple(self.log)

    def instance_id(self, worker_id: int) -> int:
        return worker_id  # the suite numbers workers by their instance ids

    def worker_bytes(self, worker_id: int) -> int:
        counter = self._received.get(worker_id)
        if counter is None:
            _, port = record_address(self._store, worker_id)
            counter = self._received[worker_id] = ReceivedBytes(port)
        return counter.total()

    def send_raw(self, worker_id: int | None, data: bytes) -> None:
        """Raw bytes at the real worker's request plane (the address in its discovery
        record), or, for None, at the real client's response-stream server."""
        if worker_id is not None:
            address = record_address(self._store, worker_id)
        else:
            address = ("127.0.0.1", self._response_port())
        send_raw(address, data)

    def _response_port(self) -> int:
        """The client process's one listener: its response-stream server."""
        ports = listening_ports(self.driver.pid)
        if len(ports) != 1:
            raise RuntimeError(f"the Dynamo client listens on {ports}, expected one port")
        return ports[0]


CAPABILITIES = frozenset(
    {
        Capability.ROUND_ROBIN,
        Capability.RANDOM,
        Capability.DIRECT,
        Capability.REMOVE_WORKER,
        Capability.KILL_WORKER,
        Capability.KILL_WORKER_PROCESS,
        Capability.SCRIPT_FAILURES,
        Capability.SCRIPT_STALL,
        Capability.WIRE_TRANSPORT,  # raw bytes at the real worker's and client's ports
        Capability.CHECK_LOAD_THRESHOLDS,  # dynamo._core.LoadThresholdConfig in a subprocess
        Capability.REFUSES_KV_AND_DIRECT,  # generate() on RouterMode.KV / Direct clients
    }
) | ({Capability.OBSERVE_WORKER_BYTES} if shutil.which("ss") else set())  # iproute2's ss


ADAPTER = DynamoRuntimeAdapter(
    "dynamo", CAPABILITIES, DynamoTarget, load_expectations(EXPECTATIONS)
)
