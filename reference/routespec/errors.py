"""Typed errors, their normalised classes and reasons, and cause-chain matching (spec: ERR)."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Iterator

MAX_MESSAGE_BYTES = 4096  # ERR-006
TRUNCATION_MARKER = "...[truncated]"
MAX_CHAIN_LINKS = 64  # ERR-010: chain walks stop here, even over a cyclic __cause__ graph


class ErrorKind(enum.Enum):
    """The legacy error types a runtime reports (ERR-001)."""

    INVALID_ARGUMENT = "InvalidArgument"
    CANNOT_CONNECT = "CannotConnect"
    DISCONNECTED = "Disconnected"
    CONNECTION_TIMEOUT = "ConnectionTimeout"
    RESPONSE_TIMEOUT = "ResponseTimeout"
    CANCELLED = "Cancelled"
    RESOURCE_EXHAUSTED = "ResourceExhausted"
    WORKER_OVERLOADED = "WorkerOverloaded"
    UNAVAILABLE = "Unavailable"
    WORKER_UNAVAILABLE = "WorkerUnavailable"
    UNKNOWN = "Unknown"


class BackendKind(enum.Enum):
    """The engine-side failures carried as ``Backend(...)`` (ERR-001)."""

    UNKNOWN = "Unknown"
    INVALID_ARGUMENT = "InvalidArgument"
    CANNOT_CONNECT = "CannotConnect"
    DISCONNECTED = "Disconnected"
    CONNECTION_TIMEOUT = "ConnectionTimeout"
    RESPONSE_TIMEOUT = "ResponseTimeout"
    CANCELLED = "Cancelled"
    ENGINE_SHUTDOWN = "EngineShutdown"
    STREAM_INCOMPLETE = "StreamIncomplete"


ErrorType = ErrorKind | BackendKind
"""A typed error is either a legacy kind or ``Backend(kind)``."""


class ErrorClass(enum.Enum):
    """Normalised classes that callers and HTTP front ends see (ERR-003)."""

    INTERNAL = "Internal"
    INVALID_REQUEST = "InvalidRequest"
    UNAVAILABLE = "Unavailable"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    CAPACITY_EXHAUSTED = "CapacityExhausted"
    CANCELLED = "Cancelled"


_CLASS_OF_KIND: dict[ErrorKind, ErrorClass] = {
    ErrorKind.INVALID_ARGUMENT: ErrorClass.INVALID_REQUEST,
    ErrorKind.CANNOT_CONNECT: ErrorClass.UNAVAILABLE,
    ErrorKind.DISCONNECTED: ErrorClass.UNAVAILABLE,
    ErrorKind.CONNECTION_TIMEOUT: ErrorClass.DEADLINE_EXCEEDED,
    ErrorKind.RESPONSE_TIMEOUT: ErrorClass.DEADLINE_EXCEEDED,
    ErrorKind.CANCELLED: ErrorClass.CANCELLED,
    ErrorKind.RESOURCE_EXHAUSTED: ErrorClass.CAPACITY_EXHAUSTED,
    ErrorKind.WORKER_OVERLOADED: ErrorClass.CAPACITY_EXHAUSTED,
    ErrorKind.UNAVAILABLE: ErrorClass.UNAVAILABLE,
    ErrorKind.WORKER_UNAVAILABLE: ErrorClass.UNAVAILABLE,
    ErrorKind.UNKNOWN: ErrorClass.INTERNAL,
}
_CLASS_OF_BACKEND: dict[BackendKind, ErrorClass] = {
    BackendKind.UNKNOWN: ErrorClass.INTERNAL,
    BackendKind.INVALID_ARGUMENT: ErrorClass.INVALID_REQUEST,
    BackendKind.CANNOT_CONNECT: ErrorClass.UNAVAILABLE,
    BackendKind.DISCONNECTED: ErrorClass.UNAVAILABLE,
    BackendKind.CONNECTION_TIMEOUT: ErrorClass.DEADLINE_EXCEEDED,
    BackendKind.RESPONSE_TIMEOUT: ErrorClass.DEADLINE_EXCEEDED,
    BackendKind.CANCELLED: ErrorClass.CANCELLED,
    BackendKind.ENGINE_SHUTDOWN: ErrorClass.UNAVAILABLE,
    BackendKind.STREAM_INCOMPLETE: ErrorClass.UNAVAILABLE,
}
_REASON_OF_KIND: dict[ErrorKind, str] = {
    ErrorKind.INVALID_ARGUMENT: "request.invalid_argument",
    ErrorKind.CANNOT_CONNECT: "transport.cannot_connect",
    ErrorKind.DISCONNECTED: "transport.disconnected",
    ErrorKind.CONNECTION_TIMEOUT: "transport.connection_timeout",
    ErrorKind.RESPONSE_TIMEOUT: "backend.response_timeout",
    ErrorKind.CANCELLED: "request.cancelled",
    ErrorKind.RESOURCE_EXHAUSTED: "capacity.pool_exhausted",
    ErrorKind.WORKER_OVERLOADED: "capacity.worker_overloaded",
    ErrorKind.UNAVAILABLE: "backend.unavailable",
    ErrorKind.WORKER_UNAVAILABLE: "backend.worker_unavailable",
    ErrorKind.UNKNOWN: "runtime.unclassified",
}
UNCLASSIFIED_REASON = "runtime.unclassified"
REASON = re.compile(r"[a-z0-9._-]{1,128}")  # ERR-004


def error_class_of(error_type: ErrorType) -> ErrorClass:
    """The normalised class of a typed error (ERR-003)."""
    if isinstance(error_type, ErrorKind):
        return _CLASS_OF_KIND[error_type]
    return _CLASS_OF_BACKEND[error_type]


def default_reason_of(error_type: ErrorType) -> str:
    """The default machine-readable reason of a typed error (ERR-004)."""
    if isinstance(error_type, ErrorKind):
        return _REASON_OF_KIND[error_type]
    return "backend." + _snake(error_type.value)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def type_label(error_type: ErrorType) -> str:
    """``CannotConnect`` or ``Backend(EngineShutdown)``: the spec's spelling of a type."""
    if isinstance(error_type, ErrorKind):
        return error_type.value
    return f"Backend({error_type.value})"


