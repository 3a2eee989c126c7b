"""Benchmark: the TCP transport between two processes, against a raw trio socket baseline.

A worker subprocess serves, on loopback, both a ``WorkerServer`` handler and a raw
length-prefixed server; each answers a request ``{"items": K}`` with K small dict items.
This process measures the reference router (``PushRouter`` round-robin over ``TcpDispatch``)
and a minimal raw client the same way: sequential p50/p99 latency, then requests/s and
items/s with ``--concurrency`` requests in flight. Prints JSON; the targets are context only.

    python -m bench.transport [--requests N] [--concurrency 64] [--profile-dir DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path

import msgpack
import trio

from routespec.discovery.instances import Instance, MemoryDiscovery
from routespec.routing.push_router import PushRouter
from routespec.routing.selection import RouterMode
from routespec.routing.streaming import Rejection, Request
from routespec.transport.connection import LOOPBACK
from routespec.transport.tcp_dispatch import TcpDispatch
from routespec.transport.worker_server import WorkerServer

ENDPOINT = "bench/transport/generate"
PATH = "generate"
INSTANCE_ID = 1
TARGETS = {"one_item_requests_per_s": 3000, "hundred_item_stream_items_per_s": 16000}
RAW_PREFIX = struct.Struct(">I")
RECEIVE_CHUNK = 64 * 1024
WORKER_EXIT_TIMEOUT = 5.0

One = Callable[[int, int], Awaitable[int]]
"""Sends request number ``n`` asking for ``k`` items; returns the items received."""


def _item(index: int) -> dict[str, object]:
    return {"index": index, "token": "tok", "logprob": -0.25}


async def _items(count: int) -> AsyncGenerator[object, None]:
    for index in range(count):
        yield _item(index)


def _count(payload: object) -> int:
    items = payload.get("items", 1) if isinstance(payload, dict) else 1
    return items if isinstance(items, int) else 1


class ItemsHandler:
    """A ``WorkerHandler`` that admits everything and yields ``payload["items"]`` items."""

    def admit(self, request: Request) -> Rejection | None:
        return None

    async def start(self, request: Request) -> AsyncGenerator[object, None]:
        return _items(_count(request.payload))


# the raw baseline: u32 length + msgpack body, both ways; K response frames per request


class RawReader:
    """Buffered reads of length-prefixed frames from one stream."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._buffer = bytearray()

    async def _exactly(self, count: int) -> bytes | None:
        while len(self._buffer) < count:
            chunk = await self.stream.receive_some(RECEIVE_CHUNK)
            if not chunk:
                return None
            self._buffer += chunk
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        return data

    async def frame(self) -> object:
        """The next frame's decoded body; ``None`` at end of stream."""
        prefix = await self._exactly(RAW_PREFIX.size)
        if prefix is None:
            return None
        (length,) = RAW_PREFIX.unpack(prefix)
        body = await self._exactly(length)
        return None if body is None else msgpack.unpackb(body)


def _raw_frame(value: object) -> bytes:
    body: bytes = msgpack.packb(value)
    return RAW_PREFIX.pack(len(body)) + body


async def _serve_raw(stream: trio.SocketStream) -> None:
    reader = RawReader(stream)
    async with stream:
        try:
            while (request := await reader.frame()) is not None:
                for index in range(_count(request)):
                    await stream.send_all(_raw_frame({"data": _item(index)}))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return


# the worker process


async def _worker() -> None:
    """Serve both servers, print their ports, and exit when stdin closes."""
    server = WorkerServer(host=LOOPBACK)
    async with trio.open_nursery() as nursery:
        reference_port = await nursery.start(server.run)
        server.serve(PATH, ItemsHandler())
        listeners = await trio.open_tcp_listeners(0, host=LOOPBACK)
        raw_port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, _serve_raw, listeners)
        print(json.dumps({"reference_port": reference_port, "raw_port": raw_port}), flush=True)
        stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        while await stdin.receive_some():
            pass
        nursery.cancel_scope.cancel()


# measurement


def _quantiles_us(latencies: list[float]) -> dict[str, float]:
    quantiles = statistics.quantiles(latencies, n=100)
    return {"p50_us": round(quantiles[49] * 1e6, 1), "p99_us": round(quantiles[98] * 1e6, 1)}


async def _sequential(requests: int, items: int, one: One) -> dict[str, float]:
    latencies = []
    received = 0
    started = time.perf_counter()
    for n in range(requests):
        begin = time.perf_counter()
        received += await one(n, items)
        latencies.append(time.perf_counter() - begin)
    elapsed = time.perf_counter() - started
    return {
        "requests": requests,
        **_quantiles_us(latencies),
        "requests_per_s": round(requests / elapsed),
        "items_per_s": round(received / elapsed),
        "items_missing": requests * items - received,
    }


