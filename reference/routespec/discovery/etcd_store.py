"""etcd v3 discovery through etcd's JSON gateway (``/v3/...``), for deployments on several hosts.

Keys follow Dynamo 1.6.1's etcd layout, ``v1/instances/<ns>/<comp>/<endpoint>/<hex id>``, with
the same JSON record as the file store. A worker's record is bound to a lease of ``ttl``
seconds that it keeps alive (DSC-005); a crashed worker's record disappears when the lease
expires (DSC-006).
Routers read a snapshot with a range request, then follow a watch from the next revision,
and re-read the snapshot after any connection failure (a restarted etcd, a compaction).
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, NoReturn

import attrs
import trio

from routespec.discovery.file_store import (
    DEFAULT_TTL,
    HEX_ID,
    INSTANCES_BUCKET,
    MalformedRecord,
    check_registrable,
    encode_record,
    instance_key,
    record_under_key,
    split_endpoint,
)
from routespec.discovery.instances import Instance, MemoryDiscovery
from routespec.discovery.store import (
    FIELD,
    DiscoveryError,
    IdCallback,
    SkipCallback,
    SkippedRecord,
    SkippedRecords,
    log_skipped,
)

try:
    import httpx
except ModuleNotFoundError as missing:  # the optional extra; url.open_store imports this
    if missing.name != "httpx":
        raise
    raise DiscoveryError(
        FIELD, "etcd:URL needs the 'etcd' extra: pip install 'routespec[etcd]'"
    ) from None

REQUEST_TIMEOUT = 5.0
RECONNECT_DELAY = 0.5  # seconds between attempts while etcd is unreachable

Json = dict[str, Any]


def b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def prefix_end(prefix: str) -> str:
    """The exclusive range end covering every key that starts with ``prefix``."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def endpoint_prefix(endpoint: str) -> str:
    return "/".join((INSTANCES_BUCKET, *split_endpoint(endpoint))) + "/"


def etcd_key(endpoint: str, instance_id: int) -> str:
    """``v1/instances/ns/comp/endpoint/<hex id>``: Dynamo's etcd key of an instance (DSC-007)."""
    return f"{INSTANCES_BUCKET}/{instance_key(endpoint, instance_id)}"


