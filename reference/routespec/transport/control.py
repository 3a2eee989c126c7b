"""The control message: the JSON header of a request's two-part payload (TRN-001, TRN-002).

The worker reads it strictly (TRN-022), as Dynamo 1.6.1's ``RequestControlMessage``: every
field is required but ``payload_codec`` (JSON when absent) and ``metadata`` (empty), a stream's
``context`` is the request's ``id`` and its ``stream_type`` the stream's, and an unusable value
is a ``WireProtocolError`` naming the field by its dotted path (``connection_info.info.address``)
and quoting the value (``shown``, TRN-044). ``read_control`` also says whether the
response-stream address itself (where to dial back, and the subject) was usable, which
decides where the worker reports the error. Where the worker may dial back to is a
``DialBackPolicy`` (TRN-027).
"""

from __future__ import annotations

import functools
import ipaddress
import json
import re

import attrs

from routespec.transport.codecs import PayloadCodec, decode_json, encode_json
from routespec.transport.connection import IPAddress, ip_literal
from routespec.transport.frames import MAX_CONTROL_BYTES, WireProtocolError, check_length

SINGLE_IN = "single_in"
MANY_IN = "many_in"
SINGLE_OUT = "single_out"  # read as many_out, as Dynamo 1.6.1's worker reads it
MANY_OUT = "many_out"
TCP_SERVER = "tcp_server"

CONNECTION_INFO = "connection_info"
REQUEST_STREAM_INFO = "request_stream_connection_info"

STOP, KILL = "stop", "kill"  # the control words a caller sends on a response stream

SHOWN = 60  # characters of an unusable value an error message quotes
_PORT = re.compile(r"[0-9]{1,5}")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?")


_json = json.encoder.encode_basestring_ascii  # a str as encode_json writes it


def shown(value: object) -> str:
    """``repr(value)``, cut to a length fit for an error message."""
    text = repr(value)
    return text if len(text) <= SHOWN else f"{text[: SHOWN - 1]}…"


