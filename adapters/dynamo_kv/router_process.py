"""Real Dynamo 1.6.1 ``KvRouter``s in one process, driven with JSON lines.

``python -m routespec.adapters.dynamo_kv.router_process`` (with the loopback environment of
``dynamo_frontend.deployment.dynamo_environment`` and ``DYN_SYSTEM_PORT`` for its
``/metrics``) opens a ``DistributedRuntime`` (file discovery, TCP request plane) and prints
``{"op": "ready"}``. Every command carries a ``call`` number and is answered by
``{"op": "reply", "call": N, "result": …}`` or ``{"op": "reply", "call": N, "error":
{"exception": "module.Class", "text": …}}``:

- ``open`` ``{"host", "endpoint", "block_size", "temperature", "expect": [ids]}``: a
  ``KvRouter`` over the endpoint (``use_kv_events=False``: its own routing decisions feed
  its index), once it sees every expected instance -> its worker ids;
- ``best`` ``{"host", "tokens", "request_id"?}``: ``best_worker`` (query-only without a
  request id, booking with one) -> ``[worker, dp_rank, overlap]``;
- ``loads`` ``{"host", "tokens"}``: ``get_potential_loads``; ``mark`` / ``free``
  ``{"host", "request_id"}``: ``mark_prefill_complete`` / ``free``;
- ``route`` ``{"host", "rid", "tokens", "max_tokens", "worker_id"?, "dp_rank"?}``:
  ``generate`` (tagged with the annotation ``routespec:<rid>``, which the worker reports),
  answered once the call returned its stream or failed; then ``{"op": "item", "rid",
  "item"}`` per item and ``{"op": "outcome", "rid", "error", "pre_stream", "dropped",
  "loads_at_error"}`` at its end (``loads_at_error``: ``get_potential_loads`` read as soon
  as an error item arrived, before the outcome is reported);
- ``drop`` ``{"rid"}``: the caller abandons the stream; ``quit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from typing import Any

from dynamo.llm import KvRouter, KvRouterConfig
from dynamo.runtime import DistributedRuntime

OPEN_LIMIT = 15.0


def emit(message: dict[str, object]) -> None:
    print(json.dumps(message), flush=True)


def described(error: BaseException) -> dict[str, str]:
    kind = type(error)
    return {"exception": f"{kind.__module__}.{kind.__qualname__}", "text": str(error)}


class Driver:
    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.routers: dict[str, Any] = {}
        self.streams: dict[str, asyncio.Task[None]] = {}

    async def open(self, command: dict[str, Any]) -> object:
        endpoint = self.runtime.endpoint(str(command["endpoint"]))
        config = KvRouterConfig(
            use_kv_events=False, router_temperature=float(command["temperature"])
        )
        router = KvRouter(endpoint, int(command["block_size"]), config)
        expect = {int(i) for i in command.get("expect") or []}
        seen: set[int] = set()
        deadline = asyncio.get_running_loop().time() + OPEN_LIMIT
        while asyncio.get_running_loop().time() < deadline:
            seen = {int(row["worker_id"]) for row in await router.get_potential_loads([0])}
            if expect <= seen:
                break
            await asyncio.sleep(0.05)
        self.routers[str(command["host"])] = router
        return sorted(seen)

    async def route(self, command: dict[str, Any]) -> object:
        router = self.routers[str(command["host"])]
        rid = str(command["rid"])
        opened: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self.streams[rid] = asyncio.ensure_future(self._stream(router, rid, command, opened))
        return await opened

    async def _stream(
        self, router: Any, rid: str, command: dict[str, Any], opened: asyncio.Future[object]
    ) -> None:
        outcome: dict[str, object] = {
            "op": "outcome", "rid": rid, "error": None, "pre_stream": False,
            "dropped": False, "loads_at_error": None,
        }  # fmt: skip
        tokens = [int(t) for t in command["tokens"]]
        try:
            try:
                stream = await router.generate_from_request(
                    {
                        "model": str(command["model"]),
                        "token_ids": tokens,
                        "stop_conditions": {"max_tokens": int(command["max_tokens"])},
                        "sampling_options": {},
                        "output_options": {},
                        "eos_token_ids": [],
                        "annotations": [f"routespec:{rid}"],
                        "routing": {
                            key: command[key]
                            for key in ("backend_instance_id", "dp_rank")
                            if command.get(key) is not None
                        },
                    }
                )
            except Exception as error:
                outcome.update(error=described(error), pre_stream=True)
                return
            finally:
                if not opened.done():
                    opened.set_result(None)
            try:
                async for item in stream:
                    emit({"op": "item", "rid": rid, "item": item})
            except asyncio.CancelledError:
                outcome["dropped"] = True
            except Exception as error:
                outcome["error"] = described(error)
                with contextlib.suppress(Exception):
                    outcome["loads_at_error"] = await router.get_potential_loads(tokens)
        finally:
            if not opened.done():
                opened.set_result(None)
            self.streams.pop(rid, None)
            emit(outcome)

    async def command(self, command: dict[str, Any]) -> object:
        op = command["op"]
        if op == "open":
            return await self.open(command)
        if op == "route":
            return await self.route(command)
        if op == "drop":
            task = self.streams.get(str(command["rid"]))
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            return None
        router = self.routers[str(command["host"])]
        if op == "best":
            request_id = command.get("request_id")
            found = await router.best_worker(
                [int(t) for t in command["tokens"]],
                request_id=None if request_id is None else str(request_id),
            )
            return list(found)
        if op == "loads":
            return await router.get_potential_loads([int(t) for t in command["tokens"]])
        if op == "mark":
            return await router.mark_prefill_complete(str(command["request_id"]))
        if op == "free":
            return await router.free(str(command["request_id"]))
        raise ValueError(f"unknown op {op!r}")

    async def answer(self, command: dict[str, Any]) -> None:
        reply: dict[str, object] = {"op": "reply", "call": command.get("call")}
        try:
            reply["result"] = await self.command(command)
        except Exception as error:  # the runtime's answer, reported to the adapter
            reply["error"] = described(error)
        emit(reply)


async def main() -> None:
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "file", "tcp")
    driver = Driver(runtime)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    emit({"op": "ready"})
    pending: set[asyncio.Task[None]] = set()
    while line := await reader.readline():
        command = json.loads(line)
        if command["op"] == "quit":
            break
        task = asyncio.ensure_future(driver.answer(command))
        pending.add(task)
        task.add_done_callback(pending.discard)
    for task in list(driver.streams.values()):
        task.cancel()
    runtime.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
