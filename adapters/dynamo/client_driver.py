"""A real Dynamo 1.6.1 client, driven over stdin/stdout with JSON lines.

``python -m routespec.adapters.dynamo.client_driver ns.comp.endpoint`` (with ``DYN_FILE_KV`` and the
loopback host variables set) opens a ``DistributedRuntime`` with file discovery and the TCP
request plane, then answers commands, one JSON object per line:

- ``{"op": "instances"}`` -> ``{"op": "instances", "ids": [...], "addresses": {id: address}}``
- ``{"op": "submit", "id": ID, "mode": "round_robin" | "random" | "direct" | "kv" |
  "direct_mode",
  "instance_id"?: N, "payload": {...}, "metadata"?: {...}}`` (the metadata travels in a
  ``dynamo._core.Context``, which puts it in the request's control message) ->
  ``{"op": "opened", "id": ID}`` once the call returned a stream, then ``{"op": "outcome",
  "id": ID, "items": [...], "error": null | {"exception": "module.Class", "text": "..."},
  "pre_stream": bool, "dropped": bool}``; ``kv`` and ``direct_mode`` call ``generate`` on a
  client built with ``RouterMode.KV`` or ``RouterMode.Direct`` (the spec's bare router refuses
  both: SEL-002)
- ``{"op": "drop", "id": ID}``: the caller abandons the request.
"""

from __future__ import annotations

import asyncio
import json
import sys

from dynamo._core import Context, RouterMode
from dynamo.runtime import Client, DistributedRuntime

COMMAND_LIMIT = 16 * 1024 * 1024
"""Bytes one command line may take (asyncio's default is 64 KiB)."""


def emit(message: dict[str, object]) -> None:
    print(json.dumps(message), flush=True)


async def run(client: Client, mode_clients: dict[str, Client], command: dict[str, object]) -> None:
    request_id = command["id"]
    items: list[object] = []
    outcome: dict[str, object] = {
        "op": "outcome", "id": request_id, "items": items, "error": None,
        "pre_stream": False, "dropped": False,
    }  # fmt: skip
    stream = None
    try:
        try:
            payload, mode = command["payload"], command["mode"]
            metadata = command.get("metadata")
            context = Context(metadata=metadata) if isinstance(metadata, dict) else None
            if mode == "direct":
                target = command["instance_id"]
                assert isinstance(target, int)
                stream = await client.direct(payload, target, annotated=False, context=context)
            elif mode == "random":
                stream = await client.random(payload, annotated=False, context=context)
            elif mode in mode_clients:
                routed = mode_clients[mode]
                if client.instance_ids():  # its own discovery watch may lag the main client's
                    await asyncio.wait_for(routed.wait_for_instances(), 10)
                stream = await routed.generate(payload, annotated=False, context=context)
            else:
                stream = await client.round_robin(payload, annotated=False, context=context)
        except Exception as error:
            outcome["pre_stream"] = True
            raise error
        emit({"op": "opened", "id": request_id})
        async for item in stream:
            items.append(item)
            emit({"op": "progress", "id": request_id, "items": len(items)})
    except asyncio.CancelledError:
        outcome["dropped"] = True
    except Exception as error:
        kind = type(error)
        outcome["error"] = {
            "exception": f"{kind.__module__}.{kind.__qualname__}",
            "text": str(error),
        }
    emit(outcome)


async def main(endpoint: str) -> None:
    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    client = await runtime.endpoint(endpoint).client()
    mode_clients = {
        "kv": await runtime.endpoint(endpoint).client(router_mode=RouterMode.KV),
        "direct_mode": await runtime.endpoint(endpoint).client(router_mode=RouterMode.Direct),
    }
    tasks: dict[object, asyncio.Task[None]] = {}
    reader = asyncio.StreamReader(limit=COMMAND_LIMIT)  # a command may carry 128 KiB+
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    emit({"op": "ready"})
    while line := await reader.readline():
        command = json.loads(line)
        if command["op"] == "instances":
            ids = sorted(int(i) for i in client.instance_ids())
            addresses = {str(i.instance_id): i.transport.address for i in client.instances()}
            emit({"op": "instances", "ids": ids, "addresses": addresses})
        elif command["op"] == "submit":
            tasks[command["id"]] = asyncio.create_task(run(client, mode_clients, command))
        elif command["op"] == "drop":
            task = tasks.get(command["id"])
            if task is not None:
                task.cancel()
    for task in tasks.values():
        task.cancel()
    runtime.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
