"""Dynamo's file discovery store: one JSON record per instance, kept alive by its mtime.

Records live at ``<root>/v1/instances/<url-encoded "ns/comp/endpoint/<hex id>">``. A live
process touches its own files every ``ttl / 3``; any process deletes files whose mtime is older
than ``ttl`` (10 s), as Dynamo's ``FileStore`` does. Expiry uses wall-clock mtimes because the
directory is shared between processes. Temporary files start with ``.tmp_`` and are never read.
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import NoReturn

import attrs
import trio

from routespec.discovery.instances import Instance
from routespec.discovery.store import FIELD, DiscoveryError, IdCallback

ROOT_ENV = "DYN_FILE_KV"
DEFAULT_DIR_NAME = "dynamo_store_kv"
INSTANCES_BUCKET = "v1/instances"
DEFAULT_TTL = 10.0  # seconds; Dynamo's FileStore default (= its etcd lease)
MIN_KEEP_ALIVE = 1.0
TEMP_FILE_PREFIX = ".tmp_"
ENDPOINT_TYPE = "Endpoint"
TCP_TRANSPORT = "tcp"
LEGACY_CODEC = "json"  # a record without ``request_plane_codec`` predates msgpack payloads


class MalformedRecord(ValueError):
    """A discovery file that is not a valid endpoint record."""


def default_root() -> Path:
    """``$DYN_FILE_KV``, else ``$TMPDIR/dynamo_store_kv`` (Rust's ``temp_dir``)."""
    configured = os.environ.get(ROOT_ENV)
    if configured:
        return Path(configured)
    return Path(os.environ.get("TMPDIR") or "/tmp") / DEFAULT_DIR_NAME


def instances_dir(root: Path) -> Path:
    return root / INSTANCES_BUCKET


def split_endpoint(endpoint: str) -> tuple[str, str, str]:
    """``"ns/comp/endpoint"`` (or Dynamo's ``"ns.comp.endpoint"``) as its three names."""
    parts = endpoint.split("/") if "/" in endpoint else endpoint.split(".")
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"endpoint must be 'namespace/component/endpoint', got {endpoint!r}")
    return parts[0], parts[1], parts[2]


def instance_key(endpoint: str, instance_id: int) -> str:
    """The store key of an instance: ``ns/comp/endpoint/<hex id>`` (DSC-007)."""
    return "/".join((*split_endpoint(endpoint), f"{instance_id:x}"))


def transport_path(endpoint: str, instance_id: int) -> str:
    """The request-plane path a worker serves: ``<hex id>/ns/comp/endpoint``."""
    return "/".join((f"{instance_id:x}", *split_endpoint(endpoint)))


def record_path(root: Path, endpoint: str, instance_id: int) -> Path:
    return instances_dir(root) / urllib.parse.quote(instance_key(endpoint, instance_id), safe="")


def random_instance_id() -> int:
    """A fresh instance id: a random u64, like Dynamo's connection id."""
    return random.getrandbits(64)


def encode_record(instance: Instance) -> bytes:
    """The JSON record Dynamo 1.6.1 writes for an endpoint instance (DSC-007)."""
    namespace, component, endpoint = split_endpoint(instance.endpoint)
    record = {
        "type": ENDPOINT_TYPE,
        "component": component,
        "endpoint": endpoint,
        "namespace": namespace,
        "instance_id": instance.instance_id,
        "transport": {TCP_TRANSPORT: instance.address},
        "device_type": instance.device_type,
        "request_plane_codec": instance.payload_codec,
    }
    return json.dumps(record, separators=(",", ":")).encode()


def decode_record(data: bytes) -> Instance:
    """An ``Instance`` from a record; anything else is a ``MalformedRecord`` (DSC-008)."""
    try:
        record = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise MalformedRecord(f"not JSON: {error}") from None
    if not isinstance(record, dict) or record.get("type") != ENDPOINT_TYPE:
        raise MalformedRecord("not an Endpoint record")
    names = [record.get(field) for field in ("namespace", "component", "endpoint")]
    instance_id = record.get("instance_id")
    transport = record.get("transport")
    if not all(isinstance(name, str) and name and "/" not in name for name in names):
        raise MalformedRecord("namespace/component/endpoint must be non-empty names")
    if not isinstance(instance_id, int) or isinstance(instance_id, bool) or instance_id < 0:
        raise MalformedRecord("instance_id must be a non-negative integer")
    address = transport.get(TCP_TRANSPORT) if isinstance(transport, dict) else None
    if not isinstance(address, str) or "/" not in address:
        raise MalformedRecord("transport.tcp must be 'host:port/path'")
    device_type = record.get("device_type", "cuda")
    codec = record.get("request_plane_codec", LEGACY_CODEC)
    if not isinstance(device_type, str) or not isinstance(codec, str):
        raise MalformedRecord("device_type and request_plane_codec must be strings")
    return Instance(instance_id, "/".join(str(name) for name in names), address, device_type, codec)


