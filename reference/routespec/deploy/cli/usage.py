"""The command-line errors: a bad argument or an unusable resource, reported in one line
naming it, exit code 2; and an internal error (a bug), reported with its traceback, exit code
``INTERNAL_ERROR_EXIT``."""

from __future__ import annotations

import errno
import importlib

USAGE_EXIT = 2
INTERNAL_ERROR_EXIT = 70  # sysexits' EX_SOFTWARE: an internal software error
# the errors of a bind that the port, not the host, is at fault for
PORT_ERRNOS = frozenset({errno.EADDRINUSE, errno.EACCES})
# what binding raises for a host it cannot use: no such address, or a name that cannot be
# encoded (IDNA refuses an empty label or one over 63 characters)
BindError = OSError | UnicodeError


class InternalError(Exception):
    """A command found that an outcome was lost below it (a bug)."""


class UsageError(Exception):
    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


def missing_extra(field: str, extra: str) -> UsageError:
    """The error for an option that needs an optional part of routespec not installed."""
    return UsageError(field, f"needs the {extra!r} extra: pip install 'routespec[{extra}]'")


def require_extra(module: str, field: str, extra: str) -> None:
    """Fail with ``missing_extra`` unless ``module`` (from the extra) can be imported."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name != module:
            raise
        raise missing_extra(field, extra) from None


def _sole(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


def sole_os_error(error: BaseException) -> OSError | None:
    """The one ``OSError`` that ``error`` is, or that nested groups of one hold."""
    error = _sole(error)
    return error if isinstance(error, OSError) else None


def sole_bind_error(error: BaseException) -> BindError | None:
    """The one error of a failed bind (``BindError``) that ``error`` is, or that nested groups
    of one hold."""
    error = _sole(error)
    return error if isinstance(error, BindError) else None


def bind_failure(error: BindError, address: tuple[str, str], port: tuple[str, int]) -> UsageError:
    """A listener that could not bind, blamed on its port option (in use, privileged) or
    else on its host option; ``address`` and ``port`` are (option, value) pairs."""
    (host_field, host), (port_field, number) = address, port
    if isinstance(error, UnicodeError):
        return UsageError(host_field, f"cannot listen on {host!r}: not a usable host name")
    reason = error.strerror or str(error)
    if error.errno in PORT_ERRNOS:
        return UsageError(port_field, f"cannot listen on {host}:{number}: {reason}")
    return UsageError(host_field, f"cannot listen on {host!r}: {reason}")
