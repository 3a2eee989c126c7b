"""Requests, response items and the ``StreamingDispatch`` seam: the final hop of a dispatch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import attrs

from routespec.discovery import Instance
from routespec.errors import RoutingError


@attrs.frozen
class Request:
    """One request as the router forwards it.

    ``annotations`` carry routing facts stamped by a ``prepare`` callback, such as the worker
    the request was prepared for (DSP-010).
    """

    request_id: str
    payload: object
    annotations: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen
class Annotated:
    """One response item: data, or a typed error item."""

    data: object = None
    error: RoutingError | None = None


class ItemStream(Protocol):
    """A response stream; ``aclose`` drops it early."""

    def __aiter__(self) -> ItemStream: ...

    async def __anext__(self) -> Annotated: ...

    async def aclose(self) -> None: ...


class StreamingDispatch(Protocol):
    """Sends a request to one resolved instance and returns its response stream.

    A failure before the stream exists is raised as a top-level typed ``RoutingError``; later
    failures are error items. Anything else would hide faults from fault detection.
    """

    async def generate(self, instance: Instance, request: Request) -> ItemStream: ...
