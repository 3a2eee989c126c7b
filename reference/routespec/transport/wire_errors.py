"""Typed errors in Dynamo's wire shape, both ways (TRN-011): written as TRN-032 says, read
as TRN-034 says.

A link is ``{"error_type", "class", "reason", "message", "caused_by"?}``. ``error_type`` is
the legacy type (``"CannotConnect"``, ``{"Backend": "EngineShutdown"}``) or ``null`` for an
untyped link. ``WorkerOverloaded`` travels as ``ResourceExhausted`` with the reason
``capacity.worker_overloaded``, as Dynamo writes it, and is restored from that reason.
An ``InvalidArgument`` link also carries ``"public": {"type": "message", "message"}``, as
Dynamo writes for its typed ``InvalidArgument``: without it Dynamo's Python client raises a
plain ``ValueError("InvalidRequest: ...")`` instead of ``InvalidArgument``.
"""

from __future__ import annotations

from routespec.errors import (
    MAX_CHAIN_LINKS,
    REASON,
    BackendKind,
    ErrorKind,
    ErrorType,
    RoutingError,
    default_reason_of,
    type_of_reason,
)

OVERLOADED_REASON = default_reason_of(ErrorKind.WORKER_OVERLOADED)
PUBLIC_TYPES: frozenset[ErrorType] = frozenset(
    {ErrorKind.INVALID_ARGUMENT, BackendKind.INVALID_ARGUMENT}
)  # messages meant for the end user

# Canonical class names Dynamo may write where a legacy type is expected.
_KIND_OF_CANONICAL = {
    "InvalidRequest": ErrorKind.INVALID_ARGUMENT,
    "DeadlineExceeded": ErrorKind.RESPONSE_TIMEOUT,
    "CapacityExhausted": ErrorKind.RESOURCE_EXHAUSTED,
    "Internal": ErrorKind.UNKNOWN,
}


def encode_error(error: RoutingError) -> dict[str, object]:
    """The wire shape of a chain, outermost link first; causes that are not typed errors
    (plain exceptions) are dropped."""
    shape: dict[str, object] = {
        "error_type": _encode_type(error.error_type),
        "class": error.error_class.value,
        "reason": error.reason,
        "message": error.message,
    }
    if error.error_type in PUBLIC_TYPES:
        shape["public"] = {"type": "message", "message": error.message}
    cause = error.__cause__
    if isinstance(cause, RoutingError):
        shape["caused_by"] = encode_error(cause)
    return shape


def _encode_type(error_type: ErrorType | None) -> object:
    if error_type is None:
        return None
    if isinstance(error_type, BackendKind):
        return {"Backend": error_type.value}
    if error_type is ErrorKind.WORKER_OVERLOADED:
        return ErrorKind.RESOURCE_EXHAUSTED.value
    return error_type.value


def decode_error(shape: object, depth: int = 0) -> RoutingError:
    """A ``RoutingError`` chain from its wire shape. Unknown types become untyped links;
    anything that is not an error object becomes one untyped link describing it."""
    if not isinstance(shape, dict):
        return RoutingError(None, f"malformed error item: {str(shape)[:200]}")
    message = shape.get("message")
    if not isinstance(message, str):
        diagnostic = shape.get("diagnostic")
        message = diagnostic if isinstance(diagnostic, str) else ""
    cause_shape = shape.get("caused_by")
    cause = None
    if cause_shape is not None and depth + 1 < MAX_CHAIN_LINKS:
        cause = decode_error(cause_shape, depth + 1)
    reason = shape.get("reason")
    error_type = _decode_type(shape.get("error_type"), reason)
    return RoutingError(error_type, message, cause=cause, reason=_explicit(error_type, reason))


def _explicit(error_type: ErrorType | None, reason: object) -> str | None:
    """The link's reason when it is valid and not its type's default: migration reads it
    (MIG-016), so a worker's ``capacity.exhausted`` must survive the wire."""
    if error_type is None or not isinstance(reason, str) or not REASON.fullmatch(reason):
        return None
    return None if reason == default_reason_of(error_type) else reason


def _decode_type(value: object, reason: object) -> ErrorType | None:
    if isinstance(value, dict) and len(value) == 1:
        backend = value.get("Backend")
        if isinstance(backend, str) and backend in BackendKind._value2member_map_:
            return BackendKind(backend)
        return None
    if not isinstance(value, str):
        return None
    if value == ErrorKind.RESOURCE_EXHAUSTED.value and reason == OVERLOADED_REASON:
        return ErrorKind.WORKER_OVERLOADED
    if value in ErrorKind._value2member_map_:
        return ErrorKind(value)
    return type_of_reason(reason) or _KIND_OF_CANONICAL.get(value)
