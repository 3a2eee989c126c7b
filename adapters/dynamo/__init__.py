"""Adapter ``dynamo`` (the real runtime through its Python bindings) and the pieces it shares
with ``dynamo-wire``."""

from routespec.adapters.dynamo.bindings import ADAPTER

__all__ = ["ADAPTER"]
