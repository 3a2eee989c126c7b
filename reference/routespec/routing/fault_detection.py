"""Fault detection: inhibit workers on transport faults, lease overload marks (spec: FLT)."""

from __future__ import annotations

from routespec.errors import BackendKind, ErrorKind, ErrorType, match_error_chain
from routespec.routing.worker_sets import WorkerSets

INHIBITING_TYPES: frozenset[ErrorType] = frozenset(
    {
        ErrorKind.CANNOT_CONNECT,
        ErrorKind.DISCONNECTED,
        ErrorKind.CONNECTION_TIMEOUT,
        ErrorKind.RESPONSE_TIMEOUT,
        ErrorKind.WORKER_UNAVAILABLE,
        BackendKind.ENGINE_SHUTDOWN,
        BackendKind.STREAM_INCOMPLETE,
    }
)  # FLT-001


def observe_fault(worker_sets: WorkerSets, instance_id: int, error: BaseException) -> None:
    """React to a worker's failure; the caller still sees the error unchanged (FLT-007).

    Errors with neither an inhibiting type nor WorkerOverloaded change nothing (FLT-006).
    """
    if match_error_chain(error, INHIBITING_TYPES):
        worker_sets.report_instance_down(instance_id)  # FLT-001
    elif match_error_chain(error, {ErrorKind.WORKER_OVERLOADED}):
        worker_sets.mark_overloaded(instance_id)  # FLT-004
