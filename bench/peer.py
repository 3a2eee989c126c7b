"""Peer benchmark: the reference against the real Dynamo 1.6.1 runtime, alternating, in one run.

Each side is one caller and one worker process of the same shape (a request ``{"items": K}``
answered by K small dict items, round-robin over TCP on 127.0.0.1, file discovery in a
temporary directory):

- ``reference``: ``bench.transport``'s ``PushRouter`` over ``TcpDispatch`` (this process) to a
  reference ``WorkerServer`` (``bench.peer_processes``), plus ``bench.transport``'s raw trio
  socket baseline to the same process;
- ``dynamo``: the bindings' client (``Client.round_robin``) to a worker on ``serve_endpoint``
  (``bench.peer_dynamo``), when ``dynamo._core`` is importable;
- the cross pairs: the reference router to the Dynamo worker, the Dynamo client to the
  reference worker.

Every round measures every pair (``bench.transport``'s four figures: sequential p50/p99 for
1 and 100 items, ``--concurrency`` req/s for 1 item and items/s for 100), in reverse order
every other round. Then, except for the raw baseline, the concurrent 1-item figure once more
with the CPU time the caller and the worker process spent per request (every thread): the
figure other load on a shared machine distorts least. Prints a table of min-max over rounds
with each figure over Dynamo's in the same round, or the JSON document (``--json``). Without
Dynamo it measures the reference and says so.

    python -m bench.peer [--rounds 3] [--requests 2000] [--concurrency 64] [--json] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from bench import transport
from bench.peer_processes import START_TIMEOUT, LineProcess, cpu_seconds, reference_worker
from bench.peer_report import (
    CPU_CASE,
    DYNAMO,
    DYNAMO_TO_REFERENCE,
    PAIRS,
    RAW,
    REFERENCE,
    REFERENCE_TO_DYNAMO,
    summarise,
    table,
)
from bench.transport import PATH
from routespec.discovery.file_store import FileDiscovery
from routespec.discovery.instances import Instance, MemoryDiscovery
from routespec.routing.push_router import PushRouter
from routespec.routing.streaming import Request
from routespec.transport.connection import LOOPBACK
from routespec.transport.tcp_dispatch import TcpDispatch

REFERENCE_ENDPOINT = "bench/reference/generate"
DYNAMO_ENDPOINT = "bench/dynamo/generate"
QUICK_REQUESTS = 100
RUNTIME = "ai-dynamo-runtime"  # the distribution that ships dynamo._core

Measure = Callable[[], Awaitable[dict[str, Any]]]


def _dotted(endpoint: str) -> str:
    return endpoint.replace("/", ".")  # the bindings spell ns/comp/endpoint ns.comp.endpoint


def dynamo_missing() -> str | None:
    """Why Dynamo cannot be measured here, or None."""
    try:
        found = importlib.util.find_spec("dynamo._core") is not None
    except ImportError:
        found = False
    return None if found else "dynamo._core is not importable (install the extra `dynamo`)"


async def _instance(store: Path, endpoint: str) -> Instance:
    """The first instance the file store lists for ``endpoint``, waiting for it."""
    discovery = FileDiscovery(store, endpoint)
    with trio.fail_after(START_TIMEOUT):
        while not discovery.instance_ids():
            await trio.sleep(0.05)
            discovery.refresh()
    instance = discovery.lookup(discovery.instance_ids()[0])
    assert instance is not None
    return instance


def _router_calls(router: PushRouter, errors: list[int]) -> transport.One:
    """As ``bench.transport._reference``'s calls: items counted, error items tallied."""

    async def one(n: int, items: int) -> int:
        stream = await router.generate(Request(f"r{n}", {"items": items}))
        received = 0
        try:
            async for item in stream:
                if item.error is None:
                    received += 1
                else:
                    errors[0] += 1
        finally:
            await stream.aclose()
        return received

    return one


async def _router_to(
    instance: Instance, requests: int, concurrency: int, worker_pid: int
) -> dict[str, Any]:
    """``bench.transport._reference``'s figures (its ``_suite``) to any instance, then the
    concurrent 1-item figure again with the CPU time of both processes."""
    async with TcpDispatch.open() as dispatch:
        discovery = MemoryDiscovery()
        discovery.register(instance)
        router = PushRouter.create(instance.endpoint, discovery, dispatch)
        errors = [0]
        one = _router_calls(router, errors)
        results = await transport._suite(requests, concurrency, one)
        caller, worker = time.process_time(), cpu_seconds(worker_pid)
        figures = await transport._concurrent(requests, 1, concurrency, one)
        caller_s, worker_s = time.process_time() - caller, cpu_seconds(worker_pid) - worker
        return {
            "error_items": errors[0],
            **results,
            CPU_CASE: _cpu(caller_s, worker_s, figures),
        }


