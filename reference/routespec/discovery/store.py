"""The discovery-store seam: how workers register and routers watch, whatever the backend.

Two backends implement it: the file store (``file_discovery``, one host) and etcd v3
(``etcd_discovery``, several hosts). Both keep Dynamo 1.6.1's record format and key layout
(DSC-007). The spec's discovery page (DSC) states what every store must do.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from routespec.discovery.instances import Discovery, Instance

IdCallback = Callable[[int], None]
FIELD = "--discovery"  # the command-line argument that names a store


class DiscoveryError(Exception):
    """A discovery store that cannot be used (bad address, unreachable); names the field
    (DSC-011)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class Registration(Protocol):
    """One instance's live record; it disappears when its process stops renewing it."""

    async def withdraw(self) -> None:
        """Remove the record now and stop renewing it (a clean shutdown's first step; DSC-004)."""
        ...


class DiscoveryStore(Protocol):
    """Where workers publish instance records and routers read them."""

    async def check(self) -> None:
        """Raise ``DiscoveryError`` when the store cannot be reached."""
        ...

    def registration(self, instance: Instance) -> AbstractAsyncContextManager[Registration]:
        """The instance is registered and kept alive for the block, withdrawn at its end."""
        ...

    def watch(
        self,
        endpoint: str,
        on_added: IdCallback | None = None,
        on_removed: IdCallback | None = None,
    ) -> AbstractAsyncContextManager[Discovery]:
        """The endpoint's instances, read once before the block starts (DSC-003) and kept
        current during it (DSC-001, DSC-002); the callbacks report each later change (DSC-012)."""
        ...
