"""A TCP connection that reads whole wire units, checking each length before reading it.

A worker's connections also share a ``ByteBudget`` (TRN-026), so that the bytes buffered by
all of them together stay bounded, and are read under an idle timeout (TRN-025): a connection
on which no byte arrives for that long ends with ``ConnectionIdle``.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import math
import os
from collections.abc import Awaitable, Callable, Iterator

import trio

from routespec.transport.frames import (
    ACK_PREFIX,
    MAX_ACK_BYTES,
    MAX_MESSAGE_BYTES,
    REQUEST_LENGTHS,
    TWO_PART_PREFIX,
    U16,
    U32,
    RequestMessage,
    TwoPart,
    WireProtocolError,
    check_length,
    two_part_lengths,
)

RECEIVE_CHUNK = 64 * 1024
# A socket call that completes at once does not yield to the scheduler (as trio's own calls
# do) except on every YIELD_EVERY-th such call of the process, so a peer that keeps a
# connection busy still cannot starve the other tasks.
YIELD_EVERY = 32


LOOPBACK = "127.0.0.1"
CONNECTION_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@functools.lru_cache(maxsize=1024)
def ip_literal(text: str) -> IPAddress | None:
    """``text`` as an IP address, or None if it is not one. Cached: a worker checks the same
    few stream addresses and peers on every request, and parsing them is not cheap."""
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


async def open_stream(address: str) -> trio.SocketStream:
    """Connect to ``ip:port``, an address a worker vetted (TRN-027): numeric, so it has one
    candidate and is dialled directly, without ``open_tcp_stream``'s resolution and
    happy-eyeballs tasks."""
    host, port = split_address(address)
    ip = ip_literal(host.removeprefix("[").removesuffix("]"))
    assert ip is not None, address  # _vetted resolves every name
    family = trio.socket.AF_INET6 if ip.version == 6 else trio.socket.AF_INET
    sock = trio.socket.socket(family, trio.socket.SOCK_STREAM)
    try:
        await sock.connect((str(ip), port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


def peer_ip(stream: trio.abc.Stream) -> IPAddress | None:
    """The IP address a socket stream's peer connects from (an IPv4-mapped IPv6 address as
    IPv4), or None when it cannot be known."""
    if not isinstance(stream, trio.SocketStream):
        return None
    try:
        ip = ip_literal(stream.socket.getpeername()[0])
    except (OSError, IndexError, TypeError):
        return None
    if ip is None:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


class OverBudget(Exception):
    """A unit was refused because buffering it would take the process past its byte budget
    (TRN-026). Its bytes were read and dropped: the connection is at a unit boundary."""


class ConnectionIdle(Exception):
    """No byte arrived on the connection for its idle timeout (TRN-025)."""


class ByteBudget:
    """The bytes that the connections sharing it may buffer at once, in total (TRN-026)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def charge(self, count: int) -> None:
        """Count ``count`` more bytes (a part that takes the total past the limit is
        refused by the connection that reads it)."""
        self.used += count

    def release(self, count: int) -> None:
        self.used -= count


