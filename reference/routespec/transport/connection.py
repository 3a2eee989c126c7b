"""A TCP connection that reads whole wire units, checking each length before reading it."""

from __future__ import annotations

import ipaddress

import trio

from routespec.transport.frames import (
    ACK_PREFIX,
    MAX_ACK_BYTES,
    MAX_MESSAGE_BYTES,
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


LOOPBACK = "127.0.0.1"
CONNECTION_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


async def open_stream(address: str) -> trio.SocketStream:
    """Connect to ``host:port``. A numeric host has one candidate address, so it is dialled
    directly, without ``open_tcp_stream``'s resolution and happy-eyeballs tasks."""
    host, port = split_address(address)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return await trio.open_tcp_stream(host, port)
    family = trio.socket.AF_INET6 if ip.version == 6 else trio.socket.AF_INET
    sock = trio.socket.socket(family, trio.socket.SOCK_STREAM)
    try:
        await sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


class FramedConnection:
    """Buffered reads of exact byte counts over one stream. ``None`` means a clean end of
    stream at a unit boundary; an end inside a unit is a ``WireProtocolError``."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self._buffer = bytearray()
        self._send_lock = trio.Lock()
        self.closed = trio.Event()

    async def send(self, data: bytes) -> None:
        # A unit is never interleaved with another. An uncontended lock is taken without
        # ``Lock.acquire``'s extra scheduling point; ``send_all`` still checkpoints.
        try:
            self._send_lock.acquire_nowait()
        except trio.WouldBlock:
            await self._send_lock.acquire()
        try:
            await self.stream.send_all(data)
        finally:
            self._send_lock.release()

    async def aclose(self) -> None:
        self.closed.set()
        await self.stream.aclose()

    async def _read(self, count: int, field: str, *, at_boundary: bool = False) -> bytes | None:
        while len(self._buffer) < count:
            # A fixed chunk: a declared length never sizes a receive buffer (TRN-012).
            chunk = await self.stream.receive_some(RECEIVE_CHUNK)
            if not chunk:
                if at_boundary and not self._buffer:
                    return None
                raise WireProtocolError(
                    field, f"connection closed after {len(self._buffer)} of {count} bytes"
                )
            self._buffer += chunk
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        return data

    async def _exactly(self, count: int, field: str) -> bytes:
        data = await self._read(count, field)
        assert data is not None
        return data

    async def read_two_part(self, limit: int = MAX_MESSAGE_BYTES) -> TwoPart | None:
        prefix = await self._read(TWO_PART_PREFIX.size, "two_part", at_boundary=True)
        if prefix is None:
            return None
        header_len, body_len = two_part_lengths(prefix, limit)
        header = await self._exactly(header_len, "two_part.header")
        body = await self._exactly(body_len, "two_part.body")
        return TwoPart(header, body)

    async def read_request(self) -> RequestMessage | None:
        prefix = await self._read(U16.size, "request.path_len", at_boundary=True)
        if prefix is None:
            return None
        (path_len,) = U16.unpack(prefix)
        path = await self._exactly(path_len, "request.path")
        (headers_len,) = U16.unpack(await self._exactly(U16.size, "request.headers_len"))
        headers = await self._exactly(headers_len, "request.headers")
        (payload_len,) = U32.unpack(await self._exactly(U32.size, "request.payload_len"))
        check_length("request.payload_len", payload_len, MAX_MESSAGE_BYTES)
        payload = await self._exactly(payload_len, "request.payload")
        try:
            text = path.decode()
        except UnicodeDecodeError:
            raise WireProtocolError("request.path", "not UTF-8") from None
        return RequestMessage(text, headers, payload)

    async def read_ack(self) -> str:
        (length,) = ACK_PREFIX.unpack(await self._exactly(ACK_PREFIX.size, "ack.len"))
        check_length("ack.len", length, MAX_ACK_BYTES)
        return (await self._exactly(length, "ack")).decode(errors="replace")
