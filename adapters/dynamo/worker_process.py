"""A real Dynamo 1.6.1 worker whose Python handler follows the suite's worker scripts.

``python -m routespec.adapters.dynamo.worker_process ns.comp.endpoint WORKER_ID`` serves the
endpoint
with ``serve_endpoint`` and speaks JSON lines: it prints ``{"op": "ready", "instance_id": N}``,
then ``{"op": "delivered", "rid": ID}`` for every request and ``{"op": "stalled", "rid": ID}``
when a stall script waits; it reads ``{"op": "script", "script": {...}}`` (``serve`` or
``stall``), ``{"op": "release"}`` and ``{"op": "remove"}``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator

from dynamo.runtime import DistributedRuntime


def emit(message: dict[str, object]) -> None:
    print(json.dumps(message), flush=True)


class ScriptedHandler:
    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id
        self.script: dict[str, object] = {"kind": "serve", "items": 1}
        self.release = asyncio.Event()

    async def generate(self, request: object, context: object) -> AsyncIterator[object]:
        rid = request.get("rid") if isinstance(request, dict) else None
        emit({"op": "delivered", "rid": rid})
        script, release = self.script, self.release
        items = int(str(script.get("items", 0)))
        for index in range(items):
            yield {"worker": self.worker_id, "request": rid, "index": index}
        if script.get("kind") == "stall":
            emit({"op": "stalled", "rid": rid})
            await release.wait()
            for index in range(items, items + int(str(script.get("items_after", 1)))):
                yield {"worker": self.worker_id, "request": rid, "index": index}


async def main(endpoint_path: str, worker_id: int) -> None:
    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    endpoint = runtime.endpoint(endpoint_path)
    handler = ScriptedHandler(worker_id)
    serving = asyncio.ensure_future(endpoint.serve_endpoint(handler.generate))
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
    )
    await asyncio.sleep(0)
    emit({"op": "ready", "instance_id": int(endpoint.connection_id())})
    while line := await reader.readline():
        command = json.loads(line)
        if command["op"] == "script":
            handler.script = command["script"]
        elif command["op"] == "release":
            handler.release.set()
            handler.release = asyncio.Event()
        elif command["op"] == "remove":
            await endpoint.unregister_endpoint_instance()
            emit({"op": "removed"})
    serving.cancel()
    runtime.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