class FramedConnection:
    """Buffered reads of exact byte counts over one stream. ``None`` means a clean end of
    stream at a unit boundary; an end inside a unit is a ``WireProtocolError``.

    With a ``budget``, the bytes this connection buffers — the unit being received and the
    unit it returned last, until the next read — count against it; a unit that would take
    the total past the limit is read and dropped, and the read raises ``OverBudget``. Reads
    inside ``ending_when_idle(timeout)`` end the block with ``ConnectionIdle`` once no byte
    has arrived for ``timeout`` seconds."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        budget: ByteBudget | None = None,
    ) -> None:
        self.stream = stream
        self._buffer = bytearray()
        self._send_lock = trio.Lock()
        self._held = b""  # sent ahead of the next send (``hold``)
        self._budget = budget
        self._charged = 0  # bytes of this connection counted in the budget
        self._idle_scope: trio.CancelScope | None = None  # ``ending_when_idle``'s
        self._idle_timeout = math.inf
        self._wait_first = False  # ``expect_a_wait``
        self.closed = trio.Event()
        self.on_close: Callable[[FramedConnection], None] | None = None  # called once
        self.reuse_offered = False  # a response stream's: the worker may take another here
        self.released = False  # the caller sent ``reuse`` after the stream (TRN-028)
        self.before_send: Callable[[], None] | None = None  # called once, before a write

    @functools.cached_property
    def peer(self) -> IPAddress | None:
        """The peer's IP address (``peer_ip``), found once per connection."""
        return peer_ip(self.stream)

    async def send(self, data: bytes) -> None:
        # A unit is never interleaved with another. An uncontended lock is taken without
        # ``Lock.acquire``'s extra scheduling point; ``send_all`` still checkpoints.
        try:
            self._send_lock.acquire_nowait()
        except trio.WouldBlock:
            await self._send_lock.acquire()
        try:
            data = self._outgoing(data)
            if isinstance(self.stream, trio.SocketStream):
                await _send_on_socket(self.stream.socket, data)
            else:
                await self.stream.send_all(data)
        finally:
            self._send_lock.release()

    def send_nowait(self, data: bytes) -> bytes:
        """Write what is held, then ``data``, as far as the socket takes it now; returns
        the rest (all of it while another task is sending)."""
        data = self._outgoing(data)
        if not data or self._send_lock.locked() or not isinstance(self.stream, trio.SocketStream):
            return data
        try:
            sent = os.write(self.stream.socket.fileno(), data)
        except BlockingIOError:
            return data
        return data[sent:] if sent < len(data) else b""

    def _outgoing(self, data: bytes) -> bytes:
        """What a write of ``data`` sends: ``before_send`` runs first (once), and what
        ``hold`` kept goes ahead of ``data``."""
        if self.before_send is not None:
            before, self.before_send = self.before_send, None
            before()
        if self._held:
            data, self._held = self._held + data, b""
        return data

    def send_held_nowait(self) -> None:
        """Write what ``hold`` kept, as far as the socket takes it now; the rest stays held
        for the next send. Never raises: a broken connection fails its next send."""
        if self._held:
            with contextlib.suppress(OSError):
                self._held = self.send_nowait(b"")

    async def wait_writable(self) -> None:
        """Until the socket may take more bytes (or another task's send has ended)."""
        assert isinstance(self.stream, trio.SocketStream)
        async with self._send_lock:
            await trio.lowlevel.wait_writable(self.stream.socket)

    def hold(self, data: bytes) -> None:
        """Send ``data`` ahead of the next ``send``, in the same write."""
        self._held += data

    @property
    def holding(self) -> bool:
        return bool(self._held)

    async def aclose(self) -> None:
        self._closing()
        await self.stream.aclose()

    def _closing(self) -> None:
        self.closed.set()
        self.release()
        if self.on_close is not None:
            on_close, self.on_close = self.on_close, None
            on_close(self)

    def close_now(self) -> bool:
        """Close without a checkpoint if the stream is a socket (closing one never blocks);
        False when it is not, and ``aclose`` is needed."""
        if not isinstance(self.stream, trio.SocketStream):
            return False
        self._closing()
        self.stream.socket.close()
        return True

    @property
    def buffered(self) -> bool:
        """Bytes were received that no read has returned yet."""
        return bool(self._buffer)

    def frame_buffered(self) -> bool:
        """Whether a whole two-part frame is buffered, so that reading it cannot wait."""
        return self.frames_buffered(1) == 1

    def frames_buffered(self, most: int) -> int:
        """How many whole two-part frames are buffered, counting up to ``most``."""
        buffer, start, count = self._buffer, 0, 0
        while count < most and len(buffer) - start >= TWO_PART_PREFIX.size:
            header_len, body_len, _ = TWO_PART_PREFIX.unpack_from(buffer, start)
            start += TWO_PART_PREFIX.size + header_len + body_len
            if start > len(buffer):
                break
            count += 1
        return count

    def request_buffered(self) -> bool:
        """Whether a whole request message is buffered, so that reading it cannot wait."""
        return self._request_layout() is not None

    def _request_layout(self) -> tuple[int, int, int] | None:
        """The buffered request message's path and headers lengths and where it ends, if
        it is wholly buffered."""
        buffer = self._buffer
        if len(buffer) < U16.size:
            return None
        (path_len,) = U16.unpack_from(buffer)
        headers_at = U16.size + path_len
        if len(buffer) < headers_at + U16.size:
            return None
        (headers_len,) = U16.unpack_from(buffer, headers_at)
        payload_len_at = headers_at + U16.size + headers_len
        if len(buffer) < payload_len_at + U32.size:
            return None
        end = payload_len_at + U32.size + U32.unpack_from(buffer, payload_len_at)[0]
        return (path_len, headers_len, end) if len(buffer) >= end else None

    def release(self) -> None:
        """Give back every byte this connection counts in its budget (when it ends)."""
        if self._budget is not None:
            self._budget.release(self._charged)
            self._charged = 0
        self._buffer.clear()

    def _settle(self) -> None:
        """Between units: the unit returned last is no longer held, only the buffer is."""
        if self._budget is not None and self._charged != len(self._buffer):
            self._budget.release(self._charged - len(self._buffer))
            self._charged = len(self._buffer)

    async def _receive(self) -> bytes | bytearray:
        # A fixed chunk: a declared length never sizes a receive buffer (TRN-012).
        if not isinstance(self.stream, trio.SocketStream):
            return await self._wait_for(functools.partial(self.stream.receive_some, RECEIVE_CHUNK))
        sock = self.stream.socket
        if self._wait_first:
            self._wait_first = False
            return await self._wait_for(functools.partial(_receive_from_socket, sock))
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            data = os.read(sock.fileno(), RECEIVE_CHUNK)
        except BlockingIOError:
            return await self._wait_for(functools.partial(_receive_from_socket, sock))
        self._restart_idle()  # bytes that came while nobody read count too (TRN-025)
        await _sometimes_yield()
        return data

    def expect_a_wait(self) -> None:
        """The next receive waits for the socket before reading: the caller knows nothing
        can have arrived yet, so the read that would only fail is not tried."""
        self._wait_first = True

    async def _wait_for(
        self, receive: Callable[[], Awaitable[bytes | bytearray]]
    ) -> bytes | bytearray:
        """``receive()``; a wait starts the idle timeout again (TRN-025)."""
        self._restart_idle()
        return await receive()

    def _restart_idle(self) -> None:
        if self._idle_scope is not None:
            self._idle_scope.deadline = trio.current_time() + self._idle_timeout

    @contextlib.contextmanager
    def ending_when_idle(self, timeout: float) -> Iterator[None]:
        """Reads inside the block share one cancel scope for the idle timeout (cheaper than
        a scope per read); when it expires, the block ends with ``ConnectionIdle``. Each
        read moves its deadline, which then holds until the next read."""
        with trio.CancelScope() as scope:
            self._idle_scope, self._idle_timeout = scope, timeout
            try:
                yield
            finally:
                self._idle_scope = None
        if scope.cancelled_caught:
            raise ConnectionIdle(f"no byte arrived for {timeout:g} s")

    async def _fill(
        self, count: int, field: str, *, at_boundary: bool = False, budgeted: bool = False
    ) -> bool:
        """Receive until ``count`` bytes are buffered; False for a clean end at a boundary.
        Every byte counts in the budget; for a ``budgeted`` part, one the budget cannot hold
        raises ``OverBudget`` (what was received still buffered). Fixed-size prefixes are
        never refused, so a refusal always falls on a part whose length is known."""
        while len(self._buffer) < count:
            chunk = await self._receive()
            if not chunk:
                if at_boundary and not self._buffer:
                    return False
                raise WireProtocolError(
                    field, f"connection closed after {len(self._buffer)} of {count} bytes"
                )
            self._buffer += chunk
            if self._budget is not None:
                self._charged += len(chunk)
                self._budget.charge(len(chunk))
            if budgeted:
                self._refuse_over_budget(count, field)
        if budgeted:  # a chunk read for an earlier part may have brought this one in whole
            self._refuse_over_budget(count, field)
        return True

    def _refuse_over_budget(self, count: int, field: str) -> None:
        """Raise ``OverBudget`` if the total held, up to the end of this part (not what was
        read ahead of it), is past the limit."""
        if self._budget is None:
            return
        ahead = max(0, len(self._buffer) - count)
        if self._budget.used - ahead > self._budget.limit:
            raise OverBudget(
                f"{field}: buffering it would exceed the limit of {self._budget.limit} bytes"
            )

    def _take(self, count: int) -> bytes:
        """The first ``count`` buffered bytes (still counted until the next read)."""
        if count == len(self._buffer):
            data = bytes(self._buffer)
            self._buffer.clear()
            return data
        with memoryview(self._buffer) as view:
            data = bytes(view[:count])
        del self._buffer[:count]
        return data

    async def _skip(self, count: int, field: str) -> None:
        """Drop the next ``count`` bytes, buffering at most one chunk of them at a time."""
        while len(self._buffer) < count:
            count -= len(self._buffer)
            self._buffer.clear()
            self._settle()
            chunk = await self._receive()
            if not chunk:
                raise WireProtocolError(field, "connection closed inside a dropped unit")
            self._buffer += chunk
            if self._budget is not None:
                self._charged += len(chunk)
                self._budget.charge(len(chunk))
        del self._buffer[:count]
        self._settle()

    async def _part(self, count: int, field: str) -> bytes | None:
        """The next ``count`` bytes, or None when the budget refused them (then dropped)."""
        try:
            await self._fill(count, field, budgeted=True)
        except OverBudget:
            await self._skip(count, field)
            return None
        return self._take(count)

    async def _exactly(self, count: int, field: str) -> bytes:
        await self._fill(count, field)
        return self._take(count)

    # TRN-041: a frame cut short fails naming its part: two_part, .header or .body.
    async def read_two_part(self, limit: int = MAX_MESSAGE_BYTES) -> TwoPart | None:
        self._settle()
        if self._budget is None:  # nothing to charge: a whole buffered frame in one step
            frame = self._buffered_two_part(limit)
            if frame is not None:
                return frame
            if not await self._fill(TWO_PART_PREFIX.size, "two_part", at_boundary=True):
                return None
            frame = self._buffered_two_part(limit)  # the chunk often holds the whole frame
            if frame is not None:
                return frame
        elif not await self._fill(TWO_PART_PREFIX.size, "two_part", at_boundary=True):
            return None
        header_len, body_len = two_part_lengths(self._take(TWO_PART_PREFIX.size), limit)
        header = await self._part(header_len, "two_part.header")
        body = await self._part(body_len, "two_part.body") if header is not None else None
        if header is None or body is None:
            if header is None:
                await self._skip(body_len, "two_part.body")
            raise OverBudget(f"a frame of {header_len + body_len} bytes: over the byte budget")
        return TwoPart(header, body)

    def _buffered_two_part(self, limit: int) -> TwoPart | None:
        """The next frame if it is wholly buffered (lengths checked, TRN-012), else None."""
        buffer, prefix = self._buffer, TWO_PART_PREFIX.size
        if len(buffer) < prefix:
            return None
        header_len, body_len, _checksum = TWO_PART_PREFIX.unpack_from(buffer)
        if header_len > limit or body_len > limit - header_len:
            two_part_lengths(bytes(buffer[:prefix]), limit)  # raises, naming the field
        end = prefix + header_len + body_len
        if len(buffer) < end:
            return None
        frame = TwoPart(
            bytes(buffer[prefix : prefix + header_len]), bytes(buffer[prefix + header_len : end])
        )
        del buffer[:end]
        return frame

    async def read_request(self) -> RequestMessage | None:
        """The next request message, or None at a clean end. A message the budget cannot
        hold is read, dropped and reported as ``OverBudget`` (TRN-026)."""
        self._settle()
        buffered = self._buffered_request()
        if buffered is not None:
            return buffered
        if not await self._fill(U16.size, "request.path_len", at_boundary=True):
            return None
        buffered = self._buffered_request()  # the chunk often holds the whole request
        if buffered is not None:
            return buffered
        (path_len,) = U16.unpack(self._take(U16.size))
        path = await self._part(path_len, "request.path")
        (headers_len,) = U16.unpack(await self._exactly(U16.size, "request.headers_len"))
        headers = await self._part(headers_len, "request.headers")
        (payload_len,) = U32.unpack(await self._exactly(U32.size, "request.payload_len"))
        envelope = REQUEST_LENGTHS + path_len + headers_len
        # TRN-049: 32 MiB in all, as Dynamo 1.6.1's worker counts it
        check_length("request.payload_len", payload_len, MAX_MESSAGE_BYTES - envelope)
        payload = await self._part(payload_len, "request.payload")
        if path is None or headers is None or payload is None:
            assert self._budget is not None  # only a budget refuses a part
            raise OverBudget(
                f"a request of {envelope + payload_len} bytes would take the worker's "
                f"buffered request bytes past their limit of {self._budget.limit}"
            )
        try:
            text = path.decode()
        except UnicodeDecodeError:
            raise WireProtocolError("request.path", "not UTF-8") from None
        return RequestMessage(text, headers, payload)

    def _buffered_request(self) -> RequestMessage | None:
        """The next request if it is wholly buffered and fits every limit, in one step;
        None leaves it to ``read_request``'s checks, which name the field at fault."""
        layout = self._request_layout()
        if layout is None:
            return None
        path_len, headers_len, end = layout
        buffer, budget = self._buffer, self._budget
        if budget is not None and budget.used - (len(buffer) - end) > budget.limit:
            return None
        if end > MAX_MESSAGE_BYTES:  # TRN-049: 32 MiB in all
            return None
        headers_start = 2 * U16.size + path_len
        payload_start = headers_start + headers_len + U32.size
        try:
            path = buffer[U16.size : U16.size + path_len].decode()
        except UnicodeDecodeError:
            return None
        message = RequestMessage(
            path,
            bytes(buffer[headers_start : headers_start + headers_len]),
            bytes(buffer[payload_start:end]),
        )
        del buffer[:end]
        return message

    async def read_ack(self) -> str:
        buffer, prefix = self._buffer, ACK_PREFIX.size
        if len(buffer) >= prefix:  # ACKs come in batches: most are wholly buffered
            (length,) = ACK_PREFIX.unpack_from(buffer)
            if length <= MAX_ACK_BYTES and len(buffer) >= prefix + length:
                text = buffer[prefix : prefix + length].decode(errors="replace")
                del buffer[: prefix + length]
                return text
        (length,) = ACK_PREFIX.unpack(await self._exactly(ACK_PREFIX.size, "ack.len"))
        check_length("ack.len", length, MAX_ACK_BYTES)
        return (await self._exactly(length, "ack")).decode(errors="replace")


