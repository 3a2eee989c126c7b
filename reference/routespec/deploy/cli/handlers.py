"""Serve a user's async-generator function (``--handler module:function``) as a worker."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import cast

import attrs

from routespec.deploy.cli.usage import UsageError
from routespec.deploy.metrics import Counts
from routespec.errors import BackendKind, RoutingError
from routespec.routing.streaming import Request

HandlerFunction = Callable[[object], AsyncIterator[object]]
FIELD = "--handler"
STOPPED_EARLY = "stream stopped before the handler finished"


def load_handler(spec: str) -> HandlerFunction:
    """The async-generator function ``module:function`` names, importable from the CWD too."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise UsageError(FIELD, f"expected module:function, got {spec!r}")
    if os.getcwd() not in sys.path:  # the console script's sys.path lacks it, unlike python -m
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
        function = getattr(module, name, None)
    except ImportError as error:
        raise UsageError(FIELD, f"cannot import {module_name!r}: {error}") from None
    except Exception as error:  # the module's code: a syntax error, or it raised as it ran
        raise UsageError(
            FIELD, f"cannot import {module_name!r}: {type(error).__name__}: {error}"
        ) from None
    if not inspect.isasyncgenfunction(function):
        raise UsageError(FIELD, f"{spec} is not an async generator function (async def + yield)")
    return cast("HandlerFunction", function)


@attrs.define
class FunctionHandler:
    """A ``WorkerHandler`` calling ``function(payload)`` per request and counting requests.

    An exception other than ``RoutingError`` becomes ``Backend(Unknown)``, as in Dynamo."""

    function: HandlerFunction
    metrics: Counts

    def admit(self, request: Request) -> None:
        return None

    async def start(self, request: Request) -> AsyncGenerator[object, None]:
        return self._items(request.payload)

    async def _items(self, payload: object) -> AsyncGenerator[object, None]:
        self.metrics.start()
        outcome: RoutingError | None = RoutingError(BackendKind.CANCELLED, STOPPED_EARLY)
        try:
            async for item in self.function(payload):
                yield item
            outcome = None
        except RoutingError as error:
            outcome = error
            raise
        except Exception as error:
            outcome = RoutingError(BackendKind.UNKNOWN, f"{type(error).__name__}: {error}")
            raise outcome from None
        finally:
            self.metrics.finish(outcome)
