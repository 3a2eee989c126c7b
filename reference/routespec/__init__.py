"""routespec: the reference implementation of the routespec routing, transport and migration spec.

The spec's layers are its packages, each importing only those before it in this list
(tests/test_layers.py enforces it): ``errors`` (ERR) -> ``discovery`` (instances and the
stores that publish them, DSC) -> ``routing`` (worker sets, occupancy, selection, fault
detection, exclusions, the streaming seam and the PushRouter: SET, SEL, DSP, FLT) ->
``transport`` (in process, and Dynamo 1.6.1's TCP wire: TRN) -> ``migration`` (MIG) -> ``host``
(the routing host: HST, AFF, MON, KVS) -> ``deploy`` (the command line, metrics, a demo).

``testing`` holds what exists to test a target (the target protocol, the portal, scripted and
drill workers), ``conformance`` the suite and its pytest plugin, ``adapters`` the shipped
adapters, and ``spec`` the normative Markdown the suite's registry is derived from.
"""

from routespec.discovery.instances import Discovery, Instance, MemoryDiscovery
from routespec.errors import (
    BackendKind,
    ErrorClass,
    ErrorKind,
    ErrorType,
    RoutingError,
    match_error_chain,
)
from routespec.routing.push_router import PushRouter, RouterStream
from routespec.routing.selection import RouterMode
from routespec.routing.streaming import Annotated, Request, StreamingDispatch
from routespec.routing.worker_sets import WorkerSets
from routespec.transport.in_process import InProcessDispatch

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
