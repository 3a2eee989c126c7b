"""The worker side of the TCP transport, driven from a raw caller: the check sends requests
to a worker's request plane itself and accepts the worker's dial-backs on its own listener,
so it sees the frames the worker writes and can write what a caller (or a misbehaving one)
would on the response and request streams: a ``kill``, or the caller going away (TRN-017,
TRN-035), a broken request stream (TRN-036) and over-budget frames (TRN-026). The ACK texts
of refused requests are read on request-plane connections held open to the worker
(Capability.WORKER_LIMITS; TRN-022, TRN-027)."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import struct
from collections.abc import Callable, Iterator

import pytest

from routespec.conformance import oracle
from routespec.conformance.checks import covers, require, requires
from routespec.conformance.scenario import finished, names_field, refused_before_stream, shows
from routespec.conformance.test_response_reuse import (
    RELEASE,
    WAIT,
    accept,
    closing_bytes,
    first_stream,
    frame,
    handshake,
    listening,
    read_frame,
    read_to_sentinel,
    readable,
)
from routespec.conformance.test_response_reuse import request as reuse_request
from routespec.conformance.test_transport import (
    NO_COLON,
    NO_ENDPOINT,
    OTHER_HOST,
    PEER,
    request_message,
    serves_again,
    usable_control,
)
from routespec.testing.target import (
    Bidirectional,
    Capability,
    Crash,
    Direct,
    HeldConnection,
    Reject,
    Serve,
    Stall,
    Target,
    Trickle,
    WorkerBounds,
)

SENTINEL = b'"sentinel"'
UNAVAILABLE_ACK = "Server unavailable: "  # WorkerUnavailable at the caller (TRN-004)


def raw_request(path: str, port: int, subject: str, *, many_in: bool = False) -> bytes:
    """A usable request for ``path`` whose streams are at ``port`` on the check's host."""
    control = json.dumps(usable_control(f"{PEER}:{port}", subject, many_in=many_in)).encode()
    return request_message(path, control, b"" if many_in else b"{}")


def body_frame(body: bytes) -> bytes:
    return struct.pack(">QQQ", 0, len(body), 0) + body


def input_frame(item: object) -> bytes:
    """One input of a request stream as Dynamo 1.6.1 writes it: the item is the body."""
    return body_frame(json.dumps(item).encode())


END_FRAME = frame(SENTINEL)  # a request stream's end (TRN-047)
NOT_UTF8_PATH = b"\x00\x01\xff\x00\x02{}\x00\x00\x00\x00"  # a request whose path is 0xff


def frames_of(data: bytes) -> list[tuple[bytes, object]]:
    """The frames in ``data`` (whole ones only): each header, and its JSON body (None: none)."""
    found: list[tuple[bytes, object]] = []
    while len(data) >= 24:
        header_len, body_len, _ = struct.unpack(">QQQ", data[:24])
        end = 24 + header_len + body_len
        if len(data) < end:
            break
        header, body = data[24 : 24 + header_len], data[24 + header_len : end]
        found.append((header, json.loads(body) if body else None))
        data = data[end:]
    return found


def opened_stream(
    target: Target, worker: int, listener: socket.socket, subject: str, *, offer: bool = False
) -> socket.socket:
    """Send a request to ``worker``'s served path (offering reuse, TRN-028, if ``offer``);
    its accepted response stream, read past the handshake, the prologue and the first data
    item."""
    port = listener.getsockname()[1]
    target.send_raw(worker, reuse_request(target.worker_path(worker), port, subject, offer=offer))
    stream = accept(listener)
    if stream is None:
        pytest.fail(f"setup: worker {worker} never dialled back for {subject}")
    introduced = handshake(stream)
    if introduced.get("subject") != subject:
        pytest.fail(f"setup: the dial-back introduced {introduced}")
    prologue, _ = read_frame(stream)
    _, first = read_frame(stream)
    item = json.loads(first).get("data", {}).get("data") if first else None
    if json.loads(prologue) != {"error": None} or not isinstance(item, dict) or item["index"]:
        pytest.fail(f"setup: expected an ok prologue and item 0, got {prologue!r}, {first!r}")
    return stream


# --- TRN-017, TRN-035: the caller's kill, and the caller going away ---

ENDINGS = {
    "kill": lambda stream: stream.sendall(frame(b'"kill"')),
    "half-close": lambda stream: stream.shutdown(socket.SHUT_WR),
    "reuse-then-kill": None,  # a reuse before the sentinel releases nothing (TRN-028)
}


@covers("TRN-017", "TRN-028", "TRN-035")
@requires(
    Capability.RESPONSE_REUSE,
    Capability.WIRE_TRANSPORT,
    Capability.SCRIPT_STALL,
    Capability.MOCK_CLOCK,
)
@pytest.mark.parametrize("offer", [False, True], ids=["not-offered", "offered"])
@pytest.mark.parametrize("ending", list(ENDINGS))
def test_a_kill_ends_the_worker_stream_at_once(target: Target, ending: str, offer: bool) -> None:
    """The handler is stalled after its first item; the caller writes ``kill`` and keeps
    its end of the connection open, or shuts down its side (the caller went away). The
    worker ends the stream while its handler is still stalled: it closes the connection
    without writing anything more, at once, even where the caller had offered reuse (a
    stream cut short leaves no connection to release)."""
    worker = target.add_worker()
    target.script_worker(worker, Stall(items=1, items_after=3))
    with listening() as listener:
        stream = opened_stream(target, worker, listener, "told", offer=offer)
        with stream:
            end = ENDINGS[ending]
            if end is None:
                stream.sendall(frame(b'"reuse"'))
                target.advance_time(0.0)  # settled: the worker has read the reuse alone
                stream.sendall(frame(b'"kill"'))
            else:
                end(stream)
            late = closing_bytes(stream)
            require(
                "TRN-035",
                late == b"",
                f"after the caller's {ending} on a stalled stream"
                + (" it had offered for reuse" if offer else "")
                + f", worker {worker} should close the connection at once without writing "
                "anything more; "
                + (
                    "it kept it open"
                    if late is None
                    else f"it wrote {frames_of(late) or late[:120]!r}"
                ),
            )
    target.release_stalled(worker)
    serves_again(target, worker, "TRN-035")


UNREAD_ITEMS = 640  # each about 25 kB (the request id's length): 16 MB, far past what the
# socket buffers between the worker and a caller that reads nothing hold


@contextlib.contextmanager
def unread_stream(target: Target, worker: int) -> Iterator[socket.socket]:
    """Send ``worker`` a request whose items each carry its 25,000-character id; its
    response stream, accepted through a small receive buffer and not read at all."""
    with listening() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # inherited
        port = listener.getsockname()[1]
        target.send_raw(worker, raw_request(target.worker_path(worker), port, "u" * 25_000))
        stream = accept(listener)
        if stream is None:
            pytest.fail(f"setup: worker {worker} never dialled back")
        with stream:
            yield stream


