"""How a worker reads its request plane: each message — ``u16`` path length, path, ``u16``
headers length, headers, ``u32`` payload length, payload (spec: "The wire in one page") —
read whole however the peer's writes cut it or join it to others, at every bound of its
lengths (TRN-049); what the worker's refusals say of a payload it cannot read (TRN-022,
TRN-050) and of a request past its byte budget (TRN-026); the budget left by what it served.

The checks hold raw request-plane connections open to a worker (Capability.WORKER_LIMITS)
and write requests for paths it does not serve, so that each request it reads is answered at
once with an ACK naming its path; a request it misreads is answered otherwise, or throws the
connection out of step, so that the next one is.
"""

from __future__ import annotations

import json
import logging
import socket
import struct

import pytest

from routespec.conformance.checks import covers, require, requires
from routespec.conformance.scenario import names_field
from routespec.conformance.test_response_reuse import listening
from routespec.conformance.test_transport import (
    NO_ENDPOINT,
    PEER,
    dialled_back,
    request_message,
    serves_again,
    usable_control,
)
from routespec.conformance.test_wire import gives_numbers
from routespec.conformance.test_worker_limits import (
    BUDGET,
    IDLE,
    MAX_MESSAGE_BYTES,
    OVERLOADED_ACK,
    declared_prefix,
    not_refused,
    refused_overloaded,
    sized_request,
)
from routespec.conformance.test_worker_server import (
    NOT_UTF8_PATH,
    SILENT_NAME,
    UNAVAILABLE_ACK,
    WORKER_LOG,
    worker_lines,
)
from routespec.testing.target import (
    Capability,
    HeldConnection,
    Serve,
    Target,
    WorkerBounds,
)

CONTROL = json.dumps(usable_control(f"{PEER}:9", "plane")).encode()  # never dialled
BODY = json.dumps({"pad": "x" * 1000}).encode()  # a request of some length: a 1 KiB body
UNUSABLE = "unusable request: "  # a refusal of the request's bytes (TRN-022), not its path
SHOWN_PATH = 1024  # a longer path is checked by its start: the ACK is bounded (TRN-038)


def refuses_unknown_path(ack: str, path: str) -> bool:
    """The answer to a request for a path the worker does not serve: ``Server unavailable:``
    naming the path last (the reference's "no endpoint at P", Dynamo's "unknown endpoint P"),
    not a refusal of the request's bytes."""
    if not ack.startswith(UNAVAILABLE_ACK) or UNUSABLE in ack:
        return False
    if len(path) > SHOWN_PATH:
        return f" {path[:SHOWN_PATH]}" in ack
    return ack.endswith(f" {path}")


def answered_in_turn(
    seen: HeldConnection, count: int, path: str, what: str, *, of: int | None = None
) -> None:
    """Request ``count`` of the connection, for ``path``, was read and answered in turn,
    and ``of`` requests (``count`` unless given) in all so far."""
    of = count if of is None else of
    ack = seen.acks[count - 1] if len(seen.acks) == of else None
    require(
        "TRN-049",
        not seen.closed and ack is not None and refuses_unknown_path(ack, path),
        f"{what}: the worker should read request {count} whole and answer it, naming its "
        f"path {path[:60]!r}, and keep the connection",
        expected=f"ACK {count} of {of}: {UNAVAILABLE_ACK}… {path[:60]}, the connection open",
        actual=f"{len(seen.acks)} ACKs, the last {seen.acks[-1:]!r}, "
        + ("closed" if seen.closed else "open"),
    )


def waiting(seen: HeldConnection, count: int, what: str) -> None:
    """Request ``count`` is part-written: not answered yet, its connection open."""
    require(
        "TRN-049",
        not seen.closed and len(seen.acks) == count - 1,
        f"{what}: the worker should wait for the rest of request {count}",
        expected=f"{count - 1} ACKs, the connection open",
        actual=f"ACKs {list(seen.acks)}, {'closed' if seen.closed else 'open'}",
    )


def numbered(count: int) -> str:
    """A path of the same length for every request, naming its turn."""
    return f"{NO_ENDPOINT}/{count:04d}"


def framed(path: str, headers: bytes, payload: bytes) -> bytes:
    """A request-plane message of these parts, as they are."""
    encoded = path.encode()
    lengths = struct.pack(">H", len(encoded)), struct.pack(">H", len(headers))
    return lengths[0] + encoded + lengths[1] + headers + struct.pack(">I", len(payload)) + payload


