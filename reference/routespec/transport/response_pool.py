"""Response-stream connections a caller released for reuse (TRN-028), kept by a worker.

A caller that offers reuse (the request header ``REUSE_HEADER``) and reads a stream to its
sentinel may send the control word ``reuse`` on that connection: it will read the next
stream's handshake there and send nothing else until then. The worker then keeps the
connection, per dial-back address, for the next stream it would otherwise dial a new
connection for. Only the worker gives a released connection up — when it has been idle for
``IDLE_SECONDS``, when the pool is full (TRN-030), or when it has become readable (TRN-031:
the caller closed it, and nothing else may arrive on it) — so it never writes into one the
caller is closing. The worker sweeps the pool every ``SWEEP_SECONDS``, so the connections of
callers that went away are closed within that, whether or not another stream comes; the
same sweep closes the connections whose release did not come within ``RELEASE_WAIT`` of
their sentinel (TRN-028).
Dynamo 1.6.1 never sends the header, and ignores it, so every stream it takes part in has its
own connection.
"""

from __future__ import annotations

import collections
import select

import trio

from routespec.transport.connection import FramedConnection

REUSE = "reuse"  # the control word: the caller read the sentinel and awaits the next stream
REUSE_HEADER = b'"x-routespec-response-reuse":"1"'  # the offer, as the caller writes it
IDLE_SECONDS = 20.0
RELEASE_WAIT = 1.0  # after a sentinel, how long the caller may take to send ``reuse``
SWEEP_SECONDS = 0.25  # so that an unreleased connection is closed within RELEASE_WAIT
PER_ADDRESS = 64
TOTAL = 1024


class ResponsePool:
    """Released connections by dial-back address, most recently released last; at most
    ``per_address`` per address and ``total`` in all (TRN-030)."""

    def __init__(self, per_address: int = PER_ADDRESS, total: int = TOTAL) -> None:
        self._per_address = per_address
        self._total = total
        self._idle: dict[str, collections.deque[tuple[float, FramedConnection]]] = {}
        self._awaiting: dict[FramedConnection, float] = {}  # sentinel sent, release not read

    def awaiting_release(self, connection: FramedConnection) -> None:
        """``connection``'s stream has ended; the sweep closes it unless ``release_ended``
        comes within ``RELEASE_WAIT`` (less one sweep period)."""
        self._awaiting[connection] = trio.current_time()

    def release_ended(self, connection: FramedConnection) -> None:
        self._awaiting.pop(connection, None)

    def __len__(self) -> int:
        return sum(map(len, self._idle.values()))

    def take(self, address: str) -> FramedConnection | None:
        """The most recently released connection to ``address`` that is still usable, or
        None; the unusable ones met on the way are closed."""
        kept = self._idle.get(address)
        now = trio.current_time()
        found = None
        while kept and found is None:
            released, connection = kept.pop()
            if _usable(released, connection, now):
                found = connection
            else:
                connection.close_now()
        if kept is not None and not kept:
            del self._idle[address]
        return found

    def put(self, address: str, connection: FramedConnection) -> None:
        """Keep ``connection``; when the address or the pool is at its bound, the connection
        released longest ago (of the address, or of all) is closed to make room."""
        kept = self._idle.get(address, ())
        if len(kept) >= self._per_address:
            self._close_oldest(address)
        elif len(self) >= self._total:
            self._close_oldest(min(self._idle, key=lambda a: self._idle[a][0][0]))
        connection.released = False  # the next stream needs a release of its own
        self._idle.setdefault(address, collections.deque()).append(
            (trio.current_time(), connection)
        )

    def _close_oldest(self, address: str) -> None:
        kept = self._idle[address]
        kept.popleft()[1].close_now()
        if not kept:
            del self._idle[address]

    def sweep(self) -> None:
        """Close every kept connection that is stale or no longer quiet, and every one whose
        release is overdue."""
        now = trio.current_time()
        overdue = [c for c, ended in self._awaiting.items() if now - ended >= _RELEASE_CUTOFF]
        for connection in overdue:
            del self._awaiting[connection]
            connection.close_now()  # its reader wakes, and does not keep it
        for address, kept in list(self._idle.items()):
            fresh: collections.deque[tuple[float, FramedConnection]] = collections.deque()
            for released, connection in kept:
                if _usable(released, connection, now):
                    fresh.append((released, connection))
                else:
                    connection.close_now()
            if fresh:
                self._idle[address] = fresh
            else:
                del self._idle[address]

    async def keep_swept(self) -> None:
        """``sweep`` every ``SWEEP_SECONDS``, forever."""
        while True:
            await trio.sleep(SWEEP_SECONDS)
            self.sweep()

    def close_all(self) -> None:
        for kept in self._idle.values():
            for _, connection in kept:
                connection.close_now()
        self._idle.clear()


_RELEASE_CUTOFF = RELEASE_WAIT - SWEEP_SECONDS  # the next sweep would come too late


def _usable(released: float, connection: FramedConnection, now: float) -> bool:
    """Released less than ``IDLE_SECONDS`` ago, and still quiet."""
    return now - released < IDLE_SECONDS and _quiet(connection)


def _quiet(connection: FramedConnection) -> bool:
    """Nothing to read: a caller that released the connection sends nothing before the next
    handshake, so anything readable is its close (or a fault). Nothing is buffered either: a
    release followed by more bytes is no release (``worker_server._await_release``)."""
    stream = connection.stream
    assert isinstance(stream, trio.SocketStream), "only dialled TCP connections are kept"
    poller = select.poll()  # not select.select: descriptors may be past FD_SETSIZE
    poller.register(stream.socket.fileno(), select.POLLIN)
    return not poller.poll(0)