def _cpu(caller_s: float, worker_s: float, figures: dict[str, Any]) -> dict[str, Any]:
    requests = figures["requests"]
    caller_us, worker_us = caller_s / requests * 1e6, worker_s / requests * 1e6
    return {
        "caller_us": round(caller_us),
        "worker_us": round(worker_us),
        "total_us": round(caller_us + worker_us),
        "items_missing": figures["items_missing"],
        "requests_per_s": figures["requests_per_s"],
    }


async def _ask_dynamo(
    client: LineProcess, name: str, requests: int, concurrency: int, worker_pid: int
) -> dict[str, Any]:
    """The Dynamo client's figures, then its CPU phase with the worker's CPU read here."""
    command: dict[str, object] = {"worker": name, "requests": requests, "concurrency": concurrency}
    results = await client.ask(command)
    worker = cpu_seconds(worker_pid)
    phase = await client.ask({**command, "phase": "cpu"})
    worker_s = cpu_seconds(worker_pid) - worker
    results["error_items"] += phase["error_items"]
    return {**results, CPU_CASE: _cpu(phase["caller_cpu_s"], worker_s, phase)}


async def _run(args: argparse.Namespace, root: Path, missing: str | None) -> list[dict[str, Any]]:
    store = root / "store"
    store.mkdir()
    requests, concurrency = args.requests, args.concurrency
    processes: list[LineProcess] = []
    try:
        worker = LineProcess(
            ["-m", "bench.peer", "--serve-reference-worker", str(store)], store, "reference-worker"
        )
        processes.append(worker)
        ports = await worker.read()
        reference_pid = worker.process.pid
        reference_instance = Instance(
            ports["instance_id"], REFERENCE_ENDPOINT, f"{LOOPBACK}:{ports['reference_port']}/{PATH}"
        )
        pairs: dict[str, Measure] = {
            RAW: lambda: transport._raw(ports["raw_port"], requests, concurrency),
            REFERENCE: lambda: _router_to(reference_instance, requests, concurrency, reference_pid),
        }
        if missing is None:
            dynamo_worker = LineProcess(
                ["-m", "bench.peer_dynamo", "worker", _dotted(DYNAMO_ENDPOINT)],
                store,
                "dynamo-worker",
            )
            processes.append(dynamo_worker)
            await dynamo_worker.read()
            dynamo_pid = dynamo_worker.process.pid
            client = LineProcess(
                [
                    "-m",
                    "bench.peer_dynamo",
                    "client",
                    f"{DYNAMO}={_dotted(DYNAMO_ENDPOINT)}",
                    f"{DYNAMO_TO_REFERENCE}={_dotted(REFERENCE_ENDPOINT)}",
                ],
                store,
                "dynamo-client",
            )
            processes.append(client)
            await client.read()
            dynamo_instance = await _instance(store, DYNAMO_ENDPOINT)

            pairs[DYNAMO] = lambda: _ask_dynamo(client, DYNAMO, requests, concurrency, dynamo_pid)
            pairs[DYNAMO_TO_REFERENCE] = lambda: _ask_dynamo(
                client, DYNAMO_TO_REFERENCE, requests, concurrency, reference_pid
            )
            pairs[REFERENCE_TO_DYNAMO] = lambda: _router_to(
                dynamo_instance, requests, concurrency, dynamo_pid
            )
        rounds = []
        for number in range(args.rounds):
            order = [pair for pair in PAIRS if pair in pairs]
            if number % 2:
                order.reverse()  # neither side always goes first
            measured = {}
            for pair in order:
                print(f"round {number + 1}: {pair}", file=sys.stderr, flush=True)
                measured[pair] = await pairs[pair]()
            rounds.append({pair: measured[pair] for pair in PAIRS if pair in measured})
        return rounds
    finally:
        for process in reversed(processes):
            process.stop()


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--json", action="store_true", help="print the JSON document")
    parser.add_argument("--quick", action="store_true", help="a smoke run: one round, few requests")
    parser.add_argument("--no-dynamo", action="store_true", help="measure the reference only")
    parser.add_argument("--serve-reference-worker", type=Path, help=argparse.SUPPRESS)
    return parser


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every round of every pair it can run, summarised: the JSON document."""
    if args.quick:
        args.rounds, args.requests = 1, QUICK_REQUESTS
    missing = "--no-dynamo was given" if args.no_dynamo else dynamo_missing()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-peer-") as root:
        rounds = trio.run(_run, args, Path(root), missing)
    return {
        "rounds": args.rounds,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "item": transport._item(0),
        "dynamo_measured": missing is None,
        **({"dynamo_version": importlib.metadata.version(RUNTIME)} if missing is None else {}),
        **({} if missing is None else {"dynamo_note": f"Dynamo was not measured: {missing}."}),
        **summarise(rounds),
        "measurements": rounds,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    args = parser().parse_args()
    if args.serve_reference_worker is not None:
        trio.run(reference_worker, REFERENCE_ENDPOINT, args.serve_reference_worker)
        return
    document = measure(args)
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(table(document, document["rounds"], document.get("dynamo_note")))


if __name__ == "__main__":
    main()
