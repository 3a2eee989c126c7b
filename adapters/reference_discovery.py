"""The reference's discovery stores as ``DiscoveryTarget`` s (Capability.DISCOVERY_STORE): the
file store (``ReferenceDiscovery``, below), and the etcd store on a server of its own
(``EtcdDiscovery``, at the end, opened with ``reopen(store="etcd")``).

A ``FileStore`` in a temporary directory, driven through the ``DiscoveryStore`` seam inside
the target's ``TrioPortal``: each registered instance is a task holding
``store.registration(instance)`` (a worker process), each watcher a task holding
``store.watch(endpoint, on_added, on_removed)``. The instances' addresses name no server:
these checks look at discovery only.

**Time.** The store runs on two clocks. Its renewals and polls sleep on trio's clock, the
portal's ``MockClock``, which moves only when asked; liveness compares file mtimes with the
wall clock, since the directory is shared between processes. The suite cannot move the wall
clock, so ``advance(s)`` moves the store's view of it instead: in steps no longer than the
poll interval, it ages every record by the step less the real time that passed since the
previous step (its mtime moves back by that much), then moves the mock clock by the step, so
that the renewals and polls falling due run. A record's age is then the store time since its
last renewal, give or take the real time of one step: a slow or loaded machine does not
make a record look older than the check made it.

**Killing.** ``lapse(id)`` leaves the record as a worker killed with SIGKILL leaves it: the
content and mtime of its last renewal, and nobody renewing it. A trio task cannot skip its
cleanup, so the adapter keeps a hard link to the record, lets the registration's task end
(its exit deletes the record, as a clean exit does) and puts the link back. The mock clock
does not move during the call, so no watcher polls in between.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import itertools
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import trio

from routespec.deploy.cli.main import endpoint as parse_endpoint
from routespec.discovery.file_store import (
    INSTANCES_BUCKET,
    MIN_KEEP_ALIVE,
    ROOT_ENV,
    FileStore,
    instances_dir,
    random_instance_id,
    record_path,
    transport_path,
    write_atomic,
)
from routespec.discovery.instances import Discovery, Instance
from routespec.discovery.store import DiscoveryError, DiscoveryStore, Registration, SkippedRecord
from routespec.discovery.url import open_store
from routespec.testing.portal import TrioPortal
from routespec.testing.target import DiscoveryTarget, DiscoveryTiming, ListedInstance, StoredRecord

if TYPE_CHECKING:
    from routespec.discovery.etcd_store import EtcdStore

POLL_INTERVAL = 0.2  # the file store's default: how often a watcher rescans the directory
FIRST_PORT = 40_000  # the (unserved) port of the first instance's address
STORE_VARIABLES = (ROOT_ENV, "TMPDIR")  # the environment that chooses the default store
PROBED_ENDPOINT = "probe/refusal/generate"  # the endpoint a refusal's first read watches


@contextlib.contextmanager
def store_environment(environment: Mapping[str, str] | None) -> Iterator[None]:
    """Of ``STORE_VARIABLES``, just ``environment``'s are set meanwhile (None: no change), as
    in a worker process started with that environment."""
    if environment is None:
        yield
        return
    saved = {name: os.environ.get(name) for name in STORE_VARIABLES}
    try:
        for name in STORE_VARIABLES:
            if name in environment:
                os.environ[name] = environment[name]
            else:
                os.environ.pop(name, None)
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@attrs.define
class WorkerProcess:
    """A registered instance and the task that keeps its registration open."""

    instance: Instance
    registration: Registration | None = None
    stop: trio.Event = attrs.field(factory=trio.Event)
    stopped: trio.Event = attrs.field(factory=trio.Event)


@attrs.define
class Watcher:
    discovery: Discovery | None = None
    log: list[tuple[str, int]] = attrs.field(factory=list)
    skips: list[tuple[str, str]] = attrs.field(factory=list)  # (key, field), as reported

    def added(self, instance_id: int) -> None:
        self.log.append(("added", instance_id))

    def removed(self, instance_id: int) -> None:
        self.log.append(("removed", instance_id))

    def skipped(self, skipped: SkippedRecord) -> None:
        """The file store names a skipped record by its file; the suite, by its key."""
        key = f"{INSTANCES_BUCKET}/{urllib.parse.unquote(Path(skipped.record).name)}"
        self.skips.append((key, skipped.field))


class StoreProcesses:
    """What the file and etcd store targets share: worker processes holding a registration,
    watchers' reports, and refusals."""

    KIND: str  # the kind of store: "file" or "etcd"
    _portal: TrioPortal
    _seed: int
    _store: DiscoveryStore
    _workers: dict[int, WorkerProcess]
    _watchers: list[Watcher]
    _endpoints: dict[int, str]  # every id registered or put, by its endpoint
    _ports: Iterator[int]
    _nursery: trio.Nursery

    def register(self, endpoint: str, *, device: str = "cuda") -> int:
        instance_id, named = self._start(endpoint, device, "127.0.0.1")
        assert named is None, f"registering {endpoint} was refused naming {named}"
        return instance_id

    def register_refusal(
        self, endpoint: str, *, device: str = "cuda", host: str = "127.0.0.1"
    ) -> str | None:
        try:  # as `routespec worker --endpoint` parses it
            parse_endpoint(endpoint)
        except argparse.ArgumentTypeError:
            return "--endpoint"
        return self._start(endpoint, device, host)[1]

    def _start(self, endpoint: str, device: str, host: str) -> tuple[int, str | None]:
        instance_id = self._fresh_id()
        address = f"{host}:{next(self._ports)}/{transport_path(endpoint, instance_id)}"
        worker = WorkerProcess(Instance(instance_id, endpoint, address, device))

        async def start() -> str | None:
            try:
                await self._nursery.start(self._run, worker)
            except DiscoveryError as refused:  # DSC-015: the store's own registration refused
                return refused.field
            return None

        named = self._portal.call(start)
        if named is None:
            self._workers[instance_id] = worker
            self._endpoints[instance_id] = endpoint
        return instance_id, named

    def _fresh_id(self) -> int:
        raise NotImplementedError

    async def _run(self, worker: WorkerProcess, *, task_status: trio.TaskStatus[None]) -> None:
        try:
            async with self._store.registration(worker.instance) as registration:
                worker.registration = registration
                task_status.started()
                await worker.stop.wait()
        finally:
            worker.stopped.set()

    def withdraw(self, instance_id: int) -> None:
        registration = self._workers[instance_id].registration
        assert registration is not None
        self._portal.call(registration.withdraw)

    def events(self, watcher: int) -> tuple[tuple[str, int], ...]:
        return tuple(self._watchers[watcher].log)

    def skipped(self, watcher: int) -> tuple[tuple[str, str], ...]:
        return tuple(self._watchers[watcher].skips)

    def refusal(self, address: str, ttl: float) -> str | None:
        return refusal(self._portal, address, ttl)

    def reopen(
        self,
        *,
        ttl: float | None = None,
        environment: Mapping[str, str] | None = None,
        store: str | None = None,
    ) -> DiscoveryTarget:
        if (store or self.KIND) == "etcd" and environment is None:
            return EtcdDiscovery(self._portal, self._seed + 1, ttl)
        return ReferenceDiscovery(self._portal, self._seed + 1, ttl, environment)


