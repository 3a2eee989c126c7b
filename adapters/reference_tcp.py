"""Adapter ``reference-tcp``: the reference router and scripted workers, every worker a real
TCP server on 127.0.0.1 speaking Dynamo 1.6.1's wire.

Workers run in the portal's trio run, except those started with ``add_worker_process``: each
of those is a separate OS process (``routespec.testing.drill_process``) that a check can
kill with SIGKILL. The parent follows such a process through the reports it prints on stdout,
waiting for them in real time, since the portal's clock is a mock that only moves on request.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import itertools
import os
import resource
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Literal

import attrs
import trio

from routespec.adapters.reference import ENDPOINT, Cluster, ReferenceAdapter
from routespec.routing.streaming import InflightGauge
from routespec.testing import drill_process
from routespec.testing.drill_server import DrillWorkerServer, serve_black_hole
from routespec.testing.portal import TrioPortal
from routespec.testing.scripted import ScriptedWorker
from routespec.testing.target import (
    Capability,
    Delivery,
    HeldConnection,
    WorkerBounds,
    WorkerScript,
)
from routespec.transport.connection import CONNECTION_ERRORS, LOOPBACK, FramedConnection
from routespec.transport.control import DialBackPolicy
from routespec.transport.frames import ACK_PREFIX, MAX_ACK_BYTES
from routespec.transport.response_pool import ResponsePool
from routespec.transport.tcp_dispatch import TcpDispatch
from routespec.transport.worker_server import WorkerLimits

PROCESS_WAIT = 20.0
"""Real seconds to wait for a worker process to start, to report on a request, or to exit."""


@contextlib.contextmanager
def real_time_limit(seconds: float, waiting_for: str) -> Iterator[None]:
    """Raise ``TimeoutError`` unless the body ends within ``seconds`` of wall-clock time.

    Trio's own timeouts follow the run's clock, which in a portal is a ``MockClock``."""
    token = trio.lowlevel.current_trio_token()
    with trio.CancelScope() as scope:

        def expire() -> None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(scope.cancel, trio_token=token)

        timer = threading.Timer(seconds, expire)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
    if scope.cancelled_caught:
        raise TimeoutError(f"waited {seconds} s (real time) for {waiting_for}")


@attrs.define
class WorkerProcess:
    """A drill worker process and what it has reported so far."""

    worker_id: int
    process: trio.Process
    port: int | None = None
    reported: set[str] = attrs.field(factory=set)  # requests stalled or written to their end
    exited: bool = False

    def take(self, report: drill_process.Report, log: list[Delivery]) -> None:
        if isinstance(port := report.get("port"), int):
            self.port = port
        if isinstance(request_id := report.get("delivered"), str):
            prepared = report.get("prepared_for")
            prepared_for = prepared if isinstance(prepared, int) else None
            log.append(Delivery(request_id, self.worker_id, prepared_for))
        for key in ("stalled", "ended"):
            if isinstance(request_id := report.get(key), str):
                self.reported.add(request_id)


@attrs.define
class RawConnection:
    """A request-plane connection the suite holds open to a worker, and what came back."""

    stream: trio.SocketStream
    acks: list[str] = attrs.field(factory=list)
    closed: bool = False
    unread: bytearray = attrs.field(factory=bytearray)  # after the last whole ACK

    async def read_acks(self) -> None:
        """Collect ACKs until the worker closes the connection (or the suite does)."""
        try:
            while data := await self.stream.receive_some():
                self.unread += data
                self._take_acks()
        except CONNECTION_ERRORS:
            pass
        finally:  # closed by the worker, the suite, or the end of the target's run
            self.closed = True
            self.stream.socket.close()

    def _take_acks(self) -> None:
        unread, prefix = self.unread, ACK_PREFIX.size
        while len(unread) >= prefix:
            (length,) = ACK_PREFIX.unpack_from(unread)
            if length > MAX_ACK_BYTES or len(unread) < prefix + length:
                return
            self.acks.append(unread[prefix : prefix + length].decode(errors="replace"))
            del unread[: prefix + length]

    def view(self) -> HeldConnection:
        trailing = bytes(self.unread) if self.closed else b""
        return HeldConnection(tuple(self.acks), self.closed, trailing)


AddressInfo = list[  # what getaddrinfo returns, as trio.abc.HostnameResolver declares it
    tuple[Literal[socket.AddressFamily.AF_INET], socket.SocketKind, int, str, tuple[str, int]]
    | tuple[
        Literal[socket.AddressFamily.AF_INET6],
        socket.SocketKind,
        int,
        str,
        tuple[str, int, int, int] | tuple[int, bytes],
    ]
]


class ScriptedNames(trio.abc.HostnameResolver):
    """The portal run's resolver (Capability.SCRIPT_NAMES): the names a check set answer
    at once with their addresses, or never (a name set to None); every other name is
    resolved as trio resolves it by default, in a thread."""

    def __init__(self) -> None:
        self._names: dict[str, tuple[str, ...] | None] = {}

    def set(self, name: str, addresses: Sequence[str] | None) -> None:
        self._names[name.lower()] = None if addresses is None else tuple(addresses)

    async def getaddrinfo(
        self,
        host: bytes | None,
        port: bytes | str | int | None,
        family: int = 0,
        type: int = 0,
        proto: int = 0,
        flags: int = 0,
    ) -> AddressInfo:
        name = None if host is None else host.decode("ascii", "replace").lower()
        if name not in self._names:
            return await trio.to_thread.run_sync(
                socket.getaddrinfo, host, port, family, type, proto, flags, abandon_on_cancel=True
            )
        addresses = self._names[name]
        if addresses is None:
            await trio.sleep_forever()  # a resolver that never answers
        number = int(port) if port is not None else 0
        return [  # the literals resolve as themselves, numerically
            info
            for address in addresses or ()
            for info in socket.getaddrinfo(address, number, family, type, proto, flags)
        ]

    async def getnameinfo(
        self, sockaddr: tuple[str, int] | tuple[str, int, int, int], flags: int
    ) -> tuple[str, str]:
        return await trio.to_thread.run_sync(socket.getnameinfo, sockaddr, flags)


def worker_limits(bounds: WorkerBounds) -> WorkerLimits:
    """The server's limits: those ``bounds`` sets, the server's own defaults for the rest
    (read under the open-file limit in force when it is called)."""
    given = {name: value for name, value in attrs.asdict(bounds).items() if value is not None}
    given.pop("open_file_limit", None)
    if (hosts := given.pop("dial_back_hosts", None)) is not None:
        given["dial_back"] = DialBackPolicy.parse(hosts)
    return WorkerLimits(**given)


class TcpCluster:
    """One ``DrillWorkerServer`` per worker and one ``TcpDispatch``, all in the portal's run."""

    def __init__(self, portal: TrioPortal) -> None:
        self._portal = portal
        self._servers: dict[int, DrillWorkerServer] = {}
        self._processes: dict[int, WorkerProcess] = {}
        self._progress = trio.Event()  # set, then replaced, whenever a process reports
        self._black_hole: str | None = None
        self._held: dict[int, RawConnection] = {}
        self._ports: dict[int, int] = {}  # an in-process worker's port, as its run started
        self._reused: collections.Counter[int] = collections.Counter()  # streams per worker
        self._handles = itertools.count(1)
        self._names = ScriptedNames()
        self._file_limit: int | None = None  # lowered for a bounded worker (WorkerBounds)
        self._starvation: trio.CancelScope | None = None  # Capability.STARVE_CALLER
        portal.call_sync(lambda: trio.socket.set_custom_hostname_resolver(self._names))
        self.transport = portal.call(self._open_dispatch)

    async def _open_dispatch(self) -> TcpDispatch:
        async def hold(*, task_status: trio.TaskStatus[TcpDispatch]) -> None:
            async with TcpDispatch.open() as dispatch:
                task_status.started(dispatch)
                await trio.sleep_forever()

        dispatch: TcpDispatch = await self._portal.nursery.start(hold)
        return dispatch

    @property
    def inflight(self) -> InflightGauge:
        return self.transport.inflight

    @property
    def response_connections(self) -> int:
        return self.transport.response_connections

    async def serve(
        self, worker_id: int, worker: ScriptedWorker, limits: WorkerLimits | None = None
    ) -> str:
        server = DrillWorkerServer(limits=limits)
        _count_reuse(server.response_pool, self._reused, worker_id)
        self._ports[worker_id] = await self._portal.nursery.start(server.run)  # as it listens
        self._servers[worker_id] = server
        return server.serve(f"{ENDPOINT}/{worker_id:x}", worker)

    async def serve_bounded(
        self, worker_id: int, worker: ScriptedWorker, bounds: WorkerBounds
    ) -> str:
        if bounds.open_file_limit is not None:
            await self._lower_file_limit(bounds.open_file_limit)
        return await self.serve(worker_id, worker, worker_limits(bounds))

    async def _lower_file_limit(self, soft: int) -> None:
        """This process's workers run under ``soft`` open files until the target closes."""
        if self._file_limit not in (None, soft):
            raise NotImplementedError("the workers in this process share one open-file limit")
        if self._file_limit is None:
            self._file_limit = soft
            await self._portal.nursery.start(_file_limit_held, soft)

    def open_file_limit(self, worker_id: int) -> int:
        if worker_id in self._processes:
            raise NotImplementedError("a worker process keeps its limits to itself")
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]  # its server runs in this process

    async def connect(self, worker_id: int) -> int:
        port = self._port(worker_id)
        if port is None:
            raise RuntimeError(f"worker {worker_id} is not listening")
        stream = await trio.open_tcp_stream(LOOPBACK, port)
        handle = next(self._handles)
        self._held[handle] = connection = RawConnection(stream)
        self._portal.nursery.start_soon(connection.read_acks)
        return handle

    async def write(self, connection: int, data: bytes) -> None:
        with contextlib.suppress(*CONNECTION_ERRORS):  # the worker closed it: read_acks saw
            await self._held[connection].stream.send_all(data)

    def held(self, connection: int) -> HeldConnection:
        return self._held[connection].view()

    async def disconnect(self, connection: int) -> None:
        await self._held[connection].stream.aclose()

    async def serve_process(self, worker_id: int, script: WorkerScript, log: list[Delivery]) -> str:
        path = f"{ENDPOINT}/{worker_id:x}"
        argv = drill_process.command(script, worker_id, path)
        worker: WorkerProcess = await self._portal.nursery.start(
            self._own_process, worker_id, argv, log
        )
        self._processes[worker_id] = worker
        with real_time_limit(PROCESS_WAIT, f"worker process {worker_id} to listen"):
            while worker.port is None:
                if worker.exited:
                    code = worker.process.returncode
                    raise RuntimeError(f"worker process {worker_id} exited with {code}")
                await self._progress.wait()
        return f"{LOOPBACK}:{worker.port}/{path}"

    async def _own_process(
        self,
        worker_id: int,
        argv: list[str],
        log: list[Delivery],
        *,
        task_status: trio.TaskStatus[WorkerProcess],
    ) -> None:
        """Start the process, follow its reports; SIGKILL it when the portal closes."""
        process = await trio.lowlevel.open_process(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=drill_process.environment()
        )
        try:
            assert process.stdout is not None
            worker = WorkerProcess(worker_id, process)
            task_status.started(worker)
            reports = drill_process.Reports(process.stdout)
            while (report := await reports.next()) is not None:
                worker.take(report, log)
                self._progressed()
            await process.wait()
            worker.exited = True
            self._progressed()
        finally:
            with trio.CancelScope(shield=True):
                process.kill()
                await process.wait()
                for pipe in (process.stdin, process.stdout):
                    if pipe is not None:
                        await pipe.aclose()

    def _progressed(self) -> None:
        self._progress.set()
        self._progress = trio.Event()

    async def settle_process_request(self, request_id: str, ended: Callable[[], bool]) -> None:
        with real_time_limit(PROCESS_WAIT, f"a worker process to report on {request_id}"):
            while not ended() and not any(
                request_id in worker.reported for worker in self._processes.values()
            ):
                await self._progress.wait()

    async def drain(self, worker_id: int, grace_period: float) -> None:
        """A graceful shutdown as ``routespec worker`` runs it on SIGTERM: the drain, then
        the server stops (its port and every connection close), as the process exits."""
        server = self._servers[worker_id]
        await server.drain(grace_period)
        server.kill()

    async def kill(self, worker_id: int) -> None:
        worker = self._processes.get(worker_id)
        if worker is None:
            self._servers[worker_id].kill()
            return
        worker.process.kill()  # SIGKILL: no handler runs, the kernel closes every socket
        with real_time_limit(PROCESS_WAIT, f"worker process {worker_id} to exit"):
            await worker.process.wait()

    def announce_removal(self, worker_id: int, removed: bool) -> None:
        if removed:
            self.transport.instance_removed(worker_id)
        else:
            self.transport.instance_added(worker_id)

    def worker_bytes(self, worker_id: int) -> int:
        if worker_id in self._processes:
            raise NotImplementedError("a worker process does not share its byte counts")
        return sum(self._servers[worker_id].bytes_received.values())

    def control_message(self, request_id: str) -> Mapping[str, object] | None:
        """Read by a worker served in this process (a worker process keeps its own)."""
        for server in self._servers.values():
            if (control := server.control_messages.get(request_id)) is not None:
                return control
        return None

    def control_words(self, request_id: str) -> Sequence[object]:
        """Read by a worker served in this process (a worker process keeps its own)."""
        for server in self._servers.values():
            if (words := server.control_words.get(request_id)) is not None:
                return tuple(words)
        return ()

    async def send_raw(self, worker_id: int | None, data: bytes) -> None:
        if worker_id is None:
            address = self.transport.response_address
        else:
            address = f"{LOOPBACK}:{self._port(worker_id)}"
        host, _, port = address.rpartition(":")
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_all(data)

    def worker_path(self, worker_id: int) -> str:
        return f"{ENDPOINT}/{worker_id:x}"

    def worker_address(self, worker_id: int) -> str:
        port = self._port(worker_id)
        if port is None:
            raise RuntimeError(f"worker {worker_id} is not listening")
        return f"{LOOPBACK}:{port}"

    def reused_streams(self, worker_id: int) -> int:
        if worker_id in self._processes:
            raise NotImplementedError("a worker process keeps its response pool to itself")
        return self._reused[worker_id]

    def resolve_name(self, name: str, addresses: Sequence[str] | None) -> None:
        self._names.set(name, addresses)

    async def starve_caller(self, spare: int | None) -> None:
        """The caller (and every worker served in this process) keeps ``spare`` free
        descriptors; a worker process keeps its own."""
        if self._starvation is not None:
            self._starvation.cancel()
            self._starvation = None
        if spare is not None:
            self._starvation = await self._portal.nursery.start(_descriptors_starved, spare)

    async def black_hole(self) -> str:
        if self._black_hole is None:
            self._black_hole = await self._portal.nursery.start(serve_black_hole)
        return self._black_hole

    def _port(self, worker_id: int) -> int | None:
        if worker_id in self._processes:
            return self._processes[worker_id].port
        return self._ports.get(worker_id)


