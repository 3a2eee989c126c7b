"""Benchmark: microseconds per routing decision, by mode and fleet size.

A decision is what the router does before it sends: the free set (discovered minus
inhibited minus overloaded), selection among it (booking for occupancy modes), resolution and
the overload check on the chosen worker. Each builtin mode runs through
``PushRouter.generate`` and the KV policy through ``RoutingHost.generate`` (4,096-token
prompts, index lookups, booking and recording), both over a transport that sends nothing and
answers an empty stream, so only the decision path is timed. Every fleet has some workers
inhibited, some overloaded (monitor marks and request-path leases) and some booked; a frozen
``MockClock`` keeps those marks from lapsing while it runs. ``direct`` (``PushRouter.direct``,
no selection) is the fixed dispatch cost every row includes.

    python -m bench.selection [--workers 4,100,1000,10000] [--budget 0.2] [--quick]

Prints JSON ``{"<mode>": {"<workers>": microseconds}}``: the fastest of ``--repeats`` timed
batches, each lasting about ``--budget`` seconds. Time is this process's CPU time (the
decision path makes no system calls and never waits), so other load on a shared machine
inflates it far less than wall time; ``--wall`` times with ``time.perf_counter`` instead.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Awaitable, Callable

import trio
import trio.testing

from routespec.discovery.instances import Instance, MemoryDiscovery
from routespec.host.kv import block_hashes
from routespec.host.request import HostRequest
from routespec.host.routing_host import RoutingHost, WorkerConfig
from routespec.routing.push_router import PushRouter
from routespec.routing.selection import CPU, RouterMode
from routespec.routing.streaming import Annotated, ItemStream, Request

ENDPOINT = "bench/selection/generate"
BUILTIN_MODES = (
    RouterMode.ROUND_ROBIN,
    RouterMode.RANDOM,
    RouterMode.POWER_OF_TWO_CHOICES,
    RouterMode.LEAST_LOADED,
    RouterMode.DEVICE_AWARE_WEIGHTED,
)
FLEETS = (4, 100, 1000, 10000)
PROMPT_TOKENS = 4096
PROMPT_FAMILIES = 16  # prompts share one of these 2,048-token prefixes
SHARED_PREFIX = PROMPT_TOKENS // 2
SEED = 15

# the fleet's state: every k-th worker (by position) is in that state
INHIBITED_EVERY = 10
MONITOR_OVERLOADED_EVERY = 13
LEASED_EVERY = 17
BOOKED_EVERY = 3
CPU_EVERY = 8
CACHED_EVERY = 4  # KV: holds one family's prefix

Decide = Callable[[int], Awaitable[None]]
"""Makes decision number ``n`` and lets go of what it booked."""


class EmptyStream:
    """A response stream that has already ended."""

    def __aiter__(self) -> EmptyStream:
        return self

    async def __anext__(self) -> Annotated:
        raise StopAsyncIteration

    async def aclose(self) -> None:
        return None


class NoSend:
    """A ``StreamingDispatch`` that sends nothing: the decision is all that is timed."""

    async def generate(self, instance: Instance, request: Request) -> ItemStream:
        return EmptyStream()


def _fleet(workers: int) -> tuple[MemoryDiscovery, list[int]]:
    """``workers`` instances with spread-out ids, some CPU; the ids in registration order."""
    rng = random.Random(SEED)
    ids = rng.sample(range(1, 1 << 40), workers)
    discovery = MemoryDiscovery()
    for position, worker_id in enumerate(ids):
        device = CPU if position % CPU_EVERY == CPU_EVERY - 1 else "cuda"
        discovery.register(Instance(worker_id, ENDPOINT, f"nosend://{worker_id}", device))
    return discovery, ids


def _router(workers: int) -> tuple[PushRouter, list[int]]:
    """A router over the fleet, with inhibitions, overload marks and held bookings applied.

    At 4 workers no mark applies (every k-th from k >= 10), so the first worker is
    booked and the second inhibited instead, leaving two free."""
    discovery, ids = _fleet(workers)
    router = PushRouter.create(ENDPOINT, discovery, NoSend(), rng=random.Random(SEED))
    sets = router.worker_sets
    for position, worker_id in enumerate(ids):
        if position % INHIBITED_EVERY == INHIBITED_EVERY - 1:
            sets.report_instance_down(worker_id)
        if position % MONITOR_OVERLOADED_EVERY == MONITOR_OVERLOADED_EVERY - 1:
            sets.set_monitor_overloaded(worker_id, True)
        if position % LEASED_EVERY == LEASED_EVERY - 1:
            sets.mark_overloaded(worker_id)
        if position % BOOKED_EVERY == 0:
            for _ in range(1 + position % 5):
                router.occupancy.book(worker_id)  # held for the whole run
    if workers < INHIBITED_EVERY:
        sets.report_instance_down(ids[1])
    return router, ids


def _builtin(router: PushRouter, mode: RouterMode) -> Decide:
    async def decide(n: int) -> None:
        stream = await router.generate(Request(f"s{n}", None), mode)
        await stream.aclose()  # releases an occupancy mode's permit

    return decide


def _direct(router: PushRouter, ids: list[int]) -> Decide:
    async def decide(n: int) -> None:
        stream = await router.direct(Request(f"d{n}", None), ids[0])
        await stream.aclose()

    return decide


def _prompts() -> list[list[int]]:
    rng = random.Random(SEED)
    prompts = []
    for family in range(PROMPT_FAMILIES):
        prefix = [family * 100_000 + t for t in range(SHARED_PREFIX)]
        for _ in range(4):
            suffix = [rng.randrange(1 << 20) for _ in range(PROMPT_TOKENS - SHARED_PREFIX)]
            prompts.append(prefix + suffix)
    return prompts


def _kv(router: PushRouter, ids: list[int], prompts: list[list[int]]) -> Decide:
    """The KV host over the router: a quarter of the workers hold a family's prefix and
    every third holds admitted requests (KV bookings, kept for the whole run)."""
    host = RoutingHost.create(router, RouterMode.KV)
    assert host.kv is not None
    kv = host.kv
    host.worker_configs.update({worker_id: WorkerConfig() for worker_id in ids})
    for position, worker_id in enumerate(ids):
        prompt = prompts[position % len(prompts)]
        if position % CACHED_EVERY == 0:
            kv.index.record(worker_id, block_hashes(prompt[:SHARED_PREFIX], kv.block_size))
        if position % BOOKED_EVERY == 0:
            kv.book(worker_id, prompt)

    async def decide(n: int) -> None:
        payload = {"token_ids": prompts[n % len(prompts)], "max_tokens": 1}
        stream = await host.generate(HostRequest(Request(f"k{n}", payload)))
        await stream.aclose()  # releases the request's KV booking

    return decide


Clock = Callable[[], float]


async def _per_decision_us(decide: Decide, budget: float, repeats: int, clock: Clock) -> float:
    """Calibrate a batch size that lasts about ``budget``; the fastest of ``repeats``."""
    for n in range(3):  # warm up: first-call allocations, caches
        await decide(n)
    began = clock()
    calibration = 0
    while calibration < 3 or clock() - began < budget / 10:
        await decide(calibration)
        calibration += 1
    per_decision = max(clock() - began, 1e-9) / calibration
    batch = max(3, int(budget / per_decision))
    best = float("inf")
    for _ in range(repeats):
        started = clock()
        for n in range(batch):
            await decide(n)
        best = min(best, (clock() - started) / batch)
    return round(best * 1e6, 2)


async def _run(
    fleets: list[int], budget: float, repeats: int, clock: Clock
) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    prompts = _prompts()
    for workers in fleets:
        for mode in BUILTIN_MODES:
            router, _ = _router(workers)
            row = results.setdefault(mode.value, {})
            row[str(workers)] = await _per_decision_us(
                _builtin(router, mode), budget, repeats, clock
            )
        router, ids = _router(workers)
        kv_row = results.setdefault(RouterMode.KV.value, {})
        kv_row[str(workers)] = await _per_decision_us(
            _kv(router, ids, prompts), budget, repeats, clock
        )
        router, ids = _router(workers)
        direct_row = results.setdefault(RouterMode.DIRECT.value, {})
        direct_row[str(workers)] = await _per_decision_us(
            _direct(router, ids), budget, repeats, clock
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default=",".join(map(str, FLEETS)), help="fleet sizes")
    parser.add_argument("--budget", type=float, default=0.2, help="seconds per timed batch")
    parser.add_argument("--repeats", type=int, default=3, help="timed batches per figure")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny batches")
    parser.add_argument("--wall", action="store_true", help="time by wall clock, not CPU")
    args = parser.parse_args()
    fleets = [int(part) for part in args.workers.split(",") if part]
    budget, repeats = (0.002, 1) if args.quick else (args.budget, args.repeats)
    # a frozen clock: inhibitions and overload leases hold for the whole run
    timer = time.perf_counter if args.wall else time.process_time
    results = trio.run(_run, fleets, budget, repeats, timer, clock=trio.testing.MockClock())
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
