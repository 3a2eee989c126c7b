"""routespec: the reference implementation of the routespec routing, transport and migration spec.

Modules follow the spec's layers, each importing only those above it in this list:
``errors`` (ERR) -> ``discovery`` / ``worker_sets`` (SET) -> ``occupancy`` / ``selection`` (SEL)
-> ``streaming`` / ``fault_detection`` / ``push_router`` (DSP, FLT) -> ``in_process`` /
``scripted`` and the ``transport`` package (TRN: Dynamo 1.6.1's TCP wire, the final hop)
-> ``exclusions`` / ``migration`` (MIG).
``target`` is the public protocol the conformance suite drives.
"""

from routespec.discovery import Discovery, Instance, MemoryDiscovery
from routespec.errors import (
    BackendKind,
    ErrorClass,
    ErrorKind,
    ErrorType,
    RoutingError,
    match_error_chain,
)
from routespec.in_process import InProcessDispatch
from routespec.push_router import PushRouter, RouterStream
from routespec.selection import RouterMode
from routespec.streaming import Annotated, Request, StreamingDispatch
from routespec.worker_sets import WorkerSets

__all__ = [
    "Annotated",
    "BackendKind",
    "Discovery",
    "ErrorClass",
    "ErrorKind",
    "ErrorType",
    "InProcessDispatch",
    "Instance",
    "MemoryDiscovery",
    "PushRouter",
    "Request",
    "RouterMode",
    "RouterStream",
    "RoutingError",
    "StreamingDispatch",
    "WorkerSets",
    "match_error_chain",
]
