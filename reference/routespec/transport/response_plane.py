"""The caller's response-stream server: workers dial in and are matched to registrations.

A registration is made before the request is written (TRN-001, TRN-014). A worker's connection
names its registration in the handshake frame; an unknown or late subject is closed. A
connection whose handshake offered reuse, read to its stream's sentinel, is released back to
its worker (TRN-028) and waits here for that worker's next handshake, for as long as the
worker keeps it open. The plane listens only at the address it gives workers (TRN-052).
"""

from __future__ import annotations

import errno

import trio

from routespec.errors import ErrorKind, RoutingError
from routespec.transport.codecs import decode_json, encode_json
from routespec.transport.connection import CONNECTION_ERRORS, FramedConnection
from routespec.transport.frames import MAX_CONTROL_BYTES, TwoPart, WireProtocolError
from routespec.transport.response_pool import REUSE

HANDSHAKE_TIMEOUT = 10.0  # TRN-053: a fresh connection's, from its accept
ACCEPT_RETRY = 0.1  # TRN-056: out of descriptors, the server tries again so often
# accept() errors that mean "out of resources", on which trio.serve_listeners waits too
ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
NOT_ESTABLISHED = "Worker disconnected before response stream was established"
REUSE_FRAME = TwoPart(header=encode_json(REUSE)).encode()


class PendingStream:
    """A registered response stream, waiting for its worker to dial in."""

    def __init__(self, plane: ResponsePlane, subject: str, instance_id: int, address: str):
        self.subject = subject
        self.instance_id = instance_id
        self.address = address  # the worker's request-plane host:port
        self._plane = plane
        self._arrived = trio.Event()
        self._connection: FramedConnection | None = None
        self._failure: RoutingError | None = None

    def connect(self, connection: FramedConnection) -> bool:
        if self._arrived.is_set():
            return False
        self._connection = connection
        self._arrived.set()
        return True

    def fail(self, failure: RoutingError) -> None:
        if not self._arrived.is_set():
            self._failure = failure
            self._arrived.set()

    def ready(self) -> bool:
        """The worker's connection is here with a whole frame (the prologue) buffered:
        taking the stream cannot wait."""
        return self._connection is not None and self._connection.frame_buffered()

    async def wait(self) -> FramedConnection:
        if not self._arrived.is_set():  # one that came with its ACK costs no task switch
            await self._arrived.wait()
        self._plane.forget(self)
        if self._connection is None:
            assert self._failure is not None
            raise self._failure
        return self._connection

    def drop(self) -> FramedConnection | None:
        """Unregister; returns a connection that arrived but was never taken."""
        self._plane.forget(self)
        self.fail(RoutingError(ErrorKind.CANCELLED, "registration dropped"))
        return self._connection


