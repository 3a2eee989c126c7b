"""Response-connection reuse (TRN-028 … TRN-031), driven from a raw caller: the check sends
requests to a worker's request plane itself and accepts the worker's dial-backs on its own
listener, so it sees on which connection each stream's handshake arrives. The caller's side
(the target's router offering, releasing and keeping its connections) is checked at the end,
through the streams its workers wrote on released connections (``Target.reused_streams``)."""

from __future__ import annotations

import json
import resource
import select
import socket
import struct
import time

import pytest

from routespec.conformance.checks import covers, require, require_equal, requires
from routespec.conformance.scenario import finished
from routespec.conformance.test_transport import PEER, _exactly, request_message, usable_control
from routespec.testing.target import (
    Adapter,
    Capability,
    Direct,
    Misbehave,
    Serve,
    Silent,
    SilentStage,
    Stall,
    Target,
    WireFault,
)

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


def ready(streams: list[socket.socket], seconds: float) -> list[socket.socket]:
    """Those of ``streams`` with something to read (or closed), waiting ``seconds`` at most
    (poll, not select: the bound checks hold descriptors past FD_SETSIZE)."""
    poller = select.poll()
    by_fd = {stream.fileno(): stream for stream in streams}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    return [by_fd[fd] for fd, _ in poller.poll(seconds * 1000)]


def readable(stream: socket.socket, seconds: float = 0.0) -> bool:
    return bool(ready([stream], seconds))


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


def require_closed(requirement: str, stream: socket.socket, expectation: str) -> None:
    """The worker closes ``stream`` (``WAIT`` real seconds at most) without writing on it;
    ``expectation`` says what it should do, for the failure message."""
    late = closing_bytes(stream)
    require(
        requirement,
        late == b"",
        f"{expectation}, "
        + ("it was still open" if late is None else f"but it wrote {late[:80]!r} on it"),
    )


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


NOT_RELEASES = {  # what the caller writes after the sentinel, and whether it offered reuse
    "offered-not-released": (b"", True),
    "never-offered": (frame(RELEASE), False),  # a release the worker never offered
    "offered-then-kill": (frame(b'"kill"'), True),
    "reuse-with-a-body": (struct.pack(">QQQ", len(RELEASE), 2, 0) + RELEASE + b"{}", True),
}


@covers("TRN-028")
@requires(Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT)
@pytest.mark.parametrize("after", list(NOT_RELEASES))
def test_a_connection_not_released_carries_no_other_stream(
    target: Target, adapter: Adapter, after: str
) -> None:
    """Offered but not released (nothing written, a ``kill``, or a ``reuse`` with a body),
    or released without an offer: the next stream comes on a connection dialled for it, and
    nothing more arrives on the first."""
    written, offer = NOT_RELEASES[after]
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
            if written:
                stream.sendall(written)
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
                    f"and not released ({after}); worker {worker} should dial a new connection "
                    "for the second stream, but "
                    f"{'none came' if second is None else f'it said {found}'} "
                    f"within {time.monotonic() - started:.1f} s",
                )
                if Capability.MOCK_CLOCK in adapter.capabilities:
                    target.advance_time(1.0)  # the release window TRN-028 allows
                require_closed(
                    "TRN-028",
                    stream,
                    f"worker {worker} should close the first stream's connection, which the caller "
                    "never released, within 1 s of its sentinel",
                )


def released(target: Target, worker: int, listener: socket.socket) -> socket.socket:
    """A first stream's connection, read to its sentinel and released; the worker has taken
    the release (the run settled) before this returns."""
    stream, _ = first_stream(target, worker, listener, offer=True)
    stream.sendall(frame(RELEASE))
    target.advance_time(0.0)
    return stream


def next_stream(
    target: Target, worker: int, listener: socket.socket, kept: socket.socket, subject: str
) -> tuple[bool, dict[str, object] | None]:
    """Request ``subject`` and return whether its handshake came on ``kept`` and what it
    said; the stream is read to its sentinel."""
    port = listener.getsockname()[1]
    target.send_raw(worker, request(target.worker_path(worker), port, subject, offer=True))
    if kept in ready([kept, listener], WAIT):
        try:
            found = handshake(kept)
        except (EOFError, OSError):  # the worker closed it
            found = None
        if found is not None:
            read_to_sentinel(kept)
            return True, found
    fresh = accept(listener)
    if fresh is None:
        return False, None
    with fresh:
        found = handshake(fresh)
        read_to_sentinel(fresh)
        return False, found


