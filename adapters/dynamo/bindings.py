"""Adapter ``dynamo``: the real Dynamo 1.6.1 runtime through its Python bindings only.

Workers are real Dynamo endpoints in separate processes (``worker_process``: a Python
handler that follows the suite's serve and stall scripts); the caller is a real Dynamo
client (``client_driver``). Discovery is the file store in a temporary directory, every
socket on 127.0.0.1. What the bindings let the suite do is small, and the capabilities say
exactly that: no failure scripts (a Python handler cannot pick the error types the suite
needs), no time control, no view of worker sets or occupancy, and errors as normalised
classes only.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from routespec.adapters.dynamo.client_target import DynamoClientTarget, DynamoRuntimeAdapter
from routespec.adapters.dynamo.driver import WAIT_LIMIT, dynamo_environment
from routespec.testing.target import (
    Capability,
    Delivery,
    Serve,
    Stall,
    WorkerScript,
)

ENDPOINT = "routespec.conformance.generate"


class WorkerProcess:
    """One ``routespec.adapters.dynamo.worker_process`` and what it reports."""

    def __init__(self, target: DynamoTarget, worker_id: int, store: Path) -> None:
        self.worker_id = worker_id
        self._target = target
        self._log = (store / f"worker-{worker_id}.log").open("w")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "routespec.adapters.dynamo.worker_process",
                ENDPOINT,
                str(worker_id),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=dynamo_environment(store),
        )
        self.instance_id: int | None = None
        self.script: WorkerScript = Serve()
        threading.Thread(target=self._read, name=f"dynamo-worker-{worker_id}", daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        changed = self._target.driver.changed
        for line in self.process.stdout:
            message = json.loads(line)
            with changed:
                if message["op"] == "ready":
                    self.instance_id = int(message["instance_id"])
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
    def __init__(self, store: Path) -> None:
        super().__init__(ENDPOINT, store)
        self._store = store
        self.log: list[Delivery] = []
        self._workers: dict[int, WorkerProcess] = {}

    def close(self) -> None:
        try:
            for worker in self._workers.values():
                worker.close()
        finally:
            self.driver.close()

    def add_worker(self, *, device: str = "cuda") -> int:
        worker = WorkerProcess(self, len(self._workers) + 1, self._store)
        self._workers[worker.worker_id] = worker
        if not self.driver.wait_for(lambda: worker.instance_id is not None, "a worker to start"):
            raise TimeoutError(f"Dynamo worker {worker.worker_id} did not start")
        assert worker.instance_id is not None
        self.driver.await_instances({worker.instance_id})
        return worker.worker_id

    def remove_worker(self, worker_id: int) -> None:
        worker = self._workers[worker_id]
        worker.send({"op": "remove"})
        self.driver.await_instances(set(), {self.instance_id(worker_id)})

    def kill_worker(self, worker_id: int) -> None:
        self._workers[worker_id].kill()
        self.unstall(worker_id)
        self.settle()

    def script_worker(self, worker_id: int, script: WorkerScript) -> None:
        if isinstance(script, Serve):
            encoded: dict[str, object] = {"kind": "serve", "items": script.items}
        elif isinstance(script, Stall):
            encoded = {"kind": "stall", "items": script.items, "items_after": script.items_after}
        else:
            raise NotImplementedError(f"{script}: {Capability.SCRIPT_FAILURES.value}")
        worker = self._workers[worker_id]
        worker.script = script
        worker.send({"op": "script", "script": encoded})

    def release_stalled(self, worker_id: int) -> None:
        self._workers[worker_id].send({"op": "release"})
        self.unstall(worker_id)
        self.settle()

    def deliveries(self) -> Sequence[Delivery]:
        return tuple(self.log)

    def instance_id(self, worker_id: int) -> int:
        worker = self._workers.get(worker_id)
        if worker is None or worker.instance_id is None:
            return worker_id  # an unknown id passes as is
        return worker.instance_id

    def worker_bytes(self, worker_id: int) -> int:
        raise NotImplementedError(Capability.OBSERVE_WORKER_BYTES.value)


# Not ROUND_ROBIN: round-robin order follows instance ids, which the runtime draws at random
# and the bindings do not let the suite choose, so the suite cannot predict the order.
CAPABILITIES = frozenset(
    {
        Capability.RANDOM,
        Capability.DIRECT,
        Capability.REMOVE_WORKER,
        Capability.KILL_WORKER,
        Capability.SCRIPT_STALL,
    }
)


ADAPTER = DynamoRuntimeAdapter("dynamo", CAPABILITIES, DynamoTarget)