def parse_url(url: str) -> httpx.URL:
    """An ``http(s)://host:port`` etcd client URL, or a ``DiscoveryError`` naming it (DSC-011)."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as error:
        raise DiscoveryError(FIELD, f"etcd URL {url!r} is invalid: {error}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise DiscoveryError(FIELD, f"etcd URL {url!r} must be http://HOST:PORT")
    return parsed


@attrs.define
class EtcdClient:
    """The few etcd v3 calls discovery needs; every transport failure is a ``DiscoveryError``."""

    url: httpx.URL
    _http: httpx.AsyncClient

    @classmethod
    @asynccontextmanager
    async def open(cls, url: str) -> AsyncIterator[EtcdClient]:
        parsed = parse_url(url)
        async with httpx.AsyncClient(base_url=parsed, timeout=REQUEST_TIMEOUT) as http:
            yield cls(parsed, http)

    async def call(self, path: str, body: Json) -> Json:
        try:
            response = await self._http.post(path, json=body)
        except httpx.HTTPError as error:
            raise self._unreachable(error) from None
        reply = _json_object(response.text)
        if response.status_code != 200 or "error" in reply:
            raise DiscoveryError(FIELD, f"etcd at {self.url} refused {path}: {response.text}")
        return reply

    def _unreachable(self, error: Exception) -> DiscoveryError:
        return DiscoveryError(FIELD, f"etcd at {self.url} is unreachable: {error!r}")

    async def grant(self, ttl: float) -> int:
        reply = await self.call("/v3/lease/grant", {"TTL": max(1, round(ttl))})
        return int(reply["ID"])

    async def keepalive(self, lease: int) -> bool:
        """Renew the lease; False when etcd no longer knows it (it expired)."""
        reply = await self.call("/v3/lease/keepalive", {"ID": str(lease)})
        return int(reply.get("result", {}).get("TTL", 0)) > 0

    async def revoke(self, lease: int) -> None:
        await self.call("/v3/lease/revoke", {"ID": str(lease)})

    async def put(self, key: str, value: bytes, lease: int) -> None:
        await self.call("/v3/kv/put", {"key": b64(key), "value": b64(value), "lease": str(lease)})

    async def range_prefix(self, prefix: str) -> tuple[int, list[tuple[str, bytes]]]:
        """The keys under ``prefix`` and the revision they were read at."""
        reply = await self.call(
            "/v3/kv/range", {"key": b64(prefix), "range_end": b64(prefix_end(prefix))}
        )
        revision = int(reply["header"]["revision"])
        return revision, [
            (_decode_key(kv), base64.b64decode(kv.get("value", ""))) for kv in reply.get("kvs", [])
        ]

    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[list[Json]]:
        """Batches of events under ``prefix`` from ``start_revision``; returns when the watch
        ends (cancelled or compacted), raises ``DiscoveryError`` when the connection fails."""
        request = {
            "create_request": {
                "key": b64(prefix),
                "range_end": b64(prefix_end(prefix)),
                "start_revision": str(start_revision),
            }
        }
        timeout = httpx.Timeout(REQUEST_TIMEOUT, read=None)  # a quiet watch is not a failure
        try:
            async with self._http.stream(
                "POST", "/v3/watch", json=request, timeout=timeout
            ) as response:
                async for line in response.aiter_lines():
                    result = _json_object(line).get("result", {})
                    if result.get("canceled") or "compact_revision" in result:
                        return
                    events = result.get("events")
                    if events:
                        yield events
        except httpx.HTTPError as error:
            raise self._unreachable(error) from None


def _json_object(text: str) -> Json:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _decode_key(kv: Json) -> str:
    return base64.b64decode(kv.get("key", "")).decode(errors="replace")


def _instance_id_of(key: str) -> int | None:
    tail = key.rpartition("/")[2]
    return int(tail, 16) if HEX_ID.fullmatch(tail) else None


@attrs.define
class EtcdRegistration:
    """One instance's key under a lease that a background task keeps alive.

    When etcd has forgotten the lease (it expired while etcd was unreachable, or etcd lost
    its data) the record is put again under a new lease (DSC-009).
    """

    client: EtcdClient
    instance: Instance
    ttl: float
    lease: int = 0
    withdrawn: bool = False

    @property
    def key(self) -> str:
        return etcd_key(self.instance.endpoint, self.instance.instance_id)

    async def register(self) -> None:
        self.lease = await self.client.grant(self.ttl)
        await self.client.put(self.key, encode_record(self.instance), self.lease)

    async def keep_alive(self) -> NoReturn:
        while True:
            await trio.sleep(self.ttl / 3)
            try:
                if not await self.client.keepalive(self.lease):
                    await self.register()
            except DiscoveryError:
                pass  # etcd is away; the next beat tries again, before the lease lapses

    async def withdraw(self) -> None:
        """Revoke the lease: etcd deletes the key and watchers see the removal at once
        (DSC-004)."""
        if not self.withdrawn:
            self.withdrawn = True
            await self.client.revoke(self.lease)


@attrs.define
class EtcdStore:
    """etcd v3 as a ``DiscoveryStore``: ``url`` is the client URL, ``http://host:2379``."""

    url: str
    ttl: float = DEFAULT_TTL
    on_skipped: SkipCallback = attrs.field(default=log_skipped, kw_only=True)

    def __attrs_post_init__(self) -> None:
        parse_url(self.url)

    async def check(self) -> None:
        async with EtcdClient.open(self.url) as client:
            await client.call("/v3/maintenance/status", {})

    @asynccontextmanager
    async def registration(self, instance: Instance) -> AsyncIterator[EtcdRegistration]:
        check_registrable(instance)
        async with EtcdClient.open(self.url) as client, trio.open_nursery() as nursery:
            registration = EtcdRegistration(client, instance, self.ttl)
            await registration.register()
            nursery.start_soon(registration.keep_alive)
            try:
                yield registration
            finally:
                nursery.cancel_scope.cancel()
                # etcd may be away: then the lease expires on its own
                with (
                    trio.CancelScope(shield=True),
                    trio.move_on_after(REQUEST_TIMEOUT),
                    contextlib.suppress(DiscoveryError),
                ):
                    await registration.withdraw()

    @asynccontextmanager
    async def watch(
        self,
        endpoint: str,
        on_added: IdCallback | None = None,
        on_removed: IdCallback | None = None,
    ) -> AsyncIterator[MemoryDiscovery]:
        async with EtcdClient.open(self.url) as client, trio.open_nursery() as nursery:
            watcher = EtcdWatcher(
                client, endpoint, on_added, on_removed, SkippedRecords(self.on_skipped)
            )
            revision = await watcher.resync()
            nursery.start_soon(watcher.follow, revision)
            try:
                yield watcher.discovery
            finally:
                nursery.cancel_scope.cancel()