@functools.lru_cache(maxsize=1024)  # a worker sees the same few addresses on every request
def host_port(address: str, field: str) -> tuple[str, int]:
    """``host:port`` (an IPv6 host optionally in brackets) with a port in 1..65535 and a host
    that is an IP address or a host name; anything else is a ``WireProtocolError``."""
    host, colon, port = address.rpartition(":")
    if not colon:
        raise WireProtocolError(field, f"{shown(address)} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not _PORT.fullmatch(port) or not 0 < int(port) <= 0xFFFF:
        raise WireProtocolError(field, f"port {shown(port)} is not a number in 1..65535")
    if not host:
        raise WireProtocolError(field, f"{shown(address)} has no host")
    if ip_literal(host) is None and not _HOSTNAME.fullmatch(host):
        raise WireProtocolError(
            field, f"host {shown(host)} is neither an IP address nor a host name"
        )
    return host, int(port)


@attrs.frozen
class StreamAddress:
    """Where the worker dials back for a stream, and the stream's subject."""

    address: str  # host:port of the caller's stream server
    subject: str
    context: str = ""  # the request's id; "" until the worker has checked it

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
        single = self.request_stream is None
        header = self._encode_single_in() if single else self._encode_fields()
        check_length("control_message", len(header), MAX_CONTROL_BYTES)
        return header

    def _encode_single_in(self) -> bytes:
        # Every request sends one: the bytes _encode_fields gives, assembled from the JSON
        # of each string rather than by encoding two nested maps (one inside a string).
        info = (
            f'{{"address":{_json(self.response.address)},"subject":{_json(self.response.subject)}'
            f',"context":{_json(self.response.context)},"stream_type":"response"}}'
        )
        metadata = f',"metadata":{encode_json(self.metadata).decode()}' if self.metadata else ""
        return (
            f'{{"id":{_json(self.request_id)},"request_type":"{SINGLE_IN}"'
            f',"response_type":"{MANY_OUT}","payload_codec":"{self.payload_codec.value}"'
            f',"connection_info":{{"transport":"{TCP_SERVER}","info":{_json(info)}}}'
            f"{metadata}}}"
        ).encode()

    def _encode_fields(self) -> bytes:
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
        return encode_json(fields)


@attrs.frozen
class UnusableControl:
    """A control message the worker cannot serve (TRN-022): the error naming the field, and
    the response-stream address if that much was usable (None: refuse at the ACK)."""

    error: WireProtocolError
    response: StreamAddress | None


def parse_control(header: bytes) -> ControlMessage:
    """The worker's view of a control message; anything unusable names its field."""
    read = read_control(header)
    if isinstance(read, UnusableControl):
        raise read.error
    return read


def read_control(header: bytes) -> ControlMessage | UnusableControl:
    """Like ``parse_control``, but an unusable message comes back as ``UnusableControl``,
    with the response address when only a later field is at fault."""
    try:
        check_length("control_message", len(header), MAX_CONTROL_BYTES)
        fields = _object(decode_json(header, "control_message"), "control_message")
        response, response_info = _stream_address(fields, CONNECTION_INFO)
    except WireProtocolError as error:
        return UnusableControl(error, None)
    try:
        return _control(fields, response, response_info)
    except WireProtocolError as error:
        return UnusableControl(error, response)


def _control(
    fields: dict[str, object], response: StreamAddress, response_info: dict[str, object]
) -> ControlMessage:
    request_id = _string(fields.get("id"), "id")
    request_type = _string(fields.get("request_type"), "request_type")
    if request_type not in (SINGLE_IN, MANY_IN):
        raise WireProtocolError("request_type", f"unsupported {shown(request_type)}")
    response_type = _string(fields.get("response_type"), "response_type")
    if response_type not in (SINGLE_OUT, MANY_OUT):
        raise WireProtocolError("response_type", f"unsupported {shown(response_type)}")
    codec_name = _string(fields.get("payload_codec", PayloadCodec.JSON.value), "payload_codec")
    if codec_name not in _CODECS:
        raise WireProtocolError("payload_codec", f"unknown codec {shown(codec_name)}")
    metadata = _strings(fields.get("metadata", {}), "metadata")
    response = _checked(response, response_info, CONNECTION_INFO, "response", request_id)
    request_stream = None
    if request_type == MANY_IN:
        address, info = _stream_address(fields, REQUEST_STREAM_INFO)
        request_stream = _checked(address, info, REQUEST_STREAM_INFO, "request", request_id)
    return ControlMessage(request_id, _CODECS[codec_name], response, metadata, request_stream)


_CODECS = {codec.value: codec for codec in PayloadCodec}


def _stream_address(
    fields: dict[str, object], name: str
) -> tuple[StreamAddress, dict[str, object]]:
    """Where the worker dials the stream ``name`` back and the subject it introduces it by,
    and the stream's info (its type and context checked later, by ``_checked``)."""
    connection = _object(fields.get(name), name)
    transport = _string(connection.get("transport"), f"{name}.transport")  # TRN-048
    if transport != TCP_SERVER:
        raise WireProtocolError(f"{name}.transport", f"unsupported {shown(transport)}")
    info_text = _string(connection.get("info"), f"{name}.info")
    info = _object(decode_json(info_text.encode(), f"{name}.info"), f"{name}.info")
    address = _string(info.get("address"), f"{name}.info.address")
    host_port(address, f"{name}.info.address")
    subject = _string(info.get("subject"), f"{name}.info.subject")
    return StreamAddress(address, subject), info


def _checked(
    address: StreamAddress,
    info: dict[str, object],
    name: str,
    stream_type: str,
    request_id: str,
) -> StreamAddress:
    """``address`` once its info names the stream's type and the request's id as its
    context, as Dynamo 1.6.1's worker requires before it dials."""
    field = f"{name}.info.stream_type"
    found = _string(info.get("stream_type"), field)
    if found != stream_type:
        raise WireProtocolError(field, f"unsupported {shown(found)} for a {stream_type} stream")
    field = f"{name}.info.context"
    context = _string(info.get("context"), field)
    if context != request_id:
        raise WireProtocolError(field, f"{shown(context)} is not the request's id")
    return StreamAddress(address.address, address.subject, context)


def _strings(value: object, field: str) -> dict[str, str]:
    """A JSON object of strings, as Dynamo's ``BTreeMap<String, String>``."""
    strings: dict[str, str] = {}
    for key, item in _object(value, field).items():
        strings[_string(key, field)] = _string(item, f"{field}[{shown(key)}]")
    return strings


def _object(value: object, field: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise WireProtocolError(field, f"expected a JSON object, got {type(value).__name__}")
    return value


def _string(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise WireProtocolError(field, f"expected a string, got {type(value).__name__}")
    if value.isascii():  # most are: no lone surrogate to look for
        return value
    try:
        value.encode()
    except UnicodeEncodeError:  # a JSON escape of a lone surrogate: no codec can send it
        raise WireProtocolError(field, f"{shown(value)} is not valid Unicode") from None
    return value


# --- where a worker may dial back (TRN-027) ---

PEER, ANY = "peer", "any"
DEFAULT_DIAL_BACK = (PEER,)


@attrs.frozen
class DialBackPolicy:
    """The hosts a worker may dial for a request's streams: the address the request came
    from (``peer``), listed IP networks, or any host (``any``)."""

    peer: bool = True
    anywhere: bool = False
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    @classmethod
    def parse(cls, entries: str | tuple[str, ...]) -> DialBackPolicy:
        """From ``peer``, ``any`` and IP addresses or networks (``10.0.0.0/8``), given as a
        tuple or comma-separated; a bad entry is a ``ValueError`` naming it."""
        if isinstance(entries, str):
            entries = tuple(entry.strip() for entry in entries.split(","))
        peer = anywhere = False
        networks = []
        for entry in entries:
            if entry == PEER:
                peer = True
            elif entry == ANY:
                anywhere = True
            else:
                try:
                    networks.append(ipaddress.ip_network(entry, strict=False))
                except ValueError:
                    raise ValueError(
                        f"{entry!r} is not 'peer', 'any' or an IP address or network"
                    ) from None
        if not (peer or anywhere or networks):
            raise ValueError("names no host: use 'peer', 'any' or IP addresses or networks")
        return cls(peer, anywhere, tuple(networks))

    def allows(self, ip: IPAddress, peer: IPAddress | None) -> bool:
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return (
            self.anywhere
            or (self.peer and peer is not None and ip == peer)
            or any(ip in network for network in self.networks)
        )

    def describe(self) -> str:
        allowed = [PEER] if self.peer else []
        allowed += [ANY] if self.anywhere else []
        return ",".join(allowed + [str(network) for network in self.networks])
