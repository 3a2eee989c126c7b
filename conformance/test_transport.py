"""Transport (TRN): the final hop's envelope, ACKs, response streams, tombstones and gauges.

Checks that need Dynamo's wire (wire faults, raw bytes, tombstones) ask for
``Capability.WIRE_TRANSPORT``; the others hold for any transport.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import itertools
import json
import re
import select
import socket
import struct
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from routespec.conformance import oracle
from routespec.conformance.checks import (
    covers,
    require,
    require_compare,
    require_equal,
    require_false,
    requires,
)
from routespec.conformance.plugin import OpenTarget
from routespec.conformance.scenario import (
    MODE_CAPABILITY,
    built,
    finished,
    finished_after_transfer,
    names_field,
    reached,
    refused_before_stream,
    shows,
    shows_outer,
    spec_of,
)
from routespec.testing.target import (
    Adapter,
    Bidirectional,
    Capability,
    Crash,
    Direct,
    ErrorSpec,
    FailBeforeStream,
    FailMidStream,
    Misbehave,
    Outcome,
    Reject,
    Serve,
    Silent,
    SilentStage,
    Stall,
    Target,
    TargetConfig,
    WireFault,
    WorkerScript,
    WriteAck,
    WriteAcks,
    WriteFrame,
    WritePrologue,
)

PRE_STREAM_PREFIX = "Worker generate() failed before response stream: "
STREAM_ENDED_EARLY = "Stream ended before generation completed"
CONTROL_LIMIT = 128 * 1024
LABELS: tuple[str | None, ...] = (None, *oracle.TYPE_LABELS)


def indices(outcome: Outcome) -> list[object]:
    return [item.get("index") if isinstance(item, dict) else item for item in outcome.items]


def ends_with_error(outcome: Outcome, requirement: str, message: str, items: int) -> None:
    require(
        requirement,
        outcome.error is not None
        and not outcome.error.pre_stream
        and message in outcome.error.links[0][1]
        and indices(outcome) == list(range(items)),
        f"expected {items} items then an error item containing {message!r}; got {outcome}",
    )


def serves_again(target: Target, worker: int, requirement: str) -> None:
    target.script_worker(worker, Serve(2))
    outcome = finished(target, target.submit(Direct(worker)), requirement)
    require(
        requirement,
        outcome.error is None and indices(outcome) == [0, 1],
        f"worker {worker} no longer serves a plain request: {outcome}",
    )


def completes_with_two_items(outcome: Outcome, requirement: str, sent: str) -> None:
    """The stream of a worker that wrote two items, then ``sent``, completed with them."""
    require(
        requirement,
        outcome.error is None and indices(outcome) == [0, 1],
        f"the worker sent two items, {sent}; the stream should complete with the two items: "
        f"{outcome}",
    )


# --- TRN-001, TRN-003 ---


@covers("TRN-001", "TRN-003")
@requires(Capability.DIRECT)
@pytest.mark.parametrize("items", [0, 1, 5])
def test_an_accepted_request_streams_its_items(
    target: Target, adapter: Adapter, items: int
) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Serve(items))
    request = target.submit(Direct(worker), metadata={"trace": "t" * 300})
    outcome = finished(target, request, "TRN-003")
    deliveries = [d for d in target.dispatch_log() if d.request_id == request]
    require_equal("TRN-003", len(deliveries), 1, f"{request} reached workers {deliveries}")
    if Capability.OBSERVE_PREPARED_TARGET in adapter.capabilities:
        require_equal(
            "TRN-001",
            deliveries[0].prepared_for,
            worker,
            f"the request's metadata should reach worker {worker} with it: {deliveries}",
        )
    require(
        "TRN-003",
        outcome.error is None
        and indices(outcome) == list(range(items))
        and all(isinstance(i, dict) and i.get("request") == request for i in outcome.items),
        f"an accepted request should deliver its {items} items in order; got {outcome}",
    )


# The control message a Dynamo 1.6.1 caller writes (TRN-001): its fields, and the stream
# address's, which travel as a JSON string in ``connection_info.info``.
STREAM_TYPES = {"connection_info": "response", "request_stream_connection_info": "request"}


def control_faults(
    control: object, streams: tuple[str, ...], metadata: Mapping[str, str] | None
) -> list[str]:
    """What in ``control`` is not a Dynamo control message with these stream fields."""
    if not isinstance(control, dict):
        return [f"no control message was read: {control!r}"]
    faults = []
    many_in = "request_stream_connection_info" in streams
    wanted = {
        "request_type": "many_in" if many_in else "single_in",
        "response_type": "many_out",
    }
    faults += [
        f"{k} is {control.get(k)!r}, not {v!r}" for k, v in wanted.items() if control.get(k) != v
    ]
    if not isinstance(control.get("id"), str) or not control["id"]:
        faults.append(f"id is {control.get('id')!r}, not a request id")
    if control.get("payload_codec") not in ("msgpack", "json"):
        faults.append(f"payload_codec is {control.get('payload_codec')!r}")
    carried = control.get("metadata")
    if metadata and not (
        isinstance(carried, dict) and all(carried.get(k) == v for k, v in metadata.items())
    ):  # the caller may add entries of its own (the reference adapter marks its target)
        faults.append(f"metadata is {carried!r}, without {metadata!r}")
    for name in streams:
        connection = control.get(name)
        if not isinstance(connection, dict) or connection.get("transport") != "tcp_server":
            faults.append(f"{name} is {connection!r}, not a tcp_server connection")
            continue
        text = connection.get("info")
        try:
            info = json.loads(text) if isinstance(text, str) else None
        except ValueError:
            info = None
        if not isinstance(info, dict):
            faults.append(f"{name}.info is {connection.get('info')!r}, not a JSON object")
            continue
        if info.get("stream_type") != STREAM_TYPES[name]:
            faults.append(f"{name}.info.stream_type is {info.get('stream_type')!r}")
        address = info.get("address")
        if not isinstance(address, str) or not address.rpartition(":")[2].isdigit():
            faults.append(f"{name}.info.address is {address!r}, not host:port")
        if not isinstance(info.get("subject"), str) or not info["subject"]:
            faults.append(f"{name}.info.subject is {info.get('subject')!r}")
        if info.get("context") != control.get("id"):  # Dynamo's: the request's id
            faults.append(f"{name}.info.context is {info.get('context')!r}, not the id")
    return faults


@covers("TRN-001")
@requires(Capability.DIRECT, Capability.OBSERVE_CONTROL_MESSAGE)
@pytest.mark.parametrize("metadata", [None, {"trace": "t1", "tenant": "a"}], ids=["none", "given"])
def test_the_control_message_is_dynamos(target: Target, metadata: dict[str, str] | None) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Serve(1))
    request = target.submit(Direct(worker), metadata=metadata)
    finished(target, request, "TRN-001")
    control = target.control_message(request)
    faults = control_faults(control, ("connection_info",), metadata)
    require(
        "TRN-001",
        not faults,
        f"the control message worker {worker} read for {request} should be Dynamo's "
        f"(single_in, many_out, a response stream address): {'; '.join(faults)}",
        actual=repr(control),
    )


@covers("TRN-001", "TRN-020")
@requires(Capability.BIDIRECTIONAL, Capability.OBSERVE_CONTROL_MESSAGE)
def test_a_bidirectional_control_message_names_both_streams(target: Target) -> None:
    target.add_worker()
    request = target.submit(Bidirectional("round-robin", 2))
    finished(target, request, "TRN-001")
    control = target.control_message(request)
    streams = ("connection_info", "request_stream_connection_info")
    faults = control_faults(control, streams, None)
    require(
        "TRN-001",
        not faults,
        f"the control message of the bidirectional {request} should be Dynamo's (many_in, "
        f"many_out, a response and a request stream address): {'; '.join(faults)}",
        actual=repr(control),
    )


# --- TRN-002 ---


@covers("TRN-002")
@requires(Capability.DIRECT, Capability.WIRE_TRANSPORT, Capability.OBSERVE_WORKER_BYTES)
def test_an_oversized_control_message_is_refused_before_sending(target: Target) -> None:
    worker = target.add_worker()
    before = target.worker_bytes(worker)
    huge = {"pad": "x" * (CONTROL_LIMIT + 1)}
    outcome = finished(target, target.submit(Direct(worker), metadata=huge), "TRN-002")
    require(
        "TRN-002",
        outcome.error is not None
        and outcome.error.pre_stream
        and "too large" in outcome.error.links[0][1]
        and str(CONTROL_LIMIT) in outcome.error.links[0][1],
        f"a control message over 128 KiB should fail before the stream naming the limit "
        f"{CONTROL_LIMIT}: {outcome}",
    )
    require(
        "TRN-002",
        target.worker_bytes(worker) == before and not reached(target, "req-1"),
        f"worker {worker} received {target.worker_bytes(worker) - before} bytes of it",
    )
    for size in (CONTROL_LIMIT // 2, CONTROL_LIMIT - 1024):  # room left for the other fields
        fits = {"pad": "x" * size}
        for _ in range(2):  # the second on the connection the first left open
            outcome = finished(target, target.submit(Direct(worker), metadata=fits), "TRN-002")
            require(
                "TRN-002",
                outcome.error is None and indices(outcome) == [0],
                f"a control message with {size} bytes of metadata should be served: {outcome}",
            )


def compact_length(control: Mapping[str, object]) -> int:
    """The bytes of ``control`` as Dynamo's serde_json (and the reference) write it: compact
    JSON, non-ASCII escaped as JSON escapes it (the checks' pads are ASCII)."""
    return len(json.dumps(control, separators=(",", ":")).encode())


@covers("TRN-002")
@requires(Capability.DIRECT, Capability.OBSERVE_CONTROL_MESSAGE)
def test_a_control_message_of_exactly_128_kib_is_sent_and_a_byte_more_is_not(
    target: Target,
) -> None:
    """Both sides of the bound: a probe's control message, as its worker read it, gives the
    length every other field takes; a pad then makes the next one exactly 128 KiB (sent) and
    the one after a byte longer (refused before any byte reaches the worker)."""
    worker = target.add_worker()
    probe = target.submit(Direct(worker), metadata={"pad": ""})
    finished(target, probe, "TRN-002")
    control = target.control_message(probe)
    if control is None:
        pytest.fail(f"setup: no worker read a control message for {probe}")
    room = CONTROL_LIMIT - compact_length(control)
    at_limit = target.submit(Direct(worker), metadata={"pad": "x" * room})
    outcome = finished(target, at_limit, "TRN-002")
    read = target.control_message(at_limit)
    if read is not None and compact_length(read) != CONTROL_LIMIT:  # the other fields grew
        pytest.fail(f"setup: the padded control message is {compact_length(read)} bytes")
    require(
        "TRN-002",
        outcome.error is None and indices(outcome) == [0] and read is not None,
        f"a control message of exactly {CONTROL_LIMIT} bytes is within the bound and should be "
        f"sent and served: {outcome}",
    )
    over = target.submit(Direct(worker), metadata={"pad": "x" * (room + 1)})
    outcome = finished(target, over, "TRN-002")
    require(
        "TRN-002",
        outcome.error is not None
        and outcome.error.pre_stream
        and str(CONTROL_LIMIT) in outcome.error.links[0][1]
        and target.control_message(over) is None
        and not reached(target, over),
        f"a control message of {CONTROL_LIMIT + 1} bytes should fail before the stream naming "
        f"the limit {CONTROL_LIMIT}, reaching no worker: {outcome}",
    )


UNENCODABLE = {  # a payload no codec of the wire can write
    "a-set": {1, 2},
    "an-int-past-64-bits": 2**70,
}
MESSAGE_LIMIT = 32 * 1024 * 1024  # a request message's bytes (TRN-043)


@covers("TRN-043")
@requires(Capability.DIRECT, Capability.WIRE_TRANSPORT, Capability.OBSERVE_WORKER_BYTES)
@pytest.mark.parametrize("payload", list(UNENCODABLE))
def test_a_payload_the_codec_cannot_encode_fails_before_sending(
    target: Target, payload: str
) -> None:
    """The caller passes a payload the worker's codec cannot encode: the dispatch fails
    before any stream with ``InvalidArgument`` naming the codec, no byte of it reaches the
    worker, and the worker serves the next request."""
    worker = target.add_worker()
    before = target.worker_bytes(worker)
    outcome = finished(target, target.submit(Direct(worker, UNENCODABLE[payload])), "TRN-043")
    require(
        "TRN-043",
        refused_before_stream(outcome, "InvalidArgument", "cannot be encoded")
        and outcome.error is not None
        and any(codec in outcome.error.links[0][1] for codec in ("msgpack", "json")),
        f"a request whose payload is {payload} should fail before the stream with "
        f"InvalidArgument naming the codec; got {outcome}",
    )
    require_equal(
        "TRN-043", target.worker_bytes(worker) - before, 0, "bytes of it reached the worker"
    )
    serves_again(target, worker, "TRN-043")


@covers("TRN-043")
@requires(Capability.DIRECT, Capability.WIRE_TRANSPORT, Capability.OBSERVE_WORKER_BYTES)
def test_a_request_message_over_32_mib_fails_before_sending(
    adapter: Adapter, target: Target
) -> None:
    """A payload that makes the request message past 32 MiB is refused before sending,
    naming ``request.payload_len``; one a few KiB under the limit is served. From the bytes
    the worker counted of that one, the payload that makes the message exactly 32 MiB in
    all is served, every byte of it reaching the worker, and one byte more is refused
    before sending."""
    worker = target.add_worker()
    before = target.worker_bytes(worker)
    over = finished(target, target.submit(Direct(worker, "x" * MESSAGE_LIMIT)), "TRN-043")
    require(
        "TRN-043",
        refused_before_stream(over, "InvalidArgument")
        and over.error is not None
        and names_field(over.error.links[0][1], "request.payload_len"),
        f"a request message past {MESSAGE_LIMIT} bytes should fail before the stream with "
        f"InvalidArgument naming request.payload_len; got {over}",
    )
    require_equal("TRN-043", target.worker_bytes(worker) - before, 0, "bytes of it were sent")
    under = finished_after_transfer(
        target,
        target.submit(Direct(worker, "x" * (MESSAGE_LIMIT - 8192))),
        "TRN-043",
        mock_clock=Capability.MOCK_CLOCK in adapter.capabilities,
    )
    require(
        "TRN-043",
        under.error is None and len(under.items) == 1,
        f"a request message 8 KiB under {MESSAGE_LIMIT} bytes should be served; got {under}",
    )
    counted = target.worker_bytes(worker) - before  # the message as the worker counts it
    # the codec frames every string this long alike: the message grows by the string's bytes
    exact = MESSAGE_LIMIT - 8192 + MESSAGE_LIMIT - counted
    before = target.worker_bytes(worker)
    served = finished_after_transfer(
        target,
        target.submit(Direct(worker, "x" * exact)),
        "TRN-043",
        mock_clock=Capability.MOCK_CLOCK in adapter.capabilities,
    )
    require(
        "TRN-043",
        served.error is None and target.worker_bytes(worker) - before == MESSAGE_LIMIT,
        f"a request message of exactly {MESSAGE_LIMIT} bytes should be served, every byte "
        f"of it reaching the worker; got {served}, "
        f"{target.worker_bytes(worker) - before} bytes read",
    )
    before = target.worker_bytes(worker)
    one_over = finished(target, target.submit(Direct(worker, "x" * (exact + 1))), "TRN-043")
    require(
        "TRN-043",
        refused_before_stream(one_over, "InvalidArgument")
        and target.worker_bytes(worker) == before,
        f"a request message of {MESSAGE_LIMIT + 1} bytes should fail before the stream with "
        f"InvalidArgument, no byte of it sent; got {one_over}",
    )


# --- TRN-004 ---


@covers("TRN-004")
@requires(Capability.DIRECT, Capability.SCRIPT_REJECTION)
@pytest.mark.parametrize("overloaded", [True, False], ids=["overloaded", "unavailable"])
def test_a_rejection_ack_is_a_typed_worker_failure(target: Target, overloaded: bool) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Reject(overloaded=overloaded, message="queue full"))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-004")
    expected = oracle.REJECTION_TYPES[overloaded]
    require(
        "TRN-004",
        refused_before_stream(outcome, expected, "queue full"),
        f"a {'Server overloaded' if overloaded else 'Server unavailable'} ACK should fail "
        f"before the stream with {expected} carrying the worker's text; got {outcome}",
    )


