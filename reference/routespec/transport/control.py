"""The control message: the JSON header of a request's two-part payload (TRN-001, TRN-002)."""

from __future__ import annotations

import attrs

from routespec.transport.codecs import PayloadCodec, decode_json, encode_json
from routespec.transport.frames import MAX_CONTROL_BYTES, WireProtocolError, check_length

SINGLE_IN = "single_in"
MANY_IN = "many_in"
MANY_OUT = "many_out"
TCP_SERVER = "tcp_server"


STOP, KILL = "stop", "kill"  # the control words a caller sends on a response stream


@attrs.frozen
class StreamAddress:
    """Where the worker dials back for a stream, and the stream's subject."""

    address: str  # host:port of the caller's stream server
    subject: str
    context: str

    def connection_info(self, stream_type: str) -> dict[str, object]:
        info = {
            "address": self.address,
            "subject": self.subject,
            "context": self.context,
            "stream_type": stream_type,
        }
        return {"transport": TCP_SERVER, "info": encode_json(info).decode()}


@attrs.frozen
class ControlMessage:
    request_id: str
    payload_codec: PayloadCodec
    response: StreamAddress
    metadata: dict[str, str] = attrs.field(factory=dict)
    request_stream: StreamAddress | None = None  # set for a bidirectional request (TRN-020)

    @property
    def request_type(self) -> str:
        return SINGLE_IN if self.request_stream is None else MANY_IN

    def encode(self) -> bytes:
        """The JSON header; over 128 KiB is refused before anything is sent (TRN-002)."""
        fields: dict[str, object] = {
            "id": self.request_id,
            "request_type": self.request_type,
            "response_type": MANY_OUT,
            "payload_codec": self.payload_codec.value,
            "connection_info": self.response.connection_info("response"),
        }
        if self.metadata:
            fields["metadata"] = self.metadata
        if self.request_stream is not None:
            fields["request_stream_connection_info"] = self.request_stream.connection_info(
                "request"
            )
        header = encode_json(fields)
        check_length("control_message", len(header), MAX_CONTROL_BYTES)
        return header


def parse_control(header: bytes) -> ControlMessage:
    """The worker's view of a control message; anything malformed names its field."""
    check_length("control_message", len(header), MAX_CONTROL_BYTES)
    fields = _object(decode_json(header, "control_message"), "control_message")
    request_type = _string(fields.get("request_type", SINGLE_IN), "request_type")
    if request_type not in (SINGLE_IN, MANY_IN):
        raise WireProtocolError("request_type", f"unsupported {request_type!r}")
    request_stream = None
    if request_type == MANY_IN:
        request_stream = _stream_address(fields, "request_stream_connection_info")
    metadata = fields.get("metadata")
    return ControlMessage(
        request_id=_string(fields.get("id"), "id"),
        payload_codec=PayloadCodec.named(fields.get("payload_codec")),
        response=_stream_address(fields, "connection_info"),
        metadata=_strings(metadata) if isinstance(metadata, dict) else {},
        request_stream=request_stream,
    )


def _stream_address(fields: dict[str, object], name: str) -> StreamAddress:
    connection = _object(fields.get(name), name)
    transport = connection.get("transport")
    if transport != TCP_SERVER:
        raise WireProtocolError(f"{name}.transport", f"unsupported {transport!r}")
    info_text = _string(connection.get("info"), f"{name}.info")
    info = _object(decode_json(info_text.encode(), f"{name}.info"), f"{name}.info")
    return StreamAddress(
        address=_string(info.get("address"), f"{name}.info.address"),
        subject=_string(info.get("subject"), f"{name}.info.subject"),
        context=_string(info.get("context", ""), f"{name}.info.context"),
    )


def _strings(value: dict[str, object]) -> dict[str, str]:
    return {str(key): str(item) for key, item in value.items()}


def _object(value: object, field: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise WireProtocolError(field, f"expected a JSON object, got {type(value).__name__}")
    return value


def _string(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise WireProtocolError(field, f"expected a string, got {type(value).__name__}")
    return value