@covers("TRN-035")
@requires(Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT)
@pytest.mark.parametrize("ending", ["kill", "half-close"])
def test_a_kill_ends_a_stream_whose_caller_reads_nothing(target: Target, ending: str) -> None:
    """The handler has 640 items ready (16 MB) and the caller reads none of them, through a
    small receive buffer, so the worker waits for the caller to read; then the caller writes
    ``kill``, or shuts down its side. The worker ends the stream there: the caller, reading
    at last, gets what was already on its way and then the connection's end, never the final
    frame or the sentinel."""
    worker = target.add_worker()
    target.script_worker(worker, Serve(UNREAD_ITEMS))
    with unread_stream(target, worker) as stream:
        end = ENDINGS[ending]
        assert end is not None
        end(stream)
        late = closing_bytes(stream)
    seen = frames_of(late or b"")
    items = sum(1 for _, body in seen if isinstance(body, dict) and "data" in body)
    require(
        "TRN-035",
        late is not None and (SENTINEL, None) not in seen and items < UNREAD_ITEMS,
        f"after the caller's {ending} on a stream it had read nothing of, worker {worker} "
        "should end the stream and close the connection without its final frame or sentinel",
        expected=f"fewer than {UNREAD_ITEMS} items, no sentinel, the connection closed",
        actual="still open"
        if late is None
        else f"{items} items, then {seen[-2:] if (SENTINEL, None) in seen else 'no sentinel'}",
    )
    serves_again(target, worker, "TRN-035")


OTHER_WORDS = {  # what the caller writes; whether the worker then writes the rest
    "unknown-word": (frame(b'"pause"'), True),
    "early-reuse": (frame(RELEASE), True),  # TRN-028: a release before the sentinel is none
    "body-only": (body_frame(b'"kill"'), True),
    "not-json": (frame(b"{kill"), False),
    "past-128-kib": (frame(b'"' + b"x" * (128 * 1024) + b'"'), False),
}


@covers("TRN-040", "TRN-028")
@requires(
    Capability.RESPONSE_REUSE,
    Capability.WIRE_TRANSPORT,
    Capability.SCRIPT_STALL,
    Capability.MOCK_CLOCK,
)
@pytest.mark.parametrize("word", list(OTHER_WORDS))
def test_a_frame_that_is_no_control_word_leaves_the_stream_alone(target: Target, word: str) -> None:
    """The handler is stalled after its first item; the caller writes a frame that is no
    control word, then the handler goes on. An unknown word or a body is ignored: items 1 to
    3, the final frame and the sentinel follow. A header that is not JSON ends the stream as
    a ``kill`` does: nothing more is written."""
    written, goes_on = OTHER_WORDS[word]
    worker = target.add_worker()
    target.script_worker(worker, Stall(items=1, items_after=3))
    with listening() as listener:
        stream = opened_stream(target, worker, listener, "other")
        with stream:
            stream.sendall(written)
            target.advance_time(0.0)  # settled: the worker has read it
            target.release_stalled(worker)
            late = closing_bytes(stream)
    seen = None if late is None else frames_of(late)
    rest = [
        (
            b"",
            {
                "data": {"data": {"worker": worker, "request": "other", "index": i}},
                "complete_final": False,
            },
        )
        for i in (1, 2, 3)
    ]
    expected = [*rest, (b"", {"complete_final": True}), (SENTINEL, None)] if goes_on else []
    require(
        "TRN-040",
        seen == expected,
        f"after the caller wrote {written[24:]!r} ({word}) on a stalled stream, worker {worker} "
        + ("should write the rest of the stream" if goes_on else "should write nothing more"),
        expected=expected,
        actual=seen if late is None or seen else late[:200],
    )
    target.release_stalled(worker)
    serves_again(target, worker, "TRN-040")


# --- TRN-022, TRN-027: a refusal at the ACK names the field ---

ADDRESS_FIELD = "connection_info.info.address"


def refused_naming(ack: str, field: str) -> bool:
    return ack.startswith(UNAVAILABLE_ACK) and field in ack


def require_answer_in_turn(
    target: Target, connection: int, count: int, host: str, refused: bool, why: str
) -> None:
    """Write the ``count``-th request on ``connection``, its response stream at ``host``
    (at an endpoint the worker does not serve, so that nothing is dialled): its ACK refuses
    it naming the address field if ``refused``, and does not otherwise, the connection
    kept open (TRN-027)."""
    control = json.dumps(usable_control(f"{host}:9", f"to-{count}")).encode()
    seen = target.write(connection, request_message(NO_ENDPOINT, control))
    ack = seen.acks[-1] if len(seen.acks) == count else None
    require(
        "TRN-027",
        not seen.closed and ack is not None and refused_naming(ack, ADDRESS_FIELD) == refused,
        f"{why}: request {count} from {PEER}, whose response stream is at {host}, should "
        + ("be refused" if refused else "not be refused"),
        expected=f"ACK {count}: "
        + (f"{UNAVAILABLE_ACK}… naming {ADDRESS_FIELD}" if refused else "no refusal")
        + ", the connection open",
        actual=f"ACKs {list(seen.acks)}, {'closed' if seen.closed else 'open'}",
    )


def refused_at_its_ack(requirement: str, seen: HeldConnection, why: str) -> None:
    """The one request written was refused at its ACK naming the response address; the
    connection stays open."""
    require(
        requirement,
        not seen.closed and len(seen.acks) == 1 and refused_naming(seen.acks[0], ADDRESS_FIELD),
        f"{why} should be refused at its ACK with {UNAVAILABLE_ACK}… naming {ADDRESS_FIELD}, "
        "the connection kept open",
        expected=f"one ACK {UNAVAILABLE_ACK}unusable request: {ADDRESS_FIELD}: …, open",
        actual=f"ACKs {list(seen.acks)}, {'closed' if seen.closed else 'open'}",
    )


