"""Workers a request must not reach again, shared by all of its attempts (MIG-010, MIG-012).

The router records a worker here before the failure it caused becomes visible to the
caller, so a retry that reacts to the failure can never pick the same worker.

When every eligible worker has failed, the error that ends migration names each of them and
its failure on untyped links below its own (TMO-011): the reader learns why each attempt
failed, and classification, which skips untyped links (ERR-007), still sees one pool-level
type that migration does not retry.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from routespec.errors import ErrorKind, RoutingError, error_chain, match_error_chain

ALL_OVERLOADED = "all eligible workers rejected the request as overloaded"
NONE_UNTRIED = "no untried eligible worker remains after migration"


def describe_chain(error: BaseException) -> str:
    """``Type: message <- Type: message …``, outermost first, one line."""
    return " <- ".join(str(link) for link in error_chain(error))


def attempt_failure(worker_id: int, error: BaseException) -> RoutingError:
    """An untyped link naming ``worker_id`` (in hex, as ``routespec instances`` lists it) and
    its failure with its type chain (TMO-011)."""
    return RoutingError(None, f"worker {worker_id:x} failed: {describe_chain(error)}")


@attrs.define
class Exclusions:
    failed: dict[int, RoutingError] = attrs.field(factory=dict)
    last_error: RoutingError | None = None

    def record(self, worker_id: int, error: RoutingError) -> None:
        """Once per worker, keeping its latest error."""
        self.failed[worker_id] = error
        self.last_error = error

    def __bool__(self) -> bool:
        return bool(self.failed)

    def eligible(self, worker_ids: Iterable[int]) -> list[int]:
        return [i for i in worker_ids if i not in self.failed]

    def exhausted(self) -> RoutingError:
        """Every eligible worker has been tried: pool-level, so migration ends (MIG-012),
        with each failed worker's failure on the untyped links below (TMO-011)."""
        if self.last_error is not None and match_error_chain(
            self.last_error, [ErrorKind.WORKER_OVERLOADED]
        ):
            ending = RoutingError(ErrorKind.RESOURCE_EXHAUSTED, ALL_OVERLOADED)
        else:
            ending = RoutingError(ErrorKind.UNAVAILABLE, NONE_UNTRIED)
        link = ending
        for worker_id, error in self.failed.items():  # in the order the workers first failed
            cause = attempt_failure(worker_id, error)
            link.__cause__ = cause
            link = cause
        return ending
