"""Prometheus metrics of a router or a worker process, served on 127.0.0.1 by default.

Each process owns its registry (never the global one), so several routers or workers can
live in one test process. Names: ``routespec_<role>_<metric>``.

prometheus-client is the optional ``metrics`` extra: it is imported only when a
``RequestMetrics`` is made. A process that serves no metrics counts into ``NoMetrics``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from routespec.errors import RoutingError, type_label

if TYPE_CHECKING:
    from prometheus_client import Counter

LOOPBACK = "127.0.0.1"
OK, ERROR = "ok", "error"
MODULE = "prometheus_client"  # what the ``metrics`` extra installs
EXTRA = "metrics"


def error_kind(error: RoutingError) -> str:
    """The label of an error: its first typed link's type, or ``untyped``."""
    typed = error.first_typed_link()
    return "untyped" if typed is None or typed.error_type is None else type_label(typed.error_type)


class Counts(Protocol):
    """What a worker's handler reports: each request's start and end."""

    def start(self) -> None: ...

    def finish(self, error: RoutingError | None = None) -> None: ...


class RouterCounts(Counts, Protocol):
    """What a router also reports: each attempt's worker."""

    def dispatched(self, instance_id: int, *, migrated: bool) -> None: ...


class NoMetrics:
    """Counts nothing: the metrics of a process that serves none (no prometheus-client)."""

    def start(self) -> None:
        return None

    def finish(self, error: RoutingError | None = None) -> None:
        return None

    def dispatched(self, instance_id: int, *, migrated: bool) -> None:
        return None


class RequestMetrics:
    """Requests started, completed (by outcome) and in flight, and typed errors by kind."""

    def __init__(self, role: str) -> None:
        from prometheus_client import CollectorRegistry, Gauge  # the optional extra

        self.role = role
        self.registry = CollectorRegistry(auto_describe=True)
        self.started = self.counter("requests_started", "Requests started")
        self.completed = self.counter(
            "requests_completed", "Requests ended, by outcome (ok or error)", "outcome"
        )
        self.inflight = Gauge(
            "requests_inflight",
            "Requests started and not yet ended",
            namespace="routespec",
            subsystem=role,
            registry=self.registry,
        )
        self.errors = self.counter("errors", "Typed errors that ended a request, by kind", "kind")
        for outcome in (OK, ERROR):
            self.completed.labels(outcome)  # exported at 0 before the first request ends

    def counter(self, name: str, documentation: str, *labels: str) -> Counter:
        from prometheus_client import Counter

        return Counter(
            name,
            documentation,
            labels,
            namespace="routespec",
            subsystem=self.role,
            registry=self.registry,
        )

    def start(self) -> None:
        self.started.inc()
        self.inflight.inc()

    def finish(self, error: RoutingError | None = None) -> None:
        self.inflight.dec()
        self.completed.labels(OK if error is None else ERROR).inc()
        if error is not None:
            self.errors.labels(error_kind(error)).inc()

    def serve(self, port: int, host: str = LOOPBACK) -> tuple[int, Callable[[], None]]:
        """Serve ``/metrics`` on ``host:port`` (0 picks a free port); returns the port and
        the function that stops the server."""
        from prometheus_client import start_http_server

        server, thread = start_http_server(port, addr=host, registry=self.registry)

        def stop() -> None:
            server.shutdown()
            server.server_close()
            thread.join()

        return int(server.server_port), stop


class RouterMetrics(RequestMetrics):
    """A router's metrics: also its dispatches per worker and its migrations."""

    def __init__(self) -> None:
        super().__init__("router")
        self.dispatches = self.counter(
            "dispatches", "Attempts sent to a worker, by instance id (hex)", "instance"
        )
        self.migrations = self.counter(
            "migrations", "Attempts that continued a request on another worker"
        )

    def dispatched(self, instance_id: int, *, migrated: bool) -> None:
        self.dispatches.labels(f"{instance_id:x}").inc()
        if migrated:
            self.migrations.inc()
