"""Transport (TRN) on Dynamo's wire, read byte for byte: what a worker writes on a response
stream, read by a raw caller (the check sends the request itself and accepts the worker's
dial-back on its own listener), and the bounds of what a caller writes.

These are the bytes a real Dynamo 1.6.1 client decodes (``dynamo-wire``): an error item in
any other shape reaches a Dynamo caller as a different error, or as none.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import time

import msgpack
import pytest

from routespec.conformance import oracle
from routespec.conformance.checks import covers, require, require_equal, requires
from routespec.conformance.scenario import finished, refused_before_stream, spec_of
from routespec.conformance.test_transport import (
    CONTROL_LIMIT,
    CUT_ACKS,
    CUT_FRAMES,
    PEER,
    _exactly,
    indices,
    request_message,
    serves_again,
    usable_control,
)
from routespec.conformance.test_worker_limits import (
    BUDGET,
    OVERLOADED_ACK,
    not_refused,
    sized_request,
)
from routespec.testing.target import (
    Capability,
    Direct,
    FailMidStream,
    ObservedError,
    Serve,
    Target,
    WorkerBounds,
    WriteErrorItem,
)

WAIT = 10.0  # real seconds a check waits for a worker's bytes
SENTINEL = b'"sentinel"'


def raw_request(target: Target, worker: int, port: int, subject: str) -> None:
    """A msgpack request (Dynamo's default codec) for the worker's served path, whose response
    stream is ``subject`` at ``port``."""
    control = usable_control(f"{PEER}:{port}", subject)
    control["payload_codec"] = "msgpack"
    body = msgpack.packb({"rid": subject}, use_bin_type=True)
    message = request_message(target.worker_path(worker), json.dumps(control).encode(), body)
    target.send_raw(worker, message)


def listening(receive_buffer: int | None = None) -> socket.socket:
    listener = socket.socket()
    if receive_buffer is not None:  # inherited by the accepted connections
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    listener.bind((PEER, 0))
    listener.listen(8)
    return listener


def accept(listener: socket.socket) -> socket.socket:
    listener.settimeout(WAIT)
    try:
        stream, _ = listener.accept()
    except TimeoutError:
        pytest.fail(f"setup: the worker did not dial back within {WAIT} s")
    stream.settimeout(WAIT)
    return stream


Frame = tuple[int, bytes, bytes]  # checksum, header, body


def frames_to_sentinel(stream: socket.socket, limit: int = 100_000) -> list[Frame]:
    """Every frame of a response stream up to and with its sentinel (handshake first)."""
    found: list[Frame] = []
    while len(found) < limit:
        prefix = _exactly(stream, 24)
        if prefix is None:
            raise EOFError(f"the stream closed after {len(found)} frames, before its sentinel")
        header_len, body_len, checksum = struct.unpack(">QQQ", prefix)
        if header_len + body_len > 64 << 20:
            raise ValueError(f"frame {len(found)} declares {header_len + body_len} bytes")
        data = _exactly(stream, header_len + body_len)
        if data is None:
            raise EOFError(f"the stream closed inside frame {len(found)}")
        found.append((checksum, data[:header_len], data[header_len:]))
        if data[:header_len] == SENTINEL:
            return found
    raise ValueError(f"no sentinel within {limit} frames")


def stream_of(target: Target, worker: int, subject: str) -> list[Frame]:
    with listening() as listener:
        raw_request(target, worker, listener.getsockname()[1], subject)
        with accept(listener) as stream:
            return frames_to_sentinel(stream)


def wire_type(label: str | None) -> object:
    """A type label as Dynamo writes it in ``error_type`` (spec: transport's compatibility
    notes): ``{"Backend": kind}``, the plain name, ``WorkerOverloaded`` as
    ``ResourceExhausted``, and ``null`` for an untyped link."""
    if label is None:
        return None
    if label.startswith("Backend("):
        return {"Backend": label.removeprefix("Backend(").removesuffix(")")}
    return "ResourceExhausted" if label == "WorkerOverloaded" else label


def expected_link(chain: tuple[str | None, ...], depth: int) -> dict[str, object]:
    """The wire link at ``depth`` of an error item whose links have the types ``chain``: the
    class and reason are those of the chain from that link on (ERR-003, ERR-004)."""
    label, message = chain[depth], f"link {depth}"
    error_class, reason = oracle.classify(chain[depth:])
    link: dict[str, object] = {
        "error_type": wire_type(label),
        "class": error_class,
        "reason": reason,
        "message": message,
    }
    if label in ("InvalidArgument", "Backend(InvalidArgument)"):
        link["public"] = {"type": "message", "message": message}
    return link


WIRE_CHAINS = [
    ("InvalidArgument", "Backend(EngineShutdown)"),
    ("Backend(InvalidArgument)",),
    ("WorkerOverloaded", None, "Backend(Cancelled)"),
    (None, "Unknown", "Backend(StreamIncomplete)"),
]


@covers("TRN-032")
@requires(Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("chain", WIRE_CHAINS, ids=lambda c: "-".join(map(str, c)))
def test_an_error_item_is_written_in_dynamos_shape(
    target: Target, chain: tuple[str | None, ...]
) -> None:
    """A worker fails mid-stream; its error item, read off the wire, has every link in
    Dynamo's shape, and every frame has checksum 0."""
    worker = target.add_worker()
    target.script_worker(worker, FailMidStream(1, spec_of(chain)))
    frames = stream_of(target, worker, "shape")
    require(
        "TRN-032",
        all(checksum == 0 for checksum, _, _ in frames),
        f"worker {worker} wrote frames with checksums {[c for c, _, _ in frames]}; "
        "every two-part checksum is 0, as Dynamo 1.6.1 writes it",
    )
    items = [msgpack.unpackb(body, raw=False) for _, header, body in frames if body]
    errors = [
        item["data"]["error"]
        for item in items
        if isinstance(item, dict)
        and isinstance(item.get("data"), dict)
        and item["data"].get("event") == "error"
    ]
    require_equal(
        "TRN-032", len(errors), 1, f"worker {worker} should write one error item, wrote {items}"
    )
    links: list[object] = []
    link: object = errors[0]
    while isinstance(link, dict) and len(links) <= len(chain):
        links.append({key: value for key, value in link.items() if key != "caused_by"})
        link = link.get("caused_by")
    expected = [expected_link(chain, depth) for depth in range(len(chain))]
    require(
        "TRN-032",
        links == expected,
        f"worker {worker}'s error item for the chain {chain} should carry, outermost first, "
        "the links as Dynamo writes them",
        expected=repr(expected),
        actual=repr(links),
    )


@covers("TRN-039")
@requires(Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT)
@pytest.mark.parametrize("items", [0, 3])
def test_a_response_stream_is_written_in_dynamos_frames(target: Target, items: int) -> None:
    """Read off the wire: the handshake, the accepting prologue, one body-only frame per
    item, the final frame and the sentinel, every checksum 0."""
    worker = target.add_worker()
    target.script_worker(worker, Serve(items))
    frames = stream_of(target, worker, "frames")
    headers = [json.loads(header) if header else None for _, header, _ in frames]
    bodies = [msgpack.unpackb(body, raw=False) if body else None for _, _, body in frames]
    data = [body["data"] if isinstance(body, dict) else None for body in bodies[2:-2]]
    shaped = (
        len(frames) == items + 4
        and all(checksum == 0 for checksum, _, _ in frames)
        and headers[0] == {"subject": "frames", "stream_type": "response"}
        and bodies[0] is None
        and headers[1] == {"error": None}
        and bodies[1] is None
        and all(header is None for header in headers[2:-1])
        and all(
            body == {"data": item, "complete_final": False}
            for body, item in zip(bodies[2:-2], data, strict=True)
        )
        and [item.get("data", {}).get("index") if isinstance(item, dict) else None for item in data]
        == list(range(items))
        and bodies[-2] == {"complete_final": True}
        and frames[-1][1:] == (SENTINEL, b"")
    )
    require(
        "TRN-039",
        shaped,
        f"worker {worker} served {items} items: its stream should be the handshake, "
        '{"error": null}, one {"data": {"data": item}, "complete_final": false} per item, '
        '{"complete_final": true} and the sentinel, every checksum 0',
        actual=repr(
            [
                (checksum, header, body)
                for (checksum, _, _), header, body in zip(frames, headers, bodies, strict=True)
            ]
        ),
    )


@covers("TRN-007")
@requires(Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT)
def test_a_slow_reader_gets_the_whole_stream(target: Target) -> None:
    """A caller that reads its response stream late, through a small receive buffer, still
    reads every frame whole: what the worker could not send at once is sent later, not
    dropped. The items are large (each carries the request id, here 25,000 characters), so
    the stream (4 MB) is far more than the socket buffers hold."""
    worker = target.add_worker()
    count = 160
    subject = "s" * 25_000
    target.script_worker(worker, Serve(count))
    with listening(receive_buffer=4096) as listener:
        raw_request(target, worker, listener.getsockname()[1], subject)
        with accept(listener) as stream:
            time.sleep(0.5)  # the worker meets a full socket
            try:
                frames = frames_to_sentinel(stream)
            except (EOFError, ValueError) as broken:
                frames, failure = [], str(broken)
            else:
                failure = ""
    items = [msgpack.unpackb(body, raw=False) for _, _, body in frames if body]
    data = [item["data"].get("data") for item in items if isinstance(item.get("data"), dict)]
    require(
        "TRN-007",
        not failure
        and [d.get("index") if isinstance(d, dict) else d for d in data] == list(range(count))
        and items[-1] == {"complete_final": True},
        f"a slow reader of worker {worker}'s {count}-item stream should read every item then "
        f"complete_final; "
        + (failure or f"it read {len(data)} items, then {items[-1:] or 'nothing'}"),
    )


@covers("TRN-002")
@requires(Capability.DIRECT)
def test_a_control_message_within_the_limit_is_sent(target: Target) -> None:
    """Metadata of many short entries whose compact JSON leaves the control message well
    within 128 KiB: the request is sent and served. (With a space after each ``:`` and ``,``
    the same message would be over the limit.)"""
    worker = target.add_worker()
    target.script_worker(worker, Serve(1))
    # '"k00000":"v",' is 13 bytes: 9,300 entries are 120,901 bytes, 139,501 if spaced
    metadata = {f"k{n:05d}": "v" for n in range(9_300)}
    size = len(json.dumps(metadata, separators=(",", ":")))
    assert size < CONTROL_LIMIT - 4096 < size + 2 * len(metadata), size
    request = target.submit(Direct(worker), metadata=metadata)
    outcome = finished(target, request, "TRN-002")
    require(
        "TRN-002",
        outcome.error is None and indices(outcome) == [0],
        f"a request whose metadata is {size} bytes of compact JSON (its control message "
        f"within {CONTROL_LIMIT} bytes) should be sent and served; got {outcome}",
    )


# An error item as Dynamo, or a newer runtime, may write it, and the links a caller reads from
# it (type label or None, message; None: the text is not checked), outermost first (TRN-034).
SHUTDOWN = {"error_type": {"Backend": "EngineShutdown"}, "class": "Unavailable"}
FOREIGN_ITEMS = {
    "diagnostic-only": (
        {**SHUTDOWN, "reason": "backend.engine_shutdown", "diagnostic": "engine gone"},
        (("Backend(EngineShutdown)", "engine gone"),),
    ),
    "no-message": (
        {**SHUTDOWN, "reason": "backend.engine_shutdown"},
        (("Backend(EngineShutdown)", None),),  # no message: its text is not checked
    ),
    "class-name-as-type": (
        {"error_type": "InvalidRequest", "class": "InvalidRequest", "reason": "request.too_long",
         "message": "m"},
        (("InvalidArgument", "m"),),
    ),
    "unknown-type-known-reason": (
        {"error_type": "EngineHalted", "class": "Unavailable",
         "reason": "backend.engine_shutdown", "message": "m"},
        (("Backend(EngineShutdown)", "m"),),
    ),
    "unknown-backend-kind": (
        {"error_type": {"Backend": "Exploded"}, "class": "Internal", "reason": "backend.exploded",
         "message": "outer", "caused_by": {"error_type": "CannotConnect", "message": "inner"}},
        ((None, "outer"), ("CannotConnect", "inner")),
    ),
    "invalid-reason": (
        {"error_type": "Cancelled", "class": "Cancelled", "reason": "Not A Reason!",
         "message": "m"},
        (("Cancelled", "m"),),
    ),
    "non-string-reason": (
        {"error_type": "Disconnected", "class": "Unavailable", "reason": 5, "message": "n"},
        (("Disconnected", "n"),),
    ),
    "unknown-type-list-reason": (
        {"error_type": "EngineHalted", "class": "Unavailable",
         "reason": ["backend.engine_shutdown"], "message": "u"},
        ((None, "u"),),
    ),
}  # fmt: skip


def read_as(seen: object, links: tuple[tuple[str | None, str | None], ...]) -> bool:
    """The caller read the links ``links``; a target that shows only the class and the text
    (``types_observed`` False: a Dynamo client) read their class and the outer message."""
    if not isinstance(seen, ObservedError) or seen.pre_stream:
        return False

    def same(found: tuple[str | None, str], wanted: tuple[str | None, str | None]) -> bool:
        return found[0] == wanted[0] and wanted[1] in (None, found[1])

    if seen.types_observed:
        return len(seen.links) == len(links) and all(map(same, seen.links, links))
    error_class, _ = oracle.classify([label for label, _ in links])
    return seen.error_class == error_class and same((None, seen.links[0][1]), (None, links[0][1]))


@covers("TRN-034")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
@pytest.mark.parametrize("name", list(FOREIGN_ITEMS))
def test_a_caller_reads_error_items_as_dynamo_writes_them(target: Target, name: str) -> None:
    shape, expected = FOREIGN_ITEMS[name]
    worker = target.add_worker()
    target.script_worker(worker, WriteErrorItem(1, json.dumps(shape)))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-034")
    require(
        "TRN-034",
        indices(outcome) == [0] and read_as(outcome.error, expected),
        f"worker {worker} wrote one item, then the error item {shape}; the caller should "
        f"read it as the links {expected} (where only classes are seen: class "
        f"{oracle.classify([label for label, _ in expected])[0]}, message "
        f"{expected[0][1]!r}); it saw {outcome}",
    )


@covers("TRN-034")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
@pytest.mark.parametrize("error", ["a bare string", None, [1, 2]], ids=["text", "null", "list"])
def test_an_error_that_is_not_an_object_is_one_untyped_link(target: Target, error: object) -> None:
    worker = target.add_worker()
    target.script_worker(worker, WriteErrorItem(1, json.dumps(error)))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-034")
    seen = outcome.error
    require(
        "TRN-034",
        indices(outcome) == [0]
        and seen is not None
        and not seen.pre_stream
        and (
            (len(seen.links) == 1 and seen.links[0][0] is None)
            if seen.types_observed
            else seen.error_class == oracle.UNCLASSIFIED[0]
        ),
        f"worker {worker} wrote one item, then an error item whose error is {error!r}; the "
        f"caller should see one untyped error item (class Internal) after the item, it saw "
        f"{outcome}",
    )


@covers("TRN-026")
@requires(Capability.WORKER_LIMITS)
def test_bytes_read_ahead_of_a_request_do_not_count_against_it(target: Target) -> None:
    """A request of exactly the worker's byte budget arrives in two writes, the second also
    carrying the whole next request: the first is read whole (the bytes of the next one,
    read with its end, are not its own), then the next one is read too."""
    worker = target.add_bounded_worker(WorkerBounds(max_buffered_bytes=BUDGET))
    connection = target.connect(worker)
    request, behind = sized_request(BUDGET), sized_request(512)
    target.write(connection, request[: BUDGET // 2])
    seen = target.write(connection, request[BUDGET // 2 :] + behind)
    what = f"a request of exactly the budget ({BUDGET} bytes), its end written with the next one"
    not_refused(seen, 2, "TRN-026", what)
    require(
        "TRN-026",
        not seen.acks[0].startswith(OVERLOADED_ACK),
        f"{what}: the worker should read it, not refuse it for load",
        expected="an ACK not refusing for load",
        actual=repr(seen.acks[0]),
    )


# --- TRN-041: how much of a part cut short came ---


def gives_numbers(text: str, numbers: tuple[int, ...]) -> bool:
    """``text`` gives each of ``numbers`` as a whole number, in that order."""
    pattern = ".*".join(rf"(?<!\d){number}(?!\d)" for number in numbers)
    return re.search(pattern, text) is not None


CUT_ACK_BYTES = {"ack.len": (2, 4), "ack": (23, 100)}  # the bytes that came, of those declared


@covers("TRN-041")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
@pytest.mark.parametrize("part", list(CUT_ACKS))
def test_an_ack_cut_short_says_how_much_of_it_came(target: Target, part: str) -> None:
    """The worker closes its connection 2 bytes into an ACK's 4-byte prefix, or 23 bytes into
    a text declared as 100: the request's ``Disconnected`` gives the bytes that came and
    those the part has."""
    worker = target.add_worker()
    target.script_worker(worker, CUT_ACKS[part])
    outcome = finished(target, target.submit(Direct(worker)), "TRN-041")
    came, declared = CUT_ACK_BYTES[part]
    message = outcome.error.links[0][1] if outcome.error is not None else ""
    require(
        "TRN-041",
        refused_before_stream(outcome, "Disconnected")
        and gives_numbers(message, CUT_ACK_BYTES[part]),
        f"the connection ended {came} bytes into the {declared} of the ACK's "
        f"{'prefix' if part == 'ack.len' else 'text'}: the Disconnected should say so",
        expected=f"Disconnected: … {part} … {came} … {declared} …",
        actual=str(outcome),
    )
    serves_again(target, worker, "TRN-041")


# the bytes that came of the part, if the check knows them (the header's and the body's are the
# frames written behind the cut one), and those its prefix declares
CUT_FRAME_BYTES = {"two_part": (10, 24), "two_part.header": (4096,), "two_part.body": (4096,)}


@covers("TRN-041")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS, Capability.MOCK_CLOCK)
@pytest.mark.parametrize("part", list(CUT_FRAMES))
def test_a_frame_cut_short_says_how_much_of_it_came(target: Target, part: str) -> None:
    """The worker's connection ends 10 bytes into a frame's 24-byte prefix, or inside a
    header or a body declared as 4 KiB: the error item that ends the stream gives the bytes
    the part declares (and, for the prefix, those of it that came)."""
    worker = target.add_worker()
    target.script_worker(worker, CUT_FRAMES[part])
    request = target.submit(Direct(worker))
    target.advance_time(2.0)  # the worker closes a second after its sentinel (TRN-028)
    outcome = finished(target, request, "TRN-041")
    message = outcome.error.links[0][1] if outcome.error is not None else ""
    require(
        "TRN-041",
        outcome.error is not None and gives_numbers(message, CUT_FRAME_BYTES[part]),
        f"the connection ended inside a frame's {part}: the error item should give "
        f"{' of '.join(map(str, CUT_FRAME_BYTES[part]))} bytes",
        expected=f"an error item: … {part} … {' … '.join(map(str, CUT_FRAME_BYTES[part]))} …",
        actual=str(outcome),
    )
