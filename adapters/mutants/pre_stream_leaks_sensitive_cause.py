"""Mutant: a failure before the first item always keeps the worker's error as its cause.

The outer error is still ``CannotConnect``, but a migration-sensitive cause (``Cancelled``,
``ResourceExhausted``, ``Backend(Cancelled)``) is no longer withheld, so it leaks into the
caller's chain and can veto migration from deep inside it. It must fail TRN-006.

It breaks TRN-005's "if, and only if" too, but the suite's TRN-005 test checks TRN-006 first
on the same outcome and stops there, so the report attributes every failure to TRN-006 and
TRN-005 stays PASS; only TRN-006 is listed.
"""

from __future__ import annotations

from routespec.adapters.reference import Cluster, InProcessCluster, ReferenceAdapter
from routespec.errors import ErrorKind, RoutingError
from routespec.routing.streaming import PRE_STREAM_FAILURE
from routespec.testing.portal import TrioPortal
from routespec.transport.in_process import InProcessDispatch

VIOLATES = ("TRN-006",)


class LeakyPreStreamDispatch(InProcessDispatch):
    def pre_stream_failure(self, worker_error: RoutingError) -> RoutingError:
        message = PRE_STREAM_FAILURE + str(worker_error)
        return RoutingError(ErrorKind.CANNOT_CONNECT, message, cause=worker_error)


def leaky_cluster(portal: TrioPortal) -> Cluster:
    return InProcessCluster(transport=LeakyPreStreamDispatch())


ADAPTER = ReferenceAdapter(name="mutant:pre-stream-leaks-sensitive-cause", cluster=leaky_cluster)
