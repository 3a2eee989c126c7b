"""Instance records and the in-memory discovery store (spec: SET)."""

from __future__ import annotations

from typing import Protocol

import attrs


@attrs.frozen
class Instance:
    """One worker instance of an endpoint, as discovery records it."""

    instance_id: int
    endpoint: str
    address: str
    device_type: str = "cuda"
    payload_codec: str = "msgpack"


class Discovery(Protocol):
    """What the router reads from a discovery store."""

    def instance_ids(self) -> tuple[int, ...]:
        """The discovered ids of the endpoint, sorted and de-duplicated (SET-001).

        Returning the same tuple object while nothing changed lets ``WorkerSets`` skip its
        O(N) comparison with the last list."""
        ...

    def lookup(self, instance_id: int) -> Instance | None:
        """The transport record of an instance, or None when it cannot be resolved."""
        ...

    def device_type(self, instance_id: int) -> str | None:
        """The device type discovery lists for an id, or None when it is not discovered."""
        ...


@attrs.define
class MemoryDiscovery:
    """In-process discovery: the router's cached id list and the transport records.

    The two normally change together. ``withdraw`` removes only the transport record,
    modelling a removal that the router's cached id list has not observed yet: the id is
    still discovered (and selectable) but its transport can no longer be resolved.
    """

    _listed: dict[int, str] = attrs.field(factory=dict)  # id -> device type
    _records: dict[int, Instance] = attrs.field(factory=dict)
    _ids: tuple[int, ...] | None = None  # the sorted list, kept until the listing changes

    def register(self, instance: Instance) -> None:
        self._listed[instance.instance_id] = instance.device_type
        self._records[instance.instance_id] = instance
        self._ids = None

    def deregister(self, instance_id: int) -> None:
        self._listed.pop(instance_id, None)
        self._records.pop(instance_id, None)
        self._ids = None

    def withdraw(self, instance_id: int) -> None:
        self._records.pop(instance_id, None)

    def instance_ids(self) -> tuple[int, ...]:
        """The discovered ids, sorted and de-duplicated (SET-001); the same tuple while the
        listing is unchanged, so ``WorkerSets`` sees no change in O(1)."""
        if self._ids is None:
            self._ids = tuple(sorted(self._listed))
        return self._ids

    def lookup(self, instance_id: int) -> Instance | None:
        """The transport record of a live instance, or None when it cannot be resolved."""
        return self._records.get(instance_id)

    def device_type(self, instance_id: int) -> str | None:
        return self._listed.get(instance_id)
