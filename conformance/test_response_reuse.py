"""Response-connection reuse (TRN-028, TRN-029), driven from a raw caller: the check sends
requests to a worker's request plane itself and accepts the worker's dial-backs on its own
listener, so it sees on which connection each stream's handshake arrives."""

from __future__ import annotations

import json
import select
import socket
import struct
import time

import pytest

from routespec.conformance.checks import covers, require, requires
from routespec.conformance.test_transport import PEER, _exactly, request_message, usable_control
from routespec.testing.target import Adapter, Capability, Target

WAIT = 10.0  # real seconds a check waits for a worker's bytes
OFFER = '"x-routespec-response-reuse":"1"'
RELEASE = b'"reuse"'
SENTINEL = b'"sentinel"'


def request(path: str, port: int, subject: str, *, offer: bool) -> bytes:
    """A request message for ``path`` whose response stream is ``subject`` at ``port``."""
    control = json.dumps(usable_control(f"{PEER}:{port}", subject)).encode()
    headers = ("{" + (OFFER if offer else "") + "}").encode()
    return request_message(path, control, headers=headers)


def frame(header: bytes) -> bytes:
    return struct.pack(">QQQ", len(header), 0, 0) + header


def read_frame(stream: socket.socket) -> tuple[bytes, bytes]:
    prefix = _exactly(stream, 24)
    if prefix is None:
        raise EOFError("the connection closed before a frame")
    header_len, body_len, _ = struct.unpack(">QQQ", prefix)
    data = _exactly(stream, header_len + body_len)
    if data is None:
        raise EOFError("the connection closed inside a frame")
    return data[:header_len], data[header_len:]


def handshake(stream: socket.socket) -> dict[str, object]:
    header, _ = read_frame(stream)
    found = json.loads(header)
    assert isinstance(found, dict), f"a handshake that is not a map: {header!r}"
    return found


def read_to_sentinel(stream: socket.socket) -> None:
    """Prologue, data frames and the final frame, up to the sentinel."""
    for _ in range(64):
        header, _ = read_frame(stream)
        if header == SENTINEL:
            return
    raise AssertionError("no sentinel within 64 frames")


def readable(stream: socket.socket, seconds: float = 0.0) -> bool:
    found, _, _ = select.select([stream], [], [], seconds)
    return bool(found)


def closing_bytes(stream: socket.socket) -> bytes | None:
    """What arrives on ``stream`` until the worker closes it (``WAIT`` real seconds at
    most; None if it stays open)."""
    data = bytearray()
    deadline = time.monotonic() + WAIT
    while (left := deadline - time.monotonic()) > 0:
        if not readable(stream, left):
            break
        try:
            chunk = stream.recv(1 << 16)
        except OSError:
            return bytes(data)
        if not chunk:
            return bytes(data)
        data += chunk
    return None


def accept(listener: socket.socket) -> socket.socket | None:
    listener.settimeout(WAIT)
    try:
        stream, _ = listener.accept()
    except TimeoutError:
        return None
    stream.settimeout(WAIT)
    return stream


def first_stream(
    target: Target, worker: int, listener: socket.socket, *, offer: bool
) -> tuple[socket.socket, dict[str, object]]:
    port = listener.getsockname()[1]
    target.send_raw(worker, request(target.worker_path(worker), port, "first", offer=offer))
    stream = accept(listener)
    if stream is None:
        pytest.fail(f"setup: worker {worker} never dialled back for the first stream")
    found = handshake(stream)
    if found.get("subject") != "first":
        pytest.fail(f"setup: the first dial-back introduced {found}")
    read_to_sentinel(stream)
    return stream, found


def listening() -> socket.socket:
    listener = socket.socket()
    listener.bind((PEER, 0))
    listener.listen(8)
    return listener


@covers("TRN-028", "TRN-029")
@requires(Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT)
def test_a_released_connection_carries_the_next_stream(target: Target) -> None:
    worker = target.add_worker()
    with listening() as listener:
        stream, introduced = first_stream(target, worker, listener, offer=True)
        with stream:
            require(
                "TRN-029",
                introduced.get("reuse") is True,
                f"worker {worker} was offered reuse; its handshake should say "
                f'"reuse": true, it was {introduced}',
            )
            stream.sendall(frame(RELEASE))
            port = listener.getsockname()[1]
            target.send_raw(worker, request(target.worker_path(worker), port, "second", offer=True))
            arrived = readable(stream, WAIT)
            second = handshake(stream) if arrived else None
            require(
                "TRN-029",
                second is not None and second.get("subject") == "second",
                f"the caller released the first stream's connection after its sentinel; worker "
                f"{worker} should write the next stream there, but on it came {second}",
            )
            read_to_sentinel(stream)


@covers("TRN-028")
@requires(Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT)
@pytest.mark.parametrize("offer", [True, False], ids=["offered-not-released", "never-offered"])
def test_a_connection_not_released_carries_no_other_stream(
    target: Target, adapter: Adapter, offer: bool
) -> None:
    """Offered but not released, or released without an offer: the next stream comes on a
    connection dialled for it, and nothing more arrives on the first."""
    worker = target.add_worker()
    with listening() as listener:
        stream, introduced = first_stream(target, worker, listener, offer=offer)
        with stream:
            if not offer:
                require(
                    "TRN-028",
                    "reuse" not in introduced,
                    f"worker {worker} was not offered reuse, yet its handshake was {introduced}",
                )
                stream.sendall(frame(RELEASE))  # a release the worker never offered
            port = listener.getsockname()[1]
            target.send_raw(
                worker, request(target.worker_path(worker), port, "second", offer=offer)
            )
            started = time.monotonic()
            second = accept(listener)
            with second or socket.socket():
                found = handshake(second) if second is not None else None
                require(
                    "TRN-028",
                    found is not None and found.get("subject") == "second",
                    f"the first stream's connection was {'offered' if offer else 'not offered'} "
                    f"and not released; worker {worker} should dial a new connection for the "
                    f"second stream, but {'none came' if second is None else f'it said {found}'} "
                    f"within {time.monotonic() - started:.1f} s",
                )
                if Capability.MOCK_CLOCK in adapter.capabilities:
                    target.advance_time(1.0)  # the release window TRN-028 allows
                late = closing_bytes(stream)
                require(
                    "TRN-028",
                    late == b"",
                    f"worker {worker} should close the first stream's connection, which the "
                    f"caller never released, within 1 s of its sentinel; "
                    + ("it was still open" if late is None else f"it wrote {late[:80]!r} on it"),
                )
