"""Adapter ``dynamo-discovery``: Dynamo 1.6.1's own file discovery judged by the DSC checks.

Every registration is a real Dynamo worker process (``DistributedRuntime(loop, "file",
"tcp")`` + ``serve_endpoint``) and every watcher a real Dynamo client process
(``endpoint.client()``), all sharing one file store (``DYN_FILE_KV``) in a temporary
directory, every socket on 127.0.0.1. The processes are this module run as a program:
``python -m routespec.adapters.dynamo_discovery worker|watcher ns.comp.endpoint``.

- ``register``: a worker starts serving; its id is its ``connection_id()``, the id its record
  names; it returns once the record file is there. A ``cpu`` worker runs with
  ``CUDA_VISIBLE_DEVICES=`` (``DEVICES``). ``withdraw``: ``unregister_endpoint_instance()``
  (the process keeps running). ``lapse``: SIGKILL. A worker still running at the end closes
  its runtime (``shutdown()`` deletes its records).
- ``put_raw`` writes a file in Dynamo's layout (``dynamo_file_name``; temp file + rename, as
  Dynamo does); ``lose_records`` deletes the record files.
- A watcher's list is its client's ``instances()``. The bindings give no change stream
  (``Client`` has no callback or watch), so ``events`` are derived from successive listings:
  the adapter samples every watcher when it starts and every 50 ms while the store's time
  passes (``advance`` sleeps in real time), and reports each id that appears or disappears
  between two samples. ``listed`` is the last sample. ``skipped`` is what the watcher warns
  on its stderr (``SKIP_WARNING``), its only report of a record it did not list.
- ``timing`` is what 1.6.1 uses (see ``TTL``).

What has no surface in 1.6.1 is SKIP with the probe behind it (``unreachable``).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any, NoReturn, cast

import attrs

from routespec.adapters.dynamo.expectations import load_expectations
from routespec.discovery.file_store import (
    INSTANCES_BUCKET,
    instances_dir,
    write_atomic,
)
from routespec.testing.target import (
    Capability,
    DiscoveryTarget,
    DiscoveryTiming,
    ListedInstance,
    StoredRecord,
    Target,
    TargetConfig,
)
from routespec.testing.unsupported import Unsupported

EXPECTATIONS = Path(__file__).resolve().with_name("dynamo_discovery_expectations.toml")
CAPABILITIES = frozenset({Capability.DISCOVERY_STORE})

NAME_MAX = 255  # bytes in one file name (Linux)
TTL = 10.0
"""The file store's liveness period: ``DEFAULT_TTL`` (10 s) in lib/runtime/src/storage/kv/
file.rs; 1.6.1 has no setting for it (no ``DYN_*`` variable names one)."""
RENEWAL = TTL / 3
"""Its keep-alive thread touches owned files every ``max(ttl / 3, 1 s)``: measured 3.34 s
between mtimes of a live worker's record."""
PROPAGATION = 0.5
"""Watchers follow the directory through inotify: a deleted record left the client's
``instances()`` within the same 20 ms sample. (Expiry is later: the next keep-alive sweep of
any live process deletes a record older than ttl, 10.4 to 12.6 s after its last renewal in
the probes, depending on the sweepers' phase.)"""
SAMPLE_EVERY = 0.05
START_TIMEOUT = 30.0
LOOPBACK = {
    "DYN_TCP_RPC_HOST": "127.0.0.1",
    "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
    "DYN_LOG": "error",
    "NO_COLOR": "1",
}
DEVICES: dict[str, dict[str, str]] = {"cuda": {}, "cpu": {"CUDA_VISIBLE_DEVICES": ""}}
"""A 1.6.1 worker's record says ``cpu`` when no CUDA device is visible, else ``cuda`` (even
on this machine, which has none); serve_endpoint has no device argument. Probed: a worker
started with CUDA_VISIBLE_DEVICES= wrote "device_type":"cpu", one without wrote "cuda"."""
NO_DEVICE_NAME = (
    "a 1.6.1 worker's device type is 'cuda' or 'cpu', from CUDA_VISIBLE_DEVICES; "
    "serve_endpoint(handler, graceful_shutdown, metrics_labels, health_check_payload) takes "
    "no device type, so {device!r} cannot be registered"
)
NO_REGISTRATION_REFUSAL = (
    "a 1.6.1 worker's device type is 'cuda' or 'cpu', from CUDA_VISIBLE_DEVICES (no other "
    "name can be registered), and its host is DYN_TCP_RPC_HOST, where it binds: this suite "
    "binds 127.0.0.1 only"
)
NO_STORE_ARGUMENTS = (
    "1.6.1 has neither argument: the store is DistributedRuntime(loop, backend, ...) with "
    "DYN_FILE_KV (probed: backend 'nats:localhost:4222' raises \"Unknown key-value store type "
    "'nats:localhost:4222'\"; DYN_FILE_KV=/dev/null makes serve_endpoint raise \"Unable to "
    'register service for discovery. Check discovery service status"), and the file '
    "store's liveness period is the constant DEFAULT_TTL (10 s), with no setting"
)
SKIP_WARNING = re.compile(
    r"WARN\s+dynamo_runtime::discovery\S*: (?P<what>[^=]*?) key=(?P<key>\S+) error=(?P<error>.*)$"
)
"""How a 1.6.1 watcher reports a record it skips: one WARN line on its stderr (the bindings
have no other channel), e.g. ``Failed to parse discovery instance from watch event
key=v1/instances/dsc/backend/generate/bad error=expected value at line 1 column 1``."""
ENDPOINT_REFUSAL = "ValueError: Invalid endpoint path"
"""How 1.6.1 refuses a worker's endpoint that is not three names: ``runtime.endpoint(path)``
raises ``ValueError: Invalid endpoint path 'dsc.backend'. Expected format:
'namespace.component.endpoint' or 'dyn://namespace.component.endpoint'`` (a typed refusal of
its one argument, the endpoint)."""
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the runtime colours its log whatever NO_COLOR says