class ResponsePlane:
    def __init__(self, host: str) -> None:
        self.host = host
        self.address = ""
        self._pending: dict[str, PendingStream] = {}
        self._handed: set[FramedConnection] = set()  # streams handed over and still open
        self._lent: dict[FramedConnection, trio.Event] = {}  # set when one comes back
        self._accepted: set[FramedConnection] = set()  # each with its task (``_accept``)

    @property
    def held(self) -> int:
        """Connections this plane holds or waits for (TRN-042): each dialled-in one whose
        task still runs (streams handed over and still open, those released back to their
        workers), and each registration still waiting for its worker to dial in."""
        return len(self._accepted | self._handed) + len(self._pending)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host=self.host)
        self.address = f"{self.host}:{listeners[0].socket.getsockname()[1]}"
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                for listener in listeners:
                    nursery.start_soon(self._serve, listener, nursery)
        finally:
            for connection in list(self._handed):  # streams still open end with the plane
                connection.close_now()

    async def _serve(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        # As trio.serve_listeners, but running out of descriptors waits instead of failing.
        async with listener:
            while True:
                stream: trio.SocketStream | None = None
                try:
                    stream = await listener.accept()
                except OSError as error:
                    if error.errno not in ACCEPT_CAPACITY_ERRNOS:
                        raise
                if stream is None:
                    await trio.sleep(ACCEPT_RETRY)  # out of descriptors: wait for some
                else:
                    nursery.start_soon(self._accept, FramedConnection(stream))

    def register(self, subject: str, instance_id: int, address: str) -> PendingStream:
        pending = PendingStream(self, subject, instance_id, address)
        self._pending[pending.subject] = pending
        return pending

    def forget(self, pending: PendingStream) -> None:
        self._pending.pop(pending.subject, None)

    def fail_where(
        self, failure: RoutingError, *, instance_id: int | None = None, address: str | None = None
    ) -> None:
        """Fail every pending registration for an instance or a worker address."""
        for pending in list(self._pending.values()):
            if pending.instance_id == instance_id or pending.address == address:
                self.forget(pending)
                pending.fail(failure)

    # TRN-046: one with bytes buffered past its sentinel is never released, but closed.
    def release(self, connection: FramedConnection) -> bool:
        """Give a connection read to its sentinel back to the worker that offered it for
        reuse, and wait for its next stream there (TRN-028); False if it cannot be."""
        if connection.buffered or connection.closed.is_set():
            return False
        returned = self._lent.pop(connection, None)
        if returned is None:
            return False
        self._handed.discard(connection)
        connection.on_close = None
        connection.reuse_offered = False
        # Sent now rather than by the task that waits for the next handshake, so that it
        # leaves before this caller's next request, which the worker may want it for.
        connection.hold(REUSE_FRAME)
        connection.send_held_nowait()
        returned.set()
        return True

    async def _accept(self, connection: FramedConnection) -> None:
        """Match a dialled-in connection to its registration by the handshake; it is then
        the registration's (its reader closes it, or releases it), or closed here. One task
        per connection: a released connection comes back to it and waits, without a
        deadline (only the worker gives it up), for its next handshake."""
        released = False
        self._accepted.add(connection)
        try:
            while self._hand_over(connection, await self._handshake(connection, released)):
                returned = trio.Event()
                self._lent[connection] = returned
                await returned.wait()
                if connection.closed.is_set():
                    return
                released = True
                connection.expect_a_wait()  # the worker has not seen the release yet
        finally:
            self._accepted.discard(connection)
            if connection not in self._handed:  # not a stream's: nobody else closes it
                connection.close_now()

    async def _handshake(
        self, connection: FramedConnection, released: bool
    ) -> PendingStream | None:
        if released:
            return await self._read_handshake(connection)
        with trio.move_on_after(HANDSHAKE_TIMEOUT):
            return await self._read_handshake(connection)
        return None

    def _hand_over(self, connection: FramedConnection, pending: PendingStream | None) -> bool:
        """Give ``connection`` to ``pending``; closed if it cannot be."""
        if pending is not None and pending.connect(connection):
            self._handed.add(connection)
            connection.on_close = self._closed_while_lent
            return True
        connection.close_now()
        return False

    def _closed_while_lent(self, connection: FramedConnection) -> None:
        self._handed.discard(connection)
        returned = self._lent.pop(connection, None)
        if returned is not None:
            returned.set()  # its task ends

    async def _read_handshake(self, connection: FramedConnection) -> PendingStream | None:
        """The registration the connection's handshake names, if it is pending."""
        try:
            if connection.holding:  # what ``release`` could not send at once
                await connection.send(b"")
            frame = await connection.read_two_part(MAX_CONTROL_BYTES)
            handshake = decode_json(frame.header, "handshake") if frame else None
        except (WireProtocolError, *CONNECTION_ERRORS):
            return None
        if not isinstance(handshake, dict):
            return None
        connection.reuse_offered = handshake.get("reuse") is True
        return self._pending.pop(str(handshake.get("subject")), None)
