"""Benchmark: the in-process PushRouter's cost per dispatch, against calling the worker directly.

Both sides run in the same trio run on the same scripted workers, so the difference is the
router (selection, resolution, overload check, permits, fault-detection wrapping). Prints JSON.

    python -m bench.dispatch [--requests N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Awaitable, Callable

import trio

from routespec.discovery import Instance, MemoryDiscovery
from routespec.in_process import InProcessDispatch
from routespec.push_router import PushRouter
from routespec.scripted import ScriptedWorker
from routespec.selection import RouterMode
from routespec.streaming import Request
from routespec.target import Delivery, Serve

ENDPOINT = "bench/router/generate"
WORKERS = 4


async def _measure(requests: int, one: Callable[[int], Awaitable[int]]) -> dict[str, float]:
    latencies = []
    items = 0
    started = time.perf_counter()
    for n in range(requests):
        begin = time.perf_counter()
        items += await one(n)
        latencies.append(time.perf_counter() - begin)
    elapsed = time.perf_counter() - started
    quantiles = statistics.quantiles(latencies, n=100)
    return {
        "requests_per_s": round(requests / elapsed),
        "items_per_s": round(items / elapsed),
        "p50_us": round(quantiles[49] * 1e6, 1),
        "p99_us": round(quantiles[98] * 1e6, 1),
    }


async def _run(requests: int) -> dict[str, object]:
    discovery, transport = MemoryDiscovery(), InProcessDispatch()
    log: list[Delivery] = []
    workers = []
    for worker_id in range(1, WORKERS + 1):
        worker = ScriptedWorker(worker_id, log)
        workers.append(worker)
        discovery.register(Instance(worker_id, ENDPOINT, f"inproc://{worker_id}"))
        transport.serve(f"inproc://{worker_id}", worker)
    router = PushRouter.create(ENDPOINT, discovery, transport)
    results: dict[str, object] = {"requests": requests, "workers": WORKERS}
    for stream_items in (1, 100):
        for worker in workers:
            worker.script = Serve(stream_items)

        async def baseline(n: int) -> int:
            stream = await workers[n % WORKERS].start(Request(f"b{n}", None))
            return len([item async for item in stream])

        async def routed(n: int, mode: RouterMode) -> int:
            stream = await router.generate(Request(f"r{n}", None), mode)
            return len([item async for item in stream])

        results[f"{stream_items}_item"] = {
            "baseline_direct_call": await _measure(requests, baseline),
            "round_robin": await _measure(requests, lambda n: routed(n, RouterMode.ROUND_ROBIN)),
            "least_loaded": await _measure(requests, lambda n: routed(n, RouterMode.LEAST_LOADED)),
        }
        log.clear()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    args = parser.parse_args()
    print(json.dumps(trio.run(_run, args.requests), indent=2))


if __name__ == "__main__":
    main()
