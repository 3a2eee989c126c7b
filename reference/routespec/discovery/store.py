"""The discovery-store seam: how workers register and routers watch, whatever the backend.

Two backends implement it: the file store (``file_discovery``, one host) and etcd v3
(``etcd_discovery``, several hosts). Both keep Dynamo 1.6.1's record format and key layout
(DSC-007). The spec's discovery page (DSC) states what every store must do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import attrs

from routespec.discovery.instances import Discovery, Instance

IdCallback = Callable[[int], None]
FIELD = "--discovery"  # the command-line argument that names a store
LOGGER = logging.getLogger("routespec.discovery")


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


@attrs.frozen
class SkippedRecord:
    """A stored record that a watcher does not list, and why (DSC-008, DSC-013): where it is
    (the file's path, or the etcd key), the field at fault (``record`` for the value as a
    whole, ``key`` for its key) and the reason."""

    record: str
    field: str
    reason: str

    def __str__(self) -> str:
        return f"skipped discovery record {self.record}: {self.field}: {self.reason}"


SkipCallback = Callable[[SkippedRecord], None]


def log_skipped(skipped: SkippedRecord) -> None:
    """The default report of a skipped record: one warning on the ``routespec.discovery``
    logger (the command line prints it as one line on stderr)."""
    LOGGER.warning("%s", skipped)


@attrs.define
class SkippedRecords:
    """One watcher's unusable records: each is reported once while it stays in the store, and
    again only if its fault changes or it comes back after it was gone (DSC-014)."""

    report: SkipCallback = log_skipped
    _reported: dict[str, SkippedRecord] = attrs.field(factory=dict, init=False)

    def skip(self, skipped: SkippedRecord) -> None:
        if self._reported.get(skipped.record) != skipped:
            self._reported[skipped.record] = skipped
            self.report(skipped)

    def forget(self, record: str) -> None:
        """The record is gone, or usable now."""
        self._reported.pop(record, None)

    def keep(self, records: Iterable[str]) -> None:
        """Forget every record but ``records`` (those a full read found unusable)."""
        kept = set(records)
        self._reported = {at: skipped for at, skipped in self._reported.items() if at in kept}
