"""The control message a worker reads (TRN-022, TRN-044, TRN-027), field by field.

Every field of ``CONTROL_SCHEMA`` (Dynamo 1.6.1's ``RequestControlMessage``) is left out, given
a value of the wrong type, a string that is not valid Unicode, and a value of the right type
its field does not allow; each request must be answered with a typed error naming that field
by its dotted path (an entry of ``metadata`` by its key) — refused at the ACK when the
response stream cannot be dialled, else failed in its prologue — saying what is wrong with
the value (TRN-048), and, for a string the field does not allow, quoting it (TRN-044). The
fields that may be absent must be: such a request is served. The checks send raw requests,
as ``test_transport``'s TRN-022 checks do, but deterministically: one request per field and
kind of fault.
"""

from __future__ import annotations

import dataclasses
import json
import re
import string
from collections.abc import Callable, Iterator, Mapping

import pytest

from routespec.conformance.checks import covers, require, requires
from routespec.conformance.scenario import names_field
from routespec.conformance.test_transport import (
    CONTROL_SCHEMA,
    MISSING,
    NO_ENDPOINT,
    NOT_THE_ID,
    OVERSIZED,
    PEER,
    REQUEST_STREAM_FIELD,
    RESPONSE_FIELD,
    Field,
    Unusable,
    _listener,
    _put,
    _unusable,
    prologues,
    request_message,
    usable_control,
)
from routespec.conformance.test_worker_server import ADDRESS_FIELD, refused_naming
from routespec.testing.target import Capability, Target

REFUSED = "Server unavailable: unusable request: "  # an ACK refusal's text, up to the field
WRONG_TYPE = 7  # of the wrong type for every field: no field is a number
NOT_UNICODE = "x\udc80"  # a lone surrogate: JSON escapes it, no UTF-8 codec can send it
NOT_UNICODE_LITERAL = "x\\udc80"  # as its quoted literal shows it, escaped
ENTRY = "trace"  # the metadata key whose value a check makes unusable
Says = tuple[tuple[str, ...], ...]  # words an error must say: one of each tuple
NUMBER = ("int", "integer", "number")  # the type of WRONG_TYPE, in any language's words
TAKES = {"object": ("object", "map"), "string-map": ("object", "map")}  # else a string


@dataclasses.dataclass(frozen=True)
class Fault:
    """A value of the right type that a field of some kind refuses: what its error must say
    (TRN-048), the literal it must quote (TRN-044; None: none), and whether it is an
    entry's value (``metadata['trace']``) rather than the field's."""

    value: object
    says: Says = ()
    quoted: str | None = None
    entry: bool = False


UNSUPPORTED: Mapping[str, Mapping[str, Fault]] = {  # by kind, by name
    "enum": {"unsupported": Fault("bogus", quoted="bogus")},
    "address": {"not-host-port": Fault("no-port", quoted="no-port")},
    "json-object": {
        "not-json": Fault("{not json", (("not valid json",),)),
        "not-an-object": Fault("[]", (("object", "map"), ("list", "array", "sequence"))),
    },
    "string-map": {
        "not-strings": Fault({ENTRY: WRONG_TYPE}, (("string",), NUMBER), entry=True),
        "not-unicode": Fault({ENTRY: NOT_UNICODE}, quoted=NOT_UNICODE_LITERAL, entry=True),
    },
    "request-id": {
        "not-the-id": Fault(f"{NOT_THE_ID}other", quoted=f"{NOT_THE_ID}other"),
    },
}
READ_AS_STRINGS = ("string", "enum", "address", "json-object", "request-id")


@dataclasses.dataclass(frozen=True, eq=False)  # a key by identity: a value may be a dict
class Case:
    """One request with one fault: the field its error must name, where it is answered (at
    the ACK, or in the prologue), and the value the error must quote (None: none)."""

    name: str
    field: str
    at_ack: bool
    quoted: str | None
    control: Callable[[int, str], bytes]  # the control message for a port and a request id
    says: Says = ()  # what the error must say is wrong (TRN-048)

    def __str__(self) -> str:
        return self.name


def _field_cases(
    fields: Mapping[str, Field], prefix: tuple[str, ...], many_in: bool
) -> Iterator[Case]:
    for name, field in fields.items():
        path = (*prefix, name)
        faults = {"wrong-type": Fault(WRONG_TYPE, (TAKES.get(field.kind, ("string",)), NUMBER))}
        if field.kind in READ_AS_STRINGS:
            faults["not-unicode"] = Fault(NOT_UNICODE, quoted=NOT_UNICODE_LITERAL)
        faults.update(UNSUPPORTED.get(field.kind, {}))
        if field.required:
            faults["missing"] = Fault(MISSING)
        for label, fault in faults.items():
            unusable = _unusable(path, many_in, (fault.value, None))
            named = f"{unusable.field}['{ENTRY}']" if fault.entry else unusable.field
            yield Case(
                f"{named}-{label}",
                named,
                unusable.at_ack,
                fault.quoted,
                unusable.control,
                fault.says,
            )
        yield from _field_cases(field.fields, path, many_in)


