"""The error model (spec/errors.md) restated as plain Python: the oracle the ERR checks use.

This module is deliberately independent of ``routespec.errors``: it is a second statement of
the ERR rules, written from the spec's tables and sentences, so that a check compares the
target against the spec rather than against the reference's own code.

Types are spelled as the spec spells them: ``"CannotConnect"`` or ``"Backend(EngineShutdown)"``.
An untyped link is ``None``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

# --- ERR-001: the closed set of types ---

PLAIN_TYPES: tuple[str, ...] = (
    "InvalidArgument",
    "CannotConnect",
    "Disconnected",
    "ConnectionTimeout",
    "ResponseTimeout",
    "Cancelled",
    "ResourceExhausted",
    "WorkerOverloaded",
    "Unavailable",
    "WorkerUnavailable",
    "Unknown",
)
BACKEND_KINDS: tuple[str, ...] = (
    "Unknown",
    "InvalidArgument",
    "CannotConnect",
    "Disconnected",
    "ConnectionTimeout",
    "ResponseTimeout",
    "Cancelled",
    "EngineShutdown",
    "StreamIncomplete",
)


def backend(kind: str) -> str:
    """The label of ``Backend(kind)``."""
    return f"Backend({kind})"


TYPE_LABELS: tuple[str, ...] = PLAIN_TYPES + tuple(backend(kind) for kind in BACKEND_KINDS)
"""Every type label of the closed set (ERR-001), plain types first."""

# --- ERR-003: normalised classes ---

CLASSES: tuple[str, ...] = (
    "Internal",
    "InvalidRequest",
    "Unavailable",
    "DeadlineExceeded",
    "CapacityExhausted",
    "Cancelled",
)

_PLAIN_CLASS: dict[str, str] = {
    "InvalidArgument": "InvalidRequest",
    "CannotConnect": "Unavailable",
    "Disconnected": "Unavailable",
    "ConnectionTimeout": "DeadlineExceeded",
    "ResponseTimeout": "DeadlineExceeded",
    "Cancelled": "Cancelled",
    "ResourceExhausted": "CapacityExhausted",
    "WorkerOverloaded": "CapacityExhausted",
    "Unavailable": "Unavailable",
    "WorkerUnavailable": "Unavailable",
    "Unknown": "Internal",
}
_BACKEND_CLASS: dict[str, str] = {
    "Unknown": "Internal",
    "InvalidArgument": "InvalidRequest",
    "CannotConnect": "Unavailable",
    "Disconnected": "Unavailable",
    "EngineShutdown": "Unavailable",
    "StreamIncomplete": "Unavailable",
    "ConnectionTimeout": "DeadlineExceeded",
    "ResponseTimeout": "DeadlineExceeded",
    "Cancelled": "Cancelled",
}

CLASS_OF: dict[str, str] = {
    **_PLAIN_CLASS,
    **{backend(kind): cls for kind, cls in _BACKEND_CLASS.items()},
}
"""The normalised class of every type label (ERR-003)."""

# --- ERR-004: reasons ---

_PLAIN_REASON: dict[str, str] = {
    "InvalidArgument": "request.invalid_argument",
    "CannotConnect": "transport.cannot_connect",
    "Disconnected": "transport.disconnected",
    "ConnectionTimeout": "transport.connection_timeout",
    "ResponseTimeout": "backend.response_timeout",
    "Cancelled": "request.cancelled",
    "ResourceExhausted": "capacity.pool_exhausted",
    "WorkerOverloaded": "capacity.worker_overloaded",
    "Unavailable": "backend.unavailable",
    "WorkerUnavailable": "backend.worker_unavailable",
    "Unknown": "runtime.unclassified",
}


def snake_case(name: str) -> str:
    """``EngineShutdown`` -> ``engine_shutdown``: an underscore before each inner capital."""
    out: list[str] = []
    for position, char in enumerate(name):
        if char.isupper() and position > 0:
            out.append("_")
        out.append(char.lower())
    return "".join(out)


DEFAULT_REASON: dict[str, str] = {
    **_PLAIN_REASON,
    **{backend(kind): "backend." + snake_case(kind) for kind in BACKEND_KINDS},
}
"""The default reason of every type label (ERR-004)."""

REASON_PATTERN = re.compile(r"[a-z0-9._-]{1,128}")
"""What every reason must be (ERR-004); use ``fullmatch``."""

UNCLASSIFIED = ("Internal", "runtime.unclassified")
"""Class and reason of a chain with no typed link (ERR-005)."""

# --- fault detection's inhibiting types (spec/fault-detection.md) ---

INHIBITING_TYPES: frozenset[str] = frozenset(
    {
        "CannotConnect",
        "Disconnected",
        "ConnectionTimeout",
        "ResponseTimeout",
        "WorkerUnavailable",
        backend("EngineShutdown"),
        backend("StreamIncomplete"),
    }
)

# --- migration-sensitive types (spec/transport.md TRN-005, shared with MIG) ---

MIGRATION_SENSITIVE_TYPES: frozenset[str] = frozenset(
    {"Cancelled", "ResourceExhausted", backend("Cancelled")}
)


def pre_stream_chain(worker_chain: Sequence[str | None]) -> tuple[str | None, ...]:
    """What a caller sees when a worker fails before its first item (TRN-005): an outer
    CannotConnect, with the worker's chain as cause only when no link is sensitive."""
    if any(label in MIGRATION_SENSITIVE_TYPES for label in worker_chain):
        return ("CannotConnect",)
    return ("CannotConnect", *worker_chain)