# Socket calls made directly on the descriptor: trio's ``SocketStream`` would add an error
# translation, a conflict check and a scheduling point to each, which are most of a small
# request's cost. Errors stay ``OSError`` (``CONNECTION_ERRORS`` has it), and a socket that
# trio closes while a call waits on it still wakes that call with ``ClosedResourceError``.

_completed_at_once = 0


async def _sometimes_yield() -> None:
    global _completed_at_once
    _completed_at_once += 1
    if _completed_at_once >= YIELD_EVERY:
        _completed_at_once = 0
        await trio.lowlevel.cancel_shielded_checkpoint()


async def _receive_from_socket(sock: trio.socket.SocketType) -> bytes:
    while True:
        await trio.lowlevel.wait_readable(sock)
        try:
            return os.read(sock.fileno(), RECEIVE_CHUNK)
        except BlockingIOError:
            continue


async def _send_on_socket(sock: trio.socket.SocketType, data: bytes) -> None:
    await trio.lowlevel.checkpoint_if_cancelled()
    waited = False
    with memoryview(data) as view:
        sent = 0
        while sent < len(view):
            try:
                sent += os.write(sock.fileno(), view[sent:])
            except BlockingIOError:
                waited = True
                await trio.lowlevel.wait_writable(sock)
    if not waited:
        await _sometimes_yield()