def unreachable(what: str) -> NoReturn:
    """This step has no surface in Dynamo 1.6.1's discovery: the check is SKIP, with why."""
    import pytest

    pytest.skip(f"dynamo-discovery: {what}")


def dynamo_path(endpoint: str) -> str:
    """The spec's ``ns/comp/endpoint`` as the bindings spell it (``ns.comp.endpoint``)."""
    return endpoint.replace("/", ".")


def dynamo_file_name(key: str) -> str:
    """A key as 1.6.1 names its file: every byte but ASCII letters and digits
    percent-encoded (``clear_kv_blocks`` is ``clear%5Fkv%5Fblocks``; ``urllib.parse.quote``
    would keep the ``_``)."""
    return "".join(
        chr(byte) if chr(byte).isalnum() and byte < 128 else f"%{byte:02X}" for byte in key.encode()
    )


STORE_VARIABLES = ("DYN_FILE_KV", "TMPDIR")  # what chooses 1.6.1's file store


def default_store(environment: Mapping[str, str]) -> Path:
    """Where 1.6.1 keeps its file store: ``$DYN_FILE_KV``, else Rust's ``temp_dir()`` (``$TMPDIR``,
    else ``/tmp``) ``/dynamo_store_kv`` (lib/runtime/src/storage/kv/file.rs)."""
    if "DYN_FILE_KV" in environment:
        return Path(environment["DYN_FILE_KV"])
    return Path(environment.get("TMPDIR", "/tmp")) / "dynamo_store_kv"


class Child:
    """A process of this module speaking JSON lines; a thread queues what it prints."""

    def __init__(
        self,
        role: str,
        endpoint: str,
        root: Path,
        env: Mapping[str, str] | None = None,
        store: Mapping[str, str] | None = None,
    ) -> None:
        """Its log goes to ``root/logs``; its store is ``root`` (``DYN_FILE_KV``), or the one
        ``store``, its only store variables, chooses."""
        inherited = {
            k: v for k, v in os.environ.items() if store is None or k not in STORE_VARIABLES
        }
        store = {"DYN_FILE_KV": str(root)} if store is None else store
        env = {**inherited, **LOOPBACK, **store, **(env or {})}
        self.log = root / "logs" / f"{role}-{time.monotonic_ns()}.log"
        self.log.parent.mkdir(exist_ok=True)
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", __name__, role, dynamo_path(endpoint)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
            )
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout:
            for line in self.process.stdout:
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def send(self, op: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op}).encode() + b"\n")
        self.process.stdin.flush()

    def expect(self, op: str, timeout: float = START_TIMEOUT) -> dict[str, Any]:
        try:
            message = self.lines.get(timeout=timeout)
        except queue.Empty:
            message = None
        if message is None or message.get("op") != op:
            raise RuntimeError(f"expected {op!r} from {self.log.name}: {message}: {self.tail()}")
        return message

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-600:]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.close_stdin()

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()

    def close(self) -> None:
        """EOF on stdin: the process shuts its runtime down (its records go) and exits."""
        self.close_stdin()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()


def start(
    role: str,
    endpoint: str,
    root: Path,
    env: Mapping[str, str] | None = None,
    store: Mapping[str, str] | None = None,
) -> tuple[Child, dict[str, Any]]:
    """Start a child; a start refused for lack of inotify instances or files is retried."""
    for attempt in range(5):
        child = Child(role, endpoint, root, env, store)
        try:
            return child, child.expect("ready")
        except RuntimeError:
            child.kill()
            if "Too many open files" not in child.tail() or attempt == 4:
                raise
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