MIGRATABLE_TYPES: frozenset[str] = frozenset(
    {
        "CannotConnect",
        "Disconnected",
        "ConnectionTimeout",
        "ResponseTimeout",
        "WorkerOverloaded",
        "WorkerUnavailable",
        *(
            backend(kind)
            for kind in (
                "CannotConnect",
                "Disconnected",
                "ConnectionTimeout",
                "ResponseTimeout",
                "EngineShutdown",
                "StreamIncomplete",
            )
        ),
    }
)
"""Types that make a failure migratable when no link blocks it (spec/migration.md)."""


def migratable(chain: Sequence[str | None]) -> bool:
    """MIG-001/002/003: a migratable link and no blocking (migration-sensitive) link."""
    labels = set(chain)
    return bool(labels & MIGRATABLE_TYPES) and not labels & MIGRATION_SENSITIVE_TYPES


REJECTION_TYPES = {True: "WorkerOverloaded", False: "WorkerUnavailable"}
"""The error a rejection ACK becomes, by ``Reject.overloaded`` (TRN-004)."""

# --- the rules ---


def typed(chain: Sequence[str | None]) -> list[str]:
    """The typed links of a chain, outermost first (untyped links skipped, ERR-007)."""
    return [label for label in chain if label is not None]


def match_chain(
    chain: Sequence[str | None], include: Collection[str], exclude: Collection[str]
) -> bool:
    """``match_error_chain``: an include anywhere matches (ERR-009) unless an exclude anywhere
    vetoes it (ERR-008); untyped links count as neither (ERR-007); every link is read (ERR-002),
    to the 64th (ERR-010).
    """
    labels = typed(chain[:MAX_CHAIN_LINKS])  # ERR-010
    if any(label in exclude for label in labels):
        return False
    return any(label in include for label in labels)


def classify(chain: Sequence[str | None]) -> tuple[str, str]:
    """(class, reason) of an error whose links are ``chain``, outermost first, all reasons
    defaulted: the first typed link decides (ERR-003, ERR-004, ERR-005)."""
    labels = typed(chain)
    if not labels:
        return UNCLASSIFIED
    first = labels[0]
    return CLASS_OF[first], DEFAULT_REASON[first]


# --- ERR-006: bounded messages ---

MAX_MESSAGE_BYTES = 4096
MAX_CHAIN_LINKS = 64  # ERR-010
TRUNCATION_MARKER = "...[truncated]"


def message_bound_violation(original: str, bounded: str) -> str | None:
    """Why ``bounded`` is not an ERR-006-conforming bound of ``original`` (None when it is).

    A message of at most 4096 UTF-8 bytes is kept unchanged; a longer one is cut: the result
    is at most 4096 bytes, ends in ``...[truncated]``, and what precedes the marker is a
    prefix of the original.
    """
    size = len(original.encode())
    if size <= MAX_MESSAGE_BYTES:
        if bounded != original:
            return f"a message of {size} bytes must be kept unchanged, got {bounded[:80]!r}..."
        return None
    out_size = len(bounded.encode())
    if out_size > MAX_MESSAGE_BYTES:
        return f"a message of {size} bytes was bounded to {out_size} bytes (> 4096)"
    if not bounded.endswith(TRUNCATION_MARKER):
        return f"a message of {size} bytes was cut without the marker: ends {bounded[-30:]!r}"
    kept = bounded[: -len(TRUNCATION_MARKER)]
    if not original.startswith(kept):
        return f"a message of {size} bytes was not cut to a prefix of itself"
    return None