# --- TRN-038: an ACK's bound and its text ---

ACK_LIMIT = 64 * 1024
UNAVAILABLE_ACK = b"Server unavailable: "


@covers("TRN-038", "TRN-004")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
def test_an_ack_at_its_bound_is_read_whole(target: Target) -> None:
    """The other side of the limit: a rejection of exactly 65,536 bytes is read (its text
    then bounded as every message is, ERR-006)."""
    text = UNAVAILABLE_ACK + b"x" * (ACK_LIMIT - len(UNAVAILABLE_ACK))
    worker = target.add_worker()
    target.script_worker(worker, WriteAck(text))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-038")
    expected = oracle.REJECTION_TYPES[False]
    require(
        "TRN-038",
        refused_before_stream(outcome, expected, "xxxxxxxx"),
        f"an ACK of {len(text)} bytes (the limit) saying 'Server unavailable: …' should fail "
        f"before the stream with {expected} carrying the whole text; got {outcome}",
    )


CUT_ACKS = {  # the part the connection ends in: 2 bytes of the prefix, or 23 of 100 of the text
    "ack.len": WriteAck(b"", length=100, close=True, cut=2),
    "ack": WriteAck(b"Server unavailable: que", length=100, close=True),
}


@covers("TRN-041", "TRN-033")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
@pytest.mark.parametrize("part", list(CUT_ACKS))
def test_an_ack_cut_short_is_named_by_its_text(target: Target, part: str) -> None:
    """The worker sends 2 bytes of an ACK's 4-byte prefix, or declares a 100-byte ACK and
    sends 23 bytes of it, and closes the connection: the request fails at once before any
    stream with ``Disconnected`` naming ``ack.len`` or ``ack``, and the worker's next
    request is served on a new connection."""
    worker = target.add_worker()
    target.script_worker(worker, CUT_ACKS[part])
    outcome = finished(target, target.submit(Direct(worker)), "TRN-033")
    require(
        "TRN-033",
        refused_before_stream(outcome, "Disconnected"),
        f"worker {worker} closed its connection inside an ACK: the request should fail "
        f"before the stream with Disconnected; got {outcome}",
    )
    assert outcome.error is not None
    require(
        "TRN-041",
        names_field(outcome.error.links[0][1], part),
        f"the connection ended inside the ACK's {'prefix' if part == 'ack.len' else 'text'}: "
        f"the error should name {part!r}; it says {outcome.error.links[0][1]!r}",
    )
    serves_again(target, worker, "TRN-033")


@covers("TRN-038", "TRN-012")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
@pytest.mark.parametrize("sent", ["whole", "declared-only"])
def test_an_ack_over_its_bound_ends_its_connection(target: Target, sent: str) -> None:
    """One byte over, whether the worker sends the bytes or only declares them: the caller
    reads no further, fails the request ``Disconnected`` naming ``ack.len`` at once, and
    the worker's next request is served on a new connection."""
    text = UNAVAILABLE_ACK + b"x" * (ACK_LIMIT + 1 - len(UNAVAILABLE_ACK))
    worker = target.add_worker()
    script = WriteAck(text) if sent == "whole" else WriteAck(b"", length=len(text))
    target.script_worker(worker, script)
    outcome = finished(target, target.submit(Direct(worker)), "TRN-038")
    require(
        "TRN-038",
        refused_before_stream(outcome, "Disconnected")
        and outcome.error is not None
        and names_field(outcome.error.links[0][1], "ack.len"),
        f"an ACK declaring {len(text)} bytes ({sent}), over the 65,536-byte limit, should "
        f"fail its request before the stream with Disconnected naming ack.len; got {outcome}",
    )
    target.script_worker(worker, Serve(1))
    after = finished(target, target.submit(Direct(worker)), "TRN-012")
    require(
        "TRN-012",
        after.error is None and indices(after) == [0],
        f"after the overlong ACK, worker {worker}'s next request should be served; got {after}",
    )


@covers("TRN-038", "TRN-004")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
def test_an_ack_that_is_not_utf8_is_read_with_replacements(target: Target) -> None:
    worker = target.add_worker()
    target.script_worker(worker, WriteAck(b"Server overloaded: queue \xff full"))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-038")
    expected = oracle.REJECTION_TYPES[True]
    require(
        "TRN-038",
        refused_before_stream(outcome, expected, "queue \ufffd full"),
        f"an ACK 'Server overloaded: queue <0xff> full' should fail before the stream with "
        f"{expected}, its text read with U+FFFD for the byte that is not UTF-8; got {outcome}",
    )


TOGETHER = (b"Server unavailable: first \xff", b"Server overloaded: queue \xff full")


@covers("TRN-038")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
@pytest.mark.parametrize("split", [None, 2], ids=["whole", "split"])
def test_acks_written_together_are_each_read_whole(
    target: Target, adapter: Adapter, split: int | None
) -> None:
    """Two requests to one worker, which writes their ACKs together in one write, or with
    the second cut 2 bytes into its text and the rest 0.1 s later: each request fails before
    the stream with its own rejection and its whole text, read with U+FFFD for the byte that
    is not UTF-8."""
    worker = target.add_worker()
    target.script_worker(worker, WriteAcks(TOGETHER, split))
    first, second = target.submit(Direct(worker)), target.submit(Direct(worker))
    if Capability.MOCK_CLOCK in adapter.capabilities:
        target.advance_time(0.5)  # the rest of a split ACK; the wait for a second request
    for request, overloaded, text in (
        (first, False, "first \ufffd"),
        (second, True, "queue \ufffd full"),
    ):
        outcome = finished(target, request, "TRN-038")
        expected = oracle.REJECTION_TYPES[overloaded]
        require(
            "TRN-038",
            refused_before_stream(outcome, expected, text),
            f"worker {worker} wrote the ACKs {TOGETHER} together"
            + ("" if split is None else f", the second cut {split} bytes into its text")
            + f": {request} should fail before the stream with {expected} carrying "
            f"{text!r}; got {outcome}",
        )


# --- TRN-005, TRN-006 ---

PRE_STREAM_CHAINS = [
    ("InvalidArgument",),
    ("Backend(EngineShutdown)",),
    (None, "Disconnected"),
    ("Cancelled",),
    ("ResourceExhausted",),
    ("Backend(Cancelled)",),
    ("WorkerOverloaded", None, "Cancelled"),
    (None,),
]


