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
from routespec.deploy.cli.usage import bind_failure, require_extra, sole_bind_error
from routespec.deploy.metrics import Counts, NoMetrics, RequestMetrics
from routespec.discovery.file_store import random_instance_id, transport_path
from routespec.discovery.instances import Instance
from routespec.discovery.url import open_store
from routespec.transport.control import DialBackPolicy
from routespec.transport.worker_server import (
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_BUFFERED_BYTES,
    WorkerLimits,
    WorkerServer,
    default_max_connections,
)

Metrics = TypeVar("Metrics", bound=RequestMetrics)
METRICS_PORT, METRICS_HOST = "--metrics-port", "--metrics-host"


def _count(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value!r}")
    return int(value)


def _timeout(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 < number < float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {value!r}")
    return number


def _dial_back(value: str) -> DialBackPolicy:
    try:
        return DialBackPolicy.parse(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_limit_options(worker: argparse.ArgumentParser) -> None:
    """``routespec worker``'s limits on what peers can hold of it (spec: TRN-024 … TRN-027)."""
    worker.add_argument(
        "--max-connections",
        type=_count,
        metavar="N",
        help="request-plane connections held at once; more are closed as soon as accepted "
        f"(default {default_max_connections()} here: 1024, or a quarter of the open-file "
        "limit when that is lower)",
    )
    worker.add_argument(
        "--idle-timeout",
        type=_timeout,
        default=DEFAULT_IDLE_TIMEOUT,
        metavar="SECONDS",
        help="close a request-plane connection on which nothing arrived for this long "
        "(default %(default)g)",
    )
    worker.add_argument(
        "--max-buffered-bytes",
        type=_count,
        default=DEFAULT_MAX_BUFFERED_BYTES,
        metavar="BYTES",
        help="request bytes buffered at once over all connections; a request that would "
        "exceed it is refused with 'Server overloaded' (default %(default)d: 64 MiB)",
    )
    worker.add_argument(
        "--dial-back-hosts",
        type=_dial_back,
        default=DialBackPolicy(),
        metavar="HOSTS",
        help="where response streams may be dialled: 'peer' (the address a request came "
        "from), IP addresses or networks such as 10.0.0.0/8, or 'any'; comma-separated "
        "(default peer)",
    )


def limits_from(args: argparse.Namespace) -> WorkerLimits:
    """The ``WorkerLimits`` the options ask for; an option the parser lacks keeps its default."""
    given = vars(args)
    max_connections = given.get("max_connections")
    return WorkerLimits(
        max_connections=default_max_connections() if max_connections is None else max_connections,
        idle_timeout=given.get("idle_timeout", DEFAULT_IDLE_TIMEOUT),
        max_buffered_bytes=given.get("max_buffered_bytes", DEFAULT_MAX_BUFFERED_BYTES),
        dial_back=given.get("dial_back_hosts", DialBackPolicy()),
    )


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
    except (OSError, UnicodeError) as error:
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
    server = WorkerServer(args.host, args.port, limits_from(args))
    with (
        trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals,
        serving_metrics(metrics, args) as metrics_url,
    ):
        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(server.run)
            except (OSError, UnicodeError, BaseExceptionGroup) as error:
                if (bind_error := sole_bind_error(error)) is None:
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