class ReferenceDiscovery(StoreProcesses):
    """The file store of one target; every call settles inside the target's portal."""

    KIND = "file"
    _store: FileStore

    def __init__(
        self,
        portal: TrioPortal,
        seed: int,
        ttl: float | None = None,
        environment: Mapping[str, str] | None = None,
    ) -> None:
        """A store in a new temporary directory, or, given ``environment``, the default
        store that environment chooses; ``ttl`` None is the implementation's default."""
        self._portal = portal
        self._seed = seed
        self._ids = random.Random(seed)
        self._own_ids = environment is not None  # the implementation's ids: a shared store
        self._ports = itertools.count(FIRST_PORT)
        self._workers: dict[int, WorkerProcess] = {}
        self._endpoints: dict[int, str] = {}  # every id registered or put, by its endpoint
        self._watchers: list[Watcher] = []
        self._aged_at = time.monotonic()  # when records were last aged (real time)
        self._root, self._nursery = portal.call(self._open)
        ttl_argument = () if ttl is None else (ttl,)  # --ttl, or none
        with store_environment(environment):  # as a worker's --discovery (or none) opens it
            spec = None if environment is not None else self.address()
            opened = open_store(spec, *ttl_argument)
        assert isinstance(opened, FileStore), f"{spec} opened {opened!r}"
        self._root = opened.root
        self._store = attrs.evolve(opened, poll_interval=POLL_INTERVAL)
        portal.call(self._store.check)

    async def _open(self) -> tuple[Path, trio.Nursery]:
        opened: tuple[Path, trio.Nursery] = await self._portal.nursery.start(self._own)
        return opened

    @staticmethod
    async def _own(*, task_status: trio.TaskStatus[tuple[Path, trio.Nursery]]) -> None:
        """Hold the directory and the store's tasks; when the portal closes, the tasks end
        first (registrations withdraw), then the directory goes."""
        with tempfile.TemporaryDirectory(prefix="routespec-discovery-") as root:
            async with trio.open_nursery() as nursery:
                task_status.started((Path(root), nursery))
                await trio.sleep_forever()

    def address(self) -> str:
        return f"file:{self._root}"

    def timing(self) -> DiscoveryTiming:
        ttl = self._store.ttl
        return DiscoveryTiming(ttl, max(ttl / 3, MIN_KEEP_ALIVE), self._store.poll_interval)

    # worker processes

    def _fresh_id(self) -> int:
        if self._own_ids:
            return random_instance_id()
        while (instance_id := self._ids.getrandbits(64)) in self._endpoints:
            pass
        return instance_id

    def lapse(self, instance_id: int) -> None:
        worker = self._workers[instance_id]
        path = self._path(instance_id)
        aside = self._root / f"killed-{instance_id:x}"  # outside the instances directory

        async def kill() -> None:
            try:
                os.link(path, aside)
            except FileNotFoundError:
                kept = False  # no record to leave behind (withdrawn, or lost)
            else:
                kept = True
            worker.stop.set()
            await worker.stopped.wait()
            if kept:
                os.replace(aside, path)

        self._portal.call(kill)

    def put_raw(self, endpoint: str, instance_id: int, value: bytes) -> None:
        self._endpoints[instance_id] = endpoint
        self._portal.call_sync(lambda: write_atomic(self._path(instance_id), value))

    def put_raw_key(self, key: str, value: bytes) -> None:
        name = urllib.parse.quote(key.removeprefix(f"{INSTANCES_BUCKET}/"), safe="")
        self._portal.call_sync(lambda: write_atomic(instances_dir(self._root) / name, value))

    def lose_records(self) -> None:
        self._portal.call_sync(lambda: shutil.rmtree(instances_dir(self._root), ignore_errors=True))

    # watchers

    def watch(self, endpoint: str) -> int:
        watcher = Watcher()
        self._watchers.append(watcher)

        async def start() -> None:
            await self._nursery.start(self._follow, endpoint, watcher)

        self._portal.call(start)
        return len(self._watchers) - 1

    async def _follow(
        self, endpoint: str, watcher: Watcher, *, task_status: trio.TaskStatus[None]
    ) -> None:
        store = attrs.evolve(self._store, on_skipped=watcher.skipped)  # this watcher's reports
        async with store.watch(endpoint, watcher.added, watcher.removed) as discovery:
            watcher.discovery = discovery
            task_status.started()
            await trio.sleep_forever()

    def listed(self, watcher: int) -> Mapping[int, ListedInstance]:
        discovery = self._watchers[watcher].discovery
        assert discovery is not None
        return listing(discovery)

    # the store itself

    def record(self, instance_id: int) -> StoredRecord | None:
        if instance_id not in self._endpoints:
            return None
        path = self._path(instance_id)
        try:
            value = path.read_bytes()
        except FileNotFoundError:
            return None
        return StoredRecord(f"{INSTANCES_BUCKET}/{urllib.parse.unquote(path.name)}", value)

    def _path(self, instance_id: int) -> Path:
        return record_path(self._root, self._endpoints[instance_id], instance_id)

    def advance(self, seconds: float) -> None:
        clock = self._portal.clock
        assert clock is not None, "the store's time moves with the portal's mock clock"
        remaining = seconds
        while remaining > 1e-9:
            step = min(remaining, self._store.poll_interval)

            async def tick(step: float = step) -> None:
                self._age(step)
                clock.jump(step)

            self._portal.call(tick)
            remaining -= step

    def _age(self, seconds: float) -> None:
        """The wall clock, as the store reads it, moves on by ``seconds`` since the last call
        (the real time since then is taken back)."""
        now = time.monotonic()
        shift = round((seconds - (now - self._aged_at)) * 1e9)
        self._aged_at = now
        try:
            entries = list(os.scandir(instances_dir(self._root)))
        except FileNotFoundError:
            return
        for entry in entries:
            stat = entry.stat(follow_symlinks=False)
            os.utime(entry.path, ns=(stat.st_atime_ns - shift, stat.st_mtime_ns - shift))


