"""Interop with the real Dynamo 1.6.1 runtime (``ai-dynamo-runtime``), both directions.

Everything runs on 127.0.0.1 with one shared file-discovery directory per direction.
(a) Reference ``WorkerServer``s, registered by ``FileRegistration``, serve the real Dynamo
client. (b) Real Dynamo workers serve the reference ``PushRouter`` over ``TcpDispatch``,
discovered by ``FileDiscovery``. Dynamo processes are subprocesses (``tests/interop/``).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from routespec.adapters.dynamo.wire_access import ReceivedBytes, listening_ports, record_address
from routespec.discovery.file_store import (
    FileDiscovery,
    FileRegistration,
    random_instance_id,
    transport_path,
)
from routespec.discovery.instances import Instance
from routespec.errors import BackendKind, ErrorKind, RoutingError, chain_types
from routespec.routing.push_router import PushRouter
from routespec.routing.streaming import Annotated, Rejection, RejectionKind, Request
from routespec.transport.tcp_dispatch import TcpDispatch
from routespec.transport.worker_server import WorkerServer

if os.environ.get("ROUTESPEC_REQUIRE_DYNAMO"):  # CI installs the extra: a skip would hide it
    import dynamo.runtime  # noqa: F401
else:
    pytest.importorskip("dynamo.runtime")

ENDPOINT = "interop/comp/generate"
DYNAMO_ENDPOINT = "interop.comp.generate"
HELPERS = Path(__file__).parent / "interop"
PROCESS_TIMEOUT = 60.0  # a Dynamo process starts in ~1-3 s; generous for loaded CI machines
CALL_TIMEOUT = 20.0

Transcript = dict[str, Any]  # the Dynamo client's JSON outcome of each call, by tag


def dynamo_env(store: Path) -> dict[str, str]:
    """Loopback only, one shared discovery directory, quiet logs."""
    return {
        **os.environ,
        "DYN_FILE_KV": str(store),
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_LOG": "error",
        "NO_COLOR": "1",
    }


# --- direction (a): reference workers, real Dynamo client ---------------------------------

REFERENCE_FAILURES: dict[str, RoutingError] = {
    "engine_shutdown": RoutingError(BackendKind.ENGINE_SHUTDOWN, "engine_shutdown from ref"),
    "invalid_argument": RoutingError(ErrorKind.INVALID_ARGUMENT, "invalid_argument from ref"),
    "backend_invalid_argument": RoutingError(
        BackendKind.INVALID_ARGUMENT, "backend_invalid_argument from ref"
    ),
    "cancelled": RoutingError(BackendKind.CANCELLED, "cancelled from ref"),
    "chained": RoutingError(
        BackendKind.ENGINE_SHUTDOWN,
        "outer from ref",
        cause=RoutingError(ErrorKind.DISCONNECTED, "inner from ref"),
    ),
}


class ScriptedHandler:
    """Per request: refuses at the door with ``reject`` (an ACK prefix), fails before the
    stream with ``fail_at_start``, or yields ``n`` items ``{"worker", "i"}`` and then raises
    ``fail`` (names from ``REFERENCE_FAILURES``)."""

    def __init__(self, label: str) -> None:
        self.label = label

    def admit(self, request: Request) -> Rejection | None:
        fields = request.payload if isinstance(request.payload, dict) else {}
        reject = fields.get("reject")
        return None if reject is None else Rejection(RejectionKind(reject), "from ref")

    async def start(self, request: Request) -> AsyncGenerator[object, None]:
        fields = request.payload if isinstance(request.payload, dict) else {}
        fail = fields.get("fail_at_start")
        if isinstance(fail, str):
            raise REFERENCE_FAILURES[fail]
        return self._items(fields)

    async def _items(self, fields: dict[object, object]) -> AsyncGenerator[object, None]:
        count = fields.get("n", 0)
        for i in range(count if isinstance(count, int) else 0):
            yield {"worker": self.label, "i": i}
        fail = fields.get("fail")
        if isinstance(fail, str):
            raise REFERENCE_FAILURES[fail]


@asynccontextmanager
async def reference_workers(store: Path, labels: list[str]) -> AsyncIterator[dict[str, int]]:
    """One ``WorkerServer`` per label, each registered with a heartbeat; label -> id."""
    ids: dict[str, int] = {}
    async with trio.open_nursery() as nursery, AsyncExitStack() as registrations:
        for label in labels:
            server = WorkerServer(host="127.0.0.1")
            await nursery.start(server.run)
            instance_id = random_instance_id()
            address = server.serve(transport_path(ENDPOINT, instance_id), ScriptedHandler(label))
            instance = Instance(instance_id, ENDPOINT, address)
            await registrations.enter_async_context(FileRegistration.open(instance, store))
            ids[label] = instance_id
        yield ids
        nursery.cancel_scope.cancel()


async def run_dynamo_client(store: Path, count: int, plan: list[dict[str, object]]) -> list[Any]:
    """Run the real client; its JSON lines, the first being ``{"instance_ids": [...]}``."""
    command = [sys.executable, str(HELPERS / "dynamo_client.py"), DYNAMO_ENDPOINT, str(count)]
    with trio.fail_after(PROCESS_TIMEOUT):
        done = await trio.run_process(
            [*command, json.dumps(plan)],
            env=dynamo_env(store),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    return [json.loads(line) for line in done.stdout.decode().splitlines() if line.startswith("{")]


def _plan(ids: dict[str, int]) -> list[dict[str, object]]:
    """Tagged calls: round robin, direct to each, then error items, pre-stream failures and
    rejection ACKs from worker A (direct calls are not held back by Dynamo's inhibition)."""
    calls: list[dict[str, object]] = [
        {"tag": f"rr{k}", "mode": "round_robin", "request": {"n": 2, "k": k}} for k in range(4)
    ]
    calls += [
        {"tag": f"direct_{label}", "mode": "direct", "instance_id": iid, "request": {"n": 3}}
        for label, iid in ids.items()
    ]
    requests: dict[str, dict[str, object]] = {
        **{fail: {"n": 1, "fail": fail} for fail in REFERENCE_FAILURES},
        "start_engine_shutdown": {"fail_at_start": "engine_shutdown"},
        "reject_unavailable": {"reject": RejectionKind.UNAVAILABLE.value},
        "reject_overloaded": {"reject": RejectionKind.OVERLOADED.value},  # last: Dynamo
    }  # then treats A as overloaded for a while
    calls += [
        {"tag": tag, "mode": "direct", "instance_id": ids["A"], "request": request}
        for tag, request in requests.items()
    ]
    return calls


@pytest.fixture(scope="module")
def client_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, int], Transcript]:
    """Two reference workers (A, B) serve one run of the real Dynamo client's plan."""
    store = tmp_path_factory.mktemp("kv_a")

    async def scenario() -> tuple[dict[str, int], Transcript]:
        async with reference_workers(store, ["A", "B"]) as ids:
            lines = await run_dynamo_client(store, 2, _plan(ids))
        assert sorted(lines[0]["instance_ids"]) == sorted(ids.values())
        return ids, {line["call"]["tag"]: line for line in lines[1:]}

    return trio.run(scenario)


