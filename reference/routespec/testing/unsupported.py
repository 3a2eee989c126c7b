"""A base for targets: every capability-gated method refuses, naming the capability.

An adapter declares what it reaches in ``Adapter.capabilities`` and overrides those methods;
the suite never calls the others (their checks are SKIP), but the ``Target`` protocol still
wants them. Subclassing ``Unsupported`` gives the rest in one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NoReturn

from routespec.testing.target import (
    Capability,
    DiscoveryTarget,
    ErrorSpec,
    HeldConnection,
    HostConfig,
    LoadReport,
    LoadThresholds,
    ObservedError,
    RoutingHostTarget,
    WorkerBounds,
    WorkerScript,
    WorkerSetsView,
)


def _lacks(capability: Capability) -> NoReturn:
    raise NotImplementedError(capability.value)


class Unsupported:
    """Every capability-gated ``Target`` method, refusing; override what the adapter reaches."""

    def vanish_worker(self, worker_id: int) -> None:
        _lacks(Capability.VANISH_WORKER)

    def drain_worker(self, worker_id: int, grace_period: float) -> None:
        _lacks(Capability.DRAIN_WORKER)

    def pace_reads(self, paced: bool) -> None:
        _lacks(Capability.PACED_READS)

    def read(self, request_id: str, items: int = 1) -> None:
        _lacks(Capability.PACED_READS)

    def set_device(self, worker_id: int, device: str) -> None:
        _lacks(Capability.DEVICE_TYPES)

    def add_worker_process(self, script: WorkerScript) -> int:
        _lacks(Capability.KILL_WORKER_PROCESS)

    def announce_removal(self, worker_id: int, removed: bool) -> None:
        _lacks(Capability.ANNOUNCE_REMOVAL)

    def mark_overloaded(self, worker_id: int, overloaded: bool) -> None:
        _lacks(Capability.MARK_OVERLOADED)

    def report_down(self, worker_id: int) -> None:
        _lacks(Capability.REPORT_DOWN)

    def report_load(self, worker_id: int, report: LoadReport) -> None:
        _lacks(Capability.REPORT_LOAD)

    def check_load_thresholds(self, thresholds: LoadThresholds) -> ObservedError | None:
        _lacks(Capability.CHECK_LOAD_THRESHOLDS)

    def advance_time(self, seconds: float) -> None:
        _lacks(Capability.MOCK_CLOCK)

    def worker_sets(self) -> WorkerSetsView:
        _lacks(Capability.OBSERVE_WORKER_SETS)

    def occupancy(self) -> Mapping[int, int]:
        _lacks(Capability.OBSERVE_OCCUPANCY)

    def open_host(self, config: HostConfig) -> RoutingHostTarget | ObservedError:
        _lacks(Capability.ROUTING_HOST)

    def open_discovery(self) -> DiscoveryTarget:
        _lacks(Capability.DISCOVERY_STORE)

    def held_guards(self) -> int:
        _lacks(Capability.FIRST_RESPONSE_GUARD)

    def transport_inflight(self) -> int:
        _lacks(Capability.OBSERVE_INFLIGHT)

    def response_connections(self) -> int:
        _lacks(Capability.OBSERVE_INFLIGHT)

    def worker_bytes(self, worker_id: int) -> int:
        _lacks(Capability.OBSERVE_WORKER_BYTES)

    def control_message(self, request_id: str) -> Mapping[str, object] | None:
        _lacks(Capability.OBSERVE_CONTROL_MESSAGE)

    def control_words(self, request_id: str) -> Sequence[object]:
        _lacks(Capability.OBSERVE_CONTROL_MESSAGE)

    def send_raw(self, worker_id: int | None, data: bytes) -> None:
        _lacks(Capability.WIRE_TRANSPORT)

    def worker_path(self, worker_id: int) -> str:
        _lacks(Capability.RESPONSE_REUSE)

    def worker_address(self, worker_id: int) -> str:
        _lacks(Capability.WORKER_LIMITS)

    def reused_streams(self, worker_id: int) -> int:
        _lacks(Capability.RESPONSE_REUSE)

    def resolve_name(self, name: str, addresses: Sequence[str] | None) -> None:
        _lacks(Capability.SCRIPT_NAMES)

    def starve_caller(self, spare: int | None) -> None:
        _lacks(Capability.STARVE_CALLER)

    def add_bounded_worker(self, bounds: WorkerBounds) -> int:
        _lacks(Capability.WORKER_LIMITS)

    def open_file_limit(self, worker_id: int) -> int:
        _lacks(Capability.WORKER_LIMITS)

    def connect(self, worker_id: int) -> int:
        _lacks(Capability.WORKER_LIMITS)

    def write(self, connection: int, data: bytes) -> HeldConnection:
        _lacks(Capability.WORKER_LIMITS)

    def held(self, connection: int) -> HeldConnection:
        _lacks(Capability.WORKER_LIMITS)

    def disconnect(self, connection: int) -> None:
        _lacks(Capability.WORKER_LIMITS)

    def match_error_chain(
        self, chain: Sequence[str | None], include: Sequence[str], exclude: Sequence[str]
    ) -> bool:
        _lacks(Capability.ERROR_MODEL)

    def classify(self, error: ErrorSpec) -> tuple[str, str]:
        _lacks(Capability.ERROR_MODEL)

    def bounded_message(self, message: str) -> str:
        _lacks(Capability.ERROR_MODEL)
