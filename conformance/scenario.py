"""Helpers shared by the scenario checks: mode parameters and outcome readers."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

import pytest

from routespec.conformance import oracle
from routespec.conformance.checks import RequirementViolation
from routespec.conformance.plugin import OpenTarget
from routespec.testing.target import (
    Capability,
    ErrorSpec,
    ObservedError,
    Outcome,
    Target,
    TargetConfig,
)

MODE_CAPABILITY = {
    "round-robin": Capability.ROUND_ROBIN,
    "random": Capability.RANDOM,
    "power-of-two-choices": Capability.POWER_OF_TWO_CHOICES,
    "least-loaded": Capability.LEAST_LOADED,
    "device-aware-weighted": Capability.DEVICE_AWARE_WEIGHTED,
}

OCCUPANCY_MODE_LABELS = ("power-of-two-choices", "least-loaded", "device-aware-weighted")

BUILTIN_MODES = [
    pytest.param(mode, marks=pytest.mark.requires(cap), id=mode)
    for mode, cap in MODE_CAPABILITY.items()
]

OCCUPANCY_MODES = [
    pytest.param(mode, marks=pytest.mark.requires(MODE_CAPABILITY[mode]), id=mode)
    for mode in OCCUPANCY_MODE_LABELS
]


def finished(target: Target, request_id: str, requirement: str) -> Outcome:
    outcome = target.outcome(request_id)
    if outcome is None:
        raise RequirementViolation(
            requirement, f"{request_id} is still open; expected its stream to have ended"
        )
    return outcome


TRANSFER_BUDGET = 60.0
"""Real seconds ``finished_after_transfer`` lets a transfer's bytes take to arrive."""


def finished_after_transfer(
    target: Target, request_id: str, requirement: str, *, mock_clock: bool
) -> Outcome:
    """``finished`` for a request that moves megabytes between two sockets of one process.

    The kernel moves loopback bytes on its own, real clock (a loaded machine defers them to
    ksoftirqd), so every task can be blocked on I/O while bytes are still on their way and
    ``submit`` returns early. On a mock clock the system is let settle again, no mock time
    passing, until the request ends or ``TRANSFER_BUDGET`` real seconds have gone; a count
    of settles was not enough under load."""
    deadline = time.monotonic() + (TRANSFER_BUDGET if mock_clock else 0.0)
    while target.outcome(request_id) is None and time.monotonic() < deadline:
        target.advance_time(0.0)
    return finished(target, request_id, requirement)


def reached(target: Target, request_id: str) -> list[int]:
    return [d.worker_id for d in target.dispatch_log() if d.request_id == request_id]


def shows(error: ObservedError | None, chain: Sequence[str | None]) -> bool:
    """The caller saw exactly the typed links of ``chain`` — or, from a target that shows only
    the normalised class (Dynamo's Python bindings), that chain's class (ERR-003)."""
    if error is None:
        return False
    if error.types_observed:
        return error.typed_chain == tuple(oracle.typed(chain))
    return error.error_class == oracle.classify(chain)[0]


def refused_before_stream(outcome: Outcome, label: str, text: str | None = None) -> bool:
    """The request failed before any stream with exactly the typed link ``label`` (see
    ``shows``), its outer message holding ``text`` if given."""
    error = outcome.error
    return (
        error is not None
        and error.pre_stream
        and shows(error, (label,))
        and (text is None or text in error.links[0][1])
    )


NO_WORKERS_AVAILABLE = re.compile(r"No workers available for endpoint [^/\s]+/[^/\s]+/[^/\s]+")
"""SEL-005's message (HST-021's too): the endpoint named by its path
``namespace/component/name``."""


def no_workers_available(error: ObservedError | None) -> bool:
    """``error`` is SEL-005's: ``Unavailable`` (see ``shows_outer``) with its message."""
    return (
        error is not None
        and shows_outer(error, "Unavailable")
        and NO_WORKERS_AVAILABLE.fullmatch(error.links[0][1]) is not None
    )


def names_field(text: str, field: str) -> bool:
    """``text`` names ``field`` (a dotted path such as ``ack.len``) as a whole word, not as
    part of a longer name."""
    return re.search(rf"(?<![\w.]){re.escape(field)}(?![\w.])", text) is not None


def shows_outer(error: ObservedError | None, label: str) -> bool:
    """The outermost link has type ``label`` (or, class-only, that type's class)."""
    if error is None:
        return False
    if error.types_observed:
        return error.type == label
    return error.error_class == oracle.classify([label])[0]


def tokens(outcome: Outcome) -> list[int]:
    """The token ids of a token request's items, in order."""
    return [
        token
        for item in outcome.items
        if isinstance(item, dict) and isinstance(item.get("token_ids"), list)
        for token in item["token_ids"]
    ]


def loads(target: Target) -> dict[int, int]:
    return {worker: count for worker, count in target.occupancy().items() if count}


def spec_of(chain: Sequence[str | None]) -> ErrorSpec:
    """The ErrorSpec whose links (outermost first) have the types ``chain``."""
    spec: ErrorSpec | None = None
    for depth, label in reversed(list(enumerate(chain))):
        spec = ErrorSpec(label, f"link {depth}", spec)
    if spec is None:
        raise ValueError("a chain has at least one link")
    return spec


def refusal(open_target: OpenTarget, config: TargetConfig) -> Exception | None:
    """What building a router with ``config`` failed with, or None if it was built."""
    try:
        with open_target(config):
            return None
    except Exception as error:  # the spec names no type for the refusal
        return error


@contextmanager
def built(open_target: OpenTarget, config: TargetConfig, requirement: str) -> Iterator[Target]:
    """A target opened with ``config``, which the spec says must be accepted."""
    with ExitStack() as stack:
        try:
            target = stack.enter_context(open_target(config))
        except Exception as error:
            raise RequirementViolation(
                requirement, f"a router with {config} should be built; it was refused: {error!r}"
            ) from error
        yield target