# the bytes before a payload: its lengths, path and headers
ENVELOPE = len(framed(numbered(0), b"{}", b""))


@covers("TRN-049")
@requires(Capability.WORKER_LIMITS)
def test_a_request_cut_anywhere_is_read_whole_once_it_is_all_there(target: Target) -> None:
    """Request n is written in two parts, cut after its n-th byte — each byte of the
    envelope (lengths, path, headers) and of the payload's two-part prefix, then every 64th
    byte: the worker answers nothing while the request is part-written, and answers it once
    it is whole, on the same connection throughout."""
    worker = target.add_worker()
    connection = target.connect(worker)
    length = len(request_message(numbered(0), CONTROL, BODY))
    cuts = [*range(1, ENVELOPE + 25), *range(ENVELOPE + 25, length, 64), length - 1]
    for count, cut in enumerate(cuts, 1):
        data = request_message(numbered(count), CONTROL, BODY)
        what = f"a request of {length} bytes cut after byte {cut}"
        waiting(target.write(connection, data[:cut]), count, what)
        answered_in_turn(target.write(connection, data[cut:]), count, numbered(count), what)


@covers("TRN-049")
@requires(Capability.WORKER_LIMITS)
def test_a_request_written_byte_by_byte_is_read_whole(target: Target) -> None:
    """Every byte in a write of its own: the worker answers the request after its last
    byte, and the next request, written whole, after it."""
    worker = target.add_worker()
    connection = target.connect(worker)
    data = request_message(numbered(1), CONTROL)
    for at in range(len(data) - 1):
        seen = target.write(connection, data[at : at + 1])
        if seen.closed or seen.acks:
            waiting(seen, 1, f"a request written byte by byte, {at + 1} of {len(data)} so far")
    what = f"a request of {len(data)} bytes written byte by byte"
    answered_in_turn(target.write(connection, data[-1:]), 1, numbered(1), what)
    again = request_message(numbered(2), CONTROL)
    answered_in_turn(target.write(connection, again), 2, numbered(2), "the next, whole")


@covers("TRN-049")
@requires(Capability.WORKER_LIMITS)
def test_requests_written_together_are_answered_in_turn(target: Target) -> None:
    """Three requests and the first half of a fourth in one write: the three are answered
    in turn, the fourth once its second half comes."""
    worker = target.add_worker()
    connection = target.connect(worker)
    requests = [request_message(numbered(n), CONTROL, BODY) for n in range(1, 5)]
    half = len(requests[3]) // 2
    seen = target.write(connection, b"".join(requests[:3]) + requests[3][:half])
    for count in range(1, 4):
        answered_in_turn(seen, count, numbered(count), "three requests written together", of=3)
    waiting(seen, 4, "the fourth request, half written with the three")
    answered_in_turn(
        target.write(connection, requests[3][half:]), 4, numbered(4), "its second half"
    )


U16_MAX = 0xFFFF
PATHS = {"empty": "", "one-byte": "p", "65535-bytes": "p" * U16_MAX}
HEADERS = {  # a JSON object of strings, or nothing at all
    "none": b"",
    "an-empty-object": b"{}",
    "three-bytes": b"{ }",
    "65535-bytes": b'{"k":"' + b"v" * (U16_MAX - 8) + b'"}',
}


@covers("TRN-049")
@requires(Capability.WORKER_LIMITS)
def test_paths_and_headers_are_read_at_every_length(target: Target) -> None:
    """A path of 0, 1 and 65,535 bytes, each with headers of 0, 2, 3 and 65,535 bytes, one
    request after the other on one connection: each is read whole and answered naming its
    path (a 65,535-byte one by its start)."""
    worker = target.add_worker()
    connection = target.connect(worker)
    count = 0
    for path_name, path in PATHS.items():
        for headers_name, headers in HEADERS.items():
            count += 1
            data = request_message(path, CONTROL, BODY, headers)
            what = f"a request with a path of {path_name} and headers of {headers_name}"
            answered_in_turn(target.write(connection, data), count, path, what)