def write_atomic(path: Path, data: bytes) -> None:
    """Publish ``data`` at ``path`` via a temp file and a rename: readers never see a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.parent / f"{TEMP_FILE_PREFIX}{random.getrandbits(64):016x}"
    try:
        with open(temp, "xb") as file:
            file.write(data)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


@attrs.define
class FileRegistration:
    """One instance's record in the store: written, kept alive, removed on deregistration."""

    instance: Instance
    root: Path = attrs.field(factory=default_root, converter=Path)
    registered: bool = attrs.field(default=False, init=False)

    @property
    def path(self) -> Path:
        return record_path(self.root, self.instance.endpoint, self.instance.instance_id)

    def register(self) -> None:
        write_atomic(self.path, encode_record(self.instance))
        self.registered = True

    def touch(self) -> None:
        """Refresh the mtime (DSC-005); rewrite the record if the store lost it or another
        process expired it meanwhile (DSC-009)."""
        if not self.registered:
            return  # withdrawn: never written again while the process drains (DSC-004)
        try:
            os.utime(self.path)
        except FileNotFoundError:
            self.register()

    def deregister(self) -> None:
        """Clean deregistration: the record disappears (DSC-004; a crash leaves it to expire,
        DSC-006)."""
        self.registered = False
        self.path.unlink(missing_ok=True)

    async def withdraw(self) -> None:
        """``deregister`` as the ``Registration`` protocol spells it."""
        self.deregister()

    async def heartbeat(self, interval: float = DEFAULT_TTL / 3) -> NoReturn:
        """Keep the record alive; run it in a nursery, well below the readers' ``ttl``."""
        while True:
            await trio.sleep(max(interval, MIN_KEEP_ALIVE))
            self.touch()

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        instance: Instance,
        root: Path | str | None = None,
        *,
        interval: float = DEFAULT_TTL / 3,
    ) -> AsyncIterator[FileRegistration]:
        """Registered with a heartbeat for the block; deregistered when it ends."""
        registration = cls(instance) if root is None else cls(instance, Path(root))
        registration.register()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(registration.heartbeat, interval)
                try:
                    yield registration
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            registration.deregister()


def _root(value: Path | str | None) -> Path:
    return default_root() if value is None else Path(value)


@attrs.define
class FileDiscovery:
    """The ``Discovery`` of one endpoint, read from a cached snapshot of the store.

    ``refresh`` rescans the directory; ``watch`` does so periodically and reports changes.
    """

    root: Path = attrs.field(converter=_root)
    endpoint: str = attrs.field()
    ttl: float = DEFAULT_TTL
    _records: dict[int, Instance] = attrs.field(factory=dict, init=False)

    @endpoint.validator
    def _check_endpoint(self, _attribute: object, value: str) -> None:
        split_endpoint(value)

    def __attrs_post_init__(self) -> None:
        self.endpoint = "/".join(split_endpoint(self.endpoint))

    def refresh(self) -> tuple[frozenset[int], frozenset[int]]:
        """Rescan: delete expired files, read this endpoint's records; returns (added, removed).

        Malformed or vanished files are skipped (DSC-008); a record older than ``ttl`` is
        dead (DSC-006); only this endpoint's records are listed (DSC-002).
        """
        found: dict[int, Instance] = {}
        deadline = time.time() - self.ttl
        try:
            entries = list(os.scandir(instances_dir(self.root)))
        except (FileNotFoundError, NotADirectoryError):
            entries = []
        for entry in entries:
            instance = self._read(entry, deadline)
            if instance is not None and instance.endpoint == self.endpoint:
                found[instance.instance_id] = instance
        added = frozenset(found.keys() - self._records.keys())
        removed = frozenset(self._records.keys() - found.keys())
        self._records = found
        return added, removed

    @staticmethod
    def _read(entry: os.DirEntry[str], deadline: float) -> Instance | None:
        try:
            if not entry.is_file(follow_symlinks=False):
                return None
            if entry.stat().st_mtime < deadline:
                os.unlink(entry.path)  # expired: its owner stopped refreshing it
                return None
            if entry.name.startswith(TEMP_FILE_PREFIX):
                return None
            with open(entry.path, "rb") as file:
                return decode_record(file.read())
        except (OSError, MalformedRecord):
            return None

    async def watch(
        self,
        interval: float = 0.5,
        on_added: IdCallback | None = None,
        on_removed: IdCallback | None = None,
    ) -> NoReturn:
        """Refresh every ``interval`` seconds and report each added and removed id (DSC-001,
        DSC-012); a wiped directory is just empty, and is followed again (DSC-010)."""
        while True:
            added, removed = self.refresh()
            for instance_id in sorted(removed):
                if on_removed is not None:
                    on_removed(instance_id)
            for instance_id in sorted(added):
                if on_added is not None:
                    on_added(instance_id)
            await trio.sleep(interval)

    def instance_ids(self) -> tuple[int, ...]:
        """The discovered ids, sorted and de-duplicated (SET-001)."""
        return tuple(sorted(self._records))

    def lookup(self, instance_id: int) -> Instance | None:
        return self._records.get(instance_id)

    def device_type(self, instance_id: int) -> str | None:
        instance = self._records.get(instance_id)
        return None if instance is None else instance.device_type


@attrs.frozen
class FileStore:
    """The file store as a ``DiscoveryStore``: zero set-up, every process on one host."""

    root: Path = attrs.field(factory=default_root, converter=_root)
    ttl: float = DEFAULT_TTL
    poll_interval: float = 0.2

    async def check(self) -> None:
        """A missing directory is created by the first registration; a file in its place is
        an error (DSC-011)."""
        if self.root.exists() and not self.root.is_dir():
            raise DiscoveryError(FIELD, f"file store {self.root} is not a directory")

    def registration(self, instance: Instance) -> AbstractAsyncContextManager[FileRegistration]:
        return FileRegistration.open(instance, self.root, interval=self.ttl / 3)

    @asynccontextmanager
    async def watch(
        self,
        endpoint: str,
        on_added: IdCallback | None = None,
        on_removed: IdCallback | None = None,
    ) -> AsyncIterator[FileDiscovery]:
        discovery = FileDiscovery(self.root, endpoint, self.ttl)
        discovery.refresh()  # the first read (DSC-003)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(discovery.watch, self.poll_interval, on_added, on_removed)
            try:
                yield discovery
            finally:
                nursery.cancel_scope.cancel()
