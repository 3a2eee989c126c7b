"""Busy thresholds: the load monitor's overloaded verdicts from workers' load reports
(spec: SET-005, SET-006; Dynamo's ``LoadThresholdConfig`` and worker monitor)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import attrs

from routespec.errors import ErrorKind, RoutingError

DEFAULT_MAX_NUM_BATCHED_TOKENS = 10_000_000  # when a worker reports none (SET-005)
U64_MAX = 2**64 - 1  # the absolute threshold is Dynamo's u64


@attrs.frozen
class LoadReport:
    """A worker's load as the monitor last saw it. ``kv_total_blocks`` 0 means unknown."""

    active_decode_blocks: int = 0
    kv_total_blocks: int = 0
    active_prefill_tokens: int = 0
    max_num_batched_tokens: int | None = None


def _refuse(field: str, rule: str, value: object) -> RoutingError:
    return RoutingError(
        ErrorKind.INVALID_ARGUMENT,
        f"invalid load threshold config: {field} must be {rule}, got {value} (SET-006)",
    )


@attrs.frozen
class LoadThresholds:
    """The busy thresholds, each opt-in: ``None`` never marks a worker (SET-005).

    Construction refuses a value out of range, naming its field (SET-006).
    """

    active_decode_blocks_threshold: float | None = None
    active_prefill_tokens_threshold: int | None = None
    active_prefill_tokens_threshold_frac: float | None = None

    def __attrs_post_init__(self) -> None:
        decode = self.active_decode_blocks_threshold
        if decode is not None and not (math.isfinite(decode) and 0.0 <= decode <= 1.0):
            raise _refuse("active_decode_blocks_threshold", "between 0.0 and 1.0", decode)
        tokens = self.active_prefill_tokens_threshold
        if tokens is not None and not 0 <= tokens <= U64_MAX:
            raise _refuse("active_prefill_tokens_threshold", f"between 0 and {U64_MAX}", tokens)
        frac = self.active_prefill_tokens_threshold_frac
        if frac is not None and not (math.isfinite(frac) and frac >= 0.0):
            raise _refuse(
                "active_prefill_tokens_threshold_frac",
                "a finite value greater than or equal to 0.0",
                frac,
            )

    def overloads(self, report: LoadReport) -> bool:
        """Whether any configured check fires on ``report``; each comparison is strict."""
        decode = self.active_decode_blocks_threshold
        # Dynamo compares the product, not the ratio: the same rounding as its monitor.
        if (
            decode is not None
            and report.kv_total_blocks > 0
            and report.active_decode_blocks > decode * report.kv_total_blocks
        ):
            return True
        tokens = self.active_prefill_tokens_threshold
        if tokens is not None and report.active_prefill_tokens > tokens:
            return True
        frac = self.active_prefill_tokens_threshold_frac
        if frac is None:
            return False
        batched = report.max_num_batched_tokens
        limit = frac * (DEFAULT_MAX_NUM_BATCHED_TOKENS if batched is None else batched)
        return report.active_prefill_tokens > min(math.floor(limit), U64_MAX)  # Rust's `as u64`


def overloaded_by_load(
    reports: Mapping[int, LoadReport], thresholds: LoadThresholds
) -> frozenset[int]:
    """The workers whose latest report fires a configured check; unreported ones are not."""
    return frozenset(worker for worker, report in reports.items() if thresholds.overloads(report))


@attrs.define
class LoadMonitor:
    """Keeps each worker's latest load report and publishes the overloaded-by-load set as
    monitor verdicts through ``publish(worker, overloaded)`` (SET-003, SET-005).

    Only changed verdicts are published, so verdicts other monitors set on other workers
    stay as they are.
    """

    thresholds: LoadThresholds
    publish: Callable[[int, bool], None]
    _reports: dict[int, LoadReport] = attrs.field(factory=dict)
    _published: frozenset[int] = frozenset()

    def report(self, worker: int, report: LoadReport) -> None:
        """A worker's load report arrives; it replaces the worker's earlier one."""
        self._reports[worker] = report
        overloaded = overloaded_by_load(self._reports, self.thresholds)
        for changed in sorted(overloaded ^ self._published):
            self.publish(changed, changed in overloaded)
        self._published = overloaded