@covers("TRN-049", "TRN-012")
@requires(Capability.WORKER_LIMITS, Capability.DIRECT)
def test_a_request_of_32_mib_is_read_and_a_byte_more_ends_its_connection(
    target: Target,
) -> None:
    """A request-plane message of exactly 32 MiB in all (lengths, path, headers and payload)
    is read and answered; one whose lengths declare a byte more ends its connection at once,
    before its payload comes, and the worker serves the next request."""
    worker = target.add_worker()
    connection = target.connect(worker)
    seen = target.write(connection, sized_request(MAX_MESSAGE_BYTES))
    not_refused(seen, 1, "TRN-049", f"a request of exactly {MAX_MESSAGE_BYTES} bytes")
    envelope = len(declared_prefix(0, 0))
    over = target.connect(worker)
    seen = target.write(over, declared_prefix(MAX_MESSAGE_BYTES + 1 - envelope, 0))
    require(
        "TRN-049",
        seen.closed and "" not in seen.acks,
        f"a request whose lengths declare {MAX_MESSAGE_BYTES + 1} bytes in all should end "
        "its connection, unaccepted, without waiting for its payload",
        expected="no empty ACK, the connection closed",
        actual=f"ACKs {list(seen.acks)}, {'closed' if seen.closed else 'open'}",
    )
    serves_again(target, worker, "TRN-012")


# --- what the refusals say ---

PREFIX = struct.Struct(">QQQ")  # a two-part message's header and body lengths, checksum
NOT_TWO_PART = {  # the payload, the field its refusal names, the numbers it gives, in order
    "shorter-than-its-prefix": (b"\x00" * 10, "two_part", (10,)),
    "longer-than-it-declares": (PREFIX.pack(2, 0, 0) + b"{}left over", "two_part", (26, 35)),
    "a-header-past-32-mib": (
        PREFIX.pack(MAX_MESSAGE_BYTES + 1, 0, 0),
        "two_part.header_len",
        (MAX_MESSAGE_BYTES + 1, MAX_MESSAGE_BYTES),
    ),
    "a-body-past-what-the-header-leaves": (
        PREFIX.pack(2, MAX_MESSAGE_BYTES - 1, 0) + b"{}",
        "two_part.body_len",
        (MAX_MESSAGE_BYTES - 1, MAX_MESSAGE_BYTES - 2),
    ),
    "a-prefix-declaring-nothing": (PREFIX.pack(0, 0, 0), "control_message", ()),
}


@covers("TRN-022", "TRN-050")
@requires(Capability.WORKER_LIMITS)
def test_a_payload_that_is_no_two_part_message_is_refused_with_its_numbers(
    target: Target,
) -> None:
    """Each payload is refused at its ACK as ``Server unavailable: unusable request:
    <field>: …``, the field the one at fault (a 24-byte prefix declaring an empty header is
    a two-part message, whose control message is not JSON), with the numbers that do not
    fit: the bytes it holds (and those it declares), or the length declared and its limit."""
    worker = target.add_worker()
    connection = target.connect(worker)
    for count, (name, (payload, field, numbers)) in enumerate(NOT_TWO_PART.items(), 1):
        seen = target.write(connection, framed(NO_ENDPOINT, b"{}", payload))
        ack = seen.acks[-1] if len(seen.acks) == count else ""
        refusal = f"{UNAVAILABLE_ACK}{UNUSABLE}{field}: "
        require(
            "TRN-022",
            not seen.closed and ack.startswith(refusal),
            f"a request whose payload is {name} should be refused at its ACK naming {field}, "
            "the connection kept open",
            expected=f"ACK {count}: {refusal}…, open",
            actual=f"ACKs {list(seen.acks)}, {'closed' if seen.closed else 'open'}",
        )
        require(
            "TRN-050",
            gives_numbers(ack, numbers),
            f"the refusal of a payload {name} should give the numbers {numbers}, in order",
            expected=f"{refusal}… {' … '.join(map(str, numbers))}",
            actual=repr(ack),
        )


@covers("TRN-026")
@requires(Capability.WORKER_LIMITS)
def test_a_refusal_for_load_names_the_requests_size_and_the_budget(target: Target) -> None:
    """A request one byte past the budget, in one write or written in two (its envelope
    first): ``Server overloaded: …`` gives its size in bytes, all of it, and the budget."""
    worker = target.add_bounded_worker(WorkerBounds(max_buffered_bytes=BUDGET))
    connection = target.connect(worker)
    over = sized_request(BUDGET + 1)
    for count, writes in enumerate(([over], [over[:64], over[64:]]), 1):
        for data in writes:
            seen = target.write(connection, data)
        refused_overloaded(seen, count, "TRN-026", f"a request of {BUDGET + 1} bytes")
        require(
            "TRN-026",
            gives_numbers(seen.acks[-1], (BUDGET + 1, BUDGET)),
            f"the refusal of a request of {BUDGET + 1} bytes for load should give its size "
            f"and the budget, {BUDGET} bytes",
            expected=f"{OVERLOADED_ACK}… {BUDGET + 1} … {BUDGET} …",
            actual=repr(seen.acks[-1]),
        )


