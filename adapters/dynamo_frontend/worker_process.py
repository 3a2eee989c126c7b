"""A real Dynamo 1.6.1 token worker whose Python handler follows the suite's worker scripts.

``python -m routespec.adapters.dynamo_frontend.worker_process MODEL_DIR`` (with the loopback
environment of ``deployment.dynamo_environment``) opens a ``DistributedRuntime`` (file
discovery, TCP request plane) and speaks JSON lines on stdin/stdout:

- it prints ``{"op": "ready", "instance_id": N}`` (the id every endpoint of this process has);
- ``{"op": "serve", "endpoint": "ns.backend.generate", "model": NAME, "block_size": B,
  "router": {...} | null, "taints": [...]}`` registers the model on a new
  endpoint (``register_model(ModelInput.Tokens, …)`` with the router configuration the model
  card advertises) and serves it -> ``{"op": "served", "endpoint": …}`` or
  ``{"op": "serve-failed", "endpoint": …, "error": TEXT}``;
- ``{"op": "lora" | "unlora", "endpoint": …, "lora": NAME, "block_size": B, "router": …}``
  registers (unregisters) LoRA adapter NAME on a served endpoint -> ``{"op": "lora-done" |
  "unlora-done", …}`` or ``{"op": "lora-failed", …}``;
- ``{"op": "unserve", "endpoint": …}`` unregisters it; ``{"op": "taints", "endpoint": …,
  "taints": [...]}`` updates its taints; ``{"op": "script", "script": {...}}`` sets how every
  request is answered; ``{"op": "release"}`` releases stalled requests; ``{"op": "unload"}``
  releases load requests (prompts starting with ``LOAD_MARK``, held whatever the script);
  ``{"op": "quit"}``.

For every request it prints ``{"op": "delivered", "rid": ID, "endpoint": …, "payload":
{"token_ids", "max_tokens", "min_tokens", "n", "annotations"}}``; ``{"op": "stalled", "rid"}``
when a script waits; ``{"op": "ended", "rid", "how": "complete" | "raised" | "stopped" |
"closed"}`` when its handler returns.

A token request is answered one token per item, each the position it continues (prompt
length + i), the last with ``finish_reason: "stop"``; a script decides only where it stops
or fails. Failures are the runtime's own typed exceptions (``dynamo._core.EngineShutdown``
…), raised from the handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import dynamo._core as core
from dynamo.llm import (
    KvRouterConfig,
    ModelInput,
    ModelType,
    RouterConfig,
    RouterMode,
    WorkerType,
    register_model,
    unregister_model,
    update_model_taints,
)
from dynamo.runtime import DistributedRuntime

from routespec.adapters.dynamo_frontend.tiny_model import BARE_MARK, LOAD_MARK, data_token

MODES = {
    "round-robin": "RoundRobin",
    "random": "Random",
    "power-of-two-choices": "PowerOfTwoChoices",
    "kv": "KV",
    "direct": "Direct",
    "least-loaded": "LeastLoaded",
    "device-aware-weighted": "DeviceAwareWeighted",
}

EXCEPTIONS = {
    # label -> the dynamo._core exception a Python handler raises for it
    "InvalidArgument": "InvalidArgument",
    "Backend(InvalidArgument)": "InvalidArgument",
    "CannotConnect": "CannotConnect",
    "Backend(CannotConnect)": "CannotConnect",
    "Disconnected": "Disconnected",
    "Backend(Disconnected)": "Disconnected",
    "ConnectionTimeout": "ConnectionTimeout",
    "Backend(ConnectionTimeout)": "ConnectionTimeout",
    "Cancelled": "Cancelled",
    "Backend(Cancelled)": "Cancelled",
    "Backend(EngineShutdown)": "EngineShutdown",
    "Backend(StreamIncomplete)": "StreamIncomplete",
    "WorkerUnavailable": "WorkerUnavailable",
    "Unknown": "Unknown",
    "Backend(Unknown)": "Unknown",
}


def emit(message: dict[str, object]) -> None:
    print(json.dumps(message), flush=True)


def build_error(error: dict[str, Any]) -> BaseException:
    """The exception a handler raises for a scripted error (its outermost link)."""
    label = error.get("type")
    message = str(error.get("message", "injected"))
    if label is None:
        return RuntimeError(message)
    name = EXCEPTIONS.get(str(label))
    if name is None:
        return RuntimeError(f"{label}: {message}")  # the adapter refuses these up front
    exception: BaseException = getattr(core, name)(message)
    return exception


def router_config(router: dict[str, Any] | None) -> Any:
    if router is None:
        return None
    mode = getattr(RouterMode, MODES[str(router["policy"])])
    kv = None
    if router["policy"] == "kv":
        kv = KvRouterConfig(
            router_temperature=float(router.get("temperature", 0.0)),
            use_kv_events=False,
        )
    ttl = router.get("affinity_ttl")
    busy = router.get("busy_prefill_tokens")
    settings: dict[str, Any] = {
        "active_prefill_tokens_threshold": None if busy is None else int(busy),
        "session_affinity_ttl_secs": ttl,
    }
    if "affinity_mode" in router:  # else Dynamo's own default
        settings["session_affinity_mode"] = str(router["affinity_mode"])
    return RouterConfig(mode, kv, **settings)


class Worker:
    def __init__(self, runtime: Any, model_dir: str) -> None:
        self.runtime = runtime
        self.model_dir = model_dir
        self.script: dict[str, Any] = {"kind": "serve"}
        self.release = asyncio.Event()
        self.name = 0  # the suite's number for this worker, spelled in bare calls' tokens
        self.unload = asyncio.Event()  # releases the adapter's load requests (LOAD_MARK)
        self.serving: dict[str, asyncio.Future[Any]] = {}
        self.endpoints: dict[str, Any] = {}
        self.sent: dict[str, int] = {}  # data tokens yielded per request

    def handler(self, endpoint: str) -> Any:
        async def generate(request: dict[str, Any], context: Any) -> AsyncIterator[object]:
            rid = str(context.id())
            stop = request.get("stop_conditions") or {}
            sampling = request.get("sampling_options") or {}
            payload = {
                "token_ids": list(request.get("token_ids") or []),
                "max_tokens": stop.get("max_tokens"),
                "min_tokens": stop.get("min_tokens") or 0,
                "n": sampling.get("n"),
                "annotations": request.get("annotations"),
            }
            emit({"op": "delivered", "rid": rid, "endpoint": endpoint, "payload": payload})
            how = "closed"
            try:
                async for item in self.answer(rid, payload, context):
                    if isinstance(item, dict) and item.get("token_ids"):
                        self.sent[rid] = self.sent.get(rid, 0) + 1
                    yield item
                how = "stopped" if context.is_stopped() else "complete"
            except Exception:
                how = "raised"
                raise
            finally:
                emit({"op": "ended", "rid": rid, "how": how})

        return generate

    async def answer(
        self, rid: str, payload: dict[str, Any], context: Any
    ) -> AsyncIterator[object]:
        if payload["token_ids"][:1] == [LOAD_MARK]:
            # the adapter's load: held, whatever the script, until unloaded
            emit({"op": "loaded", "rid": rid})
            await self.wait(self.unload, context)
            yield {"token_ids": [], "finish_reason": "stop"}
            return
        script, release = self.script, self.release
        kind = script["kind"]
        if kind == "fail-before":
            raise build_error(script["error"])
        prompt = len(payload["token_ids"])
        budget = payload["max_tokens"] if isinstance(payload["max_tokens"], int) else 16
        bare = payload["token_ids"][:1] == [BARE_MARK]
        first = int(script.get("items", budget))
        if bare and kind in ("serve", "stall"):  # a bare call's script counts its items
            total = first + (int(script.get("items_after", 0)) if kind == "stall" else 0)
        elif kind in ("serve", "stall"):
            first = min(first, budget) if kind == "stall" else budget
            total = budget
        else:
            first = min(first, budget)
            total = first
        if kind in ("terminal-then", "terminal-flood"):
            total = first + 1

        def token(index: int) -> int:
            return data_token(self.name, index) if bare else prompt + index

        def item(index: int) -> dict[str, object]:
            finish = "stop" if index == total - 1 else None
            return {"token_ids": [token(index)], "finish_reason": finish}

        for index in range(first):
            if context.is_stopped():
                return
            yield item(index)
        if kind == "fail-mid":
            raise build_error(script["error"])
        if kind == "cancel-then-fail":
            yield {"token_ids": [], "finish_reason": "cancelled"}
            raise build_error(script["error"])
        if kind == "stall":
            emit({"op": "stalled", "rid": rid, "sent": self.sent.get(rid, 0)})
            await self.wait(release, context)
            for index in range(first, total):
                if context.is_stopped():
                    return
                yield item(index)
        if kind == "terminal-then":
            yield {"token_ids": [], "finish_reason": script.get("finish", "cancelled")}
            for index in range(first, first + int(script.get("items_after", 0))):
                yield {"token_ids": [token(index)]}  # item() would stamp "stop" on the first
            if script.get("stall"):
                emit({"op": "stalled", "rid": rid, "sent": self.sent.get(rid, 0)})
                await self.wait(release, context)
            if script.get("error") is not None:
                raise build_error(script["error"])
        if kind == "terminal-flood":
            while not context.is_stopped():
                yield {"token_ids": [], "finish_reason": "cancelled"}
                await asyncio.sleep(float(script.get("interval", 1.0)))

    @staticmethod
    async def wait(release: asyncio.Event, context: Any) -> None:
        """Wait until released or until the caller stops the request."""
        while not release.is_set() and not context.is_stopped():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(release.wait(), 0.05)

    async def serve(self, command: dict[str, Any]) -> None:
        name = str(command["endpoint"])
        endpoint = self.runtime.endpoint(name)
        try:
            await register_model(
                ModelInput.Tokens,
                ModelType.Chat | ModelType.Completions,
                endpoint,
                self.model_dir,
                str(command["model"]),
                worker_type=WorkerType.Aggregated,
                kv_cache_block_size=int(command.get("block_size", 16)),
                router_config=router_config(command.get("router")),
            )
            taints = command.get("taints") or []
            if taints:
                await update_model_taints(endpoint, set(taints))
        except Exception as error:
            emit(
                {
                    "op": "serve-failed",
                    "endpoint": name,
                    "error": f"{type(error).__name__}: {error}",
                }
            )
            return
        self.endpoints[name] = endpoint
        self.serving[name] = asyncio.ensure_future(endpoint.serve_endpoint(self.handler(name)))
        await asyncio.sleep(0)
        emit({"op": "served", "endpoint": name})

    async def lora(self, command: dict[str, Any]) -> None:
        """Register (or, ``unlora``, unregister) a LoRA adapter on a served endpoint: its own
        card, whose served name is the adapter's; it makes this worker a replica."""
        name, lora = str(command["endpoint"]), str(command["lora"])
        try:
            endpoint = self.endpoints[name]
            if command["op"] == "unlora":
                await unregister_model(endpoint, lora_name=lora)
            else:
                await register_model(
                    ModelInput.Tokens,
                    ModelType.Chat | ModelType.Completions,
                    endpoint,
                    self.model_dir,
                    lora,
                    worker_type=WorkerType.Aggregated,
                    kv_cache_block_size=int(command.get("block_size", 16)),
                    router_config=router_config(command.get("router")),
                    lora_name=lora,
                    base_model_path=self.model_dir,
                )
        except Exception as error:
            emit({"op": "lora-failed", "lora": lora, "error": f"{type(error).__name__}: {error}"})
            return
        emit({"op": f"{command['op']}-done", "endpoint": name, "lora": lora})

    async def command(self, command: dict[str, Any]) -> bool:
        op = command["op"]
        if op == "serve":
            await self.serve(command)
        elif op in ("lora", "unlora"):
            await self.lora(command)
        elif op == "unserve":
            endpoint = self.endpoints.pop(str(command["endpoint"]), None)
            if endpoint is not None:
                with contextlib.suppress(Exception):
                    await unregister_model(endpoint)
                with contextlib.suppress(Exception):
                    await endpoint.unregister_endpoint_instance()
            emit({"op": "unserved", "endpoint": command["endpoint"]})
        elif op == "taints":
            endpoint = self.endpoints[str(command["endpoint"])]
            await update_model_taints(endpoint, set(command.get("taints") or []))
            emit({"op": "tainted", "endpoint": command["endpoint"]})
        elif op == "script":
            self.script = dict(command["script"])
        elif op == "release":
            self.release.set()
            self.release = asyncio.Event()
        elif op == "name":
            self.name = int(command["worker"])
        elif op == "unload":
            self.unload.set()
            self.unload = asyncio.Event()
        elif op == "ping":  # answered after every report written before it
            emit({"op": "pong", "n": command["n"]})
        elif op == "quit":
            return False
        return True


async def main(model_dir: str) -> None:
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "file", "tcp")
    worker = Worker(runtime, model_dir)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    # the instance id is the runtime's connection id, the same for every endpoint
    emit(
        {
            "op": "ready",
            "instance_id": int(runtime.endpoint("routespec.probe.ready").connection_id()),
        }
    )
    while line := await reader.readline():
        if not await worker.command(json.loads(line)):
            break
    for endpoint in list(worker.endpoints.values()):
        with contextlib.suppress(Exception):
            await unregister_model(endpoint)
    runtime.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
