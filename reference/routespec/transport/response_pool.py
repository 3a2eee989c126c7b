"""Response-stream connections a caller released for reuse (TRN-028), kept by a worker.

A caller that offers reuse (the request header ``REUSE_HEADER``) and reads a stream to its
sentinel may send the control word ``reuse`` on that connection: it will read the next
stream's handshake there and send nothing else until then. The worker then keeps the
connection, per dial-back address, for the next stream it would otherwise dial a new
connection for. Only the worker gives a released connection up — when it has been idle for
``IDLE_SECONDS``, when the pool is full, or when it has become readable (the caller closed
it: nothing else may arrive on it) — so it never writes into one the caller is closing. The
worker sweeps the pool every ``SWEEP_SECONDS``, so the connections of callers that went away
are closed within that, whether or not another stream comes.
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
SWEEP_SECONDS = 1.0
PER_ADDRESS = 64
TOTAL = 1024


class ResponsePool:
    """Released connections by dial-back address, most recently released first; bounded in
    number per address and in total."""

    def __init__(self, per_address: int = PER_ADDRESS, total: int = TOTAL) -> None:
        self._per_address = per_address
        self._total = total
        self._idle: dict[str, collections.deque[tuple[float, FramedConnection]]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def take(self, address: str) -> FramedConnection | None:
        """A released connection to ``address`` that is still quiet, or None."""
        kept = self._idle.get(address)
        now = trio.current_time()
        while kept:
            released, connection = kept.pop()
            self._count -= 1
            if _usable(released, connection, now):
                if not kept:
                    del self._idle[address]
                return connection
            connection.close_now()
        self._idle.pop(address, None)
        return None

    def put(self, address: str, connection: FramedConnection) -> None:
        """Keep ``connection``; the oldest one kept for the address, or the first address's
        oldest when the pool is full, is closed to make room."""
        kept = self._idle.setdefault(address, collections.deque())
        now = trio.current_time()
        while kept and now - kept[0][0] >= IDLE_SECONDS:  # the stale ones first
            kept.popleft()[1].close_now()
            self._count -= 1
        if len(kept) >= self._per_address:
            kept.popleft()[1].close_now()
            self._count -= 1
        elif self._count >= self._total:
            first = next(a for a, k in self._idle.items() if k)
            oldest = self._idle[first]
            oldest.popleft()[1].close_now()
            self._count -= 1
            if not oldest and first != address:
                del self._idle[first]
        connection.released = False
        kept.append((now, connection))
        self._count += 1

    def sweep(self) -> None:
        """Close every kept connection that is stale or no longer quiet."""
        now = trio.current_time()
        for address, kept in list(self._idle.items()):
            fresh: collections.deque[tuple[float, FramedConnection]] = collections.deque()
            for released, connection in kept:
                if _usable(released, connection, now):
                    fresh.append((released, connection))
                else:
                    connection.close_now()
                    self._count -= 1
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
        self._count = 0


def _usable(released: float, connection: FramedConnection, now: float) -> bool:
    """Released less than ``IDLE_SECONDS`` ago, and still quiet."""
    return now - released < IDLE_SECONDS and _quiet(connection)


def _quiet(connection: FramedConnection) -> bool:
    """Nothing buffered and nothing to read: a caller that released the connection sends
    nothing before the next handshake, so anything readable is its close (or a fault)."""
    stream = connection.stream
    if connection.buffered or not isinstance(stream, trio.SocketStream):
        return False
    poller = select.poll()  # not select.select: descriptors may be past FD_SETSIZE
    poller.register(stream.socket.fileno(), select.POLLIN)
    return not poller.poll(0)