# what another connection leaves of the budget, and a request that does not fit in it: one
# of 512 bytes, or one whose path or headers alone do not, its other parts fitting once the
# part refused is dropped
PAST_THE_BUDGET = {
    **{f"512-bytes-{spare}-left": (spare, sized_request(512)) for spare in range(1, 9)},
    "only-its-path": (16, framed("p" * 24, b"{}", b"x")),
    "only-its-headers": (16, framed("p", b'{"k":"' + b"v" * 16 + b'"}', b"x")),
}


@covers("TRN-026")
@requires(Capability.WORKER_LIMITS)
def test_a_request_refused_for_load_leaves_its_connection_in_step(target: Target) -> None:
    """Another connection holds all but a few bytes of the budget (a request cut short): a
    request that does not fit is refused for load and dropped whole, its length prefixes
    with it, even where only one part did not fit, so that once the held bytes are gone its
    connection's next request is read and answered."""
    worker = target.add_bounded_worker(WorkerBounds(max_buffered_bytes=BUDGET))
    held = sized_request(BUDGET)
    for name, (spare, request) in PAST_THE_BUDGET.items():
        holder, other = target.connect(worker), target.connect(worker)
        target.write(holder, held[: BUDGET - spare])
        what = f"a request ({name}) with {BUDGET - spare} bytes held on another connection"
        refused_overloaded(target.write(other, request), 1, "TRN-026", what)
        not_refused(target.write(holder, held[BUDGET - spare :]), 1, "TRN-026", "the held one")
        seen = target.write(other, sized_request(512))
        not_refused(seen, 2, "TRN-026", f"the next request after {what}")
        target.disconnect(holder)
        target.disconnect(other)


@covers("TRN-026")
@requires(Capability.WORKER_LIMITS, Capability.DIRECT)
def test_streams_served_leave_the_byte_budget_as_it_was(target: Target) -> None:
    """A worker that served three streams (their connections bounded by the same budget)
    still reads a request of exactly its budget and refuses one a byte longer."""
    worker = target.add_bounded_worker(WorkerBounds(max_buffered_bytes=BUDGET))
    target.script_worker(worker, Serve(2))
    for _ in range(3):
        serves_again(target, worker, "TRN-026")
    connection = target.connect(worker)
    not_refused(target.write(connection, sized_request(BUDGET)), 1, "TRN-026", "at the budget")
    seen = target.write(connection, sized_request(BUDGET + 1))
    refused_overloaded(seen, 2, "TRN-026", "a byte past the budget, after three streams")


# --- dialling ---

MAPPED_PEER = f"[::ffff:{PEER}]"  # the peer's IPv4 address in its IPv6 form


def ipv6_sockets() -> bool:
    try:
        socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()
    except OSError:
        return False
    return True


@covers("TRN-027")
@requires(Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT)
def test_a_response_address_in_ipv6_form_is_dialled(target: Target) -> None:
    """The response address names the request's peer as an IPv4-mapped IPv6 literal,
    ``[::ffff:127.0.0.1]:PORT``: that is the peer, so the worker dials it there and serves
    the request (on a host without IPv6 sockets there is nothing to check)."""
    if not ipv6_sockets():
        return
    worker = target.add_worker()
    with listening() as listener:
        address = f"{MAPPED_PEER}:{listener.getsockname()[1]}"
        control = json.dumps(usable_control(address, "mapped")).encode()
        target.send_raw(worker, request_message(target.worker_path(worker), control))
        earlier, prologue = dialled_back(listener, "mapped")
    require(
        "TRN-027",
        prologue == {"error": None} and not earlier,
        f"worker {worker} should dial {address} back and serve the request there",
        expected='the stream "mapped", its prologue {"error": null}',
        actual=f"prologue {prologue!r}, other streams' handshakes {earlier!r}",
    )