def parse_type_label(label: str) -> ErrorType:
    """Inverse of :func:`type_label`; raises ``ValueError`` naming the label."""
    if label.startswith("Backend(") and label.endswith(")"):
        return BackendKind(label[len("Backend(") : -1])
    return ErrorKind(label)


def bound_message(message: str) -> str:
    """Truncate a message to at most 4096 UTF-8 bytes, marking the cut (ERR-006). A lone
    surrogate, which UTF-8 cannot encode, becomes one U+FFFD per byte of its surrogate-escaped
    form, as Dynamo 1.6.1 writes a Python exception's message: every codec can write the
    message of an error item (TRN-023)."""
    try:
        encoded = message.encode()
    except UnicodeEncodeError:
        message = message.encode(errors="surrogatepass").decode(errors="replace")
        encoded = message.encode()
    if len(encoded) <= MAX_MESSAGE_BYTES:
        return message
    keep = MAX_MESSAGE_BYTES - len(TRUNCATION_MARKER.encode())
    return encoded[:keep].decode(errors="ignore") + TRUNCATION_MARKER


class RoutingError(Exception):
    """A routing, transport or worker failure.

    ``error_type`` is None for an untyped error: its class and reason then come from the
    first typed link of its cause chain, or are Internal / runtime.unclassified (ERR-005).
    The cause is Python's ``__cause__``, so ``raise RoutingError(...) from cause`` chains.
    """

    def __init__(
        self,
        error_type: ErrorType | None,
        message: str,
        *,
        cause: BaseException | None = None,
        reason: str | None = None,
    ) -> None:
        if reason is not None and (error_type is None or not REASON.fullmatch(reason)):
            raise ValueError(f"reason {reason!r} needs a type and [a-z0-9._-]{{1,128}} (ERR-004)")
        self.error_type = error_type
        self.explicit_reason = reason
        """A reason other than the type's default, as a worker or a newer runtime wrote it."""
        self.message = bound_message(message)
        super().__init__(self.message)
        if cause is not None:
            self.__cause__ = cause

    @property
    def error_class(self) -> ErrorClass:
        typed = self.first_typed_link()
        return ErrorClass.INTERNAL if typed is None else error_class_of(_type_of(typed))

    @property
    def reason(self) -> str:
        typed = self.first_typed_link()
        if typed is None:
            return UNCLASSIFIED_REASON
        return link_reason(typed)  # ERR-004

    def first_typed_link(self) -> RoutingError | None:
        return next((link for link in typed_links(self)), None)

    def __str__(self) -> str:
        label = "untyped" if self.error_type is None else type_label(self.error_type)
        return f"{label}: {self.message}"

    def __repr__(self) -> str:
        return f"RoutingError({self})"


