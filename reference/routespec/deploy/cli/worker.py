"""``routespec worker``: serve a handler, register it, and shut down gracefully on a signal.

On SIGTERM or SIGINT the worker withdraws its record first (routers stop choosing it), then
refuses new requests and lets open streams finish for ``--grace-period`` seconds; streams
still open then end with ``Backend(EngineShutdown)``, so their callers migrate them.
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import trio

from routespec.deploy import metrics as prometheus
from routespec.deploy.cli.handlers import FunctionHandler, load_handler
from routespec.deploy.cli.usage import bind_failure, require_extra, sole_os_error
from routespec.deploy.metrics import Counts, NoMetrics, RequestMetrics
from routespec.discovery.file_store import random_instance_id, transport_path
from routespec.discovery.instances import Instance
from routespec.discovery.url import open_store
from routespec.transport.worker_server import WorkerServer

Metrics = TypeVar("Metrics", bound=RequestMetrics)
METRICS_PORT, METRICS_HOST = "--metrics-port", "--metrics-host"


def metrics_for(args: argparse.Namespace, make: Callable[[], Metrics]) -> Metrics | NoMetrics:
    """The process's metrics: Prometheus ones with ``--metrics-port`` (which needs the
    ``metrics`` extra), else ``NoMetrics``."""
    if args.metrics_port is None:
        return NoMetrics()
    require_extra(prometheus.MODULE, METRICS_PORT, prometheus.EXTRA)
    return make()


@contextmanager
def serving_metrics(metrics: Counts, args: argparse.Namespace) -> Iterator[str]:
    """Serve ``metrics`` on ``--metrics-host:--metrics-port`` for the block; yields the
    address, or ``-`` when the process serves none."""
    if not isinstance(metrics, RequestMetrics):
        yield "-"
        return
    host, port = args.metrics_host, args.metrics_port
    try:
        bound, stop = metrics.serve(port, host)
    except OSError as error:
        raise bind_failure(error, (METRICS_HOST, host), (METRICS_PORT, port)) from None
    try:
        yield f"http://{host}:{bound}/metrics"
    finally:
        stop()


async def serve_worker(args: argparse.Namespace) -> None:
    function = load_handler(args.handler)
    metrics = metrics_for(args, lambda: RequestMetrics("worker"))
    store = open_store(args.discovery, args.ttl)
    await store.check()
    server = WorkerServer(args.host, args.port)
    with (
        trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals,
        serving_metrics(metrics, args) as metrics_url,
    ):
        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(server.run)
            except (OSError, BaseExceptionGroup) as error:
                if (bind_error := sole_os_error(error)) is None:
                    raise
                host, port = ("--host", args.host), ("--port", args.port)
                raise bind_failure(bind_error, host, port) from None
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
