"""Where the reference's time goes, per request, on two paths (issue 15, item 3).

    python -m bench.profile_paths transport [--requests N] [--concurrency 64] [--out DIR]
    python -m bench.profile_paths host [--requests N] [--out DIR]

``transport``: ``bench.transport``'s 1-item requests, ``--concurrency`` in flight, from a
``PushRouter`` over ``TcpDispatch`` here to ``bench.transport``'s worker in a subprocess, both
under cProfile and a trio instrument. ``host``: ``bench.dispatch``'s 100-item streams in
process through the routing host (round-robin), then through the bare router for contrast.

For each side it prints the wall time per request (cProfile's overhead included, so read the
shares, not the absolute figures), trio task steps (a task resumed: a switch) and tasks
spawned per request, TCP connections and socket calls per request, and the top functions by
own time and by cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

from bench import dispatch, transport
from bench.peer_processes import cpu_seconds
from routespec.discovery.instances import Instance, MemoryDiscovery
from routespec.host.request import HostRequest
from routespec.host.routing_host import RoutingHost, WorkerConfig
from routespec.routing.push_router import PushRouter
from routespec.routing.selection import RouterMode
from routespec.routing.streaming import Request
from routespec.testing.scripted import ScriptedWorker
from routespec.testing.target import Delivery, Serve
from routespec.transport.connection import LOOPBACK
from routespec.transport.in_process import InProcessDispatch
from routespec.transport.tcp_dispatch import TcpDispatch

WARM_UP = 50
TOP = 15

# what each count is made of: call counts of synchronous functions (a coroutine's count in
# cProfile is its resumptions, not its calls), as (file suffix or "~" for a builtin, name)
COUNTED = {
    "sockets created (accepted or dialled)": ("python3.11/socket.py", "__init__"),
    "connect() calls": ("~", "<method 'connect' of '_socket.socket' objects>"),
    "send() syscalls": ("~", "<method 'send' of '_socket.socket' objects>"),
    "recv() syscalls (EAGAIN included)": ("~", "<method 'recv' of '_socket.socket' objects>"),
    "epoll waits": ("~", "<method 'poll' of 'select.epoll' objects>"),
    "cancel scopes entered": ("trio/_core/_run.py", "__enter__"),
    "msgpack encodes": ("msgpack/__init__.py", "packb"),
    "getpeername() calls": ("~", "<method 'getpeername' of '_socket.socket' objects>"),
}


class Steps(trio.abc.Instrument):
    """Counts task steps (each resumption of a task is one switch) and tasks spawned."""

    def __init__(self) -> None:
        self.steps = 0
        self.spawned = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.spawned += 1


@contextmanager
def _measured(steps: Steps, profiler: cProfile.Profile) -> Iterator[None]:
    trio.lowlevel.add_instrument(steps)
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        trio.lowlevel.remove_instrument(steps)


def _name(key: tuple[str, int, str]) -> str:
    path, line, function = key
    if path == "~":
        return function
    short = "/".join(Path(path).parts[-2:])
    return f"{short}:{line}({function})"


def _counted(stats: pstats.Stats, requests: int) -> dict[str, float]:
    calls: dict[str, float] = {}
    table: dict[tuple[str, int, str], Any] = stats.stats  # type: ignore[attr-defined]
    for label, (suffix, function) in COUNTED.items():
        total = sum(
            value[1]
            for key, value in table.items()
            if key[0].endswith(suffix) and key[2] == function
        )
        if total:
            calls[label] = round(total / requests, 2)
    return calls


def _top(stats: pstats.Stats, requests: int) -> dict[str, list[str]]:
    """The top functions by own and by cumulative time, in µs per request."""
    table: dict[tuple[str, int, str], Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(value[2] for value in table.values()) or 1.0

    def line(key: tuple[str, int, str], seconds: float) -> str:
        share = 100 * seconds / total
        return f"{seconds / requests * 1e6:8.1f} µs/req {share:5.1f}%  {_name(key)}"

    by_own = sorted(table.items(), key=lambda kv: kv[1][2], reverse=True)[:TOP]
    by_cumulative = sorted(table.items(), key=lambda kv: kv[1][3], reverse=True)[:TOP]
    return {
        "own_time": [line(k, v[2]) for k, v in by_own],
        "cumulative_time": [line(k, v[3]) for k, v in by_cumulative],
    }


def _report(
    label: str, stats: pstats.Stats, requests: int, wall: float | None, steps: Steps | None
) -> dict[str, Any]:
    section: dict[str, Any] = {"side": label, "requests": requests}
    if wall is not None:
        section["wall_us_per_request_profiled"] = round(wall / requests * 1e6, 1)
    if steps is not None:
        section["task_steps_per_request"] = round(steps.steps / requests, 2)
        section["tasks_spawned_per_request"] = round(steps.spawned / requests, 2)
    section["calls_per_request"] = _counted(stats, requests)
    return {**section, **_top(stats, requests)}


# the transport path: this process is the caller, a subprocess the worker


def _serve_worker(out: Path) -> None:
    """``bench.transport``'s worker under cProfile and the step counter, until stdin closes."""
    steps, profiler = Steps(), cProfile.Profile()
    profiler.enable()
    trio.run(transport._worker, instruments=[steps])
    profiler.disable()
    profiler.dump_stats(out / "worker.prof")
    (out / "worker.json").write_text(json.dumps({"steps": steps.steps, "spawned": steps.spawned}))


