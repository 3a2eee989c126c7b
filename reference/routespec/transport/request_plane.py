"""The caller's request plane: one reused connection per worker address, ACKs in order.

Each connection has one writer task and one reader task. A request is queued for the
writer, which sends whatever is queued in one write, and waits for its ACK; ACKs are matched
to requests by their order on the wire. Connecting has a deadline (TMO-001) and so has the
ACK (TMO-002): a request fails once its connection has gone the ACK timeout without any ACK
since the request was queued. ACKs come in order, so while they keep coming the worker is
working through its queue, and a slow, busy worker is not mistaken for a silent one.

A request that leaves before the writer took it (its deadline, or a caller that left) is
taken out of the queue and never written; one already taken keeps its place in the ACK
order, so its late ACK is matched to it and dropped, never taken for the next request's
(TMO-008).
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import attrs
import trio

from routespec.errors import ErrorKind, RoutingError
from routespec.routing.deadlines import (
    DEFAULT_ACK_TIMEOUT,
    DEFAULT_CONNECT_TIMEOUT,
    ack_timed_out,
    connect_timed_out,
)
from routespec.transport.connection import CONNECTION_ERRORS, FramedConnection, split_address
from routespec.transport.frames import WireProtocolError

LostCallback = Callable[[str], None]


@attrs.define(eq=False)
class AckWaiter:
    message: bytes
    done: trio.Event = attrs.field(factory=trio.Event)
    ack: str | None = None  # None when the connection ended first
    taken: bool = False  # by the writer: from then on it holds a place in the ACK order


class WorkerConnection:
    """Requests are written by one task, in the order they were queued, and their ACKs read
    by another, in the same order."""

    def __init__(self, address: str, connection: FramedConnection) -> None:
        self.address = address
        self.connection = connection
        self.open = True
        self._queued: collections.deque[AckWaiter] = collections.deque()  # not yet written
        self._waiting: collections.deque[AckWaiter] = collections.deque()  # in wire order
        self._wake = trio.Event()
        self._last_ack = trio.current_time()
        self._unsent = b""  # what a write made without waiting left for the writer task
        self._broken_by = ""  # the wire fault that ended the connection, if one did

    async def send(self, message: bytes, ack_timeout: float = DEFAULT_ACK_TIMEOUT) -> str:
        """Queue one request and return its ACK text; ``ConnectionTimeout`` once neither it
        nor any other request on the connection is ACKed for ``ack_timeout`` (TMO-002).
        The caller hands over a connection it has just seen open (``RequestPlane.send``)."""
        waiter = AckWaiter(message)
        self._queued.append(waiter)
        queued_at = trio.current_time()
        if not self._waiting and len(self._queued) == 1 and not self._unsent:
            # Nothing else in flight here: write it now. Requests that come while others
            # are in flight are left to the writer task, which sends them together.
            self._write_queued()
        if self._queued or self._unsent:
            self._wake.set()
        try:
            while not waiter.done.is_set():
                deadline = max(queued_at, self._last_ack) + ack_timeout
                if deadline <= trio.current_time():
                    raise ack_timed_out(self.address, ack_timeout)  # no ACK came: TMO-002
                with trio.move_on_at(deadline):  # then look again: did other ACKs come?
                    await waiter.done.wait()
        finally:
            if not waiter.taken:  # never written: it leaves no trace
                self._queued.remove(waiter)
        if waiter.ack is None:  # the connection ended first: Disconnected at once (TRN-033)
            raise RoutingError(
                ErrorKind.DISCONNECTED,
                f"TCP connection to {self.address} closed before the request was acknowledged"
                + self._broken_by,
            )
        return waiter.ack

    def _take_queued(self) -> bytes:
        """Everything queued, in one batch; each request now holds its place in the ACK
        order."""
        batch = []
        while self._queued:
            waiter = self._queued.popleft()
            waiter.taken = True
            self._waiting.append(waiter)
            batch.append(waiter.message)
            waiter.message = b""
        return b"".join(batch)

    def _write_queued(self) -> None:
        """Write what is queued without waiting, as far as the socket takes it now; the
        writer task sends the rest."""
        try:
            self._unsent = self.connection.send_nowait(self._take_queued())
        except OSError:
            self._unsent = b""  # the reader sees the connection end and fails every waiter

    async def write_requests(self) -> None:
        """Send whatever is queued in one write, until the connection ends."""
        try:
            while self.open:
                if self._unsent:
                    unsent, self._unsent = self._unsent, b""
                    await self.connection.send(unsent)
                    continue
                if not self._queued:
                    self._wake = trio.Event()
                    await self._wake.wait()
                    continue
                await self.connection.send(self._take_queued())
        except CONNECTION_ERRORS:
            pass  # the reader sees the connection end and fails every waiter
        finally:
            self.open = False
            with trio.CancelScope(shield=True):
                await self.connection.aclose()

    async def read_acks(self, on_lost: LostCallback) -> None:
        try:
            while True:
                ack = await self.connection.read_ack()
                self._last_ack = trio.current_time()
                waiter = self._waiting.popleft()  # an abandoned request's ACK ends here
                waiter.ack = ack
                waiter.done.set()
        except WireProtocolError as fault:  # TRN-038: the fault names its field
            self._broken_by = f": the worker's ACK broke the wire ({fault})"
        except (IndexError, *CONNECTION_ERRORS):
            pass
        finally:
            self.open = False
            self._wake.set()  # the writer ends too
            for waiters in (self._waiting, self._queued):
                while waiters:
                    waiter = waiters.popleft()
                    waiter.taken = True  # failed, and no longer queued
                    waiter.done.set()
            on_lost(self.address)
            with trio.CancelScope(shield=True):
                await self.connection.aclose()


class RequestPlane:
    def __init__(self, nursery: trio.Nursery, on_lost: LostCallback) -> None:
        self._nursery = nursery
        self._on_lost = on_lost
        self._connections: dict[str, WorkerConnection] = {}
        self._connecting: dict[str, trio.Lock] = collections.defaultdict(trio.Lock)

    async def send(
        self,
        address: str,
        message: bytes,
        *,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        ack_timeout: float = DEFAULT_ACK_TIMEOUT,
    ) -> str:
        """Write one request message to the worker at ``address`` and return its ACK text.

        A connection not there within ``connect_timeout`` — counting any wait for another
        request's connect to the same worker — fails with ``ConnectionTimeout`` (TMO-001)."""
        connection = self._connections.get(address)
        if connection is not None and connection.open:  # no connect, so no deadline to keep
            return await connection.send(message, ack_timeout)
        connection = None
        with trio.move_on_after(connect_timeout):
            connection = await self._connection(address)
        if connection is None:
            raise connect_timed_out(address, connect_timeout)  # nothing was written
        return await connection.send(message, ack_timeout)

    async def _connection(self, address: str) -> WorkerConnection:
        existing = self._connections.get(address)
        if existing is not None and existing.open:
            return existing  # no lock to queue on: a burst of requests must not wait in turn
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
            self._nursery.start_soon(connection.write_requests)
            return connection

    async def aclose(self) -> None:
        for connection in self._connections.values():
            await connection.connection.aclose()
