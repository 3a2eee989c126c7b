"""``routespec worker``: serve a handler, register it, and shut down gracefully on a signal.

On SIGTERM or SIGINT the worker withdraws its record first (routers stop choosing it), then
refuses new requests and lets open streams finish for ``--grace-period`` seconds; streams
still open then end with ``Backend(EngineShutdown)``, so their callers migrate them.
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import trio

from routespec.deploy.cli.handlers import FunctionHandler, load_handler
from routespec.deploy.metrics import RequestMetrics
from routespec.discovery.file_store import random_instance_id, transport_path
from routespec.discovery.instances import Instance
from routespec.discovery.url import open_store
from routespec.transport.worker_server import WorkerServer


@contextmanager
def serving_metrics(metrics: RequestMetrics, port: int | None, host: str) -> Iterator[str]:
    """Metrics on ``host:port`` for the block; yields the address, or ``-`` when off."""
    if port is None:
        yield "-"
        return
    bound, stop = metrics.serve(port, host)
    try:
        yield f"http://{host}:{bound}/metrics"
    finally:
        stop()


async def serve_worker(args: argparse.Namespace) -> None:
    function = load_handler(args.handler)
    store = open_store(args.discovery, args.ttl)
    await store.check()
    metrics = RequestMetrics("worker")
    server = WorkerServer(args.host, args.port)
    with (
        trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals,
        serving_metrics(metrics, args.metrics_port, args.metrics_host) as metrics_url,
    ):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            instance_id = random_instance_id()
            path = transport_path(args.endpoint, instance_id)
            address = server.serve(path, FunctionHandler(function, metrics))
            instance = Instance(instance_id, args.endpoint, address, args.device_type)
            async with store.registration(instance) as registration:
                print(
                    f"ready instance={instance_id:x} address={address} metrics={metrics_url}",
                    flush=True,
                )
                async for _signal in signals:
                    break
                await registration.withdraw()
                print("deregistered", flush=True)
                await server.drain(args.grace_period)
            server.kill()
    print("stopped", flush=True)
