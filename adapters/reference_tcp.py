"""Adapter ``reference-tcp``: the reference router and scripted workers, every worker a real
TCP server on 127.0.0.1 speaking Dynamo 1.6.1's wire."""

from __future__ import annotations

import contextlib

import trio

from adapters.reference import ENDPOINT, Cluster, ReferenceAdapter
from routespec.portal import TrioPortal
from routespec.scripted import ScriptedWorker
from routespec.streaming import InflightGauge
from routespec.target import Capability
from routespec.transport.drill_server import DrillWorkerServer
from routespec.transport.tcp_dispatch import TcpDispatch


class TcpCluster:
    """One ``DrillWorkerServer`` per worker and one ``TcpDispatch``, all in the portal's run."""

    def __init__(self, portal: TrioPortal) -> None:
        self._portal = portal
        self._servers: dict[int, DrillWorkerServer] = {}
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

    async def serve(self, worker_id: int, worker: ScriptedWorker) -> str:
        server = DrillWorkerServer()
        await self._portal.nursery.start(server.run)
        self._servers[worker_id] = server
        return server.serve(f"{ENDPOINT}/{worker_id:x}", worker)

    def kill(self, worker_id: int) -> None:
        self._servers[worker_id].kill()

    def announce_removal(self, worker_id: int, removed: bool) -> None:
        if removed:
            self.transport.instance_removed(worker_id)
        else:
            self.transport.instance_added(worker_id)

    def worker_bytes(self, worker_id: int) -> int:
        return sum(self._servers[worker_id].bytes_received.values())

    async def send_raw(self, worker_id: int | None, data: bytes) -> None:
        if worker_id is None:
            address = self.transport.response_address
        else:
            address = f"127.0.0.1:{self._servers[worker_id].port}"
        host, _, port = address.rpartition(":")
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_all(data)


def tcp_cluster(portal: TrioPortal) -> Cluster:
    return TcpCluster(portal)


ADAPTER = ReferenceAdapter(
    name="reference-tcp",
    capabilities=frozenset(Capability) - {Capability.KILL_WORKER_PROCESS},
    cluster=tcp_cluster,
)
