"""Adapter ``dynamo`` (the real runtime through its Python bindings) and the pieces it shares
with ``dynamo-wire``.

``ADAPTER`` is imported on first use, so that the worker and client processes, which run
modules of this package, do not load the adapter's side (the suite's types, trio, attrs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from routespec.adapters.dynamo.bindings import ADAPTER

__all__ = ["ADAPTER"]


def __getattr__(name: str) -> object:
    if name == "ADAPTER":
        from routespec.adapters.dynamo.bindings import ADAPTER

        return ADAPTER
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
