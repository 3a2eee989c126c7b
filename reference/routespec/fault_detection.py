"""Fault detection: inhibit workers on transport faults, lease overload marks (spec: FLT)."""

from __future__ import annotations

import attrs

from routespec.errors import BackendKind, ErrorKind, ErrorType, match_error_chain
from routespec.worker_sets import WorkerSets

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


@attrs.frozen
class FaultDetector:
    """Reacts to a worker's failure; never changes the error the caller sees (FLT-007)."""

    worker_sets: WorkerSets

    def observe(self, instance_id: int, error: BaseException) -> None:
        """Other errors leave the worker sets alone (FLT-006)."""
        if match_error_chain(error, INHIBITING_TYPES):
            self.worker_sets.report_instance_down(instance_id)  # FLT-001
        elif match_error_chain(error, {ErrorKind.WORKER_OVERLOADED}):
            self.worker_sets.mark_overloaded(instance_id)  # FLT-004
