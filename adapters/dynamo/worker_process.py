"""A real Dynamo 1.6.1 worker whose Python handler follows the suite's worker scripts.

``python -m routespec.adapters.dynamo.worker_process ns.comp.endpoint`` serves the endpoint
with ``serve_endpoint`` and speaks JSON lines; its items name it by its instance id. It
prints ``{"op": "ready", "instance_id": N}``, then ``{"op": "delivered", "rid": ID}`` for
every request and ``{"op": "stalled", "rid": ID}`` when a stall script waits. It reads
``{"op": "script", "seq": N, "script": {...}}`` (and answers ``{"op": "scripted", "seq":
N}`` once the script applies), ``{"op": "release"}`` and ``{"op": "remove"}``.

Scripts: ``serve`` (``items``), ``stall`` (``items``, ``items_after``), ``fail_before`` and
``fail_mid`` (``items``), the last two with ``raise`` (a class of ``dynamo._core`` in
``RAISABLE``, or null for a plain ``Exception``) and ``message``; ``crash`` (``items``,
``messages``, ``at_start``) raises plain ``RuntimeError``s, one or a group, from the stream or,
with ``at_start``, from the call itself.

The handler is a plain callable returning an async generator, as ``serve_endpoint`` allows:
an exception raised by the call itself is a failure before the response stream (Dynamo sends
it in the stream's prologue), one raised by the generator is an error item after the items
already yielded. The runtime calls the handler on a thread of its own and runs the generator
on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import AsyncIterator

import dynamo._core as core
from dynamo.runtime import DistributedRuntime

RAISABLE = frozenset(
    {
        "EngineShutdown",
        "StreamIncomplete",
        "Disconnected",
        "CannotConnect",
        "ConnectionTimeout",
        "Cancelled",
        "Unknown",
        "InvalidArgument",
        "WorkerUnavailable",
    }
)
"""The typed exceptions ``dynamo._core`` offers a handler (1.6.1)."""

_OUTPUT = threading.Lock()


def emit(message: dict[str, object]) -> None:
    line = json.dumps(message) + "\n"
    with _OUTPUT:  # the handler's thread and the event loop both report
        sys.stdout.write(line)
        sys.stdout.flush()


def failure(script: dict[str, object]) -> Exception:
    name, message = script.get("raise"), str(script.get("message", ""))
    if name is None:
        return Exception(message)
    if name not in RAISABLE:
        raise ValueError(f"not a raisable dynamo exception: {name!r}")
    error: Exception = getattr(core, str(name))(message)
    return error


class ScriptedHandler:
    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id
        self.script: dict[str, object] = {"kind": "serve", "items": 1}
        self.release = asyncio.Event()

    def generate(self, request: object, context: object) -> AsyncIterator[object]:
        rid = request.get("rid") if isinstance(request, dict) else None
        script = self.script  # the script this request was delivered under
        emit({"op": "delivered", "rid": rid})
        if script.get("kind") == "fail_before":
            raise failure(script)
        if script.get("kind") == "crash" and script.get("at_start"):
            raise crash(script)
        return self._items(rid, script)

    async def _items(self, rid: object, script: dict[str, object]) -> AsyncIterator[object]:
        release = self.release
        items = int(str(script.get("items", 0)))
        for index in range(items):
            yield {"worker": self.worker_id, "request": rid, "index": index}
        if script.get("kind") == "fail_mid":
            raise failure(script)
        if script.get("kind") == "crash":
            raise crash(script)
        if script.get("kind") == "stall":
            emit({"op": "stalled", "rid": rid})
            await release.wait()
            for index in range(items, items + int(str(script.get("items_after", 1)))):
                yield {"worker": self.worker_id, "request": rid, "index": index}


def crash(script: dict[str, object]) -> Exception:
    """Plain exceptions, as a handler's own fault."""
    messages = script.get("messages")
    faults = [RuntimeError(str(m)) for m in messages] if isinstance(messages, list) else []
    return faults[0] if len(faults) == 1 else ExceptionGroup("handler", faults)


async def main(endpoint_path: str) -> None:
    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    endpoint = runtime.endpoint(endpoint_path)
    instance_id = int(endpoint.connection_id())
    handler = ScriptedHandler(instance_id)
    serving = asyncio.ensure_future(endpoint.serve_endpoint(handler.generate))
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
    )
    await asyncio.sleep(0)
    emit({"op": "ready", "instance_id": instance_id})
    while line := await reader.readline():
        command = json.loads(line)
        if command["op"] == "script":
            handler.script = command["script"]
            emit({"op": "scripted", "seq": command["seq"]})
        elif command["op"] == "release":
            handler.release.set()
            handler.release = asyncio.Event()
        elif command["op"] == "remove":
            await endpoint.unregister_endpoint_instance()
            emit({"op": "removed"})
    serving.cancel()
    runtime.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
