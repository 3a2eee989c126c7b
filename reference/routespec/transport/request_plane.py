"""The caller's request plane: one reused connection per worker address, ACKs in order."""

from __future__ import annotations

import collections
from collections.abc import Callable

import attrs
import trio

from routespec.errors import ErrorKind, RoutingError
from routespec.transport.connection import CONNECTION_ERRORS, FramedConnection, split_address
from routespec.transport.frames import WireProtocolError

LostCallback = Callable[[str], None]


@attrs.define(eq=False)
class AckWaiter:
    done: trio.Event = attrs.field(factory=trio.Event)
    ack: str | None = None  # None when the connection ended first


class WorkerConnection:
    """Requests are written under a lock and their ACKs read by one task, in order."""

    def __init__(self, address: str, connection: FramedConnection) -> None:
        self.address = address
        self.connection = connection
        self.open = True
        self._waiting: collections.deque[AckWaiter] = collections.deque()

    async def send(self, message: bytes) -> str:
        waiter = AckWaiter()
        self._waiting.append(waiter)
        try:
            await self.connection.send(message)
        except CONNECTION_ERRORS as error:
            self.open = False
            raise RoutingError(
                ErrorKind.DISCONNECTED, f"TCP connection to {self.address} lost: {error}"
            ) from None
        await waiter.done.wait()
        if waiter.ack is None:
            raise RoutingError(
                ErrorKind.DISCONNECTED,
                f"TCP connection to {self.address} closed before the request was acknowledged",
            )
        return waiter.ack

    async def read_acks(self, on_lost: LostCallback) -> None:
        try:
            while True:
                ack = await self.connection.read_ack()
                waiter = self._waiting.popleft()
                waiter.ack = ack
                waiter.done.set()
        except (WireProtocolError, IndexError, *CONNECTION_ERRORS):
            pass
        finally:
            self.open = False
            while self._waiting:
                self._waiting.popleft().done.set()
            on_lost(self.address)
            with trio.CancelScope(shield=True):
                await self.connection.aclose()


class RequestPlane:
    def __init__(self, nursery: trio.Nursery, on_lost: LostCallback) -> None:
        self._nursery = nursery
        self._on_lost = on_lost
        self._connections: dict[str, WorkerConnection] = {}
        self._connecting: dict[str, trio.Lock] = collections.defaultdict(trio.Lock)

    async def send(self, address: str, message: bytes) -> str:
        """Write one request message to the worker at ``address`` and return its ACK text."""
        connection = await self._connection(address)
        return await connection.send(message)

    async def _connection(self, address: str) -> WorkerConnection:
        async with self._connecting[address]:
            existing = self._connections.get(address)
            if existing is not None and existing.open:
                return existing
            try:
                stream = await trio.open_tcp_stream(*split_address(address))
            except OSError as error:
                raise RoutingError(
                    ErrorKind.CANNOT_CONNECT, f"TCP connection to {address} failed: {error}"
                ) from None
            connection = WorkerConnection(address, FramedConnection(stream))
            self._connections[address] = connection
            self._nursery.start_soon(connection.read_acks, self._on_lost)
            return connection

    async def aclose(self) -> None:
        for connection in self._connections.values():
            await connection.connection.aclose()