@covers("TRN-005", "TRN-006")
@requires(Capability.DIRECT, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("labels", PRE_STREAM_CHAINS, ids=lambda c: "-".join(map(str, c)))
def test_a_failure_before_the_first_item_is_cannot_connect(
    target: Target, labels: tuple[str | None, ...]
) -> None:
    worker = target.add_worker()
    target.script_worker(worker, FailBeforeStream(spec_of(labels)))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-005")
    seen = outcome.error
    require("TRN-005", seen is not None and seen.pre_stream, f"expected a failure: {outcome}")
    assert seen is not None
    if seen.types_observed:
        require_false(
            "TRN-006",
            set(seen.typed_chain) & oracle.MIGRATION_SENSITIVE_TYPES,
            f"the worker failed with {labels}; the caller's chain {seen.describe()} carries a "
            "migration-sensitive type",
        )
    expected = oracle.pre_stream_chain(labels)
    require(
        "TRN-005",
        (tuple(label for label, _ in seen.links) == expected or not seen.types_observed)
        and shows(seen, expected)
        and seen.links[0][1].startswith(PRE_STREAM_PREFIX),
        f"the worker failed with {labels}; expected CannotConnect {PRE_STREAM_PREFIX!r}… "
        f"over {expected[1:] or 'no cause'}; got {seen.describe()}",
    )


PROLOGUES = {
    "error-text-only": ('{"error": "prologue-text"}', "prologue-text"),
    "error-and-null-typed": ('{"error": "prologue-text", "typed_error": null}', "prologue-text"),
    "accepting-spelled-otherwise": ('{"typed_error": null, "error": null}', None),
    "accepting-empty": ("{}", None),
}


@covers("TRN-003", "TRN-005")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
@pytest.mark.parametrize("prologue", list(PROLOGUES.values()), ids=list(PROLOGUES))
def test_a_prologue_is_read_by_its_fields(target: Target, prologue: tuple[str, str | None]) -> None:
    """A prologue as another runtime writes it: Dynamo 1.6.1's error text without a typed
    error fails the request before its stream with ``CannotConnect`` carrying the text; a
    prologue naming no error, however spelled, accepts, and the items follow."""
    text, error = prologue
    worker = target.add_worker()
    target.script_worker(worker, WritePrologue(text, items=2))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-005")
    if error is None:
        require(
            "TRN-003",
            outcome.error is None and indices(outcome) == [0, 1],
            f"the prologue {text} names no error: the stream's 2 items should follow",
            expected="items [0, 1], no error",
            actual=outcome,
        )
        return
    seen = outcome.error
    require(
        "TRN-005",
        seen is not None
        and seen.pre_stream
        and not outcome.items
        and shows_outer(seen, "CannotConnect")
        and any(error in message for _, message in seen.links),
        f"the prologue {text} fails the request before its stream",
        expected=f"CannotConnect before the stream, its chain carrying {error!r}",
        actual=seen.describe() if seen else outcome,
    )


@covers("TRN-027", "TRN-022")
@requires(Capability.DIRECT, Capability.WIRE_TRANSPORT, Capability.BIDIRECTIONAL)
def test_a_request_stream_at_another_host_is_never_dialled(target: Target) -> None:
    """A bidirectional request whose response address is the request's peer but whose
    request stream is at another address of this machine: the worker dials only the
    response address, and fails the request there with ``InvalidArgument`` naming the
    request stream's field."""
    worker = target.add_worker()
    with _listener(PEER) as own:
        try:
            other = _listener(OTHER_HOST)
        except OSError:  # no 127.0.0.2 here (not Linux)
            pytest.skip(f"this host has no second loopback address {OTHER_HOST}")
        with other:
            fields = usable_control(f"{PEER}:{own.getsockname()[1]}", "split", many_in=True)
            _put(
                fields,
                (REQUEST_STREAM_FIELD, "info", "address"),
                f"{OTHER_HOST}:{other.getsockname()[1]}",
            )
            target.send_raw(worker, request_message(NO_ENDPOINT, json.dumps(fields).encode(), b""))
            _, prologue = dialled_back(own, "split")
            require(
                "TRN-022",
                names_invalid_argument(prologue, REQUEST_STREAM_FIELD),
                f"worker {worker} should fail the request in its prologue with InvalidArgument "
                f"naming {REQUEST_STREAM_FIELD}; got {prologue!r}",
            )
            require(
                "TRN-027",
                not _was_dialled(other),
                f"worker {worker} dialled the request stream at {OTHER_HOST}, which is not "
                f"the host the request came from ({PEER})",
            )
    serves_again(target, worker, "TRN-027")


@covers("TRN-006")
@requires(
    Capability.DIRECT,
    Capability.SCRIPT_FAILURES,
    Capability.MOCK_CLOCK,
    Capability.OBSERVE_ERROR_TYPES,
)
def test_no_pre_stream_failure_carries_a_sensitive_type(target: Target) -> None:
    """Every chain of one or two links, each link any type or untyped."""
    worker = target.add_worker()
    for labels in itertools.chain(
        ((label,) for label in LABELS), itertools.product(LABELS, repeat=2)
    ):
        target.script_worker(worker, FailBeforeStream(spec_of(labels)))
        outcome = finished(target, target.submit(Direct(worker)), "TRN-006")
        typed = set() if outcome.error is None else set(outcome.error.typed_chain)
        require(
            "TRN-006",
            outcome.error is not None and not typed & oracle.MIGRATION_SENSITIVE_TYPES,
            f"the worker failed with {labels} before the stream; the caller saw {outcome}",
        )


# --- TRN-007 ---


@covers("TRN-007")
@requires(Capability.DIRECT, Capability.SCRIPT_FAILURES, Capability.SCRIPT_STALL)
def test_every_stream_ends_in_completion_or_one_error(target: Target) -> None:
    worker = target.add_worker()
    for items in range(4):
        target.script_worker(worker, Serve(items))
        outcome = finished(target, target.submit(Direct(worker)), "TRN-007")
        require(
            "TRN-007",
            outcome.error is None and indices(outcome) == list(range(items)),
            f"Serve({items}) ended {outcome}",
        )
        target.script_worker(worker, FailMidStream(items, ErrorSpec("InvalidArgument")))
        outcome = finished(target, target.submit(Direct(worker)), "TRN-007")
        ends_with_error(outcome, "TRN-007", "injected", items)
    target.script_worker(worker, Stall(items=1, items_after=2))
    request = target.submit(Direct(worker))
    require_compare("TRN-007", target.outcome(request), "is", None, "a stalled stream ended early")
    target.release_stalled(worker)
    outcome = finished(target, request, "TRN-007")
    require(
        "TRN-007",
        outcome.error is None and indices(outcome) == [0, 1, 2],
        f"a released stall should complete with 3 items: {outcome}",
    )


# --- TRN-008, TRN-009, TRN-010 (wire faults) ---


@covers("TRN-008")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
@pytest.mark.parametrize("items", [0, 2])
def test_end_of_stream_before_final_is_disconnected(target: Target, items: int) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Misbehave(items, WireFault.EOF_BEFORE_FINAL))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-008")
    ends_with_error(outcome, "TRN-008", "Stream ended before generation completed", items)
    require(
        "TRN-008",
        shows_outer(outcome.error, "Disconnected"),
        f"expected Disconnected: {outcome}",
    )


@covers("TRN-009")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
def test_a_frame_after_final_is_an_error_item(target: Target) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Misbehave(2, WireFault.FRAME_AFTER_FINAL))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-009")
    ends_with_error(outcome, "TRN-009", "Response received after generation ended", 2)


@covers("TRN-010")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
@pytest.mark.parametrize(
    ("fault", "message"),
    # The spec fixes the text of the empty-frame item only; any error item will do for garbage.
    [(WireFault.EMPTY_FRAME, "Empty response received"), (WireFault.GARBLED_FRAME, "")],
    ids=["empty", "garbled"],
)
def test_an_empty_or_undecodable_frame_is_an_error_item(
    target: Target, fault: WireFault, message: str
) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Misbehave(1, fault))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-010")
    ends_with_error(outcome, "TRN-010", message, 1)


# --- TRN-007, TRN-010, TRN-012: frames that carry no item (the response side) ---

ANNOTATED_ERROR_EVENT = '{"data": {"event": "error", "comment": ["boom"]}, "complete_final": false}'
NOT_ITEMS = {
    "body-not-a-map": "[1, 2]",
    "data-not-an-annotated-map": '{"data": 5, "complete_final": false}',
    "error-event-without-error": ANNOTATED_ERROR_EVENT,
}


@covers("TRN-010")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
@pytest.mark.parametrize("body", list(NOT_ITEMS.values()), ids=list(NOT_ITEMS))
def test_a_frame_that_is_no_item_is_an_error_item(target: Target, body: str) -> None:
    """A frame body that decodes, but not to a frame map whose data is an ``Annotated`` map,
    and an error event however it is written, are error items, never data."""
    worker = target.add_worker()
    target.script_worker(worker, WriteFrame(1, body=body))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-010")
    require(
        "TRN-010",
        outcome.error is not None and not outcome.error.pre_stream and indices(outcome) == [0],
        f"worker {worker} wrote one item, then the frame body {body}; the caller should see "
        f"the item, then an error item, and no other data: {outcome}",
    )


BROKEN_FRAMES = {
    "control-frame": WriteFrame(1, header=b'"stop"'),
    "header-past-every-limit": WriteFrame(1, header_length=2**40),
}


@covers("TRN-007", "TRN-012")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
@pytest.mark.parametrize("script", list(BROKEN_FRAMES.values()), ids=list(BROKEN_FRAMES))
def test_a_broken_frame_ends_the_stream_with_an_error_item(
    target: Target, script: WriteFrame
) -> None:
    """A control frame from the worker, or a frame prefix declaring a header past every
    limit: the stream cannot go on, and it ends with one error item, not silently."""
    worker = target.add_worker()
    target.script_worker(worker, script)
    outcome = finished(target, target.submit(Direct(worker)), "TRN-007")
    ends_with_error(outcome, "TRN-007", "", 1)
    serves_again(target, worker, "TRN-012")


CUT_FRAMES: dict[str, WorkerScript] = {  # the part the connection ends in, and how
    "two_part": Misbehave(1, WireFault.CUT_IN_PREFIX),  # 10 bytes of its prefix, then the close
    "two_part.header": WriteFrame(1, header_length=4096),
    "two_part.body": WriteFrame(1, body='{"data": {"data": 1}}', body_length=4096),
}


@covers("TRN-007", "TRN-012", "TRN-015", "TRN-041")
@requires(
    Capability.DIRECT,
    Capability.SCRIPT_WIRE_FAULTS,
    Capability.MOCK_CLOCK,
    Capability.OBSERVE_INFLIGHT,
)
@pytest.mark.parametrize("part", list(CUT_FRAMES))
def test_a_frame_cut_short_ends_the_stream_with_an_error_item(target: Target, part: str) -> None:
    """After one item the worker writes a frame prefix declaring a 4 KiB header (or body)
    and sends only the final frame and sentinel behind it, then closes the connection
    (TRN-028: at most 1 s after its sentinel), or it closes the connection 10 bytes into a
    prefix: the caller waits for the rest of the frame while the connection is open, and its
    end inside the frame ends the stream with one error item, which names the part it ended
    in."""
    worker = target.add_worker()
    target.script_worker(worker, CUT_FRAMES[part])
    request = target.submit(Direct(worker))
    target.advance_time(2.0)
    outcome = finished(target, request, "TRN-007")
    ends_with_error(outcome, "TRN-007", "", 1)
    assert outcome.error is not None
    message = outcome.error.links[0][1]
    require(
        "TRN-041",
        names_field(message, part),
        f"worker {worker}'s connection ended inside a frame's "
        f"{part.partition('.')[2] or 'prefix'}: the error item should name {part!r}; it says "
        f"{message!r}",
    )
    require_equal("TRN-015", target.transport_inflight(), 0, "the cut-short stream still counts")
    serves_again(target, worker, "TRN-012")


@covers("TRN-007")
@requires(Capability.DIRECT, Capability.MOCK_CLOCK)
def test_a_stream_larger_than_the_socket_buffers_arrives_whole(target: Target) -> None:
    """40,000 items (megabytes of frames, more than the sockets between worker and caller
    buffer): the worker waits for the caller to read, and every item arrives, in order.
    (On a real clock, ``submit`` may return before so long a stream has ended.)"""
    worker = target.add_worker()
    target.script_worker(worker, Serve(40_000))
    request = target.submit(Direct(worker))
    outcome = finished_after_transfer(target, request, "TRN-007", mock_clock=True)
    require(
        "TRN-007",
        outcome.error is None and indices(outcome) == list(range(40_000)),
        "a 40,000-item stream should arrive whole and in order",
        expected="items 0 .. 39999, no error",
        actual=f"{len(outcome.items)} items, error {outcome.error}",
    )


@covers("TRN-008")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
def test_a_reset_before_final_is_disconnected(target: Target, adapter: Adapter) -> None:
    """The worker's connection ends with a reset (RST) rather than a close, 0.1 s after its
    items were written: the read fails instead of meeting the end of the stream, and that is
    the same end before ``complete_final``."""
    worker = target.add_worker()
    target.script_worker(worker, Misbehave(1, WireFault.RESET_BEFORE_FINAL))
    request = target.submit(Direct(worker))
    if Capability.MOCK_CLOCK in adapter.capabilities:
        target.advance_time(0.1)  # the worker resets the connection 0.1 s after the item
    outcome = finished(target, request, "TRN-008")
    ends_with_error(outcome, "TRN-008", STREAM_ENDED_EARLY, 1)
    require(
        "TRN-008",
        shows_outer(outcome.error, "Disconnected"),
        f"a stream whose connection was reset should end with Disconnected: {outcome}",
    )


@covers("TRN-007", "TRN-042", "TRN-012")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
def test_a_reset_after_the_sentinel_ends_the_stream_cleanly(
    target: Target, adapter: Adapter
) -> None:
    """The worker writes its items, ``complete_final`` and the sentinel, and resets the
    connection (RST) in the same step: the stream completes with its items, the caller lets
    go of the connection (a release it tries meets the reset), and the worker's next request
    is served."""
    worker = target.add_worker()
    target.script_worker(worker, Misbehave(2, WireFault.RESET_AFTER_SENTINEL))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-007")
    completes_with_two_items(outcome, "TRN-007", "complete_final and the sentinel, then a reset")
    if {Capability.RESPONSE_REUSE, Capability.MOCK_CLOCK} <= adapter.capabilities:
        target.advance_time(1.0)
        held = target.response_connections()
        require(
            "TRN-042",
            held == 0,
            f"worker {worker} reset its response connection after the sentinel 1 s ago; the "
            f"caller still holds {held} response connections",
        )
    serves_again(target, worker, "TRN-012")


@covers("TRN-007", "TRN-029")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
def test_a_late_sentinel_ends_the_stream_cleanly(target: Target, adapter: Adapter) -> None:
    """``complete_final`` alone, the sentinel 0.1 s later: the stream completes with its
    items, and (where the target reuses response connections) the caller still releases the
    connection it read to that sentinel."""
    worker = target.add_worker()
    target.script_worker(worker, Misbehave(2, WireFault.LATE_SENTINEL))
    request = target.submit(Direct(worker))
    if Capability.MOCK_CLOCK in adapter.capabilities:
        target.advance_time(0.1)  # the worker sends the sentinel 0.1 s after complete_final
    outcome = finished(target, request, "TRN-007")
    completes_with_two_items(outcome, "TRN-007", "complete_final, then the sentinel 0.1 s later")
    if Capability.RESPONSE_REUSE in adapter.capabilities:
        serves_again(target, worker, "TRN-029")
        require_equal(
            "TRN-029",
            target.reused_streams(worker),
            1,
            f"the caller read worker {worker}'s stream to its late sentinel; it should have "
            "released the connection, and the next stream been written on it",
        )


