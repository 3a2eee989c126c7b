"""The processes ``bench.peer`` runs: the reference worker (here) and the Dynamo ones
(``bench.peer_dynamo``), each spoken to in JSON lines and stopped by closing its stdin.

The reference worker serves ``bench.transport``'s ``ItemsHandler`` twice on one
``WorkerServer`` (at ``bench.transport.PATH`` for ``bench.transport._reference``, and at its
file-store path so the Dynamo client discovers it), plus ``bench.transport``'s raw server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

from bench.transport import PATH, ItemsHandler, _serve_raw, _stop_worker
from routespec.adapters.dynamo.driver import dynamo_environment
from routespec.discovery.file_store import FileRegistration, random_instance_id, transport_path
from routespec.discovery.instances import Instance
from routespec.transport.connection import LOOPBACK
from routespec.transport.worker_server import WorkerServer

START_TIMEOUT = 60.0  # a Dynamo process starts in ~1-3 s; generous for a loaded machine
MEASURE_TIMEOUT = 600.0
BENCH_ROOT = Path(__file__).resolve().parents[1]
INOTIFY_LIMIT = "/proc/sys/fs/inotify/max_user_instances"


async def reference_worker(endpoint: str, store: Path) -> None:
    """Serve, register in ``store``, print the ports, and exit when stdin closes."""
    server = WorkerServer(host=LOOPBACK)
    async with trio.open_nursery() as nursery:
        reference_port = await nursery.start(server.run)
        server.serve(PATH, ItemsHandler())
        instance_id = random_instance_id()
        address = server.serve(transport_path(endpoint, instance_id), ItemsHandler())
        listeners = await trio.open_tcp_listeners(0, host=LOOPBACK)
        raw_port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, _serve_raw, listeners)
        async with FileRegistration.open(Instance(instance_id, endpoint, address), store):
            ports = {"reference_port": reference_port, "raw_port": raw_port}
            print(json.dumps({**ports, "instance_id": instance_id}), flush=True)
            stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
            while await stdin.receive_some():
                pass
        nursery.cancel_scope.cancel()


def cpu_seconds(pid: int) -> float:
    """A process's user plus system CPU time over all its threads, from ``/proc`` (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class LineProcess:
    """A subprocess that answers JSON lines; every read bounded in real time."""

    def __init__(self, command: list[str], store: Path, log_name: str) -> None:
        env = dynamo_environment(store)  # loopback only, the store, quiet Dynamo logs
        env["PYTHONPATH"] = os.pathsep.join([str(BENCH_ROOT), env.get("PYTHONPATH", "")])
        self._log_path = store.parent / f"{log_name}.log"
        self._log = self._log_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, *command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
            cwd=BENCH_ROOT,
        )
        self.name = log_name

    async def read(self, limit: float = START_TIMEOUT) -> dict[str, Any]:
        assert self.process.stdout is not None
        with trio.fail_after(limit):
            line = await trio.to_thread.run_sync(
                self.process.stdout.readline, abandon_on_cancel=True
            )
        if not line:
            self._log.flush()
            tail = self._log_path.read_text(errors="replace")[-2000:]
            if "Too many open files" in tail:  # Dynamo's file discovery takes an inotify instance
                tail += f"\n(inotify instances per user: {INOTIFY_LIMIT}; are they all taken?)"
            raise RuntimeError(f"{self.name} ended its output; its log ends:\n{tail}")
        message: dict[str, Any] = json.loads(line)
        return message

    async def ask(self, command: dict[str, object]) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return await self.read(MEASURE_TIMEOUT)

    def stop(self) -> None:
        try:
            _stop_worker(self.process)  # stdin closed, then terminate, then kill
        finally:
            if self.process.stdout is not None:
                self.process.stdout.close()
            self._log.close()
