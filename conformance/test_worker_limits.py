"""What peers may hold of a worker (TRN-024 … TRN-026): connections, idle time, buffered bytes.

The checks hold raw request-plane connections open to a worker (Capability.WORKER_LIMITS)
and write to them what a peer would: well-framed requests for an endpoint the worker does
not serve, so that every request it reads is answered at once with an ACK naming no
endpoint, and requests cut short. Time moves only through ``advance_time``; durations are
binary fractions so that the boundaries are exact. Each bound is checked on both sides
(just under or at it accepted, just over refused) and, for its default, on a worker opened
with the implementation's own defaults.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Callable, Sequence

import pytest

from routespec.conformance.checks import covers, require, require_equal, requires
from routespec.conformance.scenario import finished
from routespec.conformance.test_transport import (
    NO_ENDPOINT,
    PEER,
    accepted_elsewhere,
    indices,
    request_message,
    serves_again,
    usable_control,
)
from routespec.conformance.test_worker_server import NOT_UTF8_PATH, WORKER_LOG, worker_lines
from routespec.testing.target import (
    Capability,
    Direct,
    HeldConnection,
    Serve,
    Stall,
    Target,
    WorkerBounds,
)

DEFAULT_MAX_CONNECTIONS = 1024  # TRN-024: or a quarter of the open-file limit, if lower
FD_SHARE = 4
DEFAULT_IDLE_TIMEOUT = 600.0  # TRN-025
DEFAULT_MAX_BUFFERED_BYTES = 64 * 1024 * 1024  # TRN-026
MAX_MESSAGE_BYTES = 32 * 1024 * 1024  # TRN-012's bound on one message
NO_ENDPOINT_ACK = "Server unavailable: no endpoint"
OVERLOADED_ACK = "Server overloaded: "  # WorkerOverloaded at the caller (TRN-004)
CONTROL = usable_control(f"{PEER}:9", "held")  # never dialled: the endpoint is unknown
PREFIX = struct.Struct(">H")  # the path's length, then the path, headers' length, headers


def sized_request(total: int) -> bytes:
    """A well-framed request for ``NO_ENDPOINT`` of exactly ``total`` bytes on the wire."""
    control = json.dumps(CONTROL).encode()
    bare = request_message(NO_ENDPOINT, control, b"")
    assert total >= len(bare), f"a request needs at least {len(bare)} bytes"
    return request_message(NO_ENDPOINT, control, b" " * (total - len(bare)))


def declared_prefix(payload: int, sent: int) -> bytes:
    """The start of a request declaring a ``payload``-byte payload, with ``sent`` of them."""
    path, headers = NO_ENDPOINT.encode(), b"{}"
    head = PREFIX.pack(len(path)) + path + PREFIX.pack(len(headers)) + headers
    return head + struct.pack(">I", payload) + bytes(sent)


def answered(seen: HeldConnection, acks: int, requirement: str, what: str) -> str:
    """The last of exactly ``acks`` ACKs on a connection the worker still holds."""
    require(
        requirement,
        not seen.closed and len(seen.acks) == acks,
        f"{what}: the worker should answer with ACK number {acks} and keep the connection "
        f"open; it sent {list(seen.acks)} and {'closed' if seen.closed else 'kept'} it",
    )
    return seen.acks[-1]


def not_refused(seen: HeldConnection, acks: int, requirement: str, what: str) -> None:
    """Read and answered, not refused for load: the worker's answer for an endpoint it does
    not serve (the reference's "Server unavailable: no endpoint …", Dynamo's "… unknown
    endpoint …") is any ACK but ``Server overloaded``."""
    ack = answered(seen, acks, requirement, what)
    require(
        requirement,
        not ack.startswith(OVERLOADED_ACK),
        f"{what}: the worker should read the request and answer it, not refuse it for load",
        expected=f"an ACK such as {NO_ENDPOINT_ACK} at {NO_ENDPOINT}",
        actual=repr(ack),
    )


def refused_overloaded(seen: HeldConnection, acks: int, requirement: str, what: str) -> None:
    ack = answered(seen, acks, requirement, what)
    require(
        requirement,
        ack.startswith(OVERLOADED_ACK),
        f"{what}: the worker should refuse the request as overloaded",
        expected=f"{OVERLOADED_ACK}…",
        actual=repr(ack),
    )


# --- TRN-024 ---


@covers("TRN-024")
@requires(
    Capability.WORKER_LIMITS,
    Capability.DIRECT,
    Capability.OBSERVE_WORKER_BYTES,
)
def test_a_connection_past_the_cap_is_closed_unread(target: Target) -> None:
    """Cap 3: the router's connection and two held ones fill it; a fourth is closed at once
    and a request written on it is never read, while the three held go on being served; when
    one ends, a new connection is held again."""
    worker = target.add_bounded_worker(WorkerBounds(max_connections=3))
    serves_again(target, worker, "TRN-024")  # the router now holds a connection
    held = [target.connect(worker) for _ in range(2)]
    for connection in held:
        require(
            "TRN-024",
            not target.held(connection).closed,
            f"worker {worker} (cap 3) closed connection {len(held)} of 3",
        )
    extra = target.connect(worker)
    require(
        "TRN-024",
        target.held(extra).closed,
        f"worker {worker} holds 3 connections, its cap, and should close a 4th at once",
    )
    read_before = target.worker_bytes(worker)
    target.write(extra, sized_request(512))
    require_equal(
        "TRN-024",
        target.worker_bytes(worker),
        read_before,
        f"worker {worker} read a request from a connection past its cap",
    )
    for connection in held:
        not_refused(target.write(connection, sized_request(512)), 1, "TRN-024", "held")
    require_equal(
        "TRN-024",
        target.worker_bytes(worker) - read_before,
        2 * 512,
        f"worker {worker} should have read the two 512-byte requests written on the "
        "connections it holds, every byte of them, and nothing of the one past its cap",
    )
    serves_again(target, worker, "TRN-024")
    target.disconnect(held[0])
    again = target.connect(worker)
    not_refused(target.write(again, sized_request(512)), 1, "TRN-024", "after one ended")


def ended_by_its_peer(target: Target, ending: int, others: Sequence[int]) -> None:
    target.disconnect(ending)


def ended_by_bad_bytes(target: Target, ending: int, others: Sequence[int]) -> None:
    target.write(ending, NOT_UTF8_PATH)  # TRN-012: the worker closes that connection


def ended_by_silence(target: Target, ending: int, others: Sequence[int]) -> None:
    """The others answer a request just before ``ending`` reaches its idle timeout."""
    target.advance_time(IDLE - 0.5)
    for connection in others:
        not_refused(target.write(connection, sized_request(512)), 1, "TRN-024", "kept busy")
    target.advance_time(0.5)


SLOT_ENDINGS: dict[str, Callable[[Target, int, Sequence[int]], None]] = {
    "closed-by-its-peer": ended_by_its_peer,
    "closed-for-bad-bytes": ended_by_bad_bytes,
    "closed-when-idle": ended_by_silence,  # TRN-025: the worker's own timeout ends it
}


@covers("TRN-024")
@requires(Capability.WORKER_LIMITS, Capability.MOCK_CLOCK)
@pytest.mark.parametrize("ending", list(SLOT_ENDINGS))
def test_a_connection_that_ends_frees_one_slot(target: Target, ending: str) -> None:
    """Cap 3, three connections held, a fourth closed; one of the three ends (its peer
    closes it, the worker closes it for bad bytes or for silence): exactly one slot is free,
    so one new connection is held and the next is closed again."""
    worker = target.add_bounded_worker(WorkerBounds(max_connections=3, idle_timeout=IDLE))
    first, *others = (target.connect(worker) for _ in range(3))
    require(
        "TRN-024",
        target.held(target.connect(worker)).closed,
        f"worker {worker} holds 3 connections, its cap, and should close a 4th at once",
    )
    SLOT_ENDINGS[ending](target, first, others)
    require("TRN-024", target.held(first).closed, f"{ending}: the connection is still open")
    again, extra = target.connect(worker), target.connect(worker)
    held_again, closed_again = not target.held(again).closed, target.held(extra).closed
    require(
        "TRN-024",
        held_again and closed_again,
        f"one of the 3 connections worker {worker} held ended ({ending}): it should hold "
        "one new connection and close the next, its cap reached again",
        expected="the new connection held, the one after it closed",
        actual=f"new one {'held' if held_again else 'closed'}, "
        f"the next {'closed' if closed_again else 'held'}",
    )


@covers("TRN-024")
@requires(Capability.WORKER_LIMITS, Capability.OBSERVE_WORKER_LOG)
def test_reaching_the_cap_is_logged_once_each_time(
    target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """Cap 2: two connections past it are closed, and the worker logs one line naming its
    cap; once one of the two it held has ended, the cap reached again is logged again."""
    worker = target.add_bounded_worker(WorkerBounds(max_connections=2))
    caplog.set_level(logging.WARNING, logger=WORKER_LOG)
    held = [target.connect(worker) for _ in range(2)]
    refused = [target.connect(worker) for _ in range(2)]
    first = worker_lines(caplog)
    target.disconnect(held[0])
    again = target.connect(worker)
    refused.append(target.connect(worker))
    lines = worker_lines(caplog)
    require(
        "TRN-024",
        not target.held(again).closed and all(target.held(c).closed for c in refused),
        f"worker {worker} (cap 2) should have closed each connection past its cap, and held "
        "a new one once one of the two had ended",
    )
    require(
        "TRN-024",
        len(first) == 1 and len(lines) == 2 and all("2 connections" in line for line in lines),
        f"worker {worker} reached its cap of 2 connections, closed two more, then reached it "
        "again after one ended: it should log one line naming the cap each time",
        expected="one line naming '2 connections', then a second one",
        actual=f"after the first time {first}, after the second {lines[len(first) :]}",
    )


@covers("TRN-024")
@requires(Capability.WORKER_LIMITS)
@pytest.mark.parametrize("file_limit", [None, 1023], ids=["the-targets-own", "1023"])
def test_the_default_cap_is_1024_or_a_quarter_of_the_file_limit(
    target: Target, file_limit: int | None
) -> None:
    """Under the target's own open-file limit, and under 1023, whose quarter is not whole
    (255)."""
    worker = target.add_bounded_worker(WorkerBounds(open_file_limit=file_limit))
    limit = target.open_file_limit(worker)
    cap = min(DEFAULT_MAX_CONNECTIONS, max(1, limit // FD_SHARE))
    connections = [target.connect(worker) for _ in range(cap + 1)]
    closed = [n for n, c in enumerate(connections, 1) if target.held(c).closed]
    require_equal(
        "TRN-024",
        closed,
        [cap + 1],
        f"under an open-file limit of {limit}, a worker with the default cap should hold "
        f"{cap} connections and close connection {cap + 1}; it closed connections {closed}",
    )
    not_refused(target.write(connections[cap - 1], sized_request(512)), 1, "TRN-024", "last")


# --- TRN-025 ---

IDLE = 4.0


def idle_then_closed(target: Target, connection: int, timeout: float, what: str) -> None:
    """Open just before ``timeout`` seconds of silence, closed at it."""
    target.advance_time(timeout - 0.5)
    require(
        "TRN-025",
        not target.held(connection).closed,
        f"{what}: the worker closed the connection after {timeout - 0.5:g} s of silence, "
        f"before its idle timeout of {timeout:g} s",
    )
    target.advance_time(0.5)
    require(
        "TRN-025",
        target.held(connection).closed,
        f"{what}: the worker should close the connection after {timeout:g} s of silence",
    )


@covers("TRN-025")
@requires(Capability.WORKER_LIMITS, Capability.MOCK_CLOCK)
def test_a_silent_connection_is_closed_at_the_idle_timeout(target: Target) -> None:
    worker = target.add_bounded_worker(WorkerBounds(idle_timeout=IDLE))
    idle_then_closed(target, target.connect(worker), IDLE, "no byte ever sent")


@covers("TRN-025")
@requires(Capability.WORKER_LIMITS, Capability.MOCK_CLOCK)
def test_a_connection_idle_between_requests_is_closed(target: Target) -> None:
    worker = target.add_bounded_worker(WorkerBounds(idle_timeout=IDLE))
    connection = target.connect(worker)
    target.advance_time(IDLE - 0.5)
    not_refused(target.write(connection, sized_request(512)), 1, "TRN-025", "a request")
    idle_then_closed(target, connection, IDLE, "silent after one answered request")


@covers("TRN-025")
@requires(Capability.WORKER_LIMITS, Capability.MOCK_CLOCK)
def test_a_connection_idle_inside_a_request_is_closed(target: Target) -> None:
    """Each byte restarts the count: a request written in two parts, the second just before
    the timeout, keeps the connection; silence after it closes the connection."""
    worker = target.add_bounded_worker(WorkerBounds(idle_timeout=IDLE))
    connection = target.connect(worker)
    request = sized_request(512)
    target.write(connection, request[:100])
    target.advance_time(IDLE - 0.5)
    seen = target.write(connection, request[100:300])
    require(
        "TRN-025",
        not seen.closed and not seen.acks,
        f"a request half written: the worker should wait for the rest, it sent "
        f"{list(seen.acks)} and {'closed' if seen.closed else 'kept'} the connection",
    )
    idle_then_closed(target, connection, IDLE, "silent inside a request")


@covers("TRN-025")
@requires(
    Capability.WORKER_LIMITS, Capability.MOCK_CLOCK, Capability.DIRECT, Capability.SCRIPT_STALL
)
def test_the_idle_timeout_spares_response_streams(target: Target) -> None:
    """A stream stalled for twice the idle timeout still completes: only request-plane
    connections are closed for silence, not the response streams the worker dialled."""
    worker = target.add_bounded_worker(WorkerBounds(idle_timeout=IDLE))
    target.script_worker(worker, Stall(items=1, items_after=1))
    stalled = target.submit(Direct(worker))
    target.advance_time(2 * IDLE)
    target.release_stalled(worker)
    outcome = finished(target, stalled, "TRN-025")
    require(
        "TRN-025",
        outcome.error is None and indices(outcome) == [0, 1],
        f"a response stream silent for {2 * IDLE:g} s (idle timeout {IDLE:g} s) should "
        f"complete with items [0, 1]: {outcome}",
    )
    target.script_worker(worker, Serve())
    serves_again(target, worker, "TRN-025")  # the router connects again


@covers("TRN-025")
@requires(Capability.WORKER_LIMITS, Capability.MOCK_CLOCK)
def test_the_default_idle_timeout_is_600_seconds(target: Target) -> None:
    worker = target.add_bounded_worker(WorkerBounds())
    idle_then_closed(target, target.connect(worker), DEFAULT_IDLE_TIMEOUT, "default")


# --- TRN-026 ---

BUDGET = 16 * 1024


@covers("TRN-026")
@requires(Capability.WORKER_LIMITS)
def test_a_request_past_the_byte_budget_is_refused_overloaded(target: Target) -> None:
    """A request of exactly the budget is read; one byte more is refused with
    ``Server overloaded``, and the same connection then serves the next request."""
    worker = target.add_bounded_worker(WorkerBounds(max_buffered_bytes=BUDGET))
    connection = target.connect(worker)
    not_refused(target.write(connection, sized_request(BUDGET)), 1, "TRN-026", "at the budget")
    seen = target.write(connection, sized_request(BUDGET + 1))
    refused_overloaded(seen, 2, "TRN-026", "one byte past the budget")
    seen = target.write(connection, sized_request(BUDGET - 1))
    not_refused(seen, 3, "TRN-026", "just under the budget, after a refusal")


@covers("TRN-026")
@requires(Capability.WORKER_LIMITS)
def test_the_byte_budget_is_shared_by_all_connections(target: Target) -> None:
    """One connection holds half the budget in a request cut short; a request on another
    that would take the total past the budget is refused, one that fits is read, and the
    first request, completed, is read too."""
    worker = target.add_bounded_worker(WorkerBounds(max_buffered_bytes=BUDGET))
    holder, other = target.connect(worker), target.connect(worker)
    held = sized_request(BUDGET // 2 + 1024)
    target.write(holder, held[: BUDGET // 2])
    seen = target.write(other, sized_request(BUDGET // 2 + 1))
    refused_overloaded(seen, 1, "TRN-026", f"{BUDGET // 2} bytes held on another connection")
    not_refused(target.write(other, sized_request(BUDGET // 2)), 2, "TRN-026", "one that fits")
    not_refused(target.write(holder, held[BUDGET // 2 :]), 1, "TRN-026", "the held one")


@covers("TRN-026")
@requires(Capability.WORKER_LIMITS)
def test_the_default_byte_budget_is_64_mib(target: Target) -> None:
    """Two requests cut short hold 60 MiB (a message is at most 32 MiB); a third connection's
    request of the remaining 4 MiB is read, one of 4 MiB and a byte is refused."""
    worker = target.add_bounded_worker(WorkerBounds())
    cut_short = declared_prefix(MAX_MESSAGE_BYTES - 1024, 30 * 1024 * 1024)
    for _ in range(2):
        target.write(target.connect(worker), cut_short)
    rest = DEFAULT_MAX_BUFFERED_BYTES - 2 * len(cut_short)
    connection = target.connect(worker)
    not_refused(target.write(connection, sized_request(rest)), 1, "TRN-026", "at 64 MiB")
    refused_overloaded(
        target.write(connection, sized_request(rest + 1)), 2, "TRN-026", "past 64 MiB"
    )


@covers("TRN-026")
@requires(Capability.WORKER_LIMITS)
def test_a_refused_request_many_chunks_long_is_dropped_exactly(target: Target) -> None:
    """A request twenty times the budget (many receive chunks) is refused; the worker reads
    on to its last byte and no further, so the request written behind it in the same write is
    read and answered; the bytes it dropped no longer count, so a request of exactly the
    budget is read next, on that connection and on another, and one byte more is refused."""
    worker = target.add_bounded_worker(WorkerBounds(max_buffered_bytes=BUDGET))
    connection = target.connect(worker)
    huge, behind = sized_request(20 * BUDGET + 7), sized_request(512)
    seen = target.write(connection, huge + behind)
    require(
        "TRN-026",
        not seen.closed
        and len(seen.acks) == 2
        and seen.acks[0].startswith(OVERLOADED_ACK)
        and not seen.acks[1].startswith(OVERLOADED_ACK),
        f"a request of {len(huge)} bytes (budget {BUDGET}) then one of {len(behind)} in the "
        "same write: the worker should refuse the first as overloaded, read past it exactly "
        "and answer the second, keeping the connection",
        expected=f"[{OVERLOADED_ACK}…, an ACK not refusing for load], connection open",
        actual=f"{list(seen.acks)}, {'closed' if seen.closed else 'open'}",
    )
    not_refused(target.write(connection, sized_request(BUDGET)), 3, "TRN-026", "at the budget")
    other = target.connect(worker)
    not_refused(target.write(other, sized_request(BUDGET)), 1, "TRN-026", "another, at it")
    refused_overloaded(
        target.write(other, sized_request(BUDGET + 1)), 2, "TRN-026", "another, past it"
    )


# --- TRN-055: where a worker listens ---


@covers("TRN-055")
@requires(Capability.WORKER_LIMITS)
def test_a_worker_listens_only_at_the_address_it_registers(target: Target) -> None:
    """The request-plane address a worker's discovery record gives callers is the one address
    it accepts at: the same port on another loopback address refuses."""
    worker = target.add_worker()
    host, _, port = target.worker_address(worker).rpartition(":")
    elsewhere, accepted = accepted_elsewhere(host, int(port))
    require(
        "TRN-055",
        not accepted,
        f"worker {worker} listens at {host}:{port}; the same port at {elsewhere} should "
        "refuse a connection, and accepted it",
    )
    serves_again(target, worker, "TRN-055")