# --- the idle timeout, while the worker is on a request ---


@covers("TRN-025")
@requires(Capability.WORKER_LIMITS, Capability.SCRIPT_NAMES, Capability.MOCK_CLOCK)
def test_the_idle_timeout_runs_while_the_worker_is_on_a_request(target: Target) -> None:
    """The idle timeout counts from the last byte that came, not from the worker's last
    read: a request whose response host the worker is still resolving when no byte has come
    for the timeout (4 s) has its connection closed then, unanswered."""
    worker = target.add_bounded_worker(WorkerBounds(idle_timeout=IDLE))
    target.resolve_name(SILENT_NAME, None)
    connection = target.connect(worker)
    control = json.dumps(usable_control(f"{SILENT_NAME}:9", "silent")).encode()
    target.write(connection, request_message(NO_ENDPOINT, control))
    target.advance_time(IDLE - 0.5)
    before = target.held(connection)
    target.advance_time(0.5)
    seen = target.held(connection)
    require(
        "TRN-025",
        not before.closed and seen.closed and not seen.acks,
        f"no byte came for {IDLE:g} s after a request whose host the worker was still "
        "resolving: it should close the connection then, not before",
        expected=f"open at {IDLE - 0.5:g} s; closed at {IDLE:g} s, no ACK",
        actual=f"{'closed' if before.closed else 'open'} at {IDLE - 0.5:g} s; "
        f"{'closed' if seen.closed else 'open'} at {IDLE:g} s, ACKs {list(seen.acks)}",
    )


RESOLVING = 5.0  # TRN-027: how long a worker tries a response host that never resolves
BUSY_IDLE = RESOLVING + 1  # an idle timeout the worker's first request does not use up


@covers("TRN-025")
@requires(Capability.WORKER_LIMITS, Capability.SCRIPT_NAMES, Capability.MOCK_CLOCK)
def test_bytes_that_came_while_the_worker_was_busy_restart_the_idle_timeout(
    target: Target,
) -> None:
    """A second request arrives 4 s into the 5 s the worker spends resolving the first one's
    host: bytes came then, so the connection must still be open when the idle timeout
    (6 s) has not passed since them, though it has since the worker's last wait for bytes;
    once the worker is done with both and nothing more came, it closes."""
    worker = target.add_bounded_worker(WorkerBounds(idle_timeout=BUSY_IDLE))
    target.resolve_name(SILENT_NAME, None)
    connection = target.connect(worker)
    control = json.dumps(usable_control(f"{SILENT_NAME}:9", "silent")).encode()
    target.write(connection, request_message(NO_ENDPOINT, control))
    target.advance_time(4.0)
    target.write(connection, request_message(NO_ENDPOINT, control))
    target.advance_time(RESOLVING - 4.0)  # the first request's host gives up, in its turn
    target.advance_time(BUSY_IDLE - 1.5)
    busy = target.held(connection)
    target.advance_time(RESOLVING + 2.0)
    done = target.held(connection)
    require(
        "TRN-025",
        not busy.closed and done.closed,
        f"a request's bytes came at 4 s, while worker {worker} was still resolving the first "
        f"request's host: no {BUSY_IDLE:g} s passed without a byte until "
        f"{4 + BUSY_IDLE:g} s, so it should be open at {3.5 + BUSY_IDLE:g} s, and closed "
        "once both requests were answered and nothing more came",
        expected=f"open at {3.5 + BUSY_IDLE:g} s; closed at {5.5 + BUSY_IDLE + RESOLVING:g} s",
        actual=f"{'closed' if busy.closed else 'open'} at {3.5 + BUSY_IDLE:g} s; "
        f"{'closed' if done.closed else 'open'} at {5.5 + BUSY_IDLE + RESOLVING:g} s; "
        f"ACKs {list(done.acks)}",
    )


# --- TRN-057: what the worker logs when bad bytes end a connection ---