@covers("TRN-046", "TRN-042")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS, Capability.OBSERVE_CONTROL_MESSAGE)
def test_a_connection_written_past_its_sentinel_is_closed_unreleased(
    target: Target, adapter: Adapter
) -> None:
    """The worker writes two items, ``complete_final``, the sentinel and a data frame after
    it in one write, then reads what the caller writes: the stream completes with its two
    items, and the caller writes nothing more on the connection (no ``reuse``) and lets go
    of it; the worker's next request is served."""
    worker = target.add_worker()
    target.script_worker(worker, Misbehave(2, WireFault.FRAME_AFTER_SENTINEL))
    request = target.submit(Direct(worker))
    outcome = finished(target, request, "TRN-046")
    completes_with_two_items(outcome, "TRN-046", "complete_final and the sentinel, then a frame")
    words = list(target.control_words(request))
    require_equal(
        "TRN-046",
        words,
        [],
        f"worker {worker} wrote a frame after its sentinel; the caller should write nothing "
        f"more on that connection, it wrote the control words {words}",
    )
    if {Capability.OBSERVE_INFLIGHT, Capability.MOCK_CLOCK} <= adapter.capabilities:
        target.advance_time(1.0)  # the worker has closed the connection by then
        held = target.response_connections()
        require(
            "TRN-042",
            held == 0,
            f"worker {worker} wrote past its sentinel and closed the connection; the caller "
            f"still holds {held} response connections",
        )
    serves_again(target, worker, "TRN-046")


# --- TRN-011 ---

ITEM_CHAINS = [
    ("Backend(EngineShutdown)",),
    ("Disconnected", None, "Backend(StreamIncomplete)"),
    ("WorkerOverloaded", "ResourceExhausted"),
    (None, "Cancelled"),
    ("Unknown",),
    ("InvalidArgument", "Backend(InvalidArgument)", "Unavailable", "WorkerUnavailable"),
]


@covers("TRN-011")
@requires(Capability.DIRECT, Capability.SCRIPT_FAILURES, Capability.OBSERVE_ERROR_TYPES)
@pytest.mark.parametrize("labels", ITEM_CHAINS, ids=lambda c: "-".join(map(str, c)))
def test_error_items_keep_their_chain(target: Target, labels: tuple[str | None, ...]) -> None:
    worker = target.add_worker()
    target.script_worker(worker, FailMidStream(1, spec_of(labels)))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-011")
    expected = tuple((label, f"link {depth}") for depth, label in enumerate(labels))
    require(
        "TRN-011",
        outcome.error is not None and outcome.error.links == expected,
        f"the worker's error item {expected} reached the caller as "
        f"{outcome.error.describe() if outcome.error else outcome}",
    )


@covers("TRN-011")
@requires(Capability.DIRECT, Capability.SCRIPT_FAILURES, Capability.OBSERVE_ERROR_TYPES)
@pytest.mark.parametrize("length", [oracle.MAX_CHAIN_LINKS, oracle.MAX_CHAIN_LINKS + 6])
def test_a_long_error_chain_keeps_its_first_64_links(target: Target, length: int) -> None:
    """A worker's error item nested ``length`` links deep (``caused_by`` in ``caused_by``
    on the wire): the caller reads its links to the 64th, none lost on the way (ERR-010)."""
    labels = tuple(LABELS[depth % len(LABELS)] for depth in range(length))
    worker = target.add_worker()
    target.script_worker(worker, FailMidStream(1, spec_of(labels)))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-011")
    kept = min(length, oracle.MAX_CHAIN_LINKS)
    expected = tuple((label, f"link {depth}") for depth, label in enumerate(labels[:kept]))
    error = outcome.error
    require(
        "TRN-011",
        error is not None and error.links == expected,
        f"worker {worker}'s error item of {length} links should reach the caller with its "
        f"first {kept} links; the caller saw "
        + (f"{len(error.links)} links: {error.describe()}" if error else str(outcome)),
    )


# --- TRN-012 ---

PREFIXES = [
    struct.pack(">H", 0xFFFF),  # a path length with nothing behind it
    struct.pack(">H", 1) + b"p" + struct.pack(">H", 2) + b"{}" + struct.pack(">I", 0xFFFFFFFF),
    struct.pack(">QQQ", 2**63, 2**63, 0),  # a two-part message declaring exabytes
]
raw_bytes = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda p, tail: p + tail, st.sampled_from(PREFIXES), st.binary(max_size=64)),
)


@covers("TRN-012")
@requires(Capability.DIRECT, Capability.WIRE_TRANSPORT)
@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=raw_bytes, to_worker=st.booleans())
@example(data=b"", to_worker=True)  # pinned: the declared lengths past every limit, both ports
@example(data=PREFIXES[0], to_worker=True)
@example(data=PREFIXES[1], to_worker=True)
@example(data=PREFIXES[2], to_worker=True)
@example(data=PREFIXES[2], to_worker=False)
@example(data=b"\xff" * 300, to_worker=False)
def test_bad_bytes_close_only_their_connection(
    target: Target, data: bytes, to_worker: bool
) -> None:
    workers = [d.worker_id for d in target.dispatch_log()]
    worker = workers[0] if workers else target.add_worker()
    target.send_raw(worker if to_worker else None, data)
    serves_again(target, worker, "TRN-012")


# --- TRN-013, TRN-014 ---


@covers("TRN-013")
@requires(
    Capability.DIRECT,
    Capability.ANNOUNCE_REMOVAL,
    Capability.OBSERVE_WORKER_BYTES,
)
def test_a_tombstoned_instance_is_never_written_to(target: Target) -> None:
    worker = target.add_worker()
    target.announce_removal(worker, False)  # an addition of one never removed changes nothing
    serves_again(target, worker, "TRN-013")
    target.announce_removal(worker, True)
    refused_as_tombstoned(target, worker)
    target.announce_removal(worker, False)
    serves_again(target, worker, "TRN-013")


def refused_as_tombstoned(target: Target, worker: int) -> None:
    before = target.worker_bytes(worker)
    outcome = finished(target, target.submit(Direct(worker)), "TRN-013")
    require(
        "TRN-013",
        outcome.error is not None
        and outcome.error.pre_stream
        and shows_outer(outcome.error, "Disconnected")
        and "tombstoned" in outcome.error.links[0][1],
        f"a dispatch to tombstoned worker {worker} should fail with Disconnected: {outcome}",
    )
    require_equal(
        "TRN-013",
        target.worker_bytes(worker),
        before,
        f"tombstoned worker {worker} received {target.worker_bytes(worker) - before} bytes",
    )


TOMBSTONE_LIFETIME = 5.0


@covers("TRN-013")
@requires(
    Capability.DIRECT,
    Capability.ANNOUNCE_REMOVAL,
    Capability.OBSERVE_WORKER_BYTES,
    Capability.MOCK_CLOCK,
)
@pytest.mark.parametrize("elapsed", [TOMBSTONE_LIFETIME - 0.1, TOMBSTONE_LIFETIME])
def test_a_tombstone_lasts_five_seconds(target: Target, elapsed: float) -> None:
    """A removed instance the router still lists is refused for 5 s after the report, and
    from the 5th second on is written to as any instance, from the first dispatch."""
    worker = target.add_worker()
    target.announce_removal(worker, True)
    target.advance_time(elapsed)
    if elapsed < TOMBSTONE_LIFETIME:
        refused_as_tombstoned(target, worker)
    else:
        serves_again(target, worker, "TRN-013")


@covers("TRN-014")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS)
@pytest.mark.parametrize(
    "how",
    [
        pytest.param("removed", marks=pytest.mark.requires(Capability.ANNOUNCE_REMOVAL)),
        pytest.param("killed", marks=pytest.mark.requires(Capability.KILL_WORKER)),
    ],
)
def test_removal_fails_pending_registrations(target: Target, how: str) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Misbehave(0, WireFault.NO_CALL_HOME))
    request = target.submit(Direct(worker))
    require_compare(
        "TRN-014", target.outcome(request), "is", None, "the request ended before the test"
    )
    if how == "removed":
        target.announce_removal(worker, True)
    else:
        target.kill_worker(worker)
    outcome = finished(target, request, "TRN-014")
    require(
        "TRN-014",
        outcome.error is not None
        and outcome.error.pre_stream
        and shows_outer(outcome.error, "Disconnected")
        and "before response stream was established" in outcome.error.links[0][1],
        f"a request waiting for worker {worker}'s stream should fail with Disconnected when "
        f"the worker is {how}: {outcome}",
    )


# --- TRN-033 ---


@covers("TRN-033", "TRN-015")
@requires(Capability.DIRECT, Capability.SCRIPT_SILENCE, Capability.KILL_WORKER)
@pytest.mark.parametrize(
    "stage",
    [
        # On a real clock, ``submit`` of a request nothing answers may wait out its deadline.
        pytest.param(SilentStage.ACK, marks=pytest.mark.requires(Capability.MOCK_CLOCK)),
        SilentStage.HANDSHAKE,
    ],
    ids=lambda stage: stage.value,
)
def test_a_worker_lost_before_its_stream_began_fails_the_request_disconnected(
    target: Target, adapter: Adapter, stage: SilentStage
) -> None:
    """The worker read the request and never ACKed it, or dialled back and never sent the
    prologue; then it dies. No deadline has to fire: the connection's end fails the request
    before any stream with ``Disconnected``, and nothing stays counted in flight. A request
    behind it on the same connection fails the same way."""
    worker = target.add_worker()
    target.script_worker(worker, Silent(stage))
    requests = [target.submit(Direct(worker))]
    if stage is SilentStage.ACK:
        requests.append(target.submit(Direct(worker)))  # queued behind it, unanswered
    for request in requests:
        require_compare(
            "TRN-033", target.outcome(request), "is", None, f"{request} ended before the kill"
        )
    target.kill_worker(worker)
    for request in requests:
        outcome = finished(target, request, "TRN-033")
        require(
            "TRN-033",
            outcome.error is not None
            and outcome.error.pre_stream
            and shows_outer(outcome.error, "Disconnected")
            and not outcome.items,
            f"worker {worker} died silent at the {stage.value} stage: {request} should fail "
            "before any stream with Disconnected",
            expected="Disconnected before the stream, no items",
            actual=outcome.error.describe() if outcome.error else outcome,
        )
    if Capability.OBSERVE_INFLIGHT in adapter.capabilities:
        require_equal(
            "TRN-015",
            target.transport_inflight(),
            0,
            f"requests failed by worker {worker}'s death at the {stage.value} stage still "
            "count in flight",
        )


# --- TRN-015, TRN-016, TRN-017 ---


@covers("TRN-015")
@requires(
    Capability.DIRECT,
    Capability.OBSERVE_INFLIGHT,
    Capability.SCRIPT_FAILURES,
    Capability.SCRIPT_STALL,
    Capability.SCRIPT_REJECTION,
    Capability.KILL_WORKER,
)
def test_the_inflight_gauge_returns_to_zero_on_every_path(target: Target) -> None:
    worker, spare = target.add_worker(), target.add_worker()
    paths: dict[str, WorkerScript] = {
        "completion": Serve(2),
        "an error item": FailMidStream(1, ErrorSpec("InvalidArgument")),
        "a pre-stream failure": FailBeforeStream(ErrorSpec("InvalidArgument")),
        "a rejection": Reject(overloaded=False),
    }
    for path, script in paths.items():
        target.script_worker(spare, script)
        finished(target, target.submit(Direct(spare)), "TRN-015")
        require_equal("TRN-015", target.transport_inflight(), 0, f"after {path}: gauge not zero")
    target.script_worker(worker, Stall(items=1))
    dropped, killed = target.submit(Direct(worker)), target.submit(Direct(worker))
    require_equal("TRN-015", target.transport_inflight(), 2, "two open streams should count 2")
    target.drop(dropped)
    require_equal("TRN-015", target.transport_inflight(), 1, "a dropped stream still counts")
    target.kill_worker(worker)
    finished(target, killed, "TRN-015")
    require_equal(
        "TRN-015", target.transport_inflight(), 0, "a killed worker's stream still counts"
    )