def test_dynamo_client_round_robins_over_reference_workers(
    client_run: tuple[dict[str, int], Transcript],
) -> None:
    """TRN-001, TRN-003: Dynamo's envelope is accepted, ACKed and answered by the reference
    worker; round_robin alternates over both reference instances."""
    _, transcript = client_run
    labels = []
    for k in range(4):
        outcome = transcript[f"rr{k}"]
        assert outcome["error"] is None
        (label,) = {item["worker"] for item in outcome["items"]}
        assert outcome["items"] == [{"worker": label, "i": 0}, {"worker": label, "i": 1}]
        labels.append(label)
    assert set(labels) == {"A", "B"}
    assert all(a != b for a, b in itertools.pairwise(labels))


def test_dynamo_client_direct_reaches_each_reference_worker(
    client_run: tuple[dict[str, int], Transcript],
) -> None:
    """TRN-001, TRN-003: ``direct`` by the id in the record reaches exactly that worker."""
    ids, transcript = client_run
    for label, iid in ids.items():
        outcome = transcript[f"direct_{label}"]
        assert outcome["call"]["instance_id"] == iid
        assert outcome["error"] is None
        assert outcome["items"] == [{"worker": label, "i": i} for i in range(3)]


@pytest.mark.parametrize(
    ("fail", "exception", "text"),
    [
        ("engine_shutdown", "builtins.ValueError", "Unavailable: engine_shutdown from ref"),
        ("invalid_argument", "dynamo._core.InvalidArgument", "invalid_argument from ref"),
        (
            "backend_invalid_argument",
            "dynamo._core.InvalidArgument",
            "backend_invalid_argument from ref",
        ),
        ("cancelled", "builtins.ValueError", "Cancelled: cancelled from ref"),
        ("chained", "builtins.ValueError", "Unavailable: outer from ref"),
    ],
)
def test_reference_error_items_reach_dynamo_typed(
    client_run: tuple[dict[str, int], Transcript], fail: str, exception: str, text: str
) -> None:
    """TRN-011: a reference error item reaches Dynamo's Python client after the items before
    it, typed as Dynamo types it (class prefix, or ``InvalidArgument``)."""
    _, transcript = client_run
    outcome = transcript[fail]
    assert outcome["items"] == [{"worker": "A", "i": 0}]
    assert outcome["error"] == {"class": exception, "text": text}