def _router_calls(router: PushRouter) -> transport.One:
    async def one(n: int, items: int) -> int:
        stream = await router.generate(Request(f"r{n}", {"items": items}))
        try:
            return len([item async for item in stream if item.error is None])
        finally:
            await stream.aclose()

    return one


async def _caller(
    port: int, requests: int, concurrency: int, out: Path | None, worker_pid: int
) -> dict[str, Any]:
    """Warm up, then the concurrent 1-item figure: CPU-timed on both sides, or profiled
    and step-counted here when ``out`` is given (the worker then profiles itself)."""
    async with TcpDispatch.open() as tcp:
        discovery = MemoryDiscovery()
        address = f"{LOOPBACK}:{port}/{transport.PATH}"
        discovery.register(Instance(transport.INSTANCE_ID, transport.ENDPOINT, address))
        one = _router_calls(PushRouter.create(transport.ENDPOINT, discovery, tcp))
        await transport._sequential(WARM_UP, 1, one)
        if out is None:
            caller_cpu, worker_cpu = time.process_time(), cpu_seconds(worker_pid)
            figures = await transport._concurrent(requests, 1, concurrency, one)
            cpu_us = {
                "caller": round((time.process_time() - caller_cpu) / requests * 1e6),
                "worker": round((cpu_seconds(worker_pid) - worker_cpu) / requests * 1e6),
            }
            return {"figures_unprofiled": figures, "cpu_us_per_request_unprofiled": cpu_us}
        steps, profiler = Steps(), cProfile.Profile()
        started = time.perf_counter()
        with _measured(steps, profiler):
            figures = await transport._concurrent(requests, 1, concurrency, one)
        wall = time.perf_counter() - started
    profiler.dump_stats(out / "caller.prof")
    stats = pstats.Stats(profiler)
    caller = _report("caller (PushRouter, TcpDispatch)", stats, requests, wall, steps)
    return {"figures_profiled": figures, "caller": caller}


def _with_worker(command: list[str], run: Callable[[int, int], dict[str, Any]]) -> dict[str, Any]:
    """Run ``run(port, pid)`` against a worker started by ``command``, then stop it."""
    worker = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None
        ports = json.loads(worker.stdout.readline())
        return run(ports["reference_port"], worker.pid)
    finally:
        transport._stop_worker(worker)