@covers("TRN-029", "TRN-031")
@requires(Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT, Capability.MOCK_CLOCK)
@pytest.mark.parametrize("age", [19.5, 20.0], ids=["under-20s", "at-20s"])
def test_a_released_connection_is_used_for_less_than_20_s(target: Target, age: float) -> None:
    worker = target.add_worker()
    target.advance_time(10.0)  # released at 10 s, not at the clock's start: its age is a span
    with listening() as listener, released(target, worker, listener) as kept:
        target.advance_time(age)
        if age < 20.0:
            on_kept, found = next_stream(target, worker, listener, kept, "second")
            require(
                "TRN-029",
                on_kept and found is not None and found.get("subject") == "second",
                f"a connection released {age} s ago is still usable; worker {worker} should "
                f"write the next stream on it, but it came {'on it' if on_kept else 'elsewhere'}"
                f" as {found}",
            )
            return
        require_closed(
            "TRN-031",
            kept,
            f"worker {worker} should close a connection released {age} s ago within 1 s",
        )
        on_kept, found = next_stream(target, worker, listener, kept, "second")
        require(
            "TRN-031",
            not on_kept and found is not None and found.get("subject") == "second",
            f"a connection released {age} s ago may carry no stream; worker {worker} should "
            f"dial a new one, but the stream came {'on it' if on_kept else 'as'} {found}",
        )


@covers("TRN-031")
@requires(Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT, Capability.MOCK_CLOCK)
@pytest.mark.parametrize("then", ["wrote", "closed"])
@pytest.mark.parametrize("first", ["next-stream", "a-second-passes"])
def test_a_released_connection_the_caller_touched_is_not_used(
    target: Target, then: str, first: str
) -> None:
    """After its release the caller writes a frame, or closes its half: the worker never
    writes a stream there, and closes it within 1 s, with or without a stream to place."""
    worker = target.add_worker()
    with listening() as listener, released(target, worker, listener) as kept:
        if then == "wrote":
            kept.sendall(frame(b'"stop"'))
        else:
            kept.shutdown(socket.SHUT_WR)
        target.advance_time(0.0)
        if first == "a-second-passes":
            target.advance_time(1.0)
            require_closed(
                "TRN-031",
                kept,
                f"the caller {then} on its released connection; worker {worker} should close "
                "it within 1 s",
            )
        on_kept, found = next_stream(target, worker, listener, kept, "second")
        require(
            "TRN-031",
            not on_kept and found is not None and found.get("subject") == "second",
            f"the caller {then} on its released connection; worker {worker} should dial a new "
            f"one for the next stream, but it came {'on it' if on_kept else 'as'} {found}",
        )
        if first == "next-stream":
            target.advance_time(1.0)
            require(
                "TRN-031",
                closing_bytes(kept) is not None,
                f"the caller {then} on its released connection; worker {worker} should close "
                "it within 1 s, it was still open",
            )


@covers("TRN-028")
@requires(Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT, Capability.MOCK_CLOCK)
def test_a_reused_connection_needs_a_release_of_its_own(target: Target) -> None:
    """The second stream on a released connection is read but not released: the third
    stream is dialled for, and the connection closed within 1 s."""
    worker = target.add_worker()
    with listening() as listener, released(target, worker, listener) as kept:
        on_kept, found = next_stream(target, worker, listener, kept, "second")
        if not on_kept:
            pytest.skip("the worker did not reuse the released connection (TRN-029, a SHOULD)")
        on_kept, found = next_stream(target, worker, listener, kept, "third")
        require(
            "TRN-028",
            not on_kept and found is not None and found.get("subject") == "third",
            f"the caller did not release the second stream's connection; worker {worker} "
            f"should dial a new one for the third, but it came "
            f"{'on it' if on_kept else 'as'} {found}",
        )
        target.advance_time(1.0)
        require_closed(
            "TRN-028",
            kept,
            f"worker {worker} should close the second stream's connection, which the caller "
            "never released, within 1 s of its sentinel",
        )


@covers("TRN-029")
@requires(Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT, Capability.MOCK_CLOCK)
def test_a_release_half_a_second_after_the_sentinel_is_taken(target: Target) -> None:
    """The caller may take a moment to release: a release 0.5 s after the sentinel still
    keeps the connection for the next stream (TRN-028 lets the worker wait no longer than
    1 s for it; this is the other side of that bound)."""
    worker = target.add_worker()
    target.advance_time(10.0)  # the sentinel at 10 s, not at the clock's start: a span
    with listening() as listener:
        stream, _ = first_stream(target, worker, listener, offer=True)
        with stream:
            target.advance_time(0.5)
            stream.sendall(frame(RELEASE))
            target.advance_time(0.0)
            on_kept, found = next_stream(target, worker, listener, stream, "second")
            require(
                "TRN-029",
                on_kept and found is not None and found.get("subject") == "second",
                f"the caller released the first stream's connection 0.5 s after its sentinel; "
                f"worker {worker} should write the next stream on it, but it came "
                f"{'on it' if on_kept else 'elsewhere'} as {found}",
            )


