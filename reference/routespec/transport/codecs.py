"""Payload codecs: msgpack (Dynamo's default; a map key of any type, TRN-054) and JSON
(TRN-001)."""

from __future__ import annotations

import enum
import json

import msgpack

from routespec.transport.frames import WireProtocolError


class PayloadCodec(enum.Enum):
    MSGPACK = "msgpack"
    JSON = "json"

    def encode(self, value: object) -> bytes:
        if self is PayloadCodec.MSGPACK:
            packed: bytes = msgpack.packb(value, use_bin_type=True)
            return packed
        return json.dumps(value, separators=(",", ":")).encode()

    def decode(self, data: bytes, field: str) -> object:
        """Decode ``data``; malformed bytes are a ``WireProtocolError`` naming ``field``."""
        try:
            if self is PayloadCodec.MSGPACK:
                return msgpack.unpackb(data, raw=False, strict_map_key=False)
            return json.loads(data)
        except (ValueError, TypeError, RecursionError, msgpack.UnpackException) as error:
            raise WireProtocolError(field, f"not valid {self.value}: {error}") from None


def decode_json(data: bytes, field: str) -> object:
    return PayloadCodec.JSON.decode(data, field)


def encode_json(value: object) -> bytes:
    return PayloadCodec.JSON.encode(value)
