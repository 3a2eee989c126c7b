"""Benchmark: the in-process PushRouter's cost per dispatch, against calling the worker directly.

Both sides run in the same trio run on the same scripted workers, so the difference is the
router (selection, resolution, overload check, permits, fault-detection wrapping). The
routing host's policies (round-robin, and KV over 64-token prompts sharing a prefix) run in
the same run, so their cost over the bare router reads off directly. Prints JSON.

    python -m bench.dispatch [--requests N]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Awaitable, Callable

import trio

from routespec.discovery.instances import Instance, MemoryDiscovery
from routespec.host.request import HostRequest
from routespec.host.routing_host import RoutingHost, WorkerConfig
from routespec.routing.push_router import PushRouter
from routespec.routing.selection import RouterMode
from routespec.routing.streaming import Request
from routespec.testing.scripted import ScriptedWorker
from routespec.testing.target import Delivery, Serve
from routespec.transport.in_process import InProcessDispatch

ENDPOINT = "bench/router/generate"
WORKERS = 4
HOST_POLICIES = (RouterMode.ROUND_ROBIN, RouterMode.KV)
PREFIX = list(range(63))  # with one varying token: 64-token prompts, 4 KV blocks


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

        hosts = {mode: RoutingHost.create(router, mode) for mode in HOST_POLICIES}
        for host in hosts.values():
            host.worker_configs.update({w.worker_id: WorkerConfig() for w in workers})

        async def hosted(n: int, host: RoutingHost, items: int = stream_items) -> int:
            prompt = {"token_ids": [*PREFIX, n % 16], "max_tokens": items}
            stream = await host.generate(HostRequest(Request(f"h{n}", prompt)))
            return len([item async for item in stream])

        results[f"{stream_items}_item"] = {
            "baseline_direct_call": await _measure(requests, baseline),
            "round_robin": await _measure(requests, lambda n: routed(n, RouterMode.ROUND_ROBIN)),
            "least_loaded": await _measure(requests, lambda n: routed(n, RouterMode.LEAST_LOADED)),
            **{
                f"host_{mode.value}": await _measure(requests, functools.partial(hosted, host=host))
                for mode, host in hosts.items()
            },
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