@covers("TRN-022")
@requires(Capability.WORKER_LIMITS)
def test_a_request_without_a_usable_response_address_is_refused_at_its_ack(
    target: Target,
) -> None:
    """The refusal is an ACK ``Server unavailable: …`` naming the field, on a connection the
    worker keeps open; written together with the next request (so that the worker reads both
    at once), it still comes first, and the next request is answered after it."""
    worker = target.add_worker()
    connection = target.connect(worker)
    unusable = request_message(NO_ENDPOINT, NO_COLON.control(9, "alone"))
    seen = target.write(connection, unusable)
    refused_at_its_ack("TRN-022", seen, f"a request whose response address is {NO_COLON.value!r}")
    usable = request_message(NO_ENDPOINT, json.dumps(usable_control(f"{PEER}:9", "n")).encode())
    seen = target.write(connection, unusable + usable)
    require(
        "TRN-022",
        not seen.closed
        and len(seen.acks) == 3
        and refused_naming(seen.acks[1], ADDRESS_FIELD)
        and not refused_naming(seen.acks[2], ADDRESS_FIELD),
        "an unusable request written together with a usable one should be refused at its "
        "ACK, naming the field, and the next request answered after it",
        expected=f"ACKs 2 and 3: {UNAVAILABLE_ACK}… naming {ADDRESS_FIELD}, then another",
        actual=f"ACKs {list(seen.acks)}, {'closed' if seen.closed else 'open'}",
    )
    serves_again(target, worker, "TRN-022")


def raw_message(path: str, payload: bytes) -> bytes:
    """A request-plane message whose payload is ``payload`` as is."""
    encoded = path.encode()
    return (
        struct.pack(">H", len(encoded))
        + encoded
        + struct.pack(">H", 2)
        + b"{}"
        + struct.pack(">I", len(payload))
        + payload
    )


NOT_TWO_PART = {
    "shorter-than-its-prefix": b"\x00" * 10,
    "longer-than-it-declares": struct.pack(">QQQ", 2, 0, 0) + b"{}" + b"left over",
}


@covers("TRN-022")
@requires(Capability.WORKER_LIMITS)
@pytest.mark.parametrize("payload", list(NOT_TWO_PART))
def test_a_payload_that_is_no_two_part_message_is_refused_at_its_ack(
    target: Target, payload: str
) -> None:
    """A request whose payload is not one two-part message has no control message, so no
    address to fail it at: it is refused at its ACK naming ``two_part``, the connection kept
    open."""
    worker = target.add_worker()
    connection = target.connect(worker)
    seen = target.write(connection, raw_message(NO_ENDPOINT, NOT_TWO_PART[payload]))
    require(
        "TRN-022",
        not seen.closed and len(seen.acks) == 1 and refused_naming(seen.acks[0], "two_part"),
        f"a request whose payload is {payload} should be refused at its ACK with "
        f"{UNAVAILABLE_ACK}… naming two_part, the connection kept open",
        expected=f"one ACK {UNAVAILABLE_ACK}unusable request: two_part: …, open",
        actual=f"ACKs {list(seen.acks)}, {'closed' if seen.closed else 'open'}",
    )
    serves_again(target, worker, "TRN-022")


@covers("TRN-022")
@requires(Capability.WORKER_LIMITS)
def test_a_request_with_a_usable_address_and_an_unusable_field_is_acked(target: Target) -> None:
    """An unknown payload codec, but a response address the worker can dial: the request is
    ACKed with the empty ACK (it fails later, in its prologue), the connection kept open."""
    worker = target.add_worker()
    connection = target.connect(worker)
    control = {**usable_control(f"{PEER}:9", "codec"), "payload_codec": "cbor"}
    seen = target.write(connection, request_message(NO_ENDPOINT, json.dumps(control).encode()))
    require(
        "TRN-022",
        not seen.closed and list(seen.acks) == [""],
        "a request with an unknown payload_codec and a usable response address should be "
        "ACKed (empty ACK) and fail in its prologue, the connection kept open",
        expected="one empty ACK, open",
        actual=f"ACKs {list(seen.acks)}, {'closed' if seen.closed else 'open'}",
    )
    serves_again(target, worker, "TRN-022")


@covers("TRN-027")
@requires(Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT)
@pytest.mark.parametrize("many_in", [False, True], ids=["response-stream", "both-streams"])
def test_a_stream_address_named_by_a_host_name_is_resolved(target: Target, many_in: bool) -> None:
    """``localhost`` names the request's peer (127.0.0.1): the worker resolves it, dials
    back there — the response stream and, for a bidirectional request, its request stream
    too — and serves the request."""
    worker = target.add_worker()
    kind = "bidirectional request" if many_in else "request"
    with listening() as listener, contextlib.ExitStack() as streams:
        port = listener.getsockname()[1]
        control = usable_control(f"localhost:{port}", "named", many_in=many_in)
        body = b"" if many_in else b"{}"
        message = request_message(target.worker_path(worker), json.dumps(control).encode(), body)
        target.send_raw(worker, message)
        dialled: dict[object, socket.socket] = {}
        for _ in range(2 if many_in else 1):
            stream = accept(listener)
            require(
                "TRN-027",
                stream is not None,
                f"worker {worker} dialled back {sorted(map(str, dialled))} only for a {kind} "
                f"whose streams are at localhost:{port}, a name for its peer",
            )
            assert stream is not None
            dialled[handshake(streams.enter_context(stream)).get("stream_type")] = stream
        if "request" in dialled:
            dialled["request"].sendall(END_FRAME)  # no inputs: the handler may answer
        response = dialled.get("response")
        prologue = json.loads(read_frame(response)[0]) if response is not None else None
        require(
            "TRN-027",
            set(dialled) == ({"request", "response"} if many_in else {"response"})
            and prologue == {"error": None},
            f"worker {worker} should serve a {kind} whose streams are at localhost:{port}",
            expected="its streams dialled there, the response stream's prologue ok",
            actual=f"streams {sorted(map(str, dialled))}, prologue {prologue}",
        )


@covers("TRN-027")
@requires(Capability.WORKER_LIMITS)
def test_a_request_naming_another_host_is_refused_at_its_ack(target: Target) -> None:
    """A response address at another host than the request's peer is refused at the ACK,
    naming the field, and the connection goes on being served."""
    worker = target.add_worker()
    connection = target.connect(worker)
    elsewhere = usable_control(f"{OTHER_HOST}:9", "elsewhere")
    seen = target.write(connection, request_message(NO_ENDPOINT, json.dumps(elsewhere).encode()))
    refused_at_its_ack(
        "TRN-027", seen, f"a request whose response stream is at {OTHER_HOST} (not its peer {PEER})"
    )
    require(
        "TRN-027",
        OTHER_HOST in seen.acks[0] and PEER in seen.acks[0],
        f"the refusal should name the host it will not dial ({OTHER_HOST}) and the peer the "
        f"request came from ({PEER}); it says {seen.acks[0]!r}",
    )
    serves_again(target, worker, "TRN-027")


UNRESOLVED = "nosuch.invalid"  # RFC 6761: a name under .invalid never resolves