@attrs.define
class Watcher:
    child: Child
    listed: dict[int, ListedInstance] = attrs.field(factory=dict)
    log: list[tuple[str, int]] = attrs.field(factory=list)

    def sample(self) -> None:
        """Read the client's ``instances()`` now; ids that changed since the last read are
        reported, removals first, each kind in id order."""
        self.child.send("sample")
        now = {
            int(instance_id): ListedInstance(address, device)
            for instance_id, address, device in self.child.expect("sample", 10)["instances"]
        }
        self.log += [("removed", i) for i in sorted(set(self.listed) - set(now))]
        self.log += [("added", i) for i in sorted(set(now) - set(self.listed))]
        self.listed = now


class DynamoDiscovery:
    """One file store of real Dynamo processes; ``close`` stops every one of them."""

    def __init__(self, environment: Mapping[str, str] | None = None) -> None:
        """A store in a new temporary directory, or the default one ``environment`` chooses."""
        self._root = Path(tempfile.mkdtemp(prefix="routespec-dynamo-discovery-"))  # and logs
        self._environment = environment
        self._store = self._root if environment is None else default_store(environment)
        self._reopened: list[DynamoDiscovery] = []
        self._workers: dict[int, Child] = {}
        self._endpoints: dict[int, str] = {}  # every id registered or put, by its endpoint
        self._watchers: list[Watcher] = []

    def close(self) -> None:
        workers = list(self._workers.values())
        for worker in workers:  # all shut down at once, then each is waited for
            worker.close_stdin()
        for watcher in self._watchers:  # it owns no record: SIGKILL spares its 0.6 s shutdown
            watcher.child.kill()
        for worker in workers:
            worker.close()
        for store in self._reopened:
            store.close()
        shutil.rmtree(self._root, ignore_errors=True)

    def address(self) -> str:
        return f"file:{self._store}"

    def timing(self) -> DiscoveryTiming:
        return DiscoveryTiming(TTL, RENEWAL, PROPAGATION)

    # worker processes

    def register(self, endpoint: str, *, device: str = "cuda") -> int:
        if device not in DEVICES:
            unreachable(NO_DEVICE_NAME.format(device=device))
        child, ready = start("worker", endpoint, self._root, DEVICES[device], self._environment)
        instance_id = int(ready["instance_id"])
        self._workers[instance_id] = child
        self._endpoints[instance_id] = endpoint
        deadline = time.monotonic() + START_TIMEOUT
        path = self._path(instance_id)
        name_bytes = len(path.name.encode())
        if name_bytes > NAME_MAX:  # no file system here could hold the record: none to wait for
            raise RuntimeError(
                f"{instance_id:x} started, but its record's file name is {name_bytes} bytes, "
                f"past this file system's {NAME_MAX}: {child.tail()}"
            )
        while not path.exists():  # serve_endpoint registers after a while
            if time.monotonic() > deadline:
                raise RuntimeError(f"{instance_id:x} never stored its record: {child.tail()}")
            time.sleep(0.01)
        return instance_id

    def register_refusal(
        self, endpoint: str, *, device: str = "cuda", host: str = "127.0.0.1"
    ) -> str | None:
        if device not in DEVICES or host != "127.0.0.1":
            unreachable(NO_REGISTRATION_REFUSAL)
        try:  # only the endpoint is left to refuse
            self.register(endpoint, device=device)
        except RuntimeError as refused:
            if ENDPOINT_REFUSAL in str(refused):
                return "--endpoint"  # runtime.endpoint(path) refused its one argument
            return f"not an option: {refused}"
        return None

    def withdraw(self, instance_id: int) -> None:
        worker = self._workers[instance_id]
        worker.send("withdraw")
        worker.expect("withdrawn")

    def lapse(self, instance_id: int) -> None:
        self._workers[instance_id].kill()

    def put_raw(self, endpoint: str, instance_id: int, value: bytes) -> None:
        self._endpoints[instance_id] = endpoint
        write_atomic(self._path(instance_id), value)  # via a ".tmp_" file, which Dynamo ignores

    def put_raw_key(self, key: str, value: bytes) -> None:
        name = dynamo_file_name(key.removeprefix(f"{INSTANCES_BUCKET}/"))
        write_atomic(instances_dir(self._store) / name, value)

    def lose_records(self) -> None:
        for entry in instances_dir(self._store).iterdir():
            if entry.is_file() and not entry.name.startswith("."):
                entry.unlink(missing_ok=True)

    # watchers

    def watch(self, endpoint: str) -> int:
        child, _ready = start(
            "watcher", endpoint, self._root, {"DYN_LOG": "warn"}, self._environment
        )
        watcher = Watcher(child)
        self._watchers.append(watcher)
        watcher.sample()
        watcher.log.clear()  # the first read is a list, not a report of changes
        return len(self._watchers) - 1

    def listed(self, watcher: int) -> Mapping[int, ListedInstance]:
        return dict(self._watchers[watcher].listed)

    def events(self, watcher: int) -> tuple[tuple[str, int], ...]:
        return tuple(self._watchers[watcher].log)

    def skipped(self, watcher: int) -> tuple[tuple[str, str], ...]:
        """The watcher's WARN lines about records, in order, as (key, its error text): 1.6.1
        names no field, so the error text stands where the spec wants the field."""
        log = ANSI.sub("", self._watchers[watcher].child.log.read_text(errors="replace"))
        return tuple(
            (found["key"], found["error"])
            for line in log.splitlines()
            if (found := SKIP_WARNING.search(line)) is not None
        )

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
        names = dynamo_path(self._endpoints[instance_id]).split(".")  # even a malformed one's
        return instances_dir(self._store) / dynamo_file_name("/".join((*names, f"{instance_id:x}")))

    def advance(self, seconds: float) -> None:
        """Real time: the processes' own threads renew, expire and notify meanwhile."""
        deadline = time.monotonic() + seconds
        while True:
            for watcher in self._watchers:
                watcher.sample()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(SAMPLE_EVERY, left))

    def refusal(self, address: str, ttl: float) -> str | None:
        unreachable(NO_STORE_ARGUMENTS)

    def reopen(
        self,
        *,
        ttl: float | None = None,
        environment: Mapping[str, str] | None = None,
        store: str | None = None,
    ) -> DynamoDiscovery:
        if ttl is not None:
            unreachable(NO_STORE_ARGUMENTS)
        if store not in (None, "file"):
            unreachable(f"this adapter runs 1.6.1's file store only, not an {store} store")
        reopened = DynamoDiscovery(environment)
        self._reopened.append(reopened)
        return reopened