def listing(discovery: Discovery) -> dict[int, ListedInstance]:
    """What a watcher's ``Discovery`` lists now."""
    listed: dict[int, ListedInstance] = {}
    for instance_id in discovery.instance_ids():
        instance = discovery.lookup(instance_id)
        address, codec = (
            (None, None) if instance is None else (instance.address, instance.payload_codec)
        )
        listed[instance_id] = ListedInstance(address, discovery.device_type(instance_id), codec)
    return listed


def refusal(portal: TrioPortal, address: str, ttl: float) -> str | None:
    """Open ``address`` as a router starting on it does: checked, then a watcher's first read;
    the argument its ``DiscoveryError`` names, or None."""

    async def attempt() -> str | None:
        try:
            store = open_store(address, ttl)
            await store.check()
            async with store.watch(PROBED_ENDPOINT):
                pass
        except DiscoveryError as refused:
            return refused.field
        return None

    return portal.call(attempt)


# --- the etcd store ---

ETCD_PROPAGATION = 0.5  # seconds: a watch event takes milliseconds; the rest is slack
ETCD_START_TIMEOUT = 20.0
ETCD_STEP = 0.1  # advance() sleeps in steps this long, then moves the mock clock as far


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class EtcdDiscovery(StoreProcesses):
    """The reference's etcd store as a ``DiscoveryTarget``, against an etcd server of its own
    (Debian's ``etcd-server``; the check is SKIP where ``etcd`` is not installed).

    **Time** is real: etcd expires leases on its own clock. ``advance(s)`` sleeps ``s`` in
    steps and moves the portal's mock clock as far after each, so that the registrations'
    keep-alives (trio sleeps) fall due when etcd expects them. **Killing**: ``lapse(id)``
    marks the registration withdrawn before its task ends, so its lease is not revoked but
    no longer kept alive, as after SIGKILL. Another process's record (``put_raw``) is put
    under a lease of ``ttl`` that nobody keeps alive. ``lose_records`` revokes every lease
    and deletes every key, as an etcd restarted without its data.
    """

    KIND = "etcd"
    _store: EtcdStore

    def __init__(self, portal: TrioPortal, seed: int, ttl: float | None = None) -> None:
        import pytest

        try:
            import httpx

            from routespec.discovery import etcd_store
        except ModuleNotFoundError:
            pytest.skip("the etcd store needs the 'etcd' extra (httpx)")
        binary = shutil.which("etcd")
        if binary is None:
            pytest.skip("etcd is not installed (apt-get install etcd-server)")
        self._etcd = etcd_store
        self._portal = portal
        self._seed = seed
        self._ids = random.Random(seed)
        self._ports = itertools.count(FIRST_PORT)
        self._workers: dict[int, WorkerProcess] = {}
        self._endpoints: dict[int, str] = {}
        self._watchers: list[Watcher] = []
        self._data = Path(tempfile.mkdtemp(prefix="routespec-etcd-"))
        client, peer = (f"http://127.0.0.1:{_free_port()}" for _ in range(2))
        with open(self._data / "etcd.log", "ab") as log:
            self._process = subprocess.Popen(
                [
                    binary,
                    "--name=routespec",
                    f"--data-dir={self._data / 'data'}",
                    f"--listen-client-urls={client}",
                    f"--advertise-client-urls={client}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=routespec={peer}",
                    "--log-level=error",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._http = httpx.Client(base_url=client, timeout=5.0)
        self._url = client
        deadline = time.monotonic() + ETCD_START_TIMEOUT
        while not self._answers(httpx.HTTPError):  # a bounded poll until it serves requests
            assert self._process.poll() is None, f"etcd exited; see {self._data / 'etcd.log'}"
            assert time.monotonic() < deadline, "etcd did not start"
            time.sleep(0.05)
        self._nursery: trio.Nursery = portal.call(self._open)
        opened = open_store(self.address(), *(() if ttl is None else (ttl,)))
        assert isinstance(opened, etcd_store.EtcdStore), f"{self.address()} opened {opened!r}"
        self._store = opened
        portal.call(self._store.check)

    def _answers(self, failure: type[Exception]) -> bool:
        try:
            return self._http.post("/v3/maintenance/status", json={}).status_code == 200
        except failure:
            return False

    async def _open(self) -> trio.Nursery:
        nursery: trio.Nursery = await self._portal.nursery.start(self._own)
        return nursery

    async def _own(self, *, task_status: trio.TaskStatus[trio.Nursery]) -> None:
        """The store's tasks end first (registrations withdraw), then the server stops."""
        try:
            async with trio.open_nursery() as nursery:
                task_status.started(nursery)
                await trio.sleep_forever()
        finally:
            self._http.close()
            self._process.terminate()
            self._process.wait(timeout=10)
            shutil.rmtree(self._data, ignore_errors=True)

    def address(self) -> str:
        return f"etcd:{self._url}"

    def timing(self) -> DiscoveryTiming:
        return DiscoveryTiming(self._store.ttl, self._store.ttl / 3, ETCD_PROPAGATION)

    # worker processes

    def _fresh_id(self) -> int:
        while (instance_id := self._ids.getrandbits(64)) in self._endpoints:
            pass
        return instance_id

    def lapse(self, instance_id: int) -> None:
        worker = self._workers[instance_id]
        registration = worker.registration
        assert isinstance(registration, self._etcd.EtcdRegistration)

        async def kill() -> None:
            registration.withdrawn = True  # its lease is left to expire
            worker.stop.set()
            await worker.stopped.wait()

        self._portal.call(kill)

    def _call(self, path: str, body: Mapping[str, object]) -> dict[str, object]:
        response = self._http.post(path, json=body)
        assert response.status_code == 200, f"etcd refused {path}: {response.text}"
        reply: dict[str, object] = response.json()
        return reply

    def put_raw(self, endpoint: str, instance_id: int, value: bytes) -> None:
        self._endpoints[instance_id] = endpoint
        self.put_raw_key(self._etcd.etcd_key(endpoint, instance_id), value)

    def put_raw_key(self, key: str, value: bytes) -> None:
        lease = self._call("/v3/lease/grant", {"TTL": max(1, round(self._store.ttl))})["ID"]
        b64 = self._etcd.b64
        self._call("/v3/kv/put", {"key": b64(key), "value": b64(value), "lease": lease})

    def lose_records(self) -> None:
        leases = self._call("/v3/lease/leases", {}).get("leases") or []
        assert isinstance(leases, list), leases
        for lease in leases:
            self._call("/v3/lease/revoke", {"ID": lease["ID"]})
        prefix, b64 = f"{INSTANCES_BUCKET}/", self._etcd.b64
        end = self._etcd.prefix_end(prefix)
        self._call("/v3/kv/deleterange", {"key": b64(prefix), "range_end": b64(end)})

    # watchers

    def watch(self, endpoint: str) -> int:
        watcher = KeyedWatcher()
        self._watchers.append(watcher)

        async def follow(*, task_status: trio.TaskStatus[None]) -> None:
            store = attrs.evolve(self._store, on_skipped=watcher.skipped)
            async with store.watch(endpoint, watcher.added, watcher.removed) as discovery:
                watcher.discovery = discovery
                task_status.started()
                await trio.sleep_forever()

        async def start() -> None:
            await self._nursery.start(follow)

        self._portal.call(start)
        return len(self._watchers) - 1

    def listed(self, watcher: int) -> Mapping[int, ListedInstance]:
        discovery = self._watchers[watcher].discovery
        assert discovery is not None

        async def snapshot() -> Mapping[int, ListedInstance]:
            return listing(discovery)

        return self._portal.call(snapshot)

    # the store itself

    def record(self, instance_id: int) -> StoredRecord | None:
        if instance_id not in self._endpoints:
            return None
        key = self._etcd.etcd_key(self._endpoints[instance_id], instance_id)
        kvs = self._call("/v3/kv/range", {"key": self._etcd.b64(key)}).get("kvs") or []
        assert isinstance(kvs, list)
        if not kvs:
            return None
        return StoredRecord(key, base64.b64decode(kvs[0].get("value", "")))

    def advance(self, seconds: float) -> None:
        clock = self._portal.clock
        assert clock is not None, "the keep-alives sleep on the portal's mock clock"
        remaining = seconds
        while remaining > 1e-9:
            step = min(remaining, ETCD_STEP)
            time.sleep(step)  # etcd's clock: leases expire in real time

            async def jump(step: float = step) -> None:
                clock.jump(step)

            self._portal.call(jump)
            remaining -= step


class KeyedWatcher(Watcher):
    def skipped(self, skipped: SkippedRecord) -> None:
        """The etcd store names a skipped record by its key already."""
        self.skips.append((skipped.record, skipped.field))
