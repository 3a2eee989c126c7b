"""Mutant: a replacement attempt gets the original request instead of the continued one.

After a mid-stream failure the next worker receives the original prompt and the original
``max_tokens``/``min_tokens``, so it regenerates tokens the client already has. It must fail
MIG-009.
"""

from __future__ import annotations

from collections.abc import Mapping

from routespec.adapters.reference import ReferenceAdapter
from routespec.migration import Migration

VIOLATES = ("MIG-009",)


class ResendsDeliveredTokens(Migration):
    def continued(self, payload: Mapping[str, object], delivered: list[int]) -> dict[str, object]:
        return dict(payload)


ADAPTER = ReferenceAdapter(
    name="mutant:migration-resends-delivered-tokens", migration_class=ResendsDeliveredTokens
)