@covers("TRN-016")
@requires(Capability.DIRECT, Capability.SCRIPT_STALL, Capability.KILL_WORKER)
def test_a_killed_worker_is_detected_without_a_timeout(target: Target) -> None:
    """No time passes (the mock clock is never advanced): the connection's end is the signal."""
    worker = target.add_worker()
    target.script_worker(worker, Stall(items=2))
    request = target.submit(Direct(worker))
    target.kill_worker(worker)
    outcome = finished(target, request, "TRN-016")
    ends_with_error(outcome, "TRN-016", "", 2)
    require(
        "TRN-016",
        shows_outer(outcome.error, "Disconnected"),
        f"a killed worker's stream should end with Disconnected: {outcome}",
    )


@covers("TRN-016")
@requires(Capability.DIRECT, Capability.KILL_WORKER_PROCESS)
def test_a_killed_worker_process_is_detected_without_a_timeout(
    target: Target, adapter: Adapter
) -> None:
    """The worker is a separate OS process killed with SIGKILL: nothing in it runs to say
    goodbye, and the mock clock is never advanced; the kernel closing its sockets is the signal."""
    worker = target.add_worker_process(Stall(items=2))
    request = target.submit(Direct(worker))
    require_compare(
        "TRN-016",
        target.outcome(request),
        "is",
        None,
        f"the stalled stream ended before the kill: {target.outcome(request)}",
    )
    target.kill_worker(worker)
    outcome = finished(target, request, "TRN-016")
    ends_with_error(outcome, "TRN-016", STREAM_ENDED_EARLY, 2)
    require(
        "TRN-016",
        shows_outer(outcome.error, "Disconnected"),
        f"a killed worker process's stream should end with Disconnected: {outcome}",
    )
    if Capability.OBSERVE_INFLIGHT in adapter.capabilities:
        require_equal(
            "TRN-016",
            target.transport_inflight(),
            0,
            "the killed worker process's stream is still counted in flight",
        )


def dropped_after_one_item(target: Target, request: str) -> None:
    outcome = finished(target, request, "TRN-017")
    require(
        "TRN-017",
        outcome.dropped and outcome.error is None and indices(outcome) == [0],
        f"a dropped stream should end for the caller without an error: {outcome}",
    )


@covers("TRN-017")
@requires(Capability.DIRECT, Capability.SCRIPT_STALL)
def test_a_dropped_stream_stops_the_worker(target: Target, adapter: Adapter) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Stall(items=1, items_after=3))
    request = target.submit(Direct(worker))
    target.drop(request)
    target.release_stalled(worker)
    dropped_after_one_item(target, request)
    if Capability.OBSERVE_INFLIGHT in adapter.capabilities:
        require_equal(
            "TRN-017",
            target.transport_inflight(),
            0,
            "the dropped stream is still in flight after the worker was released",
        )
    serves_again(target, worker, "TRN-017")


@covers("TRN-017")
@requires(Capability.DIRECT, Capability.SCRIPT_WIRE_FAULTS, Capability.OBSERVE_CONTROL_MESSAGE)
def test_a_dropped_stream_is_killed_on_the_wire(target: Target) -> None:
    """The worker writes one item, then reads what the caller writes on the stream; the
    caller drops the stream: the worker reads the header-only control word ``kill`` and
    nothing else."""
    worker = target.add_worker()
    target.script_worker(worker, Misbehave(1, WireFault.LISTEN))
    request = target.submit(Direct(worker))
    target.drop(request)
    dropped_after_one_item(target, request)
    words = list(target.control_words(request))
    require_equal(
        "TRN-017",
        words,
        ["kill"],
        f"the caller dropped worker {worker}'s open stream; the worker should read the "
        f"control word kill on it, it read {words}",
    )


# --- TRN-018, TRN-019 ---

RETAINED_LIMIT = 1024


@covers("TRN-018")
@requires(
    Capability.DIRECT,
    Capability.FIRST_RESPONSE_GUARD,
    Capability.SCRIPT_STALL,
    Capability.SCRIPT_FAILURES,
)
def test_the_guard_is_held_until_the_first_item(target: Target) -> None:
    worker = target.add_worker()
    target.script_worker(worker, Stall(items=0, items_after=2))
    request = target.submit(Direct(worker), guarded=True)
    require_equal("TRN-018", target.held_guards(), 1, "the guard was released before any item")
    target.drop(request)
    require_equal(
        "TRN-018",
        target.held_guards(),
        1,
        "the caller abandoned the request and the guard was released before the first item",
    )
    target.release_stalled(worker)
    require_equal("TRN-018", target.held_guards(), 0, "the first item came; the guard is held")
    outcome = finished(target, request, "TRN-018")
    require("TRN-018", outcome.dropped and not outcome.items, f"dropped request: {outcome}")
    for script in (Serve(3), FailBeforeStream(ErrorSpec("InvalidArgument")), Serve(0)):
        target.script_worker(worker, script)
        outcome = finished(target, target.submit(Direct(worker), guarded=True), "TRN-018")
        require(
            "TRN-018",
            target.held_guards() == 0 and len(outcome.items) == getattr(script, "items", 0),
            f"after a guarded request under {script} ended ({outcome}), "
            f"{target.held_guards()} guards are held",
        )


@covers("TRN-018")
@requires(Capability.DIRECT, Capability.FIRST_RESPONSE_GUARD, Capability.SCRIPT_STALL)
@pytest.mark.parametrize("first_items", [1, 3])
def test_the_guard_is_gone_once_the_first_item_is_received(
    target: Target, first_items: int
) -> None:
    """Observed while the stream is still open (its worker stalls after ``first_items``): a
    guard kept to the stream's end, rather than let go at its first item, shows here."""
    worker = target.add_worker()
    target.script_worker(worker, Stall(items=first_items))
    request = target.submit(Direct(worker), guarded=True)
    require_compare("TRN-018", target.outcome(request), "is", None, "the stream ended early")
    require_equal(
        "TRN-018",
        target.held_guards(),
        0,
        f"the caller has received {first_items} item(s) of a stream still open: the guard "
        "should be released at the first",
    )
    target.release_stalled(worker)
    outcome = finished(target, request, "TRN-018")
    require(
        "TRN-018",
        outcome.error is None and len(outcome.items) == first_items + 1,
        f"expected {first_items + 1} items and a clean end; got {outcome}",
    )
    require_equal("TRN-018", target.held_guards(), 0, "a guard is held after the stream ended")


@covers("TRN-015", "TRN-018")
@requires(
    Capability.DIRECT,
    Capability.FIRST_RESPONSE_GUARD,
    Capability.SCRIPT_STALL,
    Capability.OBSERVE_INFLIGHT,
)
def test_a_guarded_request_dropped_before_its_first_item_leaves_nothing_in_flight(
    target: Target,
) -> None:
    """The cancellation path before the stream's first item, for a dispatch that outlives
    its caller (TRN-018): once the worker's first item comes, the guard is released and the
    dispatch nobody reads any more is no longer counted in flight."""
    worker = target.add_worker()
    target.script_worker(worker, Stall(items=0, items_after=2))
    request = target.submit(Direct(worker), guarded=True)
    target.drop(request)
    require(
        "TRN-018",
        target.held_guards() == 1 and target.transport_inflight() == 1,
        f"the caller dropped its guarded request to worker {worker} before the first item: "
        f"the dispatch should go on, guarded and in flight; guards {target.held_guards()}, "
        f"inflight {target.transport_inflight()}",
    )
    target.release_stalled(worker)
    require_equal(
        "TRN-018",
        target.held_guards(),
        0,
        f"worker {worker}'s first item came; the dropped request's guard should be released",
    )
    require_equal(
        "TRN-015",
        target.transport_inflight(),
        0,
        f"worker {worker}'s first item came for a request its caller had dropped; the "
        "dispatch nobody reads is still counted in flight",
    )
    outcome = finished(target, request, "TRN-018")
    require("TRN-018", outcome.dropped and not outcome.items, f"dropped request: {outcome}")
    serves_again(target, worker, "TRN-015")


ENDED_AS: Mapping[str, Callable[[Outcome], bool]] = {
    "served": lambda outcome: outcome.error is None and not outcome.dropped,
    "worker-killed": lambda outcome: outcome.error is not None,
    "callers-dropped": lambda outcome: outcome.dropped,
}


@covers("TRN-019")
@requires(Capability.DIRECT, Capability.FIRST_RESPONSE_GUARD, Capability.SCRIPT_STALL)
@pytest.mark.parametrize(
    "ending",
    [
        "served",
        pytest.param("worker-killed", marks=pytest.mark.requires(Capability.KILL_WORKER)),
        "callers-dropped",
    ],
)
def test_retained_dispatches_are_bounded(target: Target, ending: str) -> None:
    """The bound's slots come back however the retained dispatches end: served, failed (their
    worker killed before the first item), or left by their callers and then served."""
    worker = target.add_worker()
    target.script_worker(worker, Stall(items=0, items_after=1))
    retained = [target.submit(Direct(worker), guarded=True) for _ in range(RETAINED_LIMIT)]
    require_equal(
        "TRN-019",
        target.held_guards(),
        RETAINED_LIMIT,
        f"{RETAINED_LIMIT} stalled guarded requests hold {target.held_guards()} guards",
    )
    outcome = finished(target, target.submit(Direct(worker), guarded=True), "TRN-019")
    require(
        "TRN-019",
        outcome.error is not None
        and outcome.error.pre_stream
        and shows(outcome.error, ("ResourceExhausted",))
        and "retained request dispatch limit reached" in outcome.error.links[0][1],
        f"guarded request {RETAINED_LIMIT + 1} should fail with ResourceExhausted: {outcome}",
    )
    require_equal("TRN-019", target.held_guards(), RETAINED_LIMIT, "the refused guard is held")
    if ending == "worker-killed":
        target.kill_worker(worker)
        worker = target.add_worker()
    else:
        if ending == "callers-dropped":
            for request in retained:
                target.drop(request)
        target.release_stalled(worker)
    ended = [target.outcome(request) for request in retained]
    require(
        "TRN-019",
        target.held_guards() == 0 and all(o is not None and ENDED_AS[ending](o) for o in ended),
        f"{ending}: {target.held_guards()} guards held; {sum(o is None for o in ended)} "
        f"requests still open; ended {[o for o in ended if o is not None][:1]}",
    )
    target.script_worker(worker, Serve(1))
    outcome = finished(target, target.submit(Direct(worker), guarded=True), "TRN-019")
    require_compare(
        "TRN-019",
        outcome.error,
        "is",
        None,
        f"{ending}: the retained dispatches ended but the bound did not free their slots: "
        f"{outcome}",
    )


@covers("TRN-019")
@requires(
    Capability.DIRECT,
    Capability.FIRST_RESPONSE_GUARD,
    Capability.SCRIPT_STALL,
    Capability.SCRIPT_FAILURES,
)
def test_a_retained_dispatch_that_fails_before_its_stream_frees_its_slot(target: Target) -> None:
    """One slot short of the bound, a guarded dispatch fails before its stream: its slot must
    come back at once, so the next guarded dispatch is still retained, and only the one after
    it is refused."""
    stalled, failing = target.add_worker(), target.add_worker()
    target.script_worker(stalled, Stall(items=0, items_after=1))
    target.script_worker(failing, FailBeforeStream(ErrorSpec("InvalidArgument")))
    for _ in range(RETAINED_LIMIT - 1):
        target.submit(Direct(stalled), guarded=True)
    failed = finished(target, target.submit(Direct(failing), guarded=True), "TRN-019")
    if failed.error is None or not failed.error.pre_stream:
        pytest.fail(f"setup: worker {failing} should fail before the stream: {failed}")
    last = target.submit(Direct(stalled), guarded=True)
    require(
        "TRN-019",
        target.outcome(last) is None and target.held_guards() == RETAINED_LIMIT,
        f"{RETAINED_LIMIT - 1} dispatches are retained and one failed before its stream, so "
        f"one slot is free; the next guarded dispatch ended {target.outcome(last)} with "
        f"{target.held_guards()} guards held",
    )
    refused = finished(target, target.submit(Direct(stalled), guarded=True), "TRN-019")
    require(
        "TRN-019",
        shows(refused.error, ("ResourceExhausted",)),
        f"with {RETAINED_LIMIT} retained, the next guarded dispatch should be refused: {refused}",
    )
    target.release_stalled(stalled)
    require_equal("TRN-019", target.held_guards(), 0, "guards held after every stream ended")


# --- TRN-020, TRN-021 ---


