"""The Dynamo 1.6.1 side of ``bench.peer``: a worker and a measuring client, each a process.

    python -m bench.peer_dynamo worker ns.comp.endpoint
    python -m bench.peer_dynamo client NAME=ns.comp.endpoint [NAME=ns.comp.endpoint ...]

The worker serves the endpoint with ``serve_endpoint``; its Python handler answers a request
``{"items": K}`` with K items shaped as ``bench.transport``'s worker yields them. It prints
``{"instance_id": N}``, then serves until its stdin closes.

The client holds one bindings client per named endpoint, waits until each has an instance,
prints ``{"ready": true}``, then for every stdin line ``{"worker": NAME, "requests": N,
"concurrency": C}`` runs ``bench.transport``'s four figures on asyncio (round-robin,
``annotated=False``) and prints them as one JSON line; with ``"phase": "cpu"``, only the
concurrent 1-item figure, with the CPU time this process spent on it. Only ever run as a
subprocess: the parent never imports ``dynamo``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator

from dynamo.runtime import Client, DistributedRuntime

from bench.transport import One, _count, _item, _quantiles_us, _sequential

READY_TIMEOUT = 60.0


async def _stdin_lines() -> AsyncIterator[bytes]:
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
    )
    while line := await reader.readline():
        yield line


def _emit(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


# the worker


async def _items(count: int) -> AsyncIterator[object]:
    for index in range(count):
        yield _item(index)


def _generate(request: object, context: object) -> AsyncIterator[object]:
    return _items(_count(request))


async def worker(endpoint_path: str) -> None:
    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    endpoint = runtime.endpoint(endpoint_path)
    serving = asyncio.ensure_future(endpoint.serve_endpoint(_generate))
    _emit({"instance_id": int(endpoint.connection_id())})
    async for _ in _stdin_lines():
        pass
    serving.cancel()
    runtime.shutdown()


# the client: bench.transport's figures, on asyncio


async def _concurrent(requests: int, items: int, concurrency: int, one: One) -> dict[str, float]:
    """As ``bench.transport._concurrent``: tasks take numbers from one shared sequence."""
    latencies: list[float] = []
    received = 0
    remaining = iter(range(requests))

    async def task() -> None:
        nonlocal received
        for n in remaining:
            begin = time.perf_counter()
            got = await one(n, items)
            received += got
            latencies.append(time.perf_counter() - begin)

    started = time.perf_counter()
    await asyncio.gather(*(task() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return {
        "requests": requests,
        "concurrency": concurrency,
        "requests_per_s": round(requests / elapsed),
        "items_per_s": round(received / elapsed),
        **_quantiles_us(latencies),
        "items_missing": requests * items - received,
    }


async def _suite(requests: int, concurrency: int, one: One) -> dict[str, object]:
    """As ``bench.transport._suite``: warm up, then the same four figures and sizes."""
    streams = max(concurrency, requests // 10)
    await _sequential(min(requests, 200), 1, one)
    return {
        "sequential_1_item": await _sequential(requests, 1, one),
        "sequential_100_items": await _sequential(streams, 100, one),
        "concurrent_1_item": await _concurrent(requests, 1, concurrency, one),
        "concurrent_100_items": await _concurrent(streams, 100, concurrency, one),
    }


def _calls(client: Client, errors: list[str]) -> One:
    """One round-robin request per call; its items counted, its failures kept."""

    async def one(n: int, items: int) -> int:
        received = 0
        try:
            stream = await client.round_robin({"items": items}, annotated=False)
            async for item in stream:
                if isinstance(item, dict):
                    received += 1
        except Exception as error:  # counted and shown: a benchmark must not hide failures
            errors.append(f"{type(error).__name__}: {error}")
        return received

    return one


async def _measure(client: Client, requests: int, concurrency: int) -> dict[str, object]:
    errors: list[str] = []
    results = await _suite(requests, concurrency, _calls(client, errors))
    return {"error_items": len(errors), "first_errors": errors[:3], **results}


async def _cpu_phase(client: Client, requests: int, concurrency: int) -> dict[str, object]:
    """The concurrent 1-item figure again, with this process's CPU time (every thread)."""
    errors: list[str] = []
    started = time.process_time()
    figures = await _concurrent(requests, 1, concurrency, _calls(client, errors))
    cpu = time.process_time() - started
    return {"caller_cpu_s": cpu, "error_items": len(errors), **figures}


async def client(endpoints: dict[str, str]) -> None:
    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    clients: dict[str, Client] = {}
    for name, path in endpoints.items():
        clients[name] = await runtime.endpoint(path).client()
        await asyncio.wait_for(clients[name].wait_for_instances(), READY_TIMEOUT)
    _emit({"ready": True})
    async for line in _stdin_lines():
        command = json.loads(line)
        target = clients[str(command["worker"])]
        measure = _cpu_phase if command.get("phase") == "cpu" else _measure
        _emit(await measure(target, int(command["requests"]), int(command["concurrency"])))
    runtime.shutdown()


def main() -> None:
    role, *rest = sys.argv[1:]
    if role == "worker":
        asyncio.run(worker(rest[0]))
    elif role == "client":
        asyncio.run(client(dict(part.split("=", 1) for part in rest)))
    else:
        raise SystemExit(f"unknown role {role!r}: worker or client")


if __name__ == "__main__":
    main()
