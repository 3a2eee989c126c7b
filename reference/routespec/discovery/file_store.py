"""Dynamo's file discovery store: one JSON record per instance, kept alive by its mtime.

Records live at ``<root>/v1/instances/<url-encoded "ns/comp/endpoint/<hex id>">``. A live
process touches its own files every ``ttl / 3``; any process deletes files whose mtime is older
than ``ttl`` (10 s), as Dynamo's ``FileStore`` does. Expiry uses wall-clock mtimes because the
directory is shared between processes. Temporary files start with ``.tmp_`` and are never read,
nor is anything but a regular file (DSC-018). With no store named, the root is Dynamo's
(``default_root``, DSC-016); an endpoint may be spelled ``ns.comp.endpoint`` (``split_endpoint``,
DSC-017).
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import re
import time
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import NoReturn

import attrs
import trio

from routespec.discovery.instances import Instance
from routespec.discovery.store import (
    FIELD,
    DiscoveryError,
    IdCallback,
    SkipCallback,
    SkippedRecord,
    SkippedRecords,
    log_skipped,
)

ROOT_ENV = "DYN_FILE_KV"
DEFAULT_DIR_NAME = "dynamo_store_kv"
INSTANCES_BUCKET = "v1/instances"
DEFAULT_TTL = 10.0  # seconds; Dynamo's FileStore default (= its etcd lease)
MIN_KEEP_ALIVE = 1.0
TEMP_FILE_PREFIX = ".tmp_"
ENDPOINT_TYPE = "Endpoint"
TCP_TRANSPORT = "tcp"
LEGACY_CODEC = "json"  # a record without ``request_plane_codec`` predates msgpack payloads
CODECS = ("msgpack", "json")  # the payload codecs a caller can speak (TRN-001; DSC-013)
MAX_RECORD_BYTES = 64 * 1024  # DSC-013: Dynamo's records are a few hundred bytes
MAX_INSTANCE_ID = 2**64 - 1  # a u64
HEX_ID = re.compile(r"[0-9a-fA-F]{1,16}")
PORT = re.compile(r"[0-9]{1,5}")
HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")
DEVICE_TYPE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_HOST_NAME = 253


class MalformedRecord(ValueError):
    """A stored value that is not a usable endpoint record: the field at fault and why."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


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
    return instances_dir(root) / file_name(instance_key(endpoint, instance_id))


def file_name(key: str) -> str:
    """The file of ``key`` as Dynamo names it: every byte but an ASCII letter or digit
    percent-encoded, so no record's name starts like a temp file's (``.tmp_``)."""
    return "".join(
        chr(byte) if byte < 128 and chr(byte).isalnum() else f"%{byte:02X}" for byte in key.encode()
    )


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
    """An ``Instance`` from a record; anything it cannot be used as is a ``MalformedRecord``
    naming the field at fault (DSC-008, DSC-013)."""
    if len(data) > MAX_RECORD_BYTES:
        raise MalformedRecord("record", f"larger than the {MAX_RECORD_BYTES}-byte limit")
    try:
        record = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise MalformedRecord("record", f"not JSON: {error}") from None
    if not isinstance(record, dict):
        raise MalformedRecord("record", f"not a JSON object but {type(record).__name__}")
    if record.get("type") != ENDPOINT_TYPE:
        raise MalformedRecord("type", f"{record.get('type')!r} is not {ENDPOINT_TYPE!r}")
    names = [_name(record, field) for field in ("namespace", "component", "endpoint")]
    instance_id = record.get("instance_id")
    if (
        not isinstance(instance_id, int)
        or isinstance(instance_id, bool)
        or not 0 <= instance_id <= MAX_INSTANCE_ID
    ):
        raise MalformedRecord("instance_id", f"{instance_id!r} is not a u64 integer")
    transport = record.get("transport")
    if not isinstance(transport, dict):
        raise MalformedRecord("transport", f"not an object but {type(transport).__name__}")
    if TCP_TRANSPORT not in transport:
        kinds = ", ".join(map(repr, transport)) or "none"
        raise MalformedRecord("transport", f"no {TCP_TRANSPORT!r} address (has {kinds})")
    address = _address(transport[TCP_TRANSPORT])
    device_type = record.get("device_type", "cuda")
    if not isinstance(device_type, str) or DEVICE_TYPE.fullmatch(device_type) is None:
        raise MalformedRecord("device_type", f"{device_type!r} is not a device name")
    codec = record.get("request_plane_codec", LEGACY_CODEC)
    if codec not in CODECS:
        raise MalformedRecord(
            "request_plane_codec", f"unknown codec {codec!r} (known: {', '.join(CODECS)})"
        )
    return Instance(instance_id, "/".join(names), address, device_type, codec)