@covers("TRN-020")
@requires(Capability.BIDIRECTIONAL, Capability.ROUND_ROBIN, Capability.RANDOM)
@pytest.mark.parametrize("mode", ["round-robin", "random"])
@pytest.mark.parametrize("inputs", [0, 1, 4])
def test_a_bidirectional_request_streams_its_items_to_one_worker(
    target: Target, mode: str, inputs: int
) -> None:
    workers = [target.add_worker() for _ in range(3)]
    for worker in workers:
        target.script_worker(worker, Serve(2))
    request = target.submit(Bidirectional(mode, inputs))
    outcome = finished(target, request, "TRN-020")
    delivered = reached(target, request)
    require_equal("TRN-020", len(delivered), 1, f"the request reached {delivered}, not one worker")
    echoed = [i.get("input") for i in outcome.items if isinstance(i, dict) and "input" in i]
    answering = {i.get("worker") for i in outcome.items if isinstance(i, dict)}
    require(
        "TRN-020",
        outcome.error is None
        and echoed == list(range(inputs))
        and indices(outcome)[inputs:] == [0, 1]
        and answering <= set(delivered),
        f"worker {delivered} should have received inputs 0..{inputs - 1} in order and answered "
        f"them, then its 2 items; the caller saw {outcome}",
    )


@covers("TRN-042", "TRN-020")
@requires(
    Capability.BIDIRECTIONAL,
    Capability.ROUND_ROBIN,
    Capability.WIRE_TRANSPORT,
    Capability.OBSERVE_INFLIGHT,
    Capability.MOCK_CLOCK,
)
@pytest.mark.parametrize(
    "ended_by",
    ["drop", pytest.param("kill", marks=pytest.mark.requires(Capability.KILL_WORKER))],
)
def test_a_bidirectional_request_ended_with_inputs_pending_holds_nothing(
    target: Target, ended_by: str
) -> None:
    """The caller has streamed two inputs and its next one is still pending when the
    request ends — the caller drops it, or its worker dies: within a second the caller
    holds neither of its connections, the request stream's included, and counts nothing in
    flight."""
    worker = target.add_worker()
    target.script_worker(worker, Serve(1))
    request = target.submit(Bidirectional("round-robin", 2, more=True))
    require_compare(
        "TRN-020", target.outcome(request), "is", None, "the request ended before its inputs"
    )
    if ended_by == "drop":
        target.drop(request)
    else:
        target.kill_worker(worker)
    target.advance_time(1.0)
    outcome = finished(target, request, "TRN-020")
    echoed = [i.get("input") for i in outcome.items if isinstance(i, dict) and "input" in i]
    require_equal("TRN-020", echoed, [0, 1], f"worker {worker} did not answer both inputs")
    held, inflight = target.response_connections(), target.transport_inflight()
    require(
        "TRN-042",
        held == 0 and inflight == 0,
        f"a bidirectional request whose next input was pending ended ({ended_by}) 1 s ago; "
        f"the caller still holds {held} response connections and counts {inflight} "
        f"dispatches in flight",
    )


@covers("TRN-042", "TRN-015")
@requires(
    Capability.BIDIRECTIONAL,
    Capability.ROUND_ROBIN,
    Capability.WIRE_TRANSPORT,
    Capability.OBSERVE_INFLIGHT,
    Capability.SCRIPT_SILENCE,
)
def test_a_bidirectional_dispatch_dropped_before_its_ack_holds_nothing(
    target: Target, adapter: Adapter
) -> None:
    """The worker dials back both of a bidirectional request's streams and introduces them
    while its ACK has not come (as a worker whose ACK is still queued does); the caller
    drops the request there: within a second it holds neither connection, and it counts
    nothing in flight."""
    worker = target.add_worker()
    target.script_worker(worker, Silent(SilentStage.DIAL_BEFORE_ACK))
    request = target.submit(Bidirectional("round-robin", 1, more=True))
    target.drop(request)
    finished(target, request, "TRN-042")
    if Capability.MOCK_CLOCK in adapter.capabilities:
        target.advance_time(1.0)
    held, inflight = target.response_connections(), target.transport_inflight()
    require(
        "TRN-042",
        held == 0,
        f"the caller dropped a bidirectional request whose two streams worker {worker} had "
        f"dialled before its ACK; the caller still holds {held} response connections",
    )
    require_equal("TRN-015", inflight, 0, "the dropped dispatch is still counted in flight")
    target.release_stalled(worker)


@covers("TRN-021")
@requires(Capability.BIDIRECTIONAL)
@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(mode, marks=pytest.mark.requires(MODE_CAPABILITY[mode]), id=mode)
        for mode in ("power-of-two-choices", "least-loaded", "device-aware-weighted")
    ],
)
def test_bidirectional_dispatch_refuses_other_modes(target: Target, mode: str) -> None:
    target.add_worker()
    request = target.submit(Bidirectional(mode, 2))
    outcome = finished(target, request, "TRN-021")
    require(
        "TRN-021",
        outcome.error is not None
        and outcome.error.pre_stream
        and shows(outcome.error, ("InvalidArgument",))
        and "not yet supported for bidirectional dispatch" in outcome.error.links[0][1]
        and not reached(target, request),
        f"a streamed request in mode {mode} should be refused with InvalidArgument before "
        f"reaching a worker; got {outcome}",
    )


# --- TRN-022, TRN-023, TRN-027: requests a worker cannot use ---
#
# The control message's schema (TRN-001; Dynamo 1.6.1's ``RequestControlMessage``): each
# field's kind, whether it must be present, and the values it allows. The checks draw the
# unusable values from it, by kind, rather than from a list of known inputs. A request goes to
# an endpoint no worker serves: the answer to an unusable request must not depend on it.

NO_ENDPOINT = "routespec/conformance/no-such-endpoint"
PEER = "127.0.0.1"  # where ``send_raw`` connects from: where a worker may dial back
OTHER_HOST = "127.0.0.2"  # this machine too, but not the request's peer (TRN-027)
DIAL_WAIT = 10.0  # real seconds a check waits for a worker to dial back
FRAME_LIMIT = 1 << 20
PORT = re.compile(r"[0-9]{1,5}")
NAME_LIKE = re.compile(r"[A-Za-z0-9.-]+")  # might name a host that resolves to the peer


@dataclasses.dataclass(frozen=True)
class Field:
    kind: str  # string | enum | address | json-object | object | string-map | request-id
    required: bool = True
    allowed: tuple[str, ...] = ()
    fields: Mapping[str, Field] = dataclasses.field(default_factory=dict)
    to_dial: bool = True  # needed to dial the stream back: a fault in the response stream's
    # is refused at the ACK (TRN-022); other faults fail the request in its prologue


def stream_connection(stream_type: str) -> dict[str, Field]:
    info = {
        "address": Field("address"),
        "subject": Field("string"),
        "context": Field("request-id", to_dial=False),  # the request's ``id``
        "stream_type": Field("enum", allowed=(stream_type,), to_dial=False),
    }
    return {
        "transport": Field("enum", allowed=("tcp_server",)),
        "info": Field("json-object", fields=info),
    }


RESPONSE_FIELD, REQUEST_STREAM_FIELD = "connection_info", "request_stream_connection_info"
CONTROL_SCHEMA = {  # Dynamo 1.6.1 requires all but two (probe_control_fields.py)
    "id": Field("string"),
    "request_type": Field("enum", allowed=("single_in", "many_in")),
    "response_type": Field("enum", allowed=("single_out", "many_out")),  # both: many items
    "payload_codec": Field("enum", required=False, allowed=("msgpack", "json")),  # absent: json
    RESPONSE_FIELD: Field("object", fields=stream_connection(STREAM_TYPES[RESPONSE_FIELD])),
    "metadata": Field("string-map", required=False),  # absent: none
    REQUEST_STREAM_FIELD: Field(  # many_in only
        "object", fields=stream_connection(STREAM_TYPES[REQUEST_STREAM_FIELD])
    ),
}
MISSING = "<missing>"  # as a drawn value: the field is left out
NOT_THE_ID = "not-the-id:"  # starts a context that is not the request's id


@dataclasses.dataclass(frozen=True)
class BadAddress:
    """An unusable ``host:port``: ``port`` None stands for the check's own (usable) port."""

    host: str
    port: str | None = None
    text: str | None = None  # the whole value, when it is not host:port at all

    def render(self, port: int) -> str:
        if self.text is not None:
            return self.text
        return f"{self.host}:{port if self.port is None else self.port}"


@dataclasses.dataclass(frozen=True)
class Unusable:
    """A control message with one unusable value at ``path`` (``MISSING``: left out). The
    worker's error names ``field``; ``at_ack`` when no usable response address remains."""

    path: tuple[str, ...]
    value: object
    many_in: bool
    field: str
    at_ack: bool

    def __repr__(self) -> str:
        value = repr(self.value)
        shown = value if len(value) <= 80 else f"{value[:60]}… ({len(value)} characters)"
        return f"Unusable({self.field} = {shown}{', many_in' if self.many_in else ''})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # Hypothesis's reports
        printer.text(repr(self))

    def control(self, port: int, subject: str) -> bytes:
        fields = usable_control(f"{PEER}:{port}", subject, many_in=self.many_in)
        value = self.value.render(port) if isinstance(self.value, BadAddress) else self.value
        _put(fields, self.path, value)
        return json.dumps(fields).encode()


def usable_control(address: str, subject: str, *, many_in: bool = False) -> dict[str, object]:
    """A control message for request ``subject`` (its id, and its streams' context) whose
    streams are at ``address``."""

    def connection(stream_subject: str, name: str) -> dict[str, object]:
        info = {
            "address": address,
            "subject": stream_subject,
            "context": subject,
            "stream_type": STREAM_TYPES[name],
        }
        return {"transport": "tcp_server", "info": json.dumps(info)}

    fields: dict[str, object] = {
        "id": subject,
        "request_type": "many_in" if many_in else "single_in",
        "response_type": "many_out",
        "payload_codec": "json",
        RESPONSE_FIELD: connection(subject, RESPONSE_FIELD),
        "metadata": {"trace": subject},
    }
    if many_in:
        fields[REQUEST_STREAM_FIELD] = connection(f"{subject}-in", REQUEST_STREAM_FIELD)
    return fields


def _put(container: dict[str, object], path: tuple[str, ...], value: object) -> None:
    key, rest = path[0], path[1:]
    if not rest:
        if value == MISSING:
            container.pop(key, None)
        else:
            container[key] = value
        return
    inner = container[key]
    if isinstance(inner, str):  # a JSON object carried as a string (``info``)
        decoded = json.loads(inner)
        _put(decoded, rest, value)
        container[key] = json.dumps(decoded)
    else:
        assert isinstance(inner, dict)
        _put(inner, rest, value)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _may_be_the_peer(host: str) -> bool:
    """A host name (it may resolve to the peer) or the peer's own address in any spelling."""
    if NAME_LIKE.fullmatch(host):
        return True
    try:
        ip = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip) == PEER


any_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)
not_a_string = any_json.filter(lambda value: not isinstance(value, str))
not_an_object = any_json.filter(lambda value: not isinstance(value, dict))
not_unicode = st.builds(  # a lone surrogate: JSON can escape it, no UTF-8 codec can send it
    # one only: a high surrogate followed by a low one is a valid pair once JSON-decoded
    str.__add__,
    st.text(max_size=4),
    st.characters(categories=["Cs"]),
)
bad_ports = st.one_of(
    st.integers(max_value=0).map(str),
    st.integers(min_value=0x10000).map(str),
    st.text(max_size=8).filter(lambda port: not PORT.fullmatch(port)),
)
bad_hosts = st.one_of(
    st.just(""),
    st.ip_addresses(v=4).map(str).filter(lambda host: host != PEER),
    st.ip_addresses(v=6).map(lambda ip: f"[{ip}]").filter(lambda host: not _may_be_the_peer(host)),
    st.text(max_size=20).filter(lambda host: not _may_be_the_peer(host)),
)
Drawn = tuple[object, str | None]  # an unusable value, and the name its error carries if not
# the field's own
Option = tuple[tuple[str, ...], st.SearchStrategy[Drawn]]  # a field's path, one class of values


def _unusable_classes(field: Field) -> list[st.SearchStrategy[Drawn]]:
    """The classes of values ``field`` cannot take, one strategy each."""
    classes: list[st.SearchStrategy[object]] = []
    if field.required:
        classes.append(st.just(MISSING))
    if field.kind in ("object", "string-map"):
        classes.append(not_an_object)
    else:
        classes += [not_a_string, not_unicode]
    if field.kind == "request-id":  # a check's request ids are plain words
        classes.append(st.text(max_size=12).map(NOT_THE_ID.__add__))
    elif field.kind == "enum":
        classes.append(st.text(max_size=12).filter(lambda text: text not in field.allowed))
    elif field.kind == "address":
        classes += [
            st.text(max_size=30)
            .filter(lambda text: ":" not in text)
            .map(lambda text: BadAddress("", text=text)),
            bad_ports.map(lambda port: BadAddress(PEER, port)),
            bad_hosts.map(BadAddress),
        ]
    elif field.kind == "json-object":
        classes += [
            st.text(max_size=20).filter(lambda text: not _is_json(text)),
            not_an_object.map(json.dumps),
        ]
    elif field.kind == "string-map":
        classes += [
            st.dictionaries(st.text(max_size=6), any_json, min_size=1).filter(
                lambda values: any(not isinstance(v, str) for v in values.values())
            ),
            st.dictionaries(not_unicode, st.text(max_size=6), min_size=1),
        ]
        oversized = st.integers(CONTROL_LIMIT + 1, CONTROL_LIMIT + 4096)
        return [*map(_own_name, classes), oversized.map(_oversized)]
    return [_own_name(values) for values in classes]