def test_reference_pre_stream_failure_reaches_dynamo(
    client_run: tuple[dict[str, int], Transcript],
) -> None:
    """TRN-005: a handler failing before its first item (non-null prologue) is a failure at
    Dynamo's call, carrying the worker's typed text."""
    _, transcript = client_run
    outcome = transcript["start_engine_shutdown"]
    assert outcome["items"] == []
    assert outcome["error"] == {
        "class": "builtins.Exception",
        "text": "Unavailable: Worker generate() failed before response stream: "
        "Backend(EngineShutdown): engine_shutdown from ref",
    }


def test_reference_rejection_acks_reach_dynamo_typed(
    client_run: tuple[dict[str, int], Transcript],
) -> None:
    """TRN-004: the reference's rejection ACK texts are Dynamo's: it classifies them as
    Unavailable and CapacityExhausted."""
    _, transcript = client_run
    assert transcript["reject_unavailable"]["error"] == {
        "class": "builtins.Exception",
        "text": "Unavailable: Server unavailable: from ref",
    }
    assert transcript["reject_overloaded"]["error"] == {
        "class": "builtins.Exception",
        "text": "CapacityExhausted: Server overloaded: from ref",
    }


# --- direction (b): real Dynamo workers, reference router ---------------------------------


@pytest.fixture(scope="module")
def dynamo_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Two real Dynamo workers (labels A and B) registered in a shared store."""
    store = tmp_path_factory.mktemp("kv_b")
    processes = []
    try:
        for label in ("A", "B"):
            with open(store.parent / f"{store.name}_worker_{label}.log", "wb") as log:
                processes.append(
                    subprocess.Popen(
                        [sys.executable, str(HELPERS / "dynamo_worker.py"), DYNAMO_ENDPOINT, label],
                        env=dynamo_env(store),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        discovery = FileDiscovery(store, ENDPOINT)
        deadline = time.monotonic() + PROCESS_TIMEOUT
        while len(discovery.instance_ids()) < 2:  # bounded poll for the discovery records
            assert time.monotonic() < deadline, "Dynamo workers did not register"
            assert all(p.poll() is None for p in processes), "a Dynamo worker exited"
            time.sleep(0.05)
            discovery.refresh()
        yield store
    finally:
        for process in processes:
            process.kill()
            process.wait(timeout=10)


@asynccontextmanager
async def reference_router(store: Path) -> AsyncIterator[PushRouter]:
    """``PushRouter`` over ``TcpDispatch``, fed by a watched ``FileDiscovery``."""
    discovery = FileDiscovery(store, ENDPOINT)
    discovery.refresh()
    async with TcpDispatch.open() as dispatch, trio.open_nursery() as nursery:
        nursery.start_soon(discovery.watch, 0.2, dispatch.instance_added, dispatch.instance_removed)
        yield PushRouter.create(ENDPOINT, discovery, dispatch)
        nursery.cancel_scope.cancel()


def _request(**payload: object) -> Request:
    return Request(str(uuid.uuid4()), payload)


async def collect(stream: AsyncIterator[Annotated]) -> list[Annotated]:
    items = []
    with trio.fail_after(CALL_TIMEOUT):
        async for item in stream:
            items.append(item)
            if item.error is not None:
                break
    return items


def test_dynamo_records_parse_as_reference_instances(dynamo_workers: Path) -> None:
    """TRN-001: a real worker's record names the request-plane path the reference sends."""
    discovery = FileDiscovery(dynamo_workers, ENDPOINT)
    discovery.refresh()
    for iid in discovery.instance_ids():
        instance = discovery.lookup(iid)
        assert instance is not None
        host_port, _, path = instance.address.partition("/")
        assert host_port.startswith("127.0.0.1:")
        assert path == transport_path(ENDPOINT, iid)
        assert (instance.device_type, instance.payload_codec) == ("cuda", "msgpack")