def _name(record: dict[str, object], field: str) -> str:
    name = record.get(field)
    if not isinstance(name, str) or not name or "/" in name or not _text(name):
        raise MalformedRecord(field, f"{name!r} is not a non-empty name without '/'")
    return name


def _text(value: str) -> bool:
    """Printable text that UTF-8 can carry (JSON lets a record hold lone surrogates)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return value.isprintable()


def _address(address: object) -> str:
    """``transport.tcp``, checked to be ``host:port/path`` that a caller can dial (DSC-013)."""
    field = f"transport.{TCP_TRANSPORT}"
    if not isinstance(address, str) or not _text(address):
        raise MalformedRecord(field, f"{address!r} is not a 'host:port/path' string")
    location, _, path = address.partition("/")
    host, colon, port = location.rpartition(":")
    if not path:
        raise MalformedRecord(field, f"{address!r} has no path: expected host:port/path")
    if not colon or PORT.fullmatch(port) is None:
        raise MalformedRecord(field, f"{address!r} has no port: expected host:port/path")
    if not 1 <= int(port) <= 65535:
        raise MalformedRecord(field, f"{address!r}: port {port} is out of range 1-65535")
    if not _host(host):
        raise MalformedRecord(field, f"{address!r}: {host!r} is not an IP address or host name")
    return address


def _host(host: str) -> bool:
    """An IP address (IPv6 with or without brackets) or a DNS host name."""
    literal = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(literal)
    except ValueError:
        labels = host.removesuffix(".").split(".")
        return len(host) <= MAX_HOST_NAME and all(HOST_LABEL.fullmatch(x) for x in labels)
    return True


def record_under_key(data: bytes, endpoint: str, key_id: str) -> Instance:
    """The instance the record stored under ``<endpoint>/<key_id>`` describes: a usable record
    (``decode_record``) of that endpoint and id, else a ``MalformedRecord`` (DSC-013)."""
    if HEX_ID.fullmatch(key_id) is None:
        raise MalformedRecord("key", f"{key_id!r} is not a hex instance id")
    instance = decode_record(data)
    for field, named, stored in zip(
        ("namespace", "component", "endpoint"),
        instance.endpoint.split("/"),
        split_endpoint(endpoint),
        strict=True,
    ):
        if named != stored:
            raise MalformedRecord(field, f"{named!r} but the record is stored under {stored!r}")
    if instance.instance_id != int(key_id, 16):
        raise MalformedRecord(
            "instance_id", f"{instance.instance_id:x} but the record is stored under {key_id}"
        )
    return instance


# the worker option each record field comes from, for a refused registration (DSC-015)
RECORD_OPTIONS = {
    "namespace": "--endpoint",
    "component": "--endpoint",
    "endpoint": "--endpoint",
    "transport.tcp": "--host",
    "device_type": "--device-type",
}


def check_registrable(instance: Instance) -> None:
    """Refuse to register a record that watchers would skip (DSC-015): a ``DiscoveryError``
    naming the option its fault comes from."""
    try:
        record_under_key(encode_record(instance), instance.endpoint, f"{instance.instance_id:x}")
    except MalformedRecord as error:
        if error.field == "record":  # too large: the longer of the two values named freely
            host = instance.address.partition("/")[0].rpartition(":")[0]
            option = "--host" if len(host) > len(instance.endpoint) else "--endpoint"
        else:
            option = RECORD_OPTIONS[error.field]
        raise DiscoveryError(option, f"watchers could not use this record: {error}") from None


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
        check_registrable(instance)
        registration = cls(instance) if root is None else cls(instance, Path(root))
        try:
            registration.register()
        except OSError as error:  # at start-up: a store this process cannot write (DSC-011)
            reason = error.strerror or str(error)
            raise DiscoveryError(
                FIELD, f"cannot write to the file store {registration.root}: {reason}"
            ) from None
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
    Unusable records of the endpoint are skipped, each reported once to ``on_skipped``.
    """

    root: Path = attrs.field(converter=_root)
    endpoint: str = attrs.field()
    ttl: float = DEFAULT_TTL
    on_skipped: SkipCallback = log_skipped
    _records: dict[int, Instance] = attrs.field(factory=dict, init=False)
    _ids: tuple[int, ...] | None = attrs.field(default=None, init=False)  # until records change
    _skipped: SkippedRecords = attrs.field(init=False)

    @endpoint.validator
    def _check_endpoint(self, _attribute: object, value: str) -> None:
        split_endpoint(value)

    def __attrs_post_init__(self) -> None:
        self.endpoint = "/".join(split_endpoint(self.endpoint))
        self._skipped = SkippedRecords(self.on_skipped)

    def refresh(self) -> tuple[frozenset[int], frozenset[int]]:
        """Rescan: delete expired files, read this endpoint's records; returns (added, removed).

        Only the records under this endpoint's keys are read (DSC-002); an unusable one is
        skipped and reported (DSC-008, DSC-013, DSC-014); a vanished file is skipped; a record
        older than ``ttl`` is dead (DSC-006). A missing records directory is an empty store; one
        that cannot be listed (a file, a link to nothing) is a ``DiscoveryError`` (DSC-011).
        """
        found: dict[int, Instance] = {}
        unusable: list[str] = []
        deadline = time.time() - self.ttl
        prefix = self.endpoint + "/"
        directory = instances_dir(self.root)
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            if os.path.islink(directory):  # a link to nothing is no records directory (DSC-011)
                raise DiscoveryError(FIELD, f"cannot read {directory}: a link to nothing") from None
            entries = []  # nothing registered yet, or the records were lost (DSC-010)
        except OSError as error:  # a file, a link loop, no permission: unusable (DSC-011)
            reason = error.strerror or str(error)
            raise DiscoveryError(FIELD, f"cannot read {directory}: {reason}") from None
        for entry in entries:
            key = urllib.parse.unquote(entry.name)
            if not self._live(entry, deadline) or not key.startswith(prefix):
                continue
            try:
                instance = self._read(entry, key.removeprefix(prefix))
            except MalformedRecord as error:
                unusable.append(entry.path)
                self._skipped.skip(SkippedRecord(entry.path, error.field, error.reason))
                continue
            if instance is not None:
                found[instance.instance_id] = instance
        self._skipped.keep(unusable)
        added = frozenset(found.keys() - self._records.keys())
        removed = frozenset(self._records.keys() - found.keys())
        if found != self._records:
            self._ids = None  # a new tuple tells WorkerSets to look again (devices too)
        self._records = found
        return added, removed

    @staticmethod
    def _live(entry: os.DirEntry[str], deadline: float) -> bool:
        """A record file still alive; an expired one is deleted (its owner stopped renewing)."""
        if entry.name.startswith(TEMP_FILE_PREFIX):
            return False
        try:
            if not entry.is_file(follow_symlinks=False):
                return False
            if entry.stat().st_mtime < deadline:
                os.unlink(entry.path)
                return False
        except OSError:  # vanished meanwhile, or another reader deleted it first
            return False
        return True

    def _read(self, entry: os.DirEntry[str], key_id: str) -> Instance | None:
        """The record's instance; None if the file vanished; ``MalformedRecord`` if unusable."""
        try:
            with open(entry.path, "rb") as file:
                data = file.read(MAX_RECORD_BYTES + 1)  # a larger record is not read whole
        except FileNotFoundError:
            return None
        except OSError as error:
            raise MalformedRecord("record", f"cannot be read: {error.strerror or error}") from None
        return record_under_key(data, self.endpoint, key_id)

    async def watch(
        self,
        interval: float,
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
        if self._ids is None:
            self._ids = tuple(sorted(self._records))
        return self._ids

    def lookup(self, instance_id: int) -> Instance | None:
        return self._records.get(instance_id)

    def device_type(self, instance_id: int) -> str | None:
        instance = self._records.get(instance_id)
        return None if instance is None else instance.device_type


def _check_root(root: Path) -> None:
    existing = root
    try:
        while not os.path.lexists(existing) and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise DiscoveryError(FIELD, f"file store {root}: {existing} is not a directory")
        with os.scandir(existing):
            pass
    except OSError as error:
        reason = error.strerror or str(error)
        raise DiscoveryError(FIELD, f"file store {root}: {reason}") from None


@attrs.frozen
class FileStore:
    """The file store as a ``DiscoveryStore``: zero set-up, every process on one host.

    ``on_skipped`` hears of each unusable record a watcher skips (by default a warning)."""

    root: Path = attrs.field(factory=default_root, converter=_root)
    ttl: float = DEFAULT_TTL
    poll_interval: float = 0.2
    on_skipped: SkipCallback = attrs.field(default=log_skipped, kw_only=True)

    async def check(self) -> None:
        """A missing directory is created by the first registration, so its nearest existing
        ancestor must be a directory; an existing one must be a directory this process can
        list (DSC-011)."""
        _check_root(self.root)

    def registration(self, instance: Instance) -> AbstractAsyncContextManager[FileRegistration]:
        return FileRegistration.open(instance, self.root, interval=self.ttl / 3)

    @asynccontextmanager
    async def watch(
        self,
        endpoint: str,
        on_added: IdCallback | None = None,
        on_removed: IdCallback | None = None,
    ) -> AsyncIterator[FileDiscovery]:
        discovery = FileDiscovery(self.root, endpoint, self.ttl, self.on_skipped)
        discovery.refresh()  # the first read (DSC-003)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(discovery.watch, self.poll_interval, on_added, on_removed)
            try:
                yield discovery
            finally:
                nursery.cancel_scope.cancel()