def _own_name(values: st.SearchStrategy[object]) -> st.SearchStrategy[Drawn]:
    def drawn(value: object) -> Drawn:
        return value, None

    return values.map(drawn)


def _oversized(size: int) -> Drawn:
    """Metadata that takes the control message past 128 KiB: its error names the message."""
    return {"pad": "x" * size}, "control_message"


def _unusable_options(fields: Mapping[str, Field], prefix: tuple[str, ...]) -> list[Option]:
    options: list[Option] = []
    for name, field in fields.items():
        path = (*prefix, name)
        options += [(path, values) for values in _unusable_classes(field)]
        options += _unusable_options(field.fields, path)
    return options


OPTIONS = {
    many_in: _unusable_options(
        {k: v for k, v in CONTROL_SCHEMA.items() if many_in or k != REQUEST_STREAM_FIELD}, ()
    )
    for many_in in (False, True)
}


def schema_field(path: tuple[str, ...]) -> Field:
    """The field of ``CONTROL_SCHEMA`` at ``path``."""
    field = CONTROL_SCHEMA[path[0]]
    for name in path[1:]:
        field = field.fields[name]
    return field


def _unusable(path: tuple[str, ...], many_in: bool, drawn: Drawn) -> Unusable:
    value, named = drawn
    field = named or ".".join(path)
    at_ack = path[0] == RESPONSE_FIELD and schema_field(path).to_dial
    return Unusable(path, value, many_in, field, at_ack or named is not None)


@st.composite
def unusable_requests(draw: st.DrawFn) -> Unusable:
    """A control message with one unusable value: a field of ``CONTROL_SCHEMA`` and a class
    of values it cannot take, both drawn uniformly, then a value of that class."""
    many_in = draw(st.booleans())
    path, values = draw(st.sampled_from(OPTIONS[many_in]))
    return _unusable(path, many_in, draw(values))


def every_unusable_kind() -> st.SearchStrategy[list[Unusable]]:
    """One unusable request for every field of ``CONTROL_SCHEMA`` and every class of values
    it cannot take, in both request types."""
    return st.tuples(
        *(
            st.tuples(st.just(path), st.just(many_in), values)
            for many_in, options in OPTIONS.items()
            for path, values in options
        )
    ).map(lambda drawn: [_unusable(*fields) for fields in drawn])


def request_message(
    path: str, control: bytes, body: bytes = b"{}", headers: bytes = b"{}"
) -> bytes:
    """A well-framed request-plane message (TRN-001) around ``control``."""
    payload = struct.pack(">QQQ", len(control), len(body), 0) + control + body
    encoded = path.encode()
    return b"".join(
        (
            struct.pack(">H", len(encoded)),
            encoded,
            struct.pack(">H", len(headers)),
            headers,
            struct.pack(">I", len(payload)),
            payload,
        )
    )


def _was_dialled(listener: socket.socket) -> bool:
    """Whether a connection is waiting on ``listener`` now (it is closed if so)."""
    listener.setblocking(False)
    try:
        stray, _ = listener.accept()
    except BlockingIOError:
        return False
    stray.close()
    return True


def _listener(host: str) -> socket.socket:
    listener = socket.socket()
    try:
        listener.bind((host, 0))
        listener.listen(64)
    except OSError:
        listener.close()
        raise
    return listener