_WHOLE = request_message(NO_ENDPOINT, CONTROL, BODY)
_PATH, _HEADERS = len(NO_ENDPOINT.encode()), len(b"{}")
ENDINGS = {  # the bytes a connection ends on, whether the peer then closes it, the field
    "inside-the-path-length": (_WHOLE[:1], True, "request.path_len"),
    "inside-the-path": (_WHOLE[: 2 + 1], True, "request.path"),
    "inside-the-headers-length": (_WHOLE[: 2 + _PATH + 1], True, "request.headers_len"),
    "inside-the-headers": (_WHOLE[: 2 + _PATH + 2 + 1], True, "request.headers"),
    "inside-the-payload-length": (
        _WHOLE[: 2 + _PATH + 2 + _HEADERS + 3],
        True,
        "request.payload_len",
    ),
    "inside-the-payload": (_WHOLE[:-1], True, "request.payload"),
    "a-payload-past-32-mib": (
        declared_prefix(MAX_MESSAGE_BYTES + 1 - len(declared_prefix(0, 0)), 0),
        False,
        "request.payload_len",
    ),
    "a-path-that-is-not-utf-8": (NOT_UTF8_PATH, False, "request.path"),
}


@covers("TRN-057", "TRN-012")
@requires(Capability.WORKER_LIMITS, Capability.OBSERVE_WORKER_LOG)
@pytest.mark.parametrize("ending", list(ENDINGS))
def test_a_connection_bad_bytes_end_is_logged_naming_the_field(
    target: Target, caplog: pytest.LogCaptureFixture, ending: str
) -> None:
    """A connection's bytes stop inside one part of a request (the peer then closes it), or
    declare a payload past 32 MiB in all, or a path that is not UTF-8: the worker closes the
    connection and logs one line naming the peer and the field at fault."""
    data, then_closed, field = ENDINGS[ending]
    worker = target.add_worker()
    caplog.set_level(logging.WARNING, logger=WORKER_LOG)
    connection = target.connect(worker)
    target.write(connection, data)
    if then_closed:
        target.disconnect(connection)
    serves_again(target, worker, "TRN-012")  # and by then the worker has read the end
    lines = worker_lines(caplog)
    require(
        "TRN-057",
        len(lines) == 1 and PEER in lines[0] and names_field(lines[0], field),
        f"worker {worker} closed a connection whose bytes ended {ending.replace('-', ' ')}: "
        f"it should log one line naming the peer ({PEER}) and the field {field}",
        expected=f"one line naming {PEER} and {field}",
        actual=lines,
    )


@covers("TRN-057")
@requires(Capability.WORKER_LIMITS, Capability.OBSERVE_WORKER_LOG)
def test_a_connection_ended_inside_a_refused_payload_is_logged_naming_it(
    target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """A payload past the byte budget is refused, and the worker reads on to drop it; the
    peer closes the connection part of the way through: the bytes still ended inside the
    payload, and the worker's one line names it."""
    worker = target.add_bounded_worker(WorkerBounds(max_buffered_bytes=BUDGET))
    caplog.set_level(logging.WARNING, logger=WORKER_LOG)
    connection = target.connect(worker)
    target.write(connection, declared_prefix(20 * BUDGET, 8 * BUDGET))  # 12 budgets short
    target.disconnect(connection)
    serves_again(target, worker, "TRN-057")
    lines = worker_lines(caplog)
    require(
        "TRN-057",
        len(lines) == 1 and PEER in lines[0] and names_field(lines[0], "request.payload"),
        f"the peer closed its connection to worker {worker} inside a payload the worker "
        "refused and was dropping: it should log one line naming the peer and the field "
        "request.payload",
        expected=f"one line naming {PEER} and request.payload",
        actual=lines,
    )


@covers("TRN-057")
@requires(Capability.WORKER_LIMITS, Capability.OBSERVE_WORKER_LOG)
@pytest.mark.parametrize("requests", [0, 2], ids=["before-any-request", "after-two-requests"])
def test_a_connection_closed_between_requests_logs_nothing(
    target: Target, caplog: pytest.LogCaptureFixture, requests: int
) -> None:
    """The peer closes a connection before its first request, or after two whole ones the
    worker answered: nothing was broken, so the worker logs nothing."""
    worker = target.add_worker()
    caplog.set_level(logging.WARNING, logger=WORKER_LOG)
    connection = target.connect(worker)
    for count in range(1, requests + 1):
        answered_in_turn(target.write(connection, _WHOLE), count, NO_ENDPOINT, "a request")
    target.disconnect(connection)
    serves_again(target, worker, "TRN-057")
    lines = worker_lines(caplog)
    require(
        "TRN-057",
        not lines,
        f"the peer closed its connection to worker {worker} between requests: the worker "
        "should log nothing for it",
        expected="no line",
        actual=lines,
    )
