"""Which failure scripts a real Dynamo 1.6.1 Python worker can play, and how.

A Python handler fails by raising an exception. What reaches Dynamo's wire was observed with
the reference router reading the typed chain (docs/dynamo.md has the probes):

- raised from the generator (an error item after the items already yielded): one link whose
  type is the exception's: ``dynamo._core.K`` is ``Backend(K)`` for the eight backend kinds
  with a Python class, ``dynamo._core.WorkerUnavailable`` is ``WorkerUnavailable``, and any
  other exception is ``Backend(Unknown)`` with its class name before its message (a
  ``ValueError`` is ``Backend(InvalidArgument)``). ``__cause__`` is dropped: a chain cannot be
  raised, and ``ResourceExhausted``, ``WorkerOverloaded``, ``Unavailable`` and
  ``ResponseTimeout`` have no Python class;
- raised by the handler call (before the stream): the prologue carries an ``Unknown`` cause
  with the exception's class name before its message, whatever was raised; the caller sees
  the transport's ``CannotConnect`` over it.

So a script is played only when what the worker really sends is, to every rule the spec
applies to an error chain (its class, inhibition, overload, migration and its sensitive
types), the same as what the script asks for; then the worker raises one of the script's own
types (or its ``Backend`` twin). Any other script is SKIP with the reason (``Unscriptable``).
"""

from __future__ import annotations

import unittest
from collections.abc import Sequence

import attrs

from routespec.conformance import oracle
from routespec.testing.target import FailBeforeStream, FailMidStream

WIRE_TYPE: dict[str | None, str] = {
    **{
        kind: oracle.backend(kind)
        for kind in (
            "EngineShutdown",
            "StreamIncomplete",
            "Disconnected",
            "CannotConnect",
            "ConnectionTimeout",
            "Cancelled",
            "Unknown",
            "InvalidArgument",
        )
    },
    "WorkerUnavailable": "WorkerUnavailable",
    None: oracle.backend("Unknown"),  # a plain ``Exception``
}
"""The exception a handler raises (a ``dynamo._core`` class name, None for ``Exception``) ->
the type of the error item Dynamo sends for it."""

PROLOGUE_CAUSE: tuple[str | None, ...] = ("Unknown",)
"""The cause a failure before the stream carries on the wire, whatever the handler raised."""


class Unscriptable(unittest.SkipTest):
    """A script the real worker cannot play: the check is SKIP (pytest reads ``SkipTest``)."""


@attrs.frozen
class Raise:
    """What the worker raises: a ``dynamo._core`` class name (None: ``Exception``), a message."""

    name: str | None
    message: str


def effects(chain: Sequence[str | None], *, pre_stream: bool) -> tuple[object, ...]:
    """What the spec does with a worker's failure ``chain``, as the caller would see it."""
    seen = oracle.pre_stream_chain(chain) if pre_stream else tuple(chain)
    inhibits = oracle.match_chain(seen, oracle.INHIBITING_TYPES, ())
    return (
        oracle.classify(seen)[0],
        inhibits,
        not inhibits and oracle.match_chain(seen, {"WorkerOverloaded"}, ()),
        oracle.migratable(seen),
        bool(set(seen) & oracle.MIGRATION_SENSITIVE_TYPES),
    )


def candidates(label: str | None) -> list[str | None]:
    """The exceptions that could stand for one link: its own type, or its ``Backend`` twin."""
    if label is None:
        return [None]
    names: list[str | None] = [
        name for name, wire in WIRE_TYPE.items() if name is not None and wire == label
    ]
    if label in oracle.BACKEND_KINDS and label in WIRE_TYPE:
        names.append(label)  # the plain type as its Backend twin
    return names


def render(script: FailBeforeStream | FailMidStream) -> Raise:
    """The exception a Dynamo Python worker raises to play ``script``, or ``Unscriptable``."""
    links = script.error.chain()
    chain = tuple(link.type for link in links)
    message = script.error.message
    pre_stream = isinstance(script, FailBeforeStream)
    wanted = effects(chain, pre_stream=pre_stream)
    options = [name for link in links for name in candidates(link.type)]
    if pre_stream:
        if effects(PROLOGUE_CAUSE, pre_stream=True) != wanted:
            raise Unscriptable(_refusal(script, chain, "its prologue cause is always Unknown"))
        return Raise(next((name for name in options if name is not None), None), message)
    for name in options:
        if effects((WIRE_TYPE[name],), pre_stream=False) == wanted:
            return Raise(name, message)
    raise Unscriptable(
        _refusal(script, chain, "it raises one exception of " + ", ".join(_raisable()))
    )


def _raisable() -> list[str]:
    return [WIRE_TYPE[name] for name in WIRE_TYPE if name is not None]


def _refusal(script: object, chain: Sequence[str | None], why: str) -> str:
    shown = " <- ".join(label or "untyped" for label in chain)
    return (
        f"a Dynamo 1.6.1 Python worker cannot play {type(script).__name__} with {shown}: {why} "
        "(adapters/dynamo/rendering.py)"
    )