def _exactly(stream: socket.socket, count: int) -> bytes | None:
    data = bytearray()
    while len(data) < count:
        chunk = stream.recv(count - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _header(stream: socket.socket) -> object:
    """The JSON header of the next two-part frame, or None if the stream ends first."""
    prefix = _exactly(stream, 24)
    if prefix is None:
        return None
    header_len, body_len, _ = struct.unpack(">QQQ", prefix)
    if header_len + body_len > FRAME_LIMIT:
        return None
    frame = _exactly(stream, header_len + body_len)
    if frame is None or not header_len:
        return None
    try:
        return json.loads(frame[:header_len])
    except ValueError:
        return None


def prologues(
    listener: socket.socket, subjects: set[str]
) -> tuple[list[object], dict[str, object]]:
    """Wait (``DIAL_WAIT`` real seconds at most) for a worker to dial ``listener`` for each
    stream of ``subjects``; returns the handshakes of the other streams that came, and the
    prologue of each stream of ``subjects`` that came."""
    deadline = time.monotonic() + DIAL_WAIT
    earlier: list[object] = []
    found: dict[str, object] = {}
    while not subjects <= found.keys() and (left := deadline - time.monotonic()) > 0:
        listener.settimeout(left)
        try:
            stream, _ = listener.accept()
        except TimeoutError:
            break
        with stream:
            stream.settimeout(max(deadline - time.monotonic(), 0.1))
            try:
                handshake = _header(stream)
                subject = handshake.get("subject") if isinstance(handshake, dict) else None
                if subject in subjects:
                    found[subject] = _header(stream)
                    continue
            except OSError:
                handshake = None
            earlier.append(handshake)
    return earlier, found


def dialled_back(listener: socket.socket, subject: str) -> tuple[list[object], object]:
    """``prologues`` for one stream: the handshakes of the streams that came first, and the
    prologue of ``subject``'s stream (None if it never came)."""
    earlier, found = prologues(listener, {subject})
    return earlier, found.get(subject)


def names_invalid_argument(prologue: object, field: str) -> bool:
    """A prologue that fails the request with ``InvalidArgument`` naming ``field``: its text
    names the field and, where the wire carries the type (``typed_error``), it is the type."""
    if not isinstance(prologue, dict) or not isinstance(prologue.get("error"), str):
        return False
    typed = prologue.get("typed_error")
    return field in prologue["error"] and (
        typed is None or (isinstance(typed, dict) and typed.get("error_type") == "InvalidArgument")
    )


def a_worker(target: Target) -> int:
    workers = [d.worker_id for d in target.dispatch_log()]
    return workers[0] if workers else target.add_worker()


MARKER = Unusable(("payload_codec",), "no-such-codec", False, "payload_codec", False)
# Pinned (TRN-022, TRN-023): one unusable request of each kind of answer, in each stream.
NO_ID = _unusable(("id",), False, (MISSING, None))
NO_COLON = _unusable((RESPONSE_FIELD, "info", "address"), False, (BadAddress("", text="x"), None))
PORT_ZERO = _unusable(
    (REQUEST_STREAM_FIELD, "info", "address"), True, (BadAddress(PEER, "0"), None)
)
NON_STRING_METADATA = _unusable(("metadata",), False, ({"trace": 1}, None))
OVERSIZED = _unusable(("metadata",), False, _oversized(CONTROL_LIMIT + 1))


@covers("TRN-022")
@requires(Capability.DIRECT, Capability.WIRE_TRANSPORT)
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(unusable=unusable_requests())
@example(unusable=MARKER)
@example(unusable=NO_ID)
@example(unusable=NO_COLON)
@example(unusable=PORT_ZERO)
@example(unusable=NON_STRING_METADATA)
@example(unusable=OVERSIZED)
def test_an_unusable_request_fails_only_itself(target: Target, unusable: Unusable) -> None:
    """Each request is answered with a typed error naming the field at fault: a prologue
    ``InvalidArgument`` where its response address is usable, else a refusal at the ACK —
    seen here as no dial-back before the next request's (a usable ``MARKER``'s)."""
    worker = a_worker(target)
    with _listener(PEER) as listener:
        port = listener.getsockname()[1]
        target.send_raw(worker, request_message(NO_ENDPOINT, unusable.control(port, "unusable")))
        if unusable.at_ack:
            target.send_raw(worker, request_message(NO_ENDPOINT, MARKER.control(port, "marker")))
            earlier, prologue = dialled_back(listener, "marker")
            require(
                "TRN-022",
                names_invalid_argument(prologue, MARKER.field),
                f"after a request with {unusable.field} = {unusable.value!r}, worker {worker} "
                f"no longer answers a request with an unknown codec (prologue {prologue!r})",
            )
            require(
                "TRN-022",
                not earlier,
                f"worker {worker} dialled back for a request whose response address is "
                f"unusable ({unusable.field} = {unusable.value!r}): handshakes {earlier!r}",
            )
        else:
            earlier, prologue = dialled_back(listener, "unusable")
            require(
                "TRN-022",
                names_invalid_argument(prologue, unusable.field),
                f"a request with {unusable.field} = {unusable.value!r} should fail in its "
                f"prologue with InvalidArgument naming {unusable.field!r}",
                expected=f"InvalidArgument naming {unusable.field}",
                actual=repr(prologue),
            )
    serves_again(target, worker, "TRN-022")


def _cut(message: bytes, at: int) -> bytes:
    return message[: at % max(len(message), 1)]


cut_requests = st.builds(  # a well-framed request that ends part-way
    _cut,
    unusable_requests().map(lambda u: request_message(NO_ENDPOINT, u.control(9, "x"))),
    st.integers(0),
)


@covers("TRN-023")
@requires(Capability.DIRECT, Capability.WIRE_TRANSPORT, Capability.SCRIPT_STALL)
@settings(
    max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sweep=every_unusable_kind(), noise=st.lists(raw_bytes | cut_requests, max_size=8))
@example(
    sweep=[MARKER, NO_ID, NO_COLON, PORT_ZERO, NON_STRING_METADATA, OVERSIZED],
    noise=[*PREFIXES, b"", request_message(NO_ENDPOINT, NO_ID.control(9, "x"))[:40]],
)
def test_no_failure_escapes_a_connection(
    target: Target, sweep: list[Unusable], noise: list[bytes]
) -> None:
    """While a stream is open, hostile connections arrive: one request for every field of the
    control message and every class of value it cannot take, then bad bytes and requests cut
    short. The stream finishes with all its items and the worker serves the next request."""
    worker = a_worker(target)
    target.script_worker(worker, Stall(items=1, items_after=1))
    stalled = target.submit(Direct(worker))
    with _listener(PEER) as listener:  # never accepts: dial-backs wait in its backlog
        port = listener.getsockname()[1]
        for unusable in sweep:
            target.send_raw(worker, request_message(NO_ENDPOINT, unusable.control(port, "h")))
        for hostile in noise:
            target.send_raw(worker, hostile)
    target.release_stalled(worker)
    outcome = finished(target, stalled, "TRN-023")
    require(
        "TRN-023",
        outcome.error is None and indices(outcome) == [0, 1],
        f"a stream open while {len(sweep) + len(noise)} hostile connections came should "
        f"complete with items [0, 1]: {outcome}",
    )
    serves_again(target, worker, "TRN-023")


HANDLER_FAULTS = {  # the exception's messages; the texts of which the error must name one
    "one": (("boom",), ("RuntimeError: boom",)),
    # Dynamo 1.6.1 names the group ("ExceptionGroup: ..."); the reference each leaf in turn
    "a-group": (("first", "second"), ("ExceptionGroup", "RuntimeError: first")),
    # a lone surrogate, which UTF-8 cannot encode: U+FFFD for each of its 3 escaped bytes
    "lone-surrogate": (("bad \ud800 text",), ("RuntimeError: bad \ufffd\ufffd\ufffd text",)),
}


@covers("TRN-023")
@requires(Capability.DIRECT, Capability.SCRIPT_FAILURES)
@pytest.mark.parametrize("fault", list(HANDLER_FAULTS))
def test_a_handlers_exception_is_a_backend_unknown_error_item(target: Target, fault: str) -> None:
    """A handler that raises a plain exception after two items (or a group of them): the
    caller reads the items, then one error item ``Backend(Unknown)`` (class Internal) naming
    the exception's type, and the worker serves the next request."""
    messages, texts = HANDLER_FAULTS[fault]
    worker = target.add_worker()
    target.script_worker(worker, Crash(2, messages))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-023")
    require(
        "TRN-023",
        indices(outcome) == [0, 1]
        and outcome.error is not None
        and not outcome.error.pre_stream
        and shows(outcome.error, ("Backend(Unknown)",))
        and any(text in outcome.error.links[0][1] for text in texts),
        f"worker {worker}'s handler raised RuntimeError{messages} after two items: the caller "
        f"should read both, then one Backend(Unknown) error item naming one of {texts}; "
        f"got {outcome}",
    )
    serves_again(target, worker, "TRN-023")


@covers("TRN-023", "TRN-005")
@requires(Capability.DIRECT, Capability.SCRIPT_FAILURES)
def test_a_handler_that_fails_to_start_fails_before_the_stream(target: Target) -> None:
    """A handler whose start raises a plain ``RuntimeError``: the caller gets the failure
    before any stream, ``CannotConnect`` over ``Backend(Unknown)`` naming the exception, and
    the worker serves the next request."""
    worker = target.add_worker()
    target.script_worker(worker, Crash(0, ("boom",), at_start=True))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-023")
    seen = outcome.error
    require(
        "TRN-023",
        not outcome.items
        and seen is not None
        and seen.pre_stream
        and shows(seen, ("CannotConnect", "Backend(Unknown)"))
        and seen.links[0][1].startswith(PRE_STREAM_PREFIX)
        and "RuntimeError: boom" in seen.links[0][1],
        f"worker {worker}'s handler raised RuntimeError('boom') from its start: expected "
        f"CannotConnect {PRE_STREAM_PREFIX!r}… over Backend(Unknown) naming "
        f"'RuntimeError: boom' before any item; got {outcome}",
    )
    serves_again(target, worker, "TRN-023")


@covers("TRN-027")
@requires(Capability.DIRECT, Capability.WIRE_TRANSPORT)
def test_a_worker_dials_back_only_to_the_request_peer(target: Target) -> None:
    """The same request (with an unknown codec, so that a worker dials back to refuse it)
    names first another address of this machine, then the request's peer: only the peer's
    listener is dialled. The first request is refused at the ACK."""
    worker = target.add_worker()
    with _listener(PEER) as own:
        try:
            other: socket.socket | None = _listener(OTHER_HOST)
        except OSError:  # no 127.0.0.2 here (not Linux): the positive half still runs
            other = None
        try:
            if other is not None:
                other_port = other.getsockname()[1]
                control = MARKER.control(other_port, "elsewhere")
                target.send_raw(worker, request_message(NO_ENDPOINT, control))
            control = MARKER.control(own.getsockname()[1], "peer")
            target.send_raw(worker, request_message(NO_ENDPOINT, control))
            _, prologue = dialled_back(own, "peer")
            require(
                "TRN-027",
                names_invalid_argument(prologue, MARKER.field),
                f"worker {worker} should dial back to the request's own peer {PEER} with an "
                f"InvalidArgument prologue; got {prologue!r}",
            )
            if other is not None:
                require(
                    "TRN-027",
                    not _was_dialled(other),
                    f"worker {worker} dialled back to {OTHER_HOST}, which is not the host "
                    f"the request came from ({PEER})",
                )
        finally:
            if other is not None:
                other.close()
    serves_again(target, worker, "TRN-027")


def _listener_below_10000() -> socket.socket:
    """A listener on the peer's address at a port of at most four digits, so that the port
    written with a leading zero is still five digits long."""
    for port in range(9000, 10000):
        listener = socket.socket()
        try:
            listener.bind((PEER, port))
        except OSError:
            listener.close()
            continue
        listener.listen(8)
        return listener
    pytest.skip(f"setup: no free port from 9000 to 9999 on {PEER}")


@covers("TRN-027")
@requires(Capability.WORKER_LIMITS, Capability.RESPONSE_REUSE)
def test_a_port_written_with_a_leading_zero_is_dialled_for_every_request(
    target: Target,
) -> None:
    """``127.0.0.1:09123`` names port 9123: each of two requests on one connection that gives
    it as the response address is dialled back there, the second as well as the first (a
    worker that remembers the addresses it has checked must still dial the one written)."""
    worker = target.add_worker()
    target.script_worker(worker, Serve(1))
    with _listener_below_10000() as listener:
        address = f"{PEER}:0{listener.getsockname()[1]}"
        connection = target.connect(worker)
        for subject in ("first", "second"):
            control = json.dumps(usable_control(address, subject)).encode()
            seen = target.write(connection, request_message(target.worker_path(worker), control))
            _, prologue = dialled_back(listener, subject)
            require(
                "TRN-027",
                isinstance(prologue, dict) and prologue.get("error") is None,
                f"request {subject!r} on one connection to worker {worker} named {address} (a "
                f"port written with a leading zero) for its response stream: it should be "
                f"dialled there and served; ACKs {list(seen.acks)}, closed {seen.closed}, "
                f"prologue {prologue!r}",
            )
    serves_again(target, worker, "TRN-027")


@covers("TRN-006")
@requires(
    Capability.DIRECT,
    Capability.SCRIPT_FAILURES,
    Capability.SCRIPT_REASONS,
    Capability.OBSERVE_ERROR_TYPES,
)
@pytest.mark.parametrize("reason", ["capacity.exhausted", "request.cancelled"])
def test_a_blocking_reason_is_withheld_before_the_stream(target: Target, reason: str) -> None:
    """A migratable type with a blocking reason is as sensitive as a blocking type: the
    transport keeps only its text, so the caller sees the outer CannotConnect alone."""
    worker = target.add_worker()
    target.script_worker(worker, FailBeforeStream(ErrorSpec("WorkerOverloaded", reason=reason)))
    outcome = finished(target, target.submit(Direct(worker)), "TRN-006")
    error = outcome.error
    require(
        "TRN-006",
        error is not None and error.typed_chain == ("CannotConnect",),
        f"worker {worker} failed before its stream with WorkerOverloaded (reason {reason}); "
        f"the caller should see CannotConnect with no typed cause, got {outcome}",
    )


# --- TRN-051 … TRN-054: the caller's response-stream server, and what a worker reads ---

HANDSHAKE_DEADLINE = 10.0  # seconds a caller waits for a dialled-in connection's handshake
INTEGER_KEYS = {"request": "integer-keys", 7: "seven", "nested": {-1: [0]}}  # msgpack carries
# any key, JSON only strings: for a worker speaking msgpack (the reference's default)


def response_infos(target: Target, count: int, requirement: str) -> list[dict[str, object]]:
    """The ``connection_info.info`` (decoded; {} if none) a worker read for each of
    ``count`` requests served one after another."""
    worker = target.add_worker()
    target.script_worker(worker, Serve(1))
    infos = []
    for _ in range(count):
        request = target.submit(Direct(worker))
        finished(target, request, requirement)
        control = target.control_message(request)
        connection = control.get(RESPONSE_FIELD) if control else None
        text = connection.get("info") if isinstance(connection, dict) else None
        info = json.loads(text) if isinstance(text, str) and _is_json(text) else None
        infos.append(info if isinstance(info, dict) else {})
    return infos


@covers("TRN-051")
@requires(Capability.DIRECT, Capability.OBSERVE_CONTROL_MESSAGE)
def test_no_two_callers_name_a_stream_alike(open_target: OpenTarget) -> None:
    """Two callers opened one after the other in this process, two requests each: the four
    response streams have four subjects."""
    subjects = []
    for _ in range(2):
        with built(open_target, TargetConfig(), "TRN-051") as target:
            subjects += [info.get("subject") for info in response_infos(target, 2, "TRN-051")]
    require(
        "TRN-051",
        all(isinstance(subject, str) for subject in subjects)
        and len(set(subjects)) == len(subjects),
        "two callers' streams should each have a subject no other stream has",
        expected="4 distinct subjects",
        actual=repr(subjects),
    )


def accepted_elsewhere(host: str, port: int) -> tuple[str, bool]:
    """Another loopback address than ``host``, and whether ``port`` there accepts a
    connection (TRN-052, TRN-055: a server listens only at the address it gives)."""
    elsewhere = "127.0.0.2" if host.strip("[]") == PEER else PEER  # loopback, not the host
    try:
        with socket.create_connection((elsewhere, port), timeout=DIAL_WAIT):
            return elsewhere, True
    except OSError:
        return elsewhere, False


@covers("TRN-052")
@requires(Capability.DIRECT, Capability.OBSERVE_CONTROL_MESSAGE)
def test_the_response_server_listens_only_where_it_says(target: Target) -> None:
    """The response address a caller writes in its control message is the one address its
    response server accepts at: the same port on another loopback address refuses."""
    [info] = response_infos(target, 1, "TRN-052")
    host, _, port = str(info.get("address")).rpartition(":")
    require("TRN-052", port.isdigit(), f"no response address was read: {info!r}")
    elsewhere, accepted = accepted_elsewhere(host, int(port))
    require_false(
        "TRN-052",
        accepted,
        f"the caller's response server is at {host}:{port}; the same port at {elsewhere} "
        "should refuse a connection, and accepted it",
    )


def readable_within(stream: socket.socket, seconds: float) -> bool:
    """Whether ``stream`` has something to read, or has closed, within ``seconds``."""
    poller = select.poll()
    poller.register(stream, select.POLLIN)
    return bool(poller.poll(seconds * 1000))


def held_more_than(target: Target, count: int) -> bool:
    """Whether the caller holds more than ``count`` response connections within
    ``DIAL_WAIT`` real seconds (it accepts a dialled connection on its own time)."""
    deadline = time.monotonic() + DIAL_WAIT
    while target.response_connections() <= count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@covers("TRN-053")
@requires(
    Capability.DIRECT,
    Capability.OBSERVE_CONTROL_MESSAGE,
    Capability.OBSERVE_INFLIGHT,
    Capability.MOCK_CLOCK,
)
def test_a_connection_without_a_handshake_is_closed_at_10_s(target: Target) -> None:
    """A connection dialled to the caller's response server that never sends a handshake is
    kept open until 10 s after the caller accepted it (here: 10 ms before) and closed at
    10 s, after which the caller holds nothing of it."""
    [info] = response_infos(target, 1, "TRN-053")
    host, _, port = str(info.get("address")).rpartition(":")
    require("TRN-053", port.isdigit(), f"no response address was read: {info!r}")
    before = target.response_connections()
    with socket.create_connection((host.strip("[]"), int(port)), timeout=DIAL_WAIT) as silent:
        if not held_more_than(target, before):
            pytest.fail(f"setup: the caller at {host}:{port} never accepted the connection")
        target.advance_time(HANDSHAKE_DEADLINE - 0.01)
        early = readable_within(silent, 0.1)
        target.advance_time(0.02)
        closed = readable_within(silent, DIAL_WAIT) and not silent.recv(1)
    require(
        "TRN-053",
        not early and closed and target.response_connections() == before,
        "a connection with no handshake should stay open for 10 s and be closed then",
        expected=f"open at 9.99 s, closed at 10.01 s, {before} connections held after",
        actual=f"{'closed' if early else 'open'} at 9.99 s, {'closed' if closed else 'open'} "
        f"at 10.01 s, {target.response_connections()} held",
    )


@covers("TRN-056")
@requires(
    Capability.DIRECT,
    Capability.KILL_WORKER_PROCESS,
    Capability.STARVE_CALLER,
    Capability.MOCK_CLOCK,
)
def test_a_caller_out_of_descriptors_accepts_its_stream_once_it_has_one(target: Target) -> None:
    """The worker is a separate process; the caller's has one free descriptor, which dialling
    the worker's request plane takes, so the worker's dial-back finds the caller unable to
    accept it. The request waits (the caller's clock stands still), and once the caller has
    its descriptors back and 1 s has passed, the stream is taken and the request served."""
    worker = target.add_worker_process(Serve(1))
    target.starve_caller(1)
    try:
        request = target.submit(Direct(worker))  # returns once the worker has written it all
        starved = target.outcome(request)
    finally:
        target.starve_caller(None)
    target.advance_time(1.0)
    outcome = finished(target, request, "TRN-056")
    require(
        "TRN-056",
        starved is None and outcome.error is None and indices(outcome) == [0],
        "a caller out of descriptors should keep the request waiting, then serve it within "
        "1 s of having descriptors again",
        expected="no outcome while starved, then one item",
        actual=f"{starved} while starved, then {outcome}",
    )


@covers("TRN-054")
@requires(Capability.DIRECT, Capability.WIRE_TRANSPORT)
def test_a_payload_with_integer_map_keys_is_served(target: Target) -> None:
    """A request whose msgpack payload has maps with integer keys (any msgpack map key
    decodes) is served, and reaches the worker as sent."""
    worker = target.add_worker()
    target.script_worker(worker, Serve(1))
    request = target.submit(Direct(worker, INTEGER_KEYS))
    outcome = finished(target, request, "TRN-054")
    delivered = [d.payload for d in target.dispatch_log() if d.request_id == request]
    require(
        "TRN-054",
        outcome.error is None and indices(outcome) == [0] and delivered == [INTEGER_KEYS],
        f"a request whose payload is {INTEGER_KEYS!r} should be served with it",
        expected=f"one item, the worker receiving {INTEGER_KEYS!r}",
        actual=f"{outcome}, received {delivered!r}",
    )
