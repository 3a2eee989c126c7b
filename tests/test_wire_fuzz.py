"""Fuzzing the reference's wire decoders (TRN-012): arbitrary bytes give a typed
``WireProtocolError`` naming the field, never a crash, a hang or an allocation past the
declared-length limit."""

from __future__ import annotations

import struct
import tracemalloc

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from routespec.errors import RoutingError
from routespec.transport.codecs import PayloadCodec
from routespec.transport.connection import FramedConnection
from routespec.transport.control import parse_control
from routespec.transport.frames import MAX_MESSAGE_BYTES, WireProtocolError, decode_two_part
from routespec.transport.wire_errors import decode_error

ALLOCATION_BOUND = 2 * 1024 * 1024  # far below any length an input can declare

huge_prefixes = st.sampled_from(
    [
        struct.pack(">QQQ", 2**64 - 1, 0, 0),
        struct.pack(">QQQ", 10, MAX_MESSAGE_BYTES, 0),
        struct.pack(">H", 3) + b"a/b" + struct.pack(">H", 2) + b"{}" + struct.pack(">I", 2**32 - 1),
        struct.pack(">I", 2**32 - 1),
    ]
)
inputs = st.one_of(
    st.binary(max_size=512),
    st.builds(lambda prefix, tail: prefix + tail, huge_prefixes, st.binary(max_size=64)),
)


@settings(max_examples=300)
@given(inputs)
def test_two_part_decoder_is_total(data: bytes) -> None:
    try:
        decode_two_part(data)
    except WireProtocolError as error:
        field = error.field
    else:
        return
    assert field.startswith("two_part")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


@settings(max_examples=300)
@given(st.one_of(st.binary(max_size=512), json_values.map(PayloadCodec.JSON.encode)))
def test_control_parser_is_total(header: bytes) -> None:
    try:
        parse_control(header)
    except WireProtocolError as error:
        field = error.field
    else:
        return
    assert field


@settings(max_examples=300)
@given(st.binary(max_size=256), st.sampled_from(list(PayloadCodec)))
def test_payload_codecs_are_total(data: bytes, codec: PayloadCodec) -> None:
    try:
        codec.decode(data, "body")
    except WireProtocolError as error:
        field = error.field
    else:
        return
    assert field == "body"


@settings(max_examples=300)
@given(json_values)
def test_error_decoder_is_total(shape: object) -> None:
    assert isinstance(decode_error(shape), RoutingError)


async def _read_everything(data: bytes) -> None:
    """Feed ``data`` to every reader of a connection, then end the stream."""
    for read in ("read_request", "read_two_part", "read_ack"):
        send, receive = trio.testing.memory_stream_pair()
        connection = FramedConnection(receive)
        await send.send_all(data)
        await send.aclose()
        try:
            with trio.fail_after(5):
                while await getattr(connection, read)() is not None:
                    pass
        except WireProtocolError:
            pass


@settings(max_examples=150, deadline=None)
@given(inputs)
def test_connection_reads_are_bounded(data: bytes) -> None:
    tracemalloc.start()
    try:
        trio.run(_read_everything, data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < ALLOCATION_BOUND, f"{peak} bytes allocated for a {len(data)}-byte input"
