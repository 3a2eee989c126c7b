"""The control message: the JSON header of a request's two-part payload (TRN-001, TRN-002)."""

from __future__ import annotations

import attrs

from routespec.transport.codecs import PayloadCodec, decode_json, encode_json
from routespec.transport.frames import MAX_CONTROL_BYTES, WireProtocolError, check_length

SINGLE_IN = "single_in"
MANY_OUT = "many_out"
TCP_SERVER = "tcp_server"


@attrs.frozen
class StreamAddress:
    """Where the worker dials back to deliver a response stream, and the stream's subject."""

    address: str  # host:port of the caller's response-stream server
    subject: str
    context: str


@attrs.frozen
class ControlMessage:
    request_id: str
    payload_codec: PayloadCodec
    response: StreamAddress
    request_type: str = SINGLE_IN
    metadata: dict[str, str] = attrs.field(factory=dict)

    def encode(self) -> bytes:
        """The JSON header; over 128 KiB is refused before anything is sent (TRN-002)."""
        info = {
            "address": self.response.address,
            "subject": self.response.subject,
            "context": self.response.context,
            "stream_type": "response",
        }
        fields: dict[str, object] = {
            "id": self.request_id,
            "request_type": self.request_type,
            "response_type": MANY_OUT,
            "payload_codec": self.payload_codec.value,
            "connection_info": {"transport": TCP_SERVER, "info": encode_json(info).decode()},
        }
        if self.metadata:
            fields["metadata"] = self.metadata
        header = encode_json(fields)
        check_length("control_message", len(header), MAX_CONTROL_BYTES)
        return header


def parse_control(header: bytes) -> ControlMessage:
    """The worker's view of a control message; anything malformed names its field."""
    check_length("control_message", len(header), MAX_CONTROL_BYTES)
    fields = _object(decode_json(header, "control_message"), "control_message")
    connection = _object(fields.get("connection_info"), "connection_info")
    transport = connection.get("transport")
    if transport != TCP_SERVER:
        raise WireProtocolError("connection_info.transport", f"unsupported {transport!r}")
    info_text = _string(connection.get("info"), "connection_info.info")
    info = _object(decode_json(info_text.encode(), "connection_info.info"), "connection_info.info")
    return ControlMessage(
        request_id=_string(fields.get("id"), "id"),
        payload_codec=PayloadCodec.named(fields.get("payload_codec")),
        response=StreamAddress(
            address=_string(info.get("address"), "connection_info.info.address"),
            subject=_string(info.get("subject"), "connection_info.info.subject"),
            context=_string(info.get("context", ""), "connection_info.info.context"),
        ),
        request_type=_string(fields.get("request_type", SINGLE_IN), "request_type"),
    )


def _object(value: object, field: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise WireProtocolError(field, f"expected a JSON object, got {type(value).__name__}")
    return value


def _string(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise WireProtocolError(field, f"expected a string, got {type(value).__name__}")
    return value