class DiscoveryOnlyTarget(Unsupported):
    """Only ``open_discovery``; routing through Dynamo is the ``dynamo`` adapter's."""

    def __init__(self) -> None:
        self.stores: list[DynamoDiscovery] = []

    def open_discovery(self) -> DiscoveryTarget:
        store = DynamoDiscovery()
        self.stores.append(store)
        return store

    def close(self) -> None:
        for store in self.stores:
            store.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        unreachable(f"{name}: this adapter judges discovery only (routing: --adapter dynamo)")


@attrs.frozen
class DynamoDiscoveryAdapter:
    name: str = "dynamo-discovery"
    capabilities: frozenset[Capability] = CAPABILITIES
    expected_failures: Mapping[str, str] = attrs.field(factory=dict)

    @contextlib.contextmanager
    def open(self, config: TargetConfig) -> Iterator[Target]:
        target = DiscoveryOnlyTarget()
        try:
            yield cast("Target", target)
        finally:
            target.close()


def _expectations() -> dict[str, str]:
    return load_expectations(EXPECTATIONS) if EXPECTATIONS.exists() else {}


ADAPTER = DynamoDiscoveryAdapter(expected_failures=_expectations())


# --- the processes ---


def emit(message: dict[str, object]) -> None:
    print(json.dumps(message), flush=True)


async def commands() -> Any:
    import asyncio

    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), cast("IO[str]", sys.stdin)
    )
    while line := await reader.readline():
        yield json.loads(line)["op"]


async def worker(path: str) -> None:
    import asyncio

    from dynamo.runtime import DistributedRuntime

    async def generate(request: object, context: object) -> Any:
        yield {"request": request}

    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    endpoint = runtime.endpoint(path)
    serving = asyncio.ensure_future(endpoint.serve_endpoint(generate))
    emit({"op": "ready", "instance_id": int(endpoint.connection_id())})
    async for op in commands():
        if op == "withdraw":
            await endpoint.unregister_endpoint_instance()
            emit({"op": "withdrawn"})
    serving.cancel()
    runtime.shutdown()


async def watcher(path: str) -> None:
    import asyncio

    from dynamo.runtime import DistributedRuntime

    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    client = await runtime.endpoint(path).client()
    # client() returns before the client's first read of the store is in: 2 of 38 watchers
    # started next to two stored records listed none right after it. wait_for_instances()
    # returns once it lists some; an endpoint with none is read within the propagation delay.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(client.wait_for_instances(), PROPAGATION)
    emit({"op": "ready"})
    async for op in commands():
        if op == "sample":
            listed = [
                [i.instance_id, i.transport.address, i.device_type] for i in client.instances()
            ]
            emit({"op": "sample", "instances": listed})
    runtime.shutdown()


if __name__ == "__main__":
    import asyncio

    role, endpoint_path = sys.argv[1], sys.argv[2]
    asyncio.run(worker(endpoint_path) if role == "worker" else watcher(endpoint_path))