@covers("TRN-027")
@requires(
    Capability.WORKER_LIMITS,
    Capability.RESPONSE_REUSE,
    Capability.WIRE_TRANSPORT,
    Capability.MOCK_CLOCK,
)
def test_a_response_host_that_does_not_resolve_is_refused_at_its_ack(target: Target) -> None:
    """A response address at a name that does not resolve (``nosuch.invalid``) is refused
    at its ACK naming the field and the name; the request written behind it on the same
    connection, whose stream is at the check's listener, is then served: once its stream has
    come, the refusal has been sent (the name is resolved outside the target's run, so only
    the next stream tells the check that the answer is in)."""
    worker = target.add_worker()
    connection = target.connect(worker)
    with listening() as listener:
        port = listener.getsockname()[1]
        nowhere = usable_control(f"{UNRESOLVED}:{port}", "nowhere")
        after = raw_request(target.worker_path(worker), port, "after")
        target.write(connection, request_message(NO_ENDPOINT, json.dumps(nowhere).encode()) + after)
        stream = accept(listener)
        require(
            "TRN-027",
            stream is not None,
            f"worker {worker} never dialled back for the request written after one whose "
            f"response stream is at {UNRESOLVED}",
        )
        assert stream is not None
        with stream:
            introduced = handshake(stream)
        target.advance_time(0.0)  # settled: the ACKs sent are read
    seen = target.held(connection)
    require(
        "TRN-027",
        not seen.closed
        and len(seen.acks) == 2
        and refused_naming(seen.acks[0], ADDRESS_FIELD)
        and UNRESOLVED in seen.acks[0]
        and seen.acks[1] == ""
        and introduced.get("subject") == "after",
        f"a request whose response stream is at {UNRESOLVED} (a name that does not resolve) "
        f"should be refused at its ACK naming {ADDRESS_FIELD} and {UNRESOLVED}, and the "
        "request behind it served, the connection kept open",
        expected=f"ACKs [{UNAVAILABLE_ACK}… {ADDRESS_FIELD}: … {UNRESOLVED} …, ''], open, "
        "then the stream 'after'",
        actual=f"ACKs {list(seen.acks)}, {'closed' if seen.closed else 'open'}, "
        f"then the handshake {introduced}",
    )


SILENT_NAME = "silent.invalid"  # one the target's resolver never answers for (SCRIPT_NAMES)


@covers("TRN-027")
@requires(Capability.WORKER_LIMITS, Capability.SCRIPT_NAMES, Capability.MOCK_CLOCK)
def test_a_response_host_is_resolved_within_five_seconds(target: Target) -> None:
    """A response address at a name the worker's resolver never answers for: 4.9 s later
    the request is still unanswered; at 5 s it is refused at its ACK naming the field and
    the name, on a connection the worker keeps open."""
    worker = target.add_worker()
    target.resolve_name(SILENT_NAME, None)
    connection = target.connect(worker)
    control = json.dumps(usable_control(f"{SILENT_NAME}:9", "silent")).encode()
    target.write(connection, request_message(NO_ENDPOINT, control))
    target.advance_time(4.9)
    waiting = target.held(connection)
    target.advance_time(0.1)
    seen = target.held(connection)
    require(
        "TRN-027",
        not waiting.acks
        and not seen.closed
        and len(seen.acks) == 1
        and refused_naming(seen.acks[0], ADDRESS_FIELD)
        and SILENT_NAME in seen.acks[0],
        f"a request whose response stream is at {SILENT_NAME}, a name the resolver never "
        f"answers for, should wait 5 s, then be refused at its ACK naming {ADDRESS_FIELD} "
        f"and {SILENT_NAME}, the connection kept open",
        expected=f"no ACK at 4.9 s; at 5 s one ACK {UNAVAILABLE_ACK}… {ADDRESS_FIELD}: … "
        f"{SILENT_NAME} …, open",
        actual=f"ACKs at 4.9 s {list(waiting.acks)}, at 5 s {list(seen.acks)}, "
        f"{'closed' if seen.closed else 'open'}",
    )


MOVING_NAME = "moving.invalid"  # one the check makes resolve otherwise between requests


@covers("TRN-027")
@requires(Capability.WORKER_LIMITS, Capability.SCRIPT_NAMES)
def test_a_host_name_is_resolved_for_each_request(target: Target) -> None:
    """A name resolves to the request's peer (127.0.0.1), then to another host: the first
    request naming it is answered (here: no endpoint), the second, on the same connection,
    is refused at its ACK naming the field, as the worker resolves the name anew."""
    worker = target.add_worker()
    connection = target.connect(worker)
    for count, address in enumerate((PEER, OTHER_HOST), 1):
        target.resolve_name(MOVING_NAME, [address])
        why = f"{MOVING_NAME} now resolves to {address}"
        require_answer_in_turn(target, connection, count, MOVING_NAME, address != PEER, why)


# --- TRN-036, TRN-026: a bidirectional request's stream, broken by its caller ---

OVERLOADED_REASON = "capacity.worker_overloaded"  # WorkerOverloaded on the wire (TRN-032)
BUDGET = 4096  # a bounded worker's byte budget (TRN-026): far above any request here


def bidirectional(
    target: Target, worker: int, listener: socket.socket
) -> tuple[socket.socket, socket.socket]:
    """Send a bidirectional request to ``worker``'s served path; its request stream and its
    response stream (read past the handshake), as the worker dialled them."""
    port = listener.getsockname()[1]
    target.send_raw(worker, raw_request(target.worker_path(worker), port, "bidi", many_in=True))
    streams: dict[object, socket.socket] = {}
    for _ in range(2):
        stream = accept(listener)
        if stream is None:
            pytest.fail(f"setup: worker {worker} dialled back {sorted(map(str, streams))} only")
        streams[handshake(stream).get("stream_type")] = stream
    if set(streams) != {"request", "response"}:
        pytest.fail(f"setup: worker {worker} introduced streams {sorted(map(str, streams))}")
    return streams["request"], streams["response"]


def error_type_of(frames: list[tuple[bytes, object]]) -> object:
    """The type of the first error item among ``frames`` as Dynamo's wire writes it
    (TRN-032): its ``error_type``, or for ``ResourceExhausted`` the type its ``reason``
    names (``capacity.worker_overloaded``: ``WorkerOverloaded``); None: no error item."""
    for _, body in frames:
        data = body.get("data") if isinstance(body, dict) else None
        if isinstance(data, dict) and data.get("event") == "error":
            error = data.get("error")
            if not isinstance(error, dict):
                return error
            if error.get("reason") == OVERLOADED_REASON:
                return "WorkerOverloaded"
            return error.get("error_type")
    return None


def error_message_of(frames: list[tuple[bytes, object]]) -> str:
    """The message of the first error item among ``frames`` ("" if none)."""
    for _, body in frames:
        data = body.get("data") if isinstance(body, dict) else None
        if isinstance(data, dict) and data.get("event") == "error":
            error = data.get("error")
            message = error.get("message") if isinstance(error, dict) else None
            return message if isinstance(message, str) else ""
    return ""