def _whole(header: bytes) -> Callable[[int, str], bytes]:
    return lambda port, subject: header


def _unusable_case(name: str, unusable: Unusable) -> Case:
    return Case(name, unusable.field, unusable.at_ack, None, unusable.control)


CASES = [
    *_field_cases(
        {k: v for k, v in CONTROL_SCHEMA.items() if k != REQUEST_STREAM_FIELD}, (), False
    ),
    *_field_cases({REQUEST_STREAM_FIELD: CONTROL_SCHEMA[REQUEST_STREAM_FIELD]}, (), True),
    Case(
        "control_message-not-json",
        "control_message",
        True,
        None,
        _whole(b"{not json"),
        UNSUPPORTED["json-object"]["not-json"].says,
    ),
    Case(
        "control_message-not-an-object",
        "control_message",
        True,
        None,
        _whole(b"[]"),
        UNSUPPORTED["json-object"]["not-an-object"].says,
    ),
    _unusable_case("control_message-over-128-kib", OVERSIZED),
]
AT_ACK = [case for case in CASES if case.at_ack]
IN_PROLOGUE = [case for case in CASES if not case.at_ack]


def quotes(text: str, value: str) -> bool:
    """``text`` quotes ``value`` (a plain word) in single or double quotes."""
    return any(f"{quote}{value}{quote}" in text for quote in "'\"")


def says(text: str, words: Says) -> bool:
    """``text`` says one of each tuple of ``words``, each as a whole word, in any case."""
    return all(
        any(re.search(rf"\b{re.escape(word)}\b", text, re.IGNORECASE) for word in choices)
        for choices in words
    )


def require_answers(seen: Mapping[Case, str | None], where: str, expected: str) -> None:
    """Each case's answer (the ACK, or the prologue's text; None: not the kind expected)
    names its field (TRN-022) and quotes its refused value (TRN-044)."""
    unnamed = [f"{case}: {text!r}" for case, text in seen.items() if not names(text, case)]
    require(
        "TRN-022",
        not unnamed,
        f"{len(unnamed)} of {len(seen)} requests were not {where} naming the field at fault",
        expected=expected,
        actual="; ".join(unnamed),
    )
    unquoted = [
        f"{case}: {text!r}"
        for case, text in seen.items()
        if case.quoted is not None and not quotes(text or "", case.quoted)
    ]
    require(
        "TRN-044",
        not unquoted,
        f"{len(unquoted)} errors for a value their field refuses do not quote it",
        expected="each error quoting the refused value",
        actual="; ".join(unquoted),
    )
    unsaid = [f"{case}: {text!r}" for case, text in seen.items() if not says(text or "", case.says)]
    require(
        "TRN-048",
        not unsaid,
        f"{len(unsaid)} errors do not say what is wrong with the value",
        expected="each error saying the type expected and the type given, or 'not valid json'",
        actual="; ".join(unsaid),
    )


def names(text: str | None, case: Case) -> bool:
    """``text`` names the field at fault: exactly as TRN-022 quotes a refusal, or, in a
    prologue, as a whole word."""
    if text is None:
        return False
    spellings = {case.field, case.field.replace("'", '"')}  # an entry's key in either quotes
    if case.at_ack:  # the refusal's text, as TRN-022 quotes it
        return any(text.startswith(f"{REFUSED}{field}: ") for field in spellings)
    return any(names_field(text, field) for field in spellings)


@covers("TRN-022", "TRN-044", "TRN-048")
@requires(Capability.WORKER_LIMITS)
def test_an_unusable_response_address_is_refused_naming_its_field(target: Target) -> None:
    """On one held connection, one request for each fault the response stream cannot be
    dialled with (and each a whole header cannot be read with): each is refused at its ACK
    with ``Server unavailable: unusable request: <field>: …`` naming the field at fault, and
    quoting the value where its field refuses a string; the connection stays open."""
    worker = target.add_worker()
    connection = target.connect(worker)
    seen: dict[Case, str | None] = {}
    for count, case in enumerate(AT_ACK, 1):
        held = target.write(connection, request_message(NO_ENDPOINT, case.control(9, "refused")))
        seen[case] = held.acks[-1] if len(held.acks) == count and not held.closed else None
    require_answers(seen, "refused at their ACK", f"each ACK {REFUSED}<field>: …, open")


def invalid_argument(prologue: object) -> str | None:
    """The text of a prologue that fails its request with ``InvalidArgument`` (where the
    wire carries the type, ``typed_error``, it is that type); None for any other."""
    if not isinstance(prologue, dict):
        return None
    text, typed = prologue.get("error"), prologue.get("typed_error")
    if not isinstance(text, str):
        return None
    if typed is None or (isinstance(typed, dict) and typed.get("error_type") == "InvalidArgument"):
        return text
    return None


