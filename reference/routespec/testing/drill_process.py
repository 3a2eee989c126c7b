"""A scripted drill worker as a separate OS process, for checks that kill a real process.

    python -m routespec.testing.drill_process --script '{"kind": "stall", "items": 2}' \\
        --worker-id 1 --path routespec/conformance/generate/1

The process serves ``--path`` with a ``ScriptedWorker`` on a ``DrillWorkerServer`` listening
on 127.0.0.1 (an ephemeral port), and reports on stdout, one JSON object a line, flushed:

- ``{"port": N}`` once it listens;
- ``{"delivered": request_id, "prepared_for": id or null}`` when a request reaches the worker;
- ``{"stalled": request_id}`` when a ``Stall`` script has sent its items and waits;
- ``{"ended": request_id}`` when a response stream has been written to its end.

A parent waits for these lines instead of sleeping. The process exits when its stdin closes,
so it never outlives its parent; a check kills it with SIGKILL to stage a crash (TRN-016).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import trio

from routespec.routing.streaming import Rejection, Request, WorkerHandler
from routespec.testing.drill_server import DrillWorkerServer
from routespec.testing.scripted import ScriptedWorker
from routespec.testing.target import Serve, Stall, WorkerScript
from routespec.transport.connection import LOOPBACK
from routespec.transport.control import ControlMessage
from routespec.transport.frames import WireProtocolError
from routespec.transport.response_pool import ResponsePool

Report = dict[str, object]


def encode_script(script: WorkerScript) -> str:
    """The ``--script`` JSON for ``script`` (``Serve`` and ``Stall`` only)."""
    if isinstance(script, Serve):
        return json.dumps({"kind": "serve", "items": script.items})
    if isinstance(script, Stall):
        fields = {"kind": "stall", "items": script.items, "items_after": script.items_after}
        return json.dumps(fields)
    raise NotImplementedError(f"a worker process serves Serve or Stall scripts, not {script!r}")


def decode_script(text: str) -> WorkerScript:
    fields = json.loads(text)
    if not isinstance(fields, dict):
        raise ValueError(f"a script is a JSON object: {text!r}")
    kind = fields.get("kind")
    if kind == "serve":
        return Serve(int(fields.get("items", 1)))
    if kind == "stall":
        return Stall(int(fields.get("items", 0)), int(fields.get("items_after", 1)))
    raise ValueError(f"unknown script kind {kind!r} (serve or stall)")


def command(script: WorkerScript, worker_id: int, path: str) -> list[str]:
    """The argv that starts a drill process with this interpreter."""
    return [
        sys.executable,
        "-m",
        "routespec.testing.drill_process",
        "--script",
        encode_script(script),
        "--worker-id",
        str(worker_id),
        "--path",
        path,
    ]


def environment() -> dict[str, str]:
    """The parent's environment, with this copy of ``routespec`` importable first."""
    source = str(Path(__file__).resolve().parents[2])
    paths = [source, *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


class Reports:
    """Reads a drill process's stdout, one report at a time."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = b""

    async def next(self) -> Report | None:
        """The next report, or None once the process has closed its stdout."""
        while b"\n" not in self._buffer:
            chunk = await self._stream.receive_some()
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        report = json.loads(line)
        if not isinstance(report, dict):
            raise ValueError(f"a drill process report is a JSON object: {line!r}")
        return report


def report(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


class ReportingWorker(ScriptedWorker):
    def admit(self, request: Request) -> Rejection | None:
        rejection = super().admit(request)
        delivery = self.log[-1]
        report(delivered=delivery.request_id, prepared_for=delivery.prepared_for)
        return rejection


class ReportingServer(DrillWorkerServer):
    async def _respond(
        self,
        control: ControlMessage,
        handler: WorkerHandler,
        request: Request,
        failure: WireProtocolError | None,
        pool: ResponsePool | None = None,
    ) -> None:
        await super()._respond(control, handler, request, failure, pool)
        report(ended=request.request_id)


async def serve(script: WorkerScript, worker_id: int, path: str) -> None:
    """Serve ``script`` at ``path`` until stdin closes."""
    worker = ReportingWorker(worker_id, [], script, lambda request_id: report(stalled=request_id))
    server = ReportingServer(LOOPBACK)
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    async with trio.open_nursery() as nursery, stdin:
        port = await nursery.start(server.run)
        server.serve(path, worker)
        report(port=port)
        while await stdin.receive_some():
            pass
        nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--script", required=True, help='e.g. {"kind": "stall", "items": 2}')
    parser.add_argument("--worker-id", type=int, required=True)
    parser.add_argument("--path", required=True, help="the endpoint path to serve")
    args = parser.parse_args()
    trio.run(serve, decode_script(args.script), args.worker_id, args.path)


if __name__ == "__main__":
    main()