def _type_of(error: RoutingError) -> ErrorType:
    assert error.error_type is not None
    return error.error_type


def error_chain(error: BaseException) -> Iterator[BaseException]:
    """The error, then each ``__cause__`` in turn; bounded and cycle-safe (ERR-002)."""
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen and len(seen) < MAX_CHAIN_LINKS:
        seen.add(id(link))
        yield link
        link = link.__cause__


def typed_links(error: BaseException) -> Iterator[RoutingError]:
    """Links of the chain that carry a type (untyped links are skipped, ERR-007)."""
    for link in error_chain(error):
        if isinstance(link, RoutingError) and link.error_type is not None:
            yield link


def chain_types(error: BaseException) -> tuple[ErrorType, ...]:
    """The types of the chain's typed links, outermost first."""
    return tuple(_type_of(link) for link in typed_links(error))


def link_reason(link: RoutingError) -> str:
    """A typed link's own reason: the one it was given, else its type's default (ERR-004)."""
    return link.explicit_reason or default_reason_of(_type_of(link))


MIGRATION_BLOCKING_TYPES: frozenset[ErrorType] = frozenset(
    {ErrorKind.CANCELLED, ErrorKind.RESOURCE_EXHAUSTED, BackendKind.CANCELLED}
)
"""Types that veto migration wherever they appear in a chain. The transport withholds such a
cause from a pre-stream failure (TRN-005); migration refuses to retry them. One definition."""

MIGRATION_BLOCKING_REASONS: frozenset[str] = frozenset(
    {"request.cancelled", "backend.cancelled", "capacity.pool_exhausted", "capacity.exhausted"}
)
"""Reasons that veto migration whatever the link's type, as Dynamo classifies (MIG-016); the
blocking types carry the first three by default, and ``capacity.exhausted`` is the reason of
the canonical ``CapacityExhausted`` class a newer runtime writes."""


def is_blocking_link(link: RoutingError) -> bool:
    """A typed link that vetoes migration: by its type or by its reason (MIG-001, MIG-016)."""
    return _type_of(link) in MIGRATION_BLOCKING_TYPES or (
        link_reason(link) in MIGRATION_BLOCKING_REASONS
    )


def is_migration_sensitive(error: BaseException) -> bool:
    """True when any typed link of the chain blocks migration, by type or reason (TRN-006)."""
    return any(is_blocking_link(link) for link in typed_links(error))


def one_line(error: BaseException) -> str:
    """``Type: message`` on one line, each leaf of an exception group in turn."""
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(one_line(leaf) for leaf in error.exceptions)
    return " ".join(f"{type(error).__name__}: {error}".split())[:500]


def type_of_reason(reason: object) -> ErrorType | None:
    """The type whose default reason is ``reason``: how a link that names only a reason
    (a newer runtime's canonical class) keeps its meaning."""
    return _TYPE_OF_REASON.get(reason) if isinstance(reason, str) else None


_TYPE_OF_REASON: dict[str, ErrorType] = {
    default_reason_of(error_type): error_type
    for error_type in (*BackendKind, *ErrorKind)
    if error_type is not ErrorKind.UNKNOWN
}


def match_error_chain(
    error: BaseException, include: Iterable[ErrorType], exclude: Iterable[ErrorType] = ()
) -> bool:
    """True when a typed link is in ``include`` and no link anywhere is in ``exclude``.

    An exclude vetoes even when it comes after an earlier include (ERR-008); an include on
    any link matches (ERR-009).
    """
    included, excluded = frozenset(include), frozenset(exclude)
    found = False
    for error_type in chain_types(error):
        if error_type in excluded:
            return False
        if error_type in included:
            found = True
    return found
