"""Mutant: migration treats ResourceExhausted as migratable instead of blocking.

A request the pool refused for lack of capacity is then sent around the pool again. It must
fail MIG-001.
"""

from __future__ import annotations

from routespec.adapters.reference import ReferenceAdapter
from routespec.errors import ErrorKind, RoutingError, match_error_chain
from routespec.migration import BLOCKING_TYPES, MIGRATABLE_TYPES, Migration

VIOLATES = ("MIG-001",)


class RetriesResourceExhausted(Migration):
    def is_migratable(self, failure: RoutingError) -> bool:
        return match_error_chain(
            failure,
            MIGRATABLE_TYPES | {ErrorKind.RESOURCE_EXHAUSTED},
            BLOCKING_TYPES - {ErrorKind.RESOURCE_EXHAUSTED},
        )


ADAPTER = ReferenceAdapter(
    name="mutant:migration-retries-resource-exhausted", migration_class=RetriesResourceExhausted
)
