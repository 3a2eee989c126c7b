"""Byte layouts of the TCP request plane and of response-stream frames (TRN-001).

Every length prefix is checked against its limit before anything is allocated for it
(TRN-012); a violation is a ``WireProtocolError`` naming the field, then the numbers that
do not fit (TRN-050).
"""

from __future__ import annotations

import struct

import attrs

MAX_CONTROL_BYTES = 128 * 1024  # TRN-002
MAX_MESSAGE_BYTES = 32 * 1024 * 1024  # a request message or a response frame
MAX_ACK_BYTES = 64 * 1024  # TRN-038

TWO_PART_PREFIX = struct.Struct(">QQQ")  # header_len, body_len, checksum
ACK_PREFIX = struct.Struct(">I")
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
REQUEST_LENGTHS = 2 * U16.size + U32.size  # a request message's three length prefixes


SENTINEL = b'"sentinel"'  # the header of a response stream's last frame


class WireProtocolError(Exception):
    """Bytes that break the wire format. ``field`` names the part at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def check_length(field: str, length: int, limit: int) -> None:
    """Refuse a declared length above its limit (TRN-012)."""
    if length > limit:
        raise WireProtocolError(field, f"declared {length} bytes, limit is {limit}")


@attrs.frozen
class TwoPart:
    """A two-part message: a header (JSON control data) and a body (codec-encoded data)."""

    header: bytes = b""
    body: bytes = b""

    def encode(self) -> bytes:
        # The checksum is 0, as in Dynamo's release builds.
        return TWO_PART_PREFIX.pack(len(self.header), len(self.body), 0) + self.header + self.body


def two_part_lengths(prefix: bytes, limit: int = MAX_MESSAGE_BYTES) -> tuple[int, int]:
    """The header and body lengths a 24-byte prefix declares, checked against ``limit``."""
    header_len, body_len, _checksum = TWO_PART_PREFIX.unpack(prefix)
    check_length("two_part.header_len", header_len, limit)
    check_length("two_part.body_len", body_len, limit - header_len)
    return header_len, body_len


def decode_two_part(data: bytes, limit: int = MAX_MESSAGE_BYTES) -> TwoPart:
    """Parse a complete two-part message held in memory."""
    if len(data) < TWO_PART_PREFIX.size:
        raise WireProtocolError("two_part", f"{len(data)} bytes is shorter than the prefix")
    header_len, body_len = two_part_lengths(data[: TWO_PART_PREFIX.size], limit)
    end = TWO_PART_PREFIX.size + header_len + body_len
    if len(data) != end:
        raise WireProtocolError("two_part", f"declares {end} bytes, holds {len(data)}")
    start = TWO_PART_PREFIX.size
    return TwoPart(data[start : start + header_len], data[start + header_len : end])


@attrs.frozen
class RequestMessage:
    """One request on the request plane: endpoint path, string headers, two-part payload."""

    path: str
    headers: bytes  # a JSON object of strings
    payload: bytes

    def encode(self) -> bytes:
        path = self.path.encode()
        check_length("request.path_len", len(path), 0xFFFF)
        check_length("request.headers_len", len(self.headers), 0xFFFF)
        # TRN-043: 32 MiB in all, as a worker counts it (TRN-049)
        room = MAX_MESSAGE_BYTES - REQUEST_LENGTHS - len(path) - len(self.headers)
        check_length("request.payload_len", len(self.payload), room)
        return b"".join(
            (
                U16.pack(len(path)),
                path,
                U16.pack(len(self.headers)),
                self.headers,
                U32.pack(len(self.payload)),
                self.payload,
            )
        )


def encode_ack(message: str = "") -> bytes:
    """Empty = accepted; otherwise a rejection text such as ``Server overloaded: …``."""
    data = message.encode()[:MAX_ACK_BYTES]
    return ACK_PREFIX.pack(len(data)) + data
