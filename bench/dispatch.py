"""Benchmark: the in-process PushRouter's cost per dispatch, against calling the worker directly.

Both sides run in the same trio run on the same scripted workers, so the difference is the
router (selection, resolution, overload check, permits, fault-detection wrapping). The
routing host's policies (round-robin, and KV over 64-token prompts sharing a prefix) run in
the same run, so their cost over the bare router reads off directly. Every row runs in
``ROUNDS`` interleaved rounds (reverse order every other round) and also reports the CPU
time per request, the figure other load on a shared machine distorts least;
``host_over_bare_router`` gives each host policy's items/s and CPU cost over the bare
round-robin router's, like for like (every row sends the same payload). Prints JSON.

    python -m bench.dispatch [--requests N]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Awaitable, Callable

import attrs
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
ROUNDS = 6


@attrs.define
class _Row:
    """One row's samples, gathered over interleaved rounds."""

    latencies: list[float] = attrs.field(factory=list)
    items: int = 0
    wall: float = 0.0
    cpu: float = 0.0

    async def measure(self, first: int, count: int, one: Callable[[int], Awaitable[int]]) -> None:
        started, cpu_started = time.perf_counter(), time.process_time()
        for n in range(first, first + count):
            begin = time.perf_counter()
            self.items += await one(n)
            self.latencies.append(time.perf_counter() - begin)
        self.wall += time.perf_counter() - started
        self.cpu += time.process_time() - cpu_started

    def figures(self) -> dict[str, float]:
        requests = len(self.latencies)
        quantiles = statistics.quantiles(self.latencies, n=100)
        return {
            "requests_per_s": round(requests / self.wall),
            "items_per_s": round(self.items / self.wall),
            "p50_us": round(quantiles[49] * 1e6, 1),
            "p99_us": round(quantiles[98] * 1e6, 1),
            "cpu_us_per_request": round(self.cpu / requests * 1e6, 1),
        }


async def _measure_rows(
    requests: int, rows: dict[str, Callable[[int], Awaitable[int]]], log: list[Delivery]
) -> dict[str, dict[str, float]]:
    """Every row in ``ROUNDS`` rounds, in reverse order every other round, so that load
    from elsewhere on the machine and a growing heap weigh on all rows alike."""
    samples = {name: _Row() for name in rows}
    per_round = max(1, requests // ROUNDS)
    for round_number in range(ROUNDS):
        names = list(rows) if round_number % 2 == 0 else list(reversed(rows))
        for name in names:
            await samples[name].measure(round_number * per_round, per_round, rows[name])
            log.clear()  # the scripted workers' delivery log: keep the heap flat
    return {name: row.figures() for name, row in samples.items()}


def _over_bare(host: dict[str, float], bare: dict[str, float]) -> dict[str, float]:
    """A host row's rate over the bare router's: items/s, and by CPU time per request."""
    return {
        "items_per_s": round(host["items_per_s"] / bare["items_per_s"], 3),
        "cpu": round(bare["cpu_us_per_request"] / host["cpu_us_per_request"], 3),
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
    requests = max(1, requests // ROUNDS) * ROUNDS  # whole rounds
    results: dict[str, object] = {"requests": requests, "workers": WORKERS, "rounds": ROUNDS}
    ratios: dict[str, object] = {}
    for stream_items in (1, 100):
        for worker in workers:
            worker.script = Serve(stream_items)

        def prompt(n: int, items: int = stream_items) -> dict[str, object]:
            # every row sends the same payload, so the rows compare like for like
            return {"token_ids": [*PREFIX, n % 16], "max_tokens": items}

        async def baseline(n: int) -> int:
            stream = await workers[n % WORKERS].start(Request(f"b{n}", prompt(n)))
            return len([item async for item in stream])

        async def routed(n: int, mode: RouterMode) -> int:
            stream = await router.generate(Request(f"r{n}", prompt(n)), mode)
            return len([item async for item in stream])

        hosts = {mode: RoutingHost.create(router, mode) for mode in HOST_POLICIES}
        for host in hosts.values():
            host.worker_configs.update({w.worker_id: WorkerConfig() for w in workers})

        async def hosted(n: int, host: RoutingHost) -> int:
            stream = await host.generate(HostRequest(Request(f"h{n}", prompt(n))))
            return len([item async for item in stream])

        rows: dict[str, Callable[[int], Awaitable[int]]] = {
            "baseline_direct_call": baseline,
            "round_robin": functools.partial(routed, mode=RouterMode.ROUND_ROBIN),
            "least_loaded": functools.partial(routed, mode=RouterMode.LEAST_LOADED),
            **{
                f"host_{mode.value}": functools.partial(hosted, host=host)
                for mode, host in hosts.items()
            },
        }
        figures = await _measure_rows(requests, rows, log)
        results[f"{stream_items}_item"] = figures
        ratios[f"{stream_items}_item"] = {
            name: _over_bare(figures[name], figures["round_robin"])
            for name in (f"host_{mode.value}" for mode in HOST_POLICIES)
        }
    results["host_over_bare_router"] = ratios
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    args = parser.parse_args()
    print(json.dumps(trio.run(_run, args.requests), indent=2))


if __name__ == "__main__":
    main()