@covers("TRN-022", "TRN-044", "TRN-048")
@requires(Capability.WIRE_TRANSPORT)
def test_an_unusable_field_fails_its_request_in_the_prologue_naming_it(target: Target) -> None:
    """One request for each fault in a field the worker needs no dial-back for (each with a
    usable response address): each is dialled back and failed in its prologue with
    ``InvalidArgument`` naming the field at fault by its dotted path, and quoting the value
    where its field refuses a string."""
    worker = target.add_worker()
    subjects = {f"case{number}": case for number, case in enumerate(IN_PROLOGUE)}
    with _listener(PEER) as listener:
        port = listener.getsockname()[1]
        for subject, case in subjects.items():
            target.send_raw(worker, request_message(NO_ENDPOINT, case.control(port, subject)))
        _, seen = prologues(listener, set(subjects))
    answers = {case: invalid_argument(seen.get(subject)) for subject, case in subjects.items()}
    require_answers(
        answers, "failed in their prologue", "each prologue InvalidArgument naming its field"
    )


OPTIONAL = [name for name, field in CONTROL_SCHEMA.items() if not field.required]


@covers("TRN-022")
@requires(Capability.RESPONSE_REUSE, Capability.WIRE_TRANSPORT)
@pytest.mark.parametrize("absent", OPTIONAL)
def test_an_absent_optional_field_takes_its_default(target: Target, absent: str) -> None:
    """A request to the worker's own endpoint without ``payload_codec`` (its JSON body is
    then read as JSON: as msgpack, ``{}`` is not one value) or without ``metadata``: the
    worker serves it, with a response stream whose prologue is ``{"error": null}``."""
    worker = target.add_worker()
    with _listener(PEER) as listener:
        control = usable_control(f"{PEER}:{listener.getsockname()[1]}", "default")
        del control[absent]
        message = request_message(target.worker_path(worker), json.dumps(control).encode())
        target.send_raw(worker, message)
        _, seen = prologues(listener, {"default"})
    require(
        "TRN-022",
        seen.get("default") == {"error": None},
        f"a request without {absent} should be served as if it had the default",
        expected='a stream for "default" whose prologue is {"error": null}',
        actual=f"prologue {seen.get('default')!r}" if seen else "no dial-back",
    )


LONG = (string.ascii_letters * 3)[:120]  # a refused value of distinct neighbours
QUOTED_WHOLE = {58: True, 59: False, 120: False}  # by length: the literal has 2 more characters


@covers("TRN-044")
@requires(Capability.WORKER_LIMITS)
@pytest.mark.parametrize("length", list(QUOTED_WHOLE))
def test_a_refused_value_is_quoted_cut_to_60_characters(target: Target, length: int) -> None:
    """A ``transport`` of ``length`` letters is refused at the ACK quoting it: whole when its
    literal (quotes included) has at most 60 characters, else the literal's first 59
    characters (the quote and 58 letters) and ``…``."""
    value, whole = LONG[:length], QUOTED_WHOLE[length]
    control = usable_control(f"{PEER}:9", "long")
    _put(control, (RESPONSE_FIELD, "transport"), value)
    worker = target.add_worker()
    message = request_message(NO_ENDPOINT, json.dumps(control).encode())
    seen = target.write(target.connect(worker), message)
    ack = seen.acks[0] if seen.acks else ""
    wanted = [f"{q}{value}{q}" if whole else f"{q}{value[:58]}…" for q in "'\""]
    require(
        "TRN-044",
        ack.startswith(f"{REFUSED}connection_info.transport: ")
        and any(text in ack for text in wanted),
        f"a transport of {length} letters should be quoted "
        + ("whole" if whole else "cut to its literal's first 59 characters and '…'"),
        expected=f"an ACK {REFUSED}connection_info.transport: … containing {wanted[0]!r}",
        actual=repr(ack),
    )


@covers("TRN-027")
@requires(Capability.WORKER_LIMITS)
def test_the_peer_in_ipv4_mapped_form_is_the_peer(target: Target) -> None:
    """A response address ``[::ffff:127.0.0.1]`` names the request's peer (127.0.0.1) in
    IPv6 form: the worker does not refuse it (here: the endpoint is unknown)."""
    worker = target.add_worker()
    control = json.dumps(usable_control("[::ffff:127.0.0.1]:9", "mapped")).encode()
    seen = target.write(target.connect(worker), request_message(NO_ENDPOINT, control))
    require(
        "TRN-027",
        len(seen.acks) == 1 and not refused_naming(seen.acks[0], ADDRESS_FIELD),
        f"a request from {PEER} whose response stream is at [::ffff:127.0.0.1] (the peer) "
        "should not be refused",
        expected="an ACK that is no refusal naming " + ADDRESS_FIELD,
        actual=f"ACKs {list(seen.acks)}",
    )