def profile_transport(requests: int, concurrency: int, out: Path) -> dict[str, Any]:
    """An unprofiled worker for the CPU figures, then a profiled one for the profiles."""
    plain = [sys.executable, "-m", "bench.transport", "--serve-worker"]
    result = _with_worker(
        plain, lambda port, pid: trio.run(_caller, port, requests, concurrency, None, pid)
    )
    profiled = [sys.executable, "-m", "bench.profile_paths", "--serve-worker", str(out)]
    result |= _with_worker(
        profiled, lambda port, pid: trio.run(_caller, port, requests, concurrency, out, pid)
    )
    served = WARM_UP + requests  # the worker's profile spans the warm-up too
    counts = json.loads((out / "worker.json").read_text())
    worker_steps = Steps()
    worker_steps.steps, worker_steps.spawned = counts["steps"], counts["spawned"]
    worker_stats = pstats.Stats(str(out / "worker.prof"))
    result["worker"] = _report(
        "worker (WorkerServer), warm-up included", worker_stats, served, None, worker_steps
    )
    return result


# the host path: in process, 100-item streams


async def _host(requests: int, out: Path) -> dict[str, Any]:
    discovery, inproc = MemoryDiscovery(), InProcessDispatch()
    log: list[Delivery] = []
    workers = []
    for worker_id in range(1, dispatch.WORKERS + 1):
        worker = ScriptedWorker(worker_id, log)
        worker.script = Serve(100)
        workers.append(worker)
        discovery.register(Instance(worker_id, dispatch.ENDPOINT, f"inproc://{worker_id}"))
        inproc.serve(f"inproc://{worker_id}", worker)
    router = PushRouter.create(dispatch.ENDPOINT, discovery, inproc)
    host = RoutingHost.create(router, RouterMode.ROUND_ROBIN)
    host.worker_configs.update({w.worker_id: WorkerConfig() for w in workers})

    async def hosted(n: int) -> int:
        prompt = {"token_ids": [*dispatch.PREFIX, n % 16], "max_tokens": 100}
        stream = await host.generate(HostRequest(Request(f"h{n}", prompt)))
        return len([item async for item in stream])

    async def routed(n: int) -> int:
        stream = await router.generate(Request(f"r{n}", None))
        return len([item async for item in stream])

    results: dict[str, Any] = {}
    for name, one in (("host_round_robin", hosted), ("bare_router_round_robin", routed)):
        for n in range(WARM_UP):
            await one(n)
        log.clear()
        steps, profiler = Steps(), cProfile.Profile()
        started = time.perf_counter()
        with _measured(steps, profiler):
            items = sum([await one(n) for n in range(requests)])
        wall = time.perf_counter() - started
        log.clear()
        profiler.dump_stats(out / f"{name}.prof")
        results[name] = _report(name, pstats.Stats(profiler), requests, wall, steps)
        results[name]["items_per_request"] = items / requests
    return results


def _print(result: dict[str, Any]) -> None:
    for name, section in result.items():
        if not isinstance(section, dict) or "own_time" not in section:
            print(f"{name}: {json.dumps(section)}")
            continue
        print(f"\n== {name}: {section['side']}, {section['requests']} requests")
        for key in (
            "wall_us_per_request_profiled",
            "task_steps_per_request",
            "tasks_spawned_per_request",
        ):
            if key in section:
                print(f"  {key}: {section[key]}")
        for label, per_request in section["calls_per_request"].items():
            print(f"  {label} per request: {per_request}")
        for heading in ("own_time", "cumulative_time"):
            print(f"  top by {heading.replace('_', ' ')}:")
            for line in section[heading]:
                print(f"    {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", choices=("transport", "host"))
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--out", type=Path, help="keep the .prof files here")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_worker is not None:
        _serve_worker(args.serve_worker)
        return
    if args.path is None:
        parser.error("name a path: transport or host")
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as scratch:
        out = args.out or Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        if args.path == "transport":
            result = profile_transport(args.requests, args.concurrency, out)
        else:
            result = trio.run(_host, args.requests, out)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result)


if __name__ == "__main__":
    main()