async def _concurrent(requests: int, items: int, concurrency: int, one: One) -> dict[str, float]:
    """``concurrency`` tasks take request numbers from one shared sequence."""
    latencies: list[float] = []
    received = 0
    remaining = iter(range(requests))

    async def task() -> None:
        nonlocal received
        for n in remaining:
            begin = time.perf_counter()
            got = await one(n, items)  # not `received += await …`: that loses updates
            received += got
            latencies.append(time.perf_counter() - begin)

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(task)
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
    """Warm up, then the four figures; 100-item streams use a tenth of the requests."""
    streams = max(concurrency, requests // 10)
    await _sequential(min(requests, 200), 1, one)
    return {
        "sequential_1_item": await _sequential(requests, 1, one),
        "sequential_100_items": await _sequential(streams, 100, one),
        "concurrent_1_item": await _concurrent(requests, 1, concurrency, one),
        "concurrent_100_items": await _concurrent(streams, 100, concurrency, one),
    }


async def _reference(port: int, requests: int, concurrency: int) -> dict[str, object]:
    async with TcpDispatch.open() as dispatch:
        discovery = MemoryDiscovery()
        discovery.register(Instance(INSTANCE_ID, ENDPOINT, f"{LOOPBACK}:{port}/{PATH}"))
        router = PushRouter.create(ENDPOINT, discovery, dispatch)
        errors = 0

        async def one(n: int, items: int) -> int:
            nonlocal errors
            stream = await router.generate(Request(f"r{n}", {"items": items}))
            received = 0
            try:
                async for item in stream:
                    if item.error is None:
                        received += 1
                    else:
                        errors += 1
            finally:
                await stream.aclose()
            return received

        results = await _suite(requests, concurrency, one)
        return {"error_items": errors, **results}


async def _raw(port: int, requests: int, concurrency: int) -> dict[str, object]:
    """One persistent connection per concurrent task (task ``n % concurrency``)."""
    readers: list[RawReader] = []
    for _ in range(concurrency):
        readers.append(RawReader(await trio.open_tcp_stream(LOOPBACK, port)))
    errors = 0

    async def one(n: int, items: int) -> int:
        nonlocal errors
        reader = readers[n % concurrency]
        await reader.stream.send_all(_raw_frame({"items": items}))
        received = 0
        for _ in range(items):
            frame = await reader.frame()
            if isinstance(frame, dict) and "data" in frame:
                received += 1
            else:
                errors += 1
        return received

    try:
        results = await _suite(requests, concurrency, _serialised(one, concurrency))
    finally:
        for reader in readers:
            await reader.stream.aclose()
    return {"error_items": errors, **results}


def _serialised(one: One, connections: int) -> One:
    """Guard each raw connection with a lock: one request in flight per connection."""
    locks = [trio.Lock() for _ in range(connections)]

    async def guarded(n: int, items: int) -> int:
        async with locks[n % connections]:
            return await one(n, items)

    return guarded


async def _client(ports: dict[str, int], requests: int, concurrency: int) -> dict[str, object]:
    return {
        "reference_push_router_tcp": await _reference(
            ports["reference_port"], requests, concurrency
        ),
        "raw_trio_socket_baseline": await _raw(ports["raw_port"], requests, concurrency),
    }


def _summary(results: dict[str, object]) -> dict[str, object]:
    def figure(side: str, case: str, key: str) -> object:
        section = results[side]
        assert isinstance(section, dict)
        return section[case][key]

    reference, raw = "reference_push_router_tcp", "raw_trio_socket_baseline"
    return {
        "reference_1_item_requests_per_s": figure(reference, "concurrent_1_item", "requests_per_s"),
        "reference_100_item_items_per_s": figure(reference, "concurrent_100_items", "items_per_s"),
        "raw_1_item_requests_per_s": figure(raw, "concurrent_1_item", "requests_per_s"),
        "raw_100_item_items_per_s": figure(raw, "concurrent_100_items", "items_per_s"),
    }


def _spawn_worker(profile_dir: Path | None) -> subprocess.Popen[str]:
    command = [sys.executable]
    if profile_dir is not None:
        command += ["-m", "cProfile", "-o", str(profile_dir / "worker.prof")]
    command += ["-m", "bench.transport", "--serve-worker"]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _stop_worker(worker: subprocess.Popen[str]) -> None:
    """Close its stdin (a clean exit, so a profile is written), then terminate, then kill."""
    if worker.stdin is not None:
        worker.stdin.close()
    try:
        worker.wait(WORKER_EXIT_TIMEOUT)
        return
    except subprocess.TimeoutExpired:
        worker.terminate()
    try:
        worker.wait(WORKER_EXIT_TIMEOUT)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--profile-dir", type=Path, help="write client.prof and worker.prof")
    parser.add_argument("--serve-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_worker:
        trio.run(_worker)
        return
    if args.profile_dir is not None:
        args.profile_dir.mkdir(parents=True, exist_ok=True)
    worker = _spawn_worker(args.profile_dir)
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        if not line:
            raise SystemExit("the worker process exited before printing its ports")
        ports = json.loads(line)
        profiler = cProfile.Profile() if args.profile_dir is not None else None
        started = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        results = trio.run(_client, ports, args.requests, args.concurrency)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile_dir / "client.prof")
    finally:
        _stop_worker(worker)
    report = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "router_mode": RouterMode.ROUND_ROBIN.value,
        "codec": "msgpack",
        "item": _item(0),
        "targets_at_concurrency_64": TARGETS,
        "summary": _summary(results),
        **results,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