BREAKS: dict[str, tuple[Callable[[socket.socket], None], str]] = {  # how the caller breaks
    # the request stream, and the type the request then fails with
    "closed": (lambda stream: stream.close(), "Disconnected"),
    "unreadable-frame": (
        lambda stream: stream.sendall(struct.pack(">QQQ", 1 << 40, 0, 0)),
        "Disconnected",
    ),
    "undecodable-item": (lambda stream: stream.sendall(body_frame(b"\xc1")), "InvalidArgument"),
    "over-budget": (
        lambda stream: stream.sendall(input_frame("x" * (4 * BUDGET))),
        "WorkerOverloaded",
    ),
    "header-over-budget": (  # its body is skipped once, unread, and nothing more is awaited
        lambda stream: stream.sendall(
            struct.pack(">QQQ", 4 * BUDGET, 4, 0) + b"x" * (4 * BUDGET) + b"abcd"
        ),
        "WorkerOverloaded",
    ),
}


@covers("TRN-036", "TRN-026")
@requires(Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT, Capability.WORKER_LIMITS)
@pytest.mark.parametrize("broken", list(BREAKS))
def test_a_broken_request_stream_fails_its_request_with_a_type(target: Target, broken: str) -> None:
    """The caller sends one input, then breaks its request stream (closes it before
    its sentinel, writes a frame declaring 1 TiB, an item that is not JSON, or one whose
    body or header is past the worker's byte budget): the response stream echoes the input,
    then ends with an error item of the type TRN-036 names."""
    worker = target.add_bounded_worker(WorkerBounds(max_buffered_bytes=BUDGET))
    breaking, expected = BREAKS[broken]
    requirement = "TRN-026" if broken.endswith("over-budget") else "TRN-036"
    with listening() as listener:
        inputs, response = bidirectional(target, worker, listener)
        with inputs, response:
            inputs.sendall(input_frame(0))
            breaking(inputs)
            rest = closing_bytes(response)
            frames = [] if rest is None else frames_of(rest)
            field = "request_stream.frame" if expected == "InvalidArgument" else None
            require(
                requirement,
                error_type_of(frames) == expected
                and (field is None or names_field(error_message_of(frames), field))
                and frames[-1][0] == SENTINEL,
                f"a bidirectional request whose request stream was broken ({broken}) should "
                f"end with an error item of type {expected}"
                + (f" naming {field}" if field else "")
                + ", then the final frame and sentinel",
                expected=f"an error item {expected!r}"
                + (f" naming {field}" if field else "")
                + ", closed",
                actual=f"frames {frames!r}" if rest is not None else "still open",
            )
    serves_again(target, worker, requirement)


REQUEST_STREAM_FRAMES = {  # what the caller writes after input 0, and the inputs read
    # an item shaped like a response-stream frame is an item like any other
    "framed-like-a-response": (
        input_frame({"data": 1, "complete_final": False}),
        [0, {"data": 1, "complete_final": False}],
    ),
    "complete-final": (input_frame({"complete_final": True}), [0, {"complete_final": True}]),
    "null": (body_frame(b"null"), [0, None]),
    "unknown-word": (frame(b'"pause"') + input_frame(2), [0, 2]),  # TRN-040: ignored
}


@covers("TRN-047", "TRN-020")
@requires(Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT)
@pytest.mark.parametrize("written", list(REQUEST_STREAM_FRAMES))
def test_each_request_stream_frame_is_one_input_until_the_sentinel(
    target: Target, written: str
) -> None:
    """A bidirectional request's caller writes input 0, then other frames, then the
    header-only sentinel: the worker's handler reads each frame's body as one input, as it
    is, and the request stream ends at the sentinel, so its stream completes."""
    after, inputs_read = REQUEST_STREAM_FRAMES[written]
    worker = target.add_worker()
    with listening() as listener:
        inputs, response = bidirectional(target, worker, listener)
        with inputs, response:
            inputs.sendall(input_frame(0) + after + END_FRAME)
            rest = closing_bytes(response)
    frames = [] if rest is None else frames_of(rest)
    echoed = [
        body["data"]["data"]["input"]
        for _, body in frames
        if isinstance(body, dict)
        and isinstance(body.get("data"), dict)
        and isinstance(body["data"].get("data"), dict)
        and "input" in body["data"]["data"]
    ]
    require(
        "TRN-047",
        echoed == inputs_read and bool(frames) and frames[-1][0] == SENTINEL,
        f"worker {worker}'s handler should read each request-stream frame's body as one "
        f"input ({written}), the stream ending at the caller's sentinel",
        expected=f"inputs {inputs_read}, then the final frame and sentinel",
        actual=f"inputs {echoed}, frames {frames[-2:]}" if rest is not None else "still open",
    )


@covers("TRN-045")
@requires(Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT)
def test_a_worker_writes_only_its_handshake_on_a_request_stream(target: Target) -> None:
    """A bidirectional request with one input, then the sentinel: the worker serves
    it on its response stream, and on the request stream it dialled it writes nothing after
    its handshake before closing it at the request's end."""
    worker = target.add_worker()
    with listening() as listener:
        inputs, response = bidirectional(target, worker, listener)
        with inputs, response:
            inputs.sendall(input_frame(0) + END_FRAME)
            rest = closing_bytes(response)
            written = closing_bytes(inputs)
    frames = [] if rest is None else frames_of(rest)
    require(
        "TRN-045",
        written == b"" and bool(frames) and frames[-1][0] == SENTINEL,
        f"worker {worker} served a bidirectional request to its sentinel: on the request "
        "stream it should have written its handshake only, then closed it",
        expected="nothing after the handshake, then the connection's end",
        actual="still open" if written is None else f"{written[:120]!r} after the handshake",
    )


@covers("TRN-026")
@requires(
    Capability.RESPONSE_REUSE,
    Capability.WIRE_TRANSPORT,
    Capability.WORKER_LIMITS,
    Capability.SCRIPT_STALL,
    Capability.MOCK_CLOCK,
)
def test_a_response_stream_frame_past_the_byte_budget_ends_the_stream(target: Target) -> None:
    """A worker whose byte budget is 4096 bytes has a stream open, its handler stalled
    after one item; the caller writes on it a frame of 96 KiB (an unknown word, within the
    control message's bound, so only the budget is at stake): the worker does not hold it,
    and ends the stream as a ``kill`` does, writing nothing more."""
    worker = target.add_bounded_worker(WorkerBounds(max_buffered_bytes=BUDGET))
    target.script_worker(worker, Stall(items=1, items_after=3))
    with listening() as listener:
        stream = opened_stream(target, worker, listener, "budget")
        with stream:
            stream.sendall(frame(b'"' + b"w" * (96 * 1024) + b'"'))
            target.advance_time(0.0)  # settled: the worker has read what it will
            target.release_stalled(worker)
            late = closing_bytes(stream)
    require(
        "TRN-026",
        late == b"",
        f"a 96 KiB frame on a stream of worker {worker}, whose byte budget is {BUDGET} "
        "bytes, should end the stream as a kill does: nothing more written, the connection "
        "closed; "
        + ("it kept it open" if late is None else f"it wrote {frames_of(late) or late[:120]!r}"),
    )
    target.release_stalled(worker)
    serves_again(target, worker, "TRN-026")