def released_many(
    target: Target, worker: int, listeners: list[socket.socket], counts: list[int]
) -> list[socket.socket]:
    """``counts[i]`` streams to ``listeners[i]``, read to their sentinels, then released
    listener by listener, one at a time and in the order returned, the run settled after
    each release and the clock a millisecond on after each listener's: a listener's
    connections are released later than the previous listener's."""
    by_subject: dict[str, socket.socket] = {}
    for index, (listener, count) in enumerate(zip(listeners, counts, strict=True)):
        port = listener.getsockname()[1]
        for subject in (f"s{index}-{n}" for n in range(count)):
            target.send_raw(worker, request(target.worker_path(worker), port, subject, offer=True))
            stream = accept(listener)
            if stream is None:
                pytest.fail(f"setup: worker {worker} dialled back fewer than {count} times")
            introduced = handshake(stream).get("subject")
            read_to_sentinel(stream)
            by_subject[str(introduced)] = stream
    ordered: list[socket.socket] = []
    for index, count in enumerate(counts):
        for n in range(count):
            ordered.append(by_subject[f"s{index}-{n}"])
            ordered[-1].sendall(frame(RELEASE))
            target.advance_time(0.0)
        target.advance_time(0.001)
    return ordered


def open_descriptors(wanted: int) -> None:
    """Raise this process's soft open-file limit to ``wanted`` if the hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        ceiling = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
        if ceiling < wanted:
            pytest.skip(f"the check holds {wanted} descriptors; the hard limit is {hard}")


@covers("TRN-030")
@requires(Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT, Capability.MOCK_CLOCK)
@pytest.mark.parametrize(
    "counts",
    [[64], [65], [64] * 16, [64] * 16 + [1], [64] * 15 + [63, 1, 1]],
    ids=[
        "address-at-bound",
        "address-past-bound",
        "total-at-bound",
        "total-past-bound",
        "total-past-bound-uneven",
    ],
)
def test_released_connections_are_kept_up_to_the_bounds(target: Target, counts: list[int]) -> None:
    """64 per response address and 1,024 in all are kept; one more closes the connection
    released longest ago. The addresses are released from the highest to the lowest (as
    text), so the longest-released is neither the lowest address nor one that holds a
    single connection; in the uneven case one address holds a single connection when the
    pool is full."""
    total = sum(counts)
    open_descriptors(4 * (total + 64))
    worker = target.add_worker()
    listeners = sorted(
        (listening() for _ in counts),
        key=lambda listener: f"{PEER}:{listener.getsockname()[1]}",
        reverse=True,
    )
    streams: list[socket.socket] = []
    try:
        streams = released_many(target, worker, listeners, counts)
        closed = [n for n, stream in enumerate(streams) if readable(stream)]
        expected = [0] if total in (65, 1025) else []
        require(
            "TRN-030",
            closed == expected,
            f"{total} connections released to worker {worker} over {len(counts)} "
            f"address(es); it should close {'the first released' if expected else 'none'}, "
            f"it closed those released {[n + 1 for n in closed]}th",
        )
    finally:
        for stream in [*streams, *listeners]:
            stream.close()


# --- the caller's side: the target's router releases what it read and keeps it open ---


def served(target: Target, worker: int, items: int, requirement: str) -> None:
    """One request to ``worker`` (scripted ``Serve(items)``) completes with its items."""
    outcome = finished(target, target.submit(Direct(worker)), requirement)
    require(
        requirement,
        outcome.error is None and len(outcome.items) == items,
        f"worker {worker} serves {items} items; the request ended {outcome}",
    )


@covers("TRN-029")
@requires(Capability.RESPONSE_REUSE, Capability.DIRECT)
@pytest.mark.parametrize("items", [0, 1, 3])
def test_the_caller_releases_each_connection_it_read_to_the_sentinel(
    target: Target, items: int
) -> None:
    """Each stream read to its sentinel is released, so every request after the first is
    written on the connection of the one before it."""
    worker = target.add_worker()
    target.script_worker(worker, Serve(items))
    for stream in range(4):
        served(target, worker, items, "TRN-029")
        require_equal(
            "TRN-029",
            target.reused_streams(worker),
            stream,
            f"the caller read {stream + 1} streams of worker {worker} to their sentinels, one "
            "after the other; it should release each, and the worker write each next stream "
            f"on the connection released before it ({stream} reused)",
        )


@covers("TRN-029", "TRN-031")
@requires(Capability.RESPONSE_REUSE, Capability.DIRECT, Capability.MOCK_CLOCK)
def test_the_caller_keeps_a_released_connection_until_the_worker_closes_it(
    target: Target,
) -> None:
    """Released 15 s ago (past any deadline the caller keeps for a handshake, under the 20 s
    of TRN-031), the connection is still open at the caller and carries the next stream; 25 s
    after a release the worker has given it up, and the next stream is dialled for."""
    worker = target.add_worker()
    target.script_worker(worker, Serve(1))
    served(target, worker, 1, "TRN-029")
    target.advance_time(15.0)
    served(target, worker, 1, "TRN-029")
    require_equal(
        "TRN-029",
        target.reused_streams(worker),
        1,
        f"the caller released worker {worker}'s connection 15 s ago and only the worker gives "
        "a released connection up; the next stream should have been written on it",
    )
    target.advance_time(25.0)
    served(target, worker, 1, "TRN-031")
    require_equal(
        "TRN-031",
        target.reused_streams(worker),
        1,
        f"worker {worker} wrote a stream on a connection released 25 s before",
    )
    served(target, worker, 1, "TRN-029")
    require_equal(
        "TRN-029",
        target.reused_streams(worker),
        2,
        f"the stream dialled for after 25 s should be released and reused in turn by worker "
        f"{worker}",
    )


@covers("TRN-042")
@requires(
    Capability.RESPONSE_REUSE,
    Capability.DIRECT,
    Capability.MOCK_CLOCK,
    Capability.OBSERVE_INFLIGHT,
    Capability.SCRIPT_WIRE_FAULTS,
)
@pytest.mark.parametrize("closed_by", ["age", "kill"])
def test_the_caller_holds_nothing_of_a_connection_its_worker_closed(
    target: Target, closed_by: str
) -> None:
    """A stream that never came (its registration given up at the establish deadline) and
    one the caller dropped (its connection closed, not released) leave nothing held. Then
    three streams read to their sentinels and released (on two connections: the first two
    at once, the third on a released one); the worker closes them, by their age (TRN-031)
    or by dying. Within a second the caller holds none of them."""
    worker = target.add_worker()
    target.script_worker(worker, Misbehave(0, WireFault.NO_CALL_HOME))
    never = target.submit(Direct(worker))
    target.advance_time(31.0)  # past the establish deadline (TMO-003: 30 s)
    finished(target, never, "TRN-042")
    holds_none(target, f"worker {worker} never dialled back, and the caller gave it up")
    target.script_worker(worker, Stall(items=1, items_after=1))
    dropped = target.submit(Direct(worker))
    target.drop(dropped)  # its connection closed by the caller, not released
    target.release_stalled(worker)
    finished(target, dropped, "TRN-042")
    holds_none(target, f"the caller dropped a stream of worker {worker}, closing its connection")
    target.script_worker(worker, Stall(items=1, items_after=1))
    first, second = target.submit(Direct(worker)), target.submit(Direct(worker))
    target.release_stalled(worker)
    for request in (first, second):
        finished(target, request, "TRN-042")
    target.script_worker(worker, Serve(1))
    served(target, worker, 1, "TRN-042")
    held = target.response_connections()
    require(
        "TRN-042",
        held == 2,
        f"two streams at once, then a third, all read to their sentinels: the caller should "
        f"hold worker {worker}'s two released connections, it holds {held}",
    )
    if closed_by == "age":
        target.advance_time(21.0)  # TRN-031: the worker closes them within 1 s past 20 s
    else:
        target.kill_worker(worker)
    target.advance_time(1.0)
    holds_none(target, f"worker {worker} closed its released connections ({closed_by}) 1 s ago")


def holds_none(target: Target, why: str) -> None:
    held = target.response_connections()
    require("TRN-042", held == 0, f"{why}; the caller still holds {held} response connections")


@covers("TRN-042", "TRN-015")
@requires(
    Capability.DIRECT,
    Capability.SCRIPT_SILENCE,
    Capability.OBSERVE_INFLIGHT,
    Capability.RESPONSE_REUSE,
)
@pytest.mark.parametrize("stage", [SilentStage.DIAL_BACK, SilentStage.HANDSHAKE], ids=str)
def test_a_dispatch_dropped_while_establishing_holds_nothing(
    target: Target, stage: SilentStage
) -> None:
    """The worker goes silent before dialling back, or after its handshake (its connection
    at the caller, the prologue never sent); the caller drops the request there. Nothing
    of it stays: no response connection, nothing in flight."""
    worker = target.add_worker()
    target.script_worker(worker, Silent(stage))
    request = target.submit(Direct(worker))
    target.drop(request)
    finished(target, request, "TRN-042")
    why = f"the caller dropped a request to worker {worker} silent at its {stage.value} stage"
    holds_none(target, why)
    inflight = target.transport_inflight()
    require("TRN-015", inflight == 0, f"{why}; it counts {inflight} dispatches in flight")
    target.release_stalled(worker)