@attrs.define
class EtcdWatcher:
    """Keeps a ``MemoryDiscovery`` equal to the usable records under one endpoint's prefix
    (DSC-002, DSC-013), and reports each change to it (DSC-001, DSC-012) and each unusable
    record once to ``skipped`` (DSC-014)."""

    client: EtcdClient
    endpoint: str
    on_added: IdCallback | None
    on_removed: IdCallback | None
    skipped: SkippedRecords = attrs.field(factory=SkippedRecords)
    discovery: MemoryDiscovery = attrs.field(factory=MemoryDiscovery)

    @property
    def prefix(self) -> str:
        return endpoint_prefix(self.endpoint)

    async def resync(self) -> int:
        """Replace the snapshot with a fresh range read (DSC-003); returns its revision."""
        revision, kvs = await self.client.range_prefix(self.prefix)
        fresh: dict[int, Instance] = {}
        unusable: list[str] = []
        for key, value in kvs:
            instance = self._instance(key, value)
            if instance is None:
                unusable.append(key)
            else:
                fresh[instance.instance_id] = instance
        self.skipped.keep(unusable)
        for instance_id in self.discovery.instance_ids():
            if instance_id not in fresh:
                self._remove(instance_id)
        for instance in fresh.values():
            self._add(instance)
        return revision

    async def follow(self, revision: int) -> NoReturn:
        """Apply watch events; after a failure, wait, re-read and watch again (DSC-010)."""
        while True:
            try:
                async for events in self.client.watch_prefix(self.prefix, revision + 1):
                    self._apply(events)
                revision = await self.resync()
            except DiscoveryError:
                await trio.sleep(RECONNECT_DELAY)
                with contextlib.suppress(DiscoveryError):
                    revision = await self.resync()

    def _apply(self, events: list[Json]) -> None:
        for event in events:
            kv = event.get("kv", {})
            key = _decode_key(kv)
            if event.get("type") == "DELETE":
                self.skipped.forget(key)
                instance_id = _instance_id_of(key)
                if instance_id is not None:
                    self._remove(instance_id)
                continue
            instance = self._instance(key, base64.b64decode(kv.get("value", "")))
            if instance is not None:
                self._add(instance)
            elif (instance_id := _instance_id_of(key)) is not None:
                self._remove(instance_id)  # its record was overwritten with an unusable one

    def _instance(self, key: str, value: bytes) -> Instance | None:
        """The instance a usable record describes; an unusable one is reported and skipped
        (DSC-008, DSC-013, DSC-014)."""
        try:
            instance = record_under_key(value, self.endpoint, key.removeprefix(self.prefix))
        except MalformedRecord as error:
            self.skipped.skip(SkippedRecord(key, error.field, error.reason))
            return None
        self.skipped.forget(key)
        return instance

    def _add(self, instance: Instance) -> None:
        known = self.discovery.lookup(instance.instance_id) is not None
        self.discovery.register(instance)
        if not known and self.on_added is not None:
            self.on_added(instance.instance_id)

    def _remove(self, instance_id: int) -> None:
        if self.discovery.lookup(instance_id) is None:
            return
        self.discovery.deregister(instance_id)
        if self.on_removed is not None:
            self.on_removed(instance_id)