async def test_reference_router_round_robins_over_dynamo_workers(dynamo_workers: Path) -> None:
    """TRN-001, TRN-003: Dynamo workers accept the reference envelope, ACK it and stream their
    items back; round robin alternates over both."""
    labels = []
    async with reference_router(dynamo_workers) as router:
        for k in range(4):
            items = await collect(await router.generate(_request(n=2, k=k)))
            (label,) = {_label(item) for item in items}
            assert items == [Annotated({"worker": label, "i": i}) for i in range(2)]
            labels.append(label)
    assert set(labels) == {"A", "B"}
    assert all(a != b for a, b in itertools.pairwise(labels))


async def test_reference_router_direct_reaches_each_dynamo_worker(dynamo_workers: Path) -> None:
    """TRN-001, TRN-003: exact dispatch by discovered id reaches that Dynamo worker only."""
    seen = {}
    async with reference_router(dynamo_workers) as router:
        for iid in router.discovery.instance_ids():
            items = await collect(await router.direct(_request(n=3), iid))
            (seen[iid],) = {_label(item) for item in items}
            assert items == [Annotated({"worker": seen[iid], "i": i}) for i in range(3)]
    assert sorted(seen.values()) == ["A", "B"]


@pytest.mark.parametrize(
    ("fail", "error_type", "message"),
    [
        ("engine_shutdown", BackendKind.ENGINE_SHUTDOWN, "engine_shutdown from {}"),
        ("invalid_argument", BackendKind.INVALID_ARGUMENT, "invalid_argument from {}"),
        ("cancelled", BackendKind.CANCELLED, "cancelled from {}"),
        ("value_error", BackendKind.INVALID_ARGUMENT, "ValueError: value_error from {}"),
        ("runtime_error", BackendKind.UNKNOWN, "RuntimeError: runtime_error from {}"),
    ],
)
async def test_dynamo_error_items_reach_the_reference_typed(
    dynamo_workers: Path, fail: str, error_type: BackendKind, message: str
) -> None:
    """TRN-011: a Dynamo handler's exception arrives, after the items before it, as a typed
    error item whose chain is Dynamo's ``Backend(...)`` type and message."""
    async with reference_router(dynamo_workers) as router:
        iid = router.discovery.instance_ids()[0]
        first, last = await collect(await router.direct(_request(n=1, fail=fail), iid))
    label = _label(first)
    assert first == Annotated({"worker": label, "i": 0})
    assert last.error is not None
    assert chain_types(last.error) == (error_type,)
    assert last.error.message == message.format(label)


def _label(item: Annotated) -> str:
    assert isinstance(item.data, dict), item
    label = item.data["worker"]
    assert isinstance(label, str)
    return label


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs iproute2's ss (worker bytes)")
def test_raw_bytes_reach_a_dynamo_worker_and_are_counted(dynamo_workers: Path) -> None:
    """The ``dynamo`` adapter's wire access (TRN-002, TRN-012, TRN-022): a real worker's
    request-plane address from its record takes raw bytes, its accepted connections' received
    bytes are counted, and an unknown endpoint is refused at the ACK."""
    discovery = FileDiscovery(dynamo_workers, ENDPOINT)
    discovery.refresh()
    for iid in discovery.instance_ids():
        address = record_address(dynamo_workers, iid)
        instance = discovery.lookup(iid)
        assert instance is not None
        assert instance.address.startswith(f"{address[0]}:{address[1]}/")
        received = ReceivedBytes(address[1])
        before = received.total()
        path, headers, payload = b"no/such/endpoint", b"{}", b"\x00" * 24
        message = b"".join(
            (
                len(path).to_bytes(2, "big"),
                path,
                len(headers).to_bytes(2, "big"),
                headers,
                len(payload).to_bytes(4, "big"),
                payload,
            )
        )
        with socket.create_connection(address, timeout=CALL_TIMEOUT) as stream:
            stream.sendall(message)
            length = int.from_bytes(_read_exactly(stream, 4), "big")
            ack = _read_exactly(stream, length)
            assert b"unknown endpoint" in ack.lower()  # refused at the ACK
            assert received.total() - before == len(message)  # counted while still open


def test_listening_ports_finds_a_process_listener() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        assert listener.getsockname()[1] in listening_ports(os.getpid())


def _read_exactly(stream: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = stream.recv(count - len(data))
        assert chunk, "the worker closed the connection"
        data += chunk
    return data