async def _descriptors_starved(
    spare: int, *, task_status: trio.TaskStatus[trio.CancelScope]
) -> None:
    """Leave this process ``spare`` free descriptors: its soft ``RLIMIT_NOFILE`` just above
    the highest it has open, every free one under it held by a copy of /dev/null; both given
    back when cancelled."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(name) for name in os.listdir("/dev/fd"))
    held: list[int] = []
    with trio.CancelScope() as scope:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1 + spare, before[1]))
            try:
                while True:
                    held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as error:
                if error.errno != errno.EMFILE:
                    raise
            for _ in range(spare):
                os.close(held.pop())
            task_status.started(scope)
            await trio.sleep_forever()
        finally:
            for descriptor in held:
                os.close(descriptor)
            resource.setrlimit(resource.RLIMIT_NOFILE, before)


async def _file_limit_held(soft: int, *, task_status: trio.TaskStatus[None]) -> None:
    """Lower this process's soft ``RLIMIT_NOFILE`` to ``soft``; restore it when cancelled."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, before[1]))
    try:
        task_status.started()
        await trio.sleep_forever()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


def _count_reuse(pool: ResponsePool, counts: collections.Counter[int], worker_id: int) -> None:
    """Count the streams the worker writes on a connection a caller released to it: those
    for which its pool hands out a kept connection (``WorkerServer._respond_with``)."""
    take = pool.take

    def counted(address: str) -> FramedConnection | None:
        kept = take(address)
        if kept is not None:
            counts[worker_id] += 1
        return kept

    pool.take = counted  # type: ignore[method-assign]


def tcp_cluster(portal: TrioPortal) -> Cluster:
    return TcpCluster(portal)


ADAPTER = ReferenceAdapter(
    name="reference-tcp",
    capabilities=frozenset(Capability) - {Capability.REAL_CLOCK},  # its clock is a MockClock
    cluster=tcp_cluster,
)