# --- TRN-022: the dial-back that fails a request in its prologue ---


PROLOGUE_FAILURES = {  # the field at fault: the control message's change, and the body
    "payload_codec": ({"payload_codec": "no-such-codec"}, b"{}"),
    "request.body": ({"payload_codec": "json"}, b"{not json"),
}


@covers("TRN-022")
@requires(Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT)
@pytest.mark.parametrize("field", list(PROLOGUE_FAILURES))
def test_a_prologue_failure_comes_on_a_response_stream(target: Target, field: str) -> None:
    """A request to the worker's own endpoint with an unknown payload codec, or a body its
    codec cannot decode: the worker dials back introducing a response stream (``{"subject",
    "stream_type": "response"}``, as for any stream) and fails the request in its prologue
    with ``InvalidArgument`` naming the field."""
    change, body = PROLOGUE_FAILURES[field]
    worker = target.add_worker()
    with listening() as listener:
        port = listener.getsockname()[1]
        control = usable_control(f"{PEER}:{port}", "codec") | change
        message = request_message(target.worker_path(worker), json.dumps(control).encode(), body)
        target.send_raw(worker, message)
        stream = accept(listener)
        require("TRN-022", stream is not None, f"worker {worker} never dialled back")
        assert stream is not None
        with stream:
            introduced = handshake(stream)
            prologue = json.loads(read_frame(stream)[0])
        typed = prologue.get("typed_error") if isinstance(prologue, dict) else None
        require(
            "TRN-022",
            introduced == {"subject": "codec", "stream_type": "response"}
            and isinstance(prologue.get("error"), str)
            and names_field(prologue["error"], field)
            and (typed is None or typed.get("error_type") == "InvalidArgument"),
            f"a request with an unusable {field} should be failed on a response stream "
            f"whose prologue is InvalidArgument naming {field}",
            expected='handshake {"subject": "codec", "stream_type": "response"}, then a '
            f"prologue InvalidArgument naming {field}",
            actual=f"handshake {introduced}, prologue {prologue}",
        )
    serves_again(target, worker, "TRN-022")


# --- TRN-027: the hosts a worker is configured to dial back to ---

DIAL_BACK_HOSTS = {  # configured as --dial-back-hosts takes them: (allowed, refused) hosts
    "peer": ((PEER,), (OTHER_HOST,)),
    "127.0.0.2": ((OTHER_HOST,), (PEER, "127.0.0.3")),
    "peer, 127.0.0.2": ((PEER, OTHER_HOST), ("127.0.0.3",)),
    "127.0.0.0/30": ((PEER, OTHER_HOST, "127.0.0.3"), ("127.0.0.4",)),
    "10.1.2.3/8": (("10.200.0.1",), (PEER, "11.0.0.1")),  # host bits set: the network 10/8
    # any: an IPv6 literal with a zone (RFC 4007) is an address too, whatever its interface
    "any": ((PEER, "10.1.2.3", "[2001:db8::1]", "[fe80::1%no-such-zone]"), ()),
}


@covers("TRN-027")
@requires(Capability.WORKER_LIMITS)
@pytest.mark.parametrize("hosts", list(DIAL_BACK_HOSTS))
def test_a_worker_dials_back_to_the_hosts_it_is_configured_for(target: Target, hosts: str) -> None:
    """A worker configured with ``hosts`` gets, from the peer 127.0.0.1, one request per
    host naming a response address there (at an endpoint it does not serve, so that nothing
    is dialled): a host it may not dial back to is refused at the ACK naming the field, any
    other is answered as for any request (here: no endpoint)."""
    worker = target.add_bounded_worker(WorkerBounds(dial_back_hosts=hosts))
    connection = target.connect(worker)
    allowed, refused = DIAL_BACK_HOSTS[hosts]
    for count, host in enumerate((*allowed, *refused), 1):
        why = f"a worker configured to dial back to {hosts!r}"
        require_answer_in_turn(target, connection, count, host, host in refused, why)
    if PEER in allowed:  # the router's streams are at its own address: the peer
        serves_again(target, worker, "TRN-027")


# --- TRN-023: a failure nobody expected is logged in one line naming the peer ---

WORKER_LOG = "routespec.worker"  # the logger of a target's workers (OBSERVE_WORKER_LOG)
CLEANUP_FAULT = "the handler's cleanup failed"


def worker_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the target's workers logged at WARNING or above, each line as written."""
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == WORKER_LOG and record.levelno >= logging.WARNING
    ]


