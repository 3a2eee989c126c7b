"""Mutant: migration treats ResourceExhausted as migratable instead of blocking.

A request the pool refused for lack of capacity is then sent around the pool again. It must
fail MIG-001.
"""

from __future__ import annotations

from routespec.adapters.reference import ReferenceAdapter
from routespec.errors import MIGRATION_BLOCKING_TYPES, ErrorKind, RoutingError, match_error_chain
from routespec.migration import MIGRATABLE_TYPES, Migration

VIOLATES = ("MIG-001",)


class RetriesResourceExhausted(Migration):
    def is_migratable(self, failure: RoutingError) -> bool:
        return match_error_chain(
            failure,
            MIGRATABLE_TYPES | {ErrorKind.RESOURCE_EXHAUSTED},
            MIGRATION_BLOCKING_TYPES - {ErrorKind.RESOURCE_EXHAUSTED},
        )


ADAPTER = ReferenceAdapter(
    name="mutant:migration-retries-resource-exhausted", migration_class=RetriesResourceExhausted
)
