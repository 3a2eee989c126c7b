"""``routespec call`` (one request) and ``routespec router`` (JSON lines on stdin): requests
through the routing host (on ``PushRouter``) and ``Migration`` over ``TcpDispatch``, fed by a
watched discovery store."""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import trio

from routespec.deploy.cli.usage import UsageError
from routespec.deploy.cli.worker import serving_metrics
from routespec.deploy.metrics import RouterMetrics, error_kind
from routespec.discovery.url import open_store
from routespec.errors import ErrorKind, RoutingError
from routespec.host.request import HostRequest, RoutingHints
from routespec.host.routing_host import RoutingHost, WorkerConfig
from routespec.migration import Migration
from routespec.routing.exclusions import Exclusions
from routespec.routing.push_router import PushRouter
from routespec.routing.selection import RouterMode
from routespec.routing.streaming import ItemStream, Request
from routespec.transport.tcp_dispatch import TcpDispatch

MODES = {
    "round-robin": RouterMode.ROUND_ROBIN,
    "random": RouterMode.RANDOM,
    "p2c": RouterMode.POWER_OF_TWO_CHOICES,
    "least-loaded": RouterMode.LEAST_LOADED,
    "direct": RouterMode.DIRECT,
    "kv": RouterMode.KV,
}
PROGRESS_AFTER = 1.0  # seconds: short streams never draw a progress line
PROGRESS_EVERY = 0.1


@attrs.define
class Caller:
    """Sends requests through one routing host and counts them in ``metrics``."""

    host: RoutingHost
    migration: Migration
    pin: int | None
    metrics: RouterMetrics
    _dispatches: dict[str, Callable[[int], None]] = attrs.field(factory=dict)

    def dispatched(self, request: Request, instance_id: int) -> Request:
        """The host's ``prepare`` step: tell the request's caller where it went."""
        self._dispatches[request.request_id](instance_id)
        return request

    async def stream(
        self, payload: object, on_item: Callable[[object, list[int]], None]
    ) -> RoutingError | None:
        """Stream one request; ``on_item`` gets each item and the workers tried so far.
        Returns the typed error that ended it, or None when it completed."""
        workers: list[int] = []
        routed = HostRequest(
            Request(uuid.uuid4().hex, payload), hints=RoutingHints(backend_instance_id=self.pin)
        )

        def on_dispatch(instance_id: int) -> None:
            self.metrics.dispatched(instance_id, migrated=bool(workers))
            workers.append(instance_id)

        async def attempt(request: Request, exclusions: Exclusions) -> ItemStream:
            return await self.host.generate(attrs.evolve(routed, request=request), exclusions)

        self._dispatches[routed.request_id] = on_dispatch
        self.metrics.start()
        error: RoutingError | None = None
        try:
            # a pinned request goes to its worker alone, and is never migrated (MIG-011)
            stream = await self.migration.stream(
                routed.request, attempt, pinned=self.pin is not None, is_stopped=lambda: False
            )
            try:
                async for item in stream:
                    if item.error is not None:
                        error = item.error
                        break
                    on_item(item.data, workers)
            finally:
                await stream.aclose()
        except RoutingError as failure:
            error = failure
        finally:
            del self._dispatches[routed.request_id]
            self.metrics.finish(error)
        return error


def _mode(args: argparse.Namespace) -> RouterMode:
    mode = MODES[args.mode]
    if mode is RouterMode.DIRECT and args.instance is None:
        raise UsageError("--instance", "--mode direct needs the worker's instance id")
    if mode is not RouterMode.DIRECT and args.instance is not None:
        raise UsageError("--instance", "only with --mode direct")
    return mode


@asynccontextmanager
async def open_caller(args: argparse.Namespace, metrics: RouterMetrics) -> AsyncIterator[Caller]:
    mode = _mode(args)
    store = open_store(args.discovery, args.ttl)
    await store.check()
    configs: dict[int, WorkerConfig] = {}  # what the KV selector knows: every discovered worker

    def added(instance_id: int) -> None:
        configs[instance_id] = WorkerConfig()
        dispatch.instance_added(instance_id)

    def removed(instance_id: int) -> None:
        configs.pop(instance_id, None)
        dispatch.instance_removed(instance_id)

    async with (
        TcpDispatch.open(args.host) as dispatch,
        store.watch(args.endpoint, added, removed) as found,
    ):
        configs.update({instance_id: WorkerConfig() for instance_id in found.instance_ids()})
        router = PushRouter.create(args.endpoint, found, dispatch)
        host = RoutingHost.create(router, mode)
        host.worker_configs = configs
        caller = Caller(host, Migration(router, args.migration_limit), args.instance, metrics)
        host.prepare = caller.dispatched
        yield caller


def parse_payload(text: str, field: str) -> object:
    try:
        return json.loads(text)
    except ValueError as error:
        raise UsageError(field, f"not JSON: {error}") from None


@attrs.define
class Progress:
    """A live line on stderr for long streams, drawn only when stderr is a terminal."""

    enabled: bool
    started: float = attrs.field(factory=time.monotonic)
    items: int = 0
    drawn_at: float = 0.0

    def item(self, workers: list[int]) -> None:
        self.items += 1
        now = time.monotonic()
        if not self.enabled or now - self.started < PROGRESS_AFTER:
            return
        if now - self.drawn_at >= PROGRESS_EVERY:
            self.drawn_at = now
            line = (
                f"{self.items} items, {now - self.started:.1f} s, worker {workers[-1]:x}, "
                f"{len(workers) - 1} migrations"
            )
            sys.stderr.write(f"\r\033[K{line}")
            sys.stderr.flush()

    def clear(self) -> None:
        if self.drawn_at:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


async def call(args: argparse.Namespace) -> int:
    """Print each item's data as a JSON line; exit 1 with the typed error if one ends it."""
    payload = parse_payload(args.request, "request")
    metrics = RouterMetrics()
    progress = Progress(sys.stderr.isatty())

    def on_item(data: object, workers: list[int]) -> None:
        print(json.dumps(data), flush=True)
        progress.item(workers)

    async with open_caller(args, metrics) as caller:
        error = await caller.stream(payload, on_item)
    progress.clear()
    if error is not None:
        print(f"routespec: request failed: {error}", file=sys.stderr)
        return 1
    return 0


async def router(args: argparse.Namespace) -> int:
    """Each stdin line is a request (JSON), sent at once; stdout gets JSON lines
    ``{"request": n, "data": ...}``, then ``{"request": n, "done": true}`` or
    ``{"request": n, "error": ..., "type": ...}``. Ends after stdin closes and all are done."""
    metrics = RouterMetrics()
    with serving_metrics(metrics, args.metrics_port, args.metrics_host) as metrics_url:
        async with open_caller(args, metrics) as caller, trio.open_nursery() as nursery:
            print(json.dumps({"ready": True, "metrics": metrics_url}), flush=True)
            number = 0
            while line := await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True):
                if line.strip():
                    nursery.start_soon(_route_one, caller, number, line)
                    number += 1
    return 0


async def _route_one(caller: Caller, number: int, line: str) -> None:
    def emit(**fields: object) -> None:
        print(json.dumps({"request": number, **fields}), flush=True)

    try:
        payload: object = json.loads(line)
    except ValueError as failure:
        error: RoutingError | None = RoutingError(
            ErrorKind.INVALID_ARGUMENT, f"request line is not JSON: {failure}"
        )
    else:
        error = await caller.stream(payload, lambda data, _workers: emit(data=data))
    if error is None:
        emit(done=True)
    else:
        emit(error=str(error), type=error_kind(error))