@covers("TRN-023")
@requires(Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT, Capability.OBSERVE_WORKER_LOG)
def test_a_handler_failing_in_its_cleanup_is_logged_in_one_line(
    target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """The caller kills a stream it has read nothing of while the worker waits for it to
    read, and the handler's stream raises when the worker then closes it: nobody is left to
    tell, so the worker logs the failure in one line naming the peer and the failure, and
    goes on serving."""
    worker = target.add_worker()
    target.script_worker(worker, Serve(UNREAD_ITEMS, close_fault=CLEANUP_FAULT))
    caplog.set_level(logging.WARNING, logger=WORKER_LOG)
    with unread_stream(target, worker) as stream:
        stream.sendall(frame(b'"kill"'))
        closing_bytes(stream)
    serves_again(target, worker, "TRN-023")
    lines = worker_lines(caplog)
    require(
        "TRN-023",
        len(lines) == 1
        and "\n" not in lines[0]
        and PEER in lines[0]
        and f"RuntimeError: {CLEANUP_FAULT}" in lines[0],
        f"worker {worker}'s handler raised RuntimeError({CLEANUP_FAULT!r}) when the worker "
        "closed its killed stream: the worker should log that in one line naming the peer "
        f"({PEER}) and the failure",
        expected=f"one line naming {PEER} and RuntimeError: {CLEANUP_FAULT}",
        actual=lines,
    )


@covers("TRN-023")
@requires(
    Capability.RESPONSE_REUSE,
    Capability.WIRE_TRANSPORT,
    Capability.OBSERVE_WORKER_LOG,
    Capability.MOCK_CLOCK,
)
@pytest.mark.parametrize("released", [True, False], ids=["released", "not-released"])
def test_a_stream_that_ends_as_the_protocol_lets_it_logs_no_failure(
    target: Target, caplog: pytest.LogCaptureFixture, released: bool
) -> None:
    """A stream offered for reuse is read to its sentinel; its caller releases the
    connection, or does not and the worker closes it a second later (TRN-028). Nothing
    failed, so the worker logs no failure."""
    worker = target.add_worker()
    caplog.set_level(logging.WARNING, logger=WORKER_LOG)
    with listening() as listener:
        stream, _ = first_stream(target, worker, listener, offer=True)
        with stream:
            if released:
                stream.sendall(frame(RELEASE))
            target.advance_time(1.0)  # past any release's wait: the worker has decided
    lines = worker_lines(caplog)
    require(
        "TRN-023",
        not lines,
        f"worker {worker} served a stream whose caller "
        + ("released" if released else "did not release")
        + " its connection: nothing failed, so it should log no failure",
        expected="no line",
        actual=lines,
    )


ADMISSION_FAULT = "the handler's admission check failed"


@covers("TRN-023")
@requires(
    Capability.WORKER_LIMITS,
    Capability.RESPONSE_REUSE,
    Capability.SCRIPT_FAILURES,
    Capability.OBSERVE_WORKER_LOG,
)
def test_a_handler_failing_to_admit_a_request_refuses_it_at_its_ack(
    target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler's admission check raises for a request: the worker refuses it at its ACK
    with ``Server unavailable:`` naming the failure, keeps the connection open, logs one
    line naming the peer and the failure, and goes on serving."""
    worker = target.add_worker()
    target.script_worker(worker, Crash(0, (ADMISSION_FAULT,), at_admission=True))
    caplog.set_level(logging.WARNING, logger=WORKER_LOG)
    connection = target.connect(worker)
    seen = target.write(connection, raw_request(target.worker_path(worker), 9, "admitted"))
    require(
        "TRN-023",
        not seen.closed
        and len(seen.acks) == 1
        and seen.acks[0].startswith(UNAVAILABLE_ACK)
        and ADMISSION_FAULT in seen.acks[0],
        f"worker {worker}'s handler raised RuntimeError({ADMISSION_FAULT!r}) admitting a "
        "request: the worker should refuse it at its ACK naming the failure, the "
        "connection kept open",
        expected=f"one ACK {UNAVAILABLE_ACK}… {ADMISSION_FAULT} …, open",
        actual=f"ACKs {list(seen.acks)}, {'closed' if seen.closed else 'open'}",
    )
    lines = worker_lines(caplog)
    require(
        "TRN-023",
        len(lines) == 1 and PEER in lines[0] and f"RuntimeError: {ADMISSION_FAULT}" in lines[0],
        f"worker {worker} should log the failed admission in one line naming the peer "
        f"({PEER}) and the failure",
        expected=f"one line naming {PEER} and RuntimeError: {ADMISSION_FAULT}",
        actual=lines,
    )
    serves_again(target, worker, "TRN-023")


UNWRITABLE_REASON = "refused \udcff"  # a lone surrogate: no UTF-8 as it is


@covers("TRN-023")
@requires(
    Capability.WORKER_LIMITS,
    Capability.RESPONSE_REUSE,
    Capability.SCRIPT_REJECTION,
    Capability.OBSERVE_WORKER_LOG,
)
def test_a_rejection_the_worker_cannot_write_ends_at_most_its_connection(
    target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler refuses a request with a text holding a lone surrogate: the worker
    writes the refusal at its ACK, or fails to and closes that connection, logging one line
    naming the peer and the failure; another connection it holds is served meanwhile, and
    so is the next request."""
    worker = target.add_worker()
    target.script_worker(worker, Reject(overloaded=False, message=UNWRITABLE_REASON))
    caplog.set_level(logging.WARNING, logger=WORKER_LOG)
    other, connection = target.connect(worker), target.connect(worker)
    seen = target.write(connection, raw_request(target.worker_path(worker), 9, "unwritable"))
    lines = worker_lines(caplog)
    if seen.closed:
        require(
            "TRN-023",
            not seen.acks and len(lines) == 1 and PEER in lines[0] and "surrogate" in lines[0],
            f"worker {worker} closed the connection of a request its handler refused with "
            f"{UNWRITABLE_REASON!r}: it should log why in one line naming the peer ({PEER}) "
            "and the failure",
            expected=f"no ACK, one line naming {PEER} and the unencodable text",
            actual=f"ACKs {list(seen.acks)}, lines {lines}",
        )
    else:
        require(
            "TRN-023",
            len(seen.acks) == 1 and seen.acks[0].startswith(UNAVAILABLE_ACK) and not lines,
            f"worker {worker} kept the connection of a request its handler refused with "
            f"{UNWRITABLE_REASON!r}: it should have written the refusal, and logged nothing",
            expected=f"one ACK {UNAVAILABLE_ACK}…, no line",
            actual=f"ACKs {list(seen.acks)}, lines {lines}",
        )
    control = json.dumps(usable_control(f"{PEER}:9", "other")).encode()
    answered = target.write(other, request_message(NO_ENDPOINT, control))
    require(
        "TRN-023",
        not answered.closed and len(answered.acks) == 1,
        f"worker {worker} should go on serving its other connection",
        expected="one ACK there, open",
        actual=f"ACKs {list(answered.acks)}, {'closed' if answered.closed else 'open'}",
    )
    serves_again(target, worker, "TRN-023")


# --- TRN-003: a worker's ACKs, and nothing else, on the request plane ---


@covers("TRN-003")
@requires(Capability.WORKER_LIMITS, Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT)
def test_a_request_read_before_bad_bytes_gets_its_empty_ack(target: Target) -> None:
    """A request for the worker's served path and, in the same write, a message whose path
    is not UTF-8: the worker accepts the request with the empty ACK, writes nothing more on
    the connection and closes it for the bad bytes, and serves the request it accepted."""
    worker = target.add_worker()
    with listening() as listener:
        port = listener.getsockname()[1]
        connection = target.connect(worker)
        request = raw_request(target.worker_path(worker), port, "read-first")
        seen = target.write(connection, request + NOT_UTF8_PATH)
        stream = accept(listener)
        introduced = handshake(stream) if stream is not None else None
        if stream is not None:
            stream.close()
    require(
        "TRN-003",
        list(seen.acks) == [""] and seen.closed and not seen.trailing,
        f"worker {worker} read a request whole, then bytes that end the connection: it "
        "should accept the request with the empty ACK, write nothing else, and close",
        expected="ACKs [''], nothing after them, closed",
        actual=f"ACKs {list(seen.acks)}, then {seen.trailing!r}, "
        f"{'closed' if seen.closed else 'open'}",
    )
    require(
        "TRN-003",
        introduced is not None and introduced.get("subject") == "read-first",
        f"worker {worker} should serve the request it accepted: its response stream "
        f"handshake, got {introduced}",
    )
    serves_again(target, worker, "TRN-003")


# --- TRN-029: a stream the caller watched over is as reusable as any ---


@covers("TRN-029")
@requires(
    Capability.RESPONSE_REUSE,
    Capability.WIRE_TRANSPORT,
    Capability.SCRIPT_STALL,
    Capability.SCRIPT_TRICKLE,
    Capability.MOCK_CLOCK,
)
@pytest.mark.parametrize("waits", [1, 2])
def test_a_stream_that_waited_on_its_handler_leaves_a_reusable_connection(
    target: Target, waits: int
) -> None:
    """The first stream waits on its handler after its first item, once (stalled until
    released) or twice (a trickle, one item a second), so the worker watches the connection
    for the caller's control words meanwhile; then it ends, the caller releases the
    connection, and the next stream comes on it."""
    worker = target.add_worker()
    target.script_worker(worker, Stall(items=1, items_after=1) if waits == 1 else Trickle(3))
    path = target.worker_path(worker)
    with listening() as listener:
        port = listener.getsockname()[1]
        target.send_raw(worker, reuse_request(path, port, "waited", offer=True))
        stream = accept(listener)
        require("TRN-029", stream is not None, f"worker {worker} never dialled back")
        assert stream is not None
        with stream:
            introduced = handshake(stream)
            read_frame(stream)  # the prologue
            read_frame(stream)  # item 0: the handler now waits
            if waits == 1:
                target.release_stalled(worker)
            else:
                for _ in range(waits):
                    target.advance_time(1.0)
                    read_frame(stream)  # the next item
            read_to_sentinel(stream)
            stream.sendall(frame(RELEASE))
            target.script_worker(worker, Serve(1))
            target.send_raw(worker, reuse_request(path, port, "next", offer=True))
            second = handshake(stream) if readable(stream, WAIT) else None
            require(
                "TRN-029",
                introduced.get("reuse") is True
                and second is not None
                and second.get("subject") == "next",
                f"worker {worker} was offered reuse and the caller released the connection "
                f"after a stream that waited {waits} time(s) on its handler; the next stream "
                "should come on it",
                expected='the handshake {"subject": "next", …} on the released connection',
                actual=f"first handshake {introduced}, then on the connection: {second}",
            )
            read_to_sentinel(stream)


# --- TRN-001, DSP-010: a bidirectional request's metadata reaches its worker ---


@covers("TRN-001", "DSP-010", "TRN-020")
@requires(Capability.BIDIRECTIONAL, Capability.OBSERVE_PREPARED_TARGET)
@pytest.mark.parametrize("mode", ["round-robin", "random"])
def test_a_bidirectional_request_carries_its_metadata(target: Target, mode: str) -> None:
    """The worker a bidirectional request reaches reads the metadata its caller gave it:
    here the mark of the worker the request was prepared for (DSP-010), which the request's
    control message carries as for any request (TRN-001); its inputs come on its request
    stream only, so the request itself carries no payload (TRN-020)."""
    workers = [target.add_worker() for _ in range(2)]
    for _ in range(2):
        finished(target, target.submit(Bidirectional(mode, 2)), "TRN-001")
    deliveries = list(target.dispatch_log())
    require(
        "TRN-001",
        len(deliveries) == 2 and all(d.prepared_for is not None for d in deliveries),
        f"two bidirectional {mode} requests should each reach their worker with the "
        "metadata their caller gave them (the mark of the worker they were prepared for)",
        expected="two deliveries, each with its prepared_for mark",
        actual=repr(deliveries),
    )
    for delivery in deliveries:
        require(
            "DSP-010",
            delivery.worker_id in workers and delivery.prepared_for == delivery.worker_id,
            f"bidirectional {mode} request {delivery.request_id} reached worker "
            f"{delivery.worker_id} but was prepared for {delivery.prepared_for}",
        )
    payloads = [delivery.payload for delivery in deliveries]
    require(
        "TRN-020",
        payloads == [None, None],
        f"two bidirectional {mode} requests reached their workers with payloads {payloads}: "
        "a bidirectional request's inputs come on its request stream, not with the request",
    )


# --- TRN-037: a graceful shutdown ---

GRACE = 2.0


@covers("TRN-037")
@requires(
    Capability.DRAIN_WORKER, Capability.DIRECT, Capability.SCRIPT_STALL, Capability.MOCK_CLOCK
)
@pytest.mark.parametrize("in_time", [True, False], ids=["finishes-in-time", "outlives-grace"])
def test_a_draining_worker_refuses_new_requests_and_cuts_late_streams(
    target: Target, in_time: bool
) -> None:
    """One stream is open (its handler stalled after one item) when the worker starts a
    graceful shutdown: a new request is refused at its ACK; the open stream completes if
    its handler resumes within the grace period, else ends with Backend(EngineShutdown).
    With no stream left open, the worker stops: a request sent then cannot connect."""
    worker = target.add_worker()
    target.script_worker(worker, Stall(items=1, items_after=1))
    open_request = target.submit(Direct(worker))
    target.drain_worker(worker, GRACE)
    refused = finished(target, target.submit(Direct(worker)), "TRN-037")
    require(
        "TRN-037",
        refused_before_stream(refused, oracle.REJECTION_TYPES[False]),
        f"a request to worker {worker} after it began shutting down should be refused at its "
        f"ACK ({oracle.REJECTION_TYPES[False]}); got {refused}",
    )
    target.advance_time(GRACE - 0.5)
    if in_time:
        target.release_stalled(worker)
    else:
        target.advance_time(1.0)
    outcome = finished(target, open_request, "TRN-037")
    expected = "completes with both items" if in_time else "ends with Backend(EngineShutdown)"
    require(
        "TRN-037",
        (outcome.error is None and len(outcome.items) == 2)
        if in_time
        else (len(outcome.items) == 1 and shows(outcome.error, ("Backend(EngineShutdown)",))),
        f"the stream open when worker {worker} began shutting down with {GRACE} s of grace "
        f"{expected}; got {outcome}",
    )
    target.advance_time(0.0)  # settled: the shutdown has done what it will
    after = finished(target, target.submit(Direct(worker)), "TRN-037")
    require(
        "TRN-037",
        refused_before_stream(after, "CannotConnect"),
        f"worker {worker} had no stream left open after its graceful shutdown began, so it "
        "should have stopped: a request sent then should fail to connect (CannotConnect); "
        f"got {after}",
    )
