"""The error model (ERR): chain matching, classification and message bounds, as properties.

Each property compares the target's error model (``match_error_chain``, ``classify``,
``bounded_message``) with ``routespec.conformance.oracle``, an independent statement of
spec/errors.md.
One target is opened per check and the property runs inside it (the error model is pure, so
examples may share it).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import example, given
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
from routespec.conformance.scenario import spec_of
from routespec.testing.target import (
    Adapter,
    Capability,
    Direct,
    ErrorSpec,
    FailBeforeStream,
    Generate,
    Outcome,
    Stall,
    Target,
    TargetConfig,
)

labels = st.sampled_from(oracle.TYPE_LABELS)
links: st.SearchStrategy[str | None] = st.one_of(st.none(), labels)
chains = st.lists(links, min_size=1, max_size=8)
label_sets = st.lists(labels, max_size=5, unique=True)


def show(chain: Sequence[str | None]) -> str:
    return " <- ".join(label or "untyped" for label in chain)


# --- ERR-001 ---


@covers("ERR-001")
@requires(Capability.ERROR_MODEL)
def test_every_type_of_the_closed_set_is_understood(adapter: Adapter) -> None:
    """Each label of the closed set is a type the target's error model knows: it classifies to
    the spec's class and matches itself, alone and as the innermost link of a chain."""
    with adapter.open(TargetConfig()) as target:
        for label in oracle.TYPE_LABELS:
            observed = target.classify(ErrorSpec(label))
            require_equal(
                "ERR-001",
                observed,
                oracle.classify([label]),
                f"{label} classifies as {observed}, expected {oracle.classify([label])}",
            )
            deep = [None, "Unknown", None, label]
            require(
                "ERR-001",
                target.match_error_chain(deep, [label], []),
                f"{label} innermost in {show(deep)} is not matched by include [{label}]",
            )


def _router_errors(target: Target) -> list[tuple[str, Outcome | None]]:
    """Provoke every kind of failure a router reports on its own account."""
    found: list[tuple[str, Outcome | None]] = []
    found.append(
        ("generate with no worker", target.outcome(target.submit(Generate("round-robin"))))
    )
    for mode in ("kv", "direct"):
        found.append((f"generate {mode}", target.outcome(target.submit(Generate(mode)))))
    first, second = target.add_worker(), target.add_worker()
    target.mark_overloaded(first, True)
    target.mark_overloaded(second, True)
    found.append(
        ("generate, all overloaded", target.outcome(target.submit(Generate("round-robin"))))
    )
    found.append(("direct to an overloaded worker", target.outcome(target.submit(Direct(first)))))
    target.mark_overloaded(first, False)
    target.mark_overloaded(second, False)
    target.script_worker(second, Stall())
    open_request = target.submit(Direct(second))
    target.kill_worker(second)
    found.append(("stream of a killed worker", target.outcome(open_request)))
    found.append(("direct to a killed worker", target.outcome(target.submit(Direct(second)))))
    target.vanish_worker(first)
    found.append(("direct to a vanished worker", target.outcome(target.submit(Direct(first)))))
    return found


@covers("ERR-001")
@requires(
    Capability.ROUND_ROBIN,
    Capability.REFUSES_KV_AND_DIRECT,
    Capability.DIRECT,
    Capability.MARK_OVERLOADED,
    Capability.SCRIPT_STALL,
    Capability.KILL_WORKER,
    Capability.VANISH_WORKER,
)
def test_router_reported_errors_use_the_closed_set(adapter: Adapter) -> None:
    """Errors the router itself produces (no worker, refused mode, overload, a dead or vanished
    worker) have only closed-set types on their typed links."""
    with adapter.open(TargetConfig()) as target:
        errors = _router_errors(target)
    failures = 0
    for situation, outcome in errors:
        if outcome is None or outcome.error is None:
            continue
        failures += 1
        strange = [t for t in outcome.error.typed_chain if t not in oracle.TYPE_LABELS]
        require_false(
            "ERR-001",
            strange,
            f"{situation}: error {outcome.error.describe()} has types {strange} outside the "
            "closed set",
        )
    require_compare(
        "ERR-001",
        failures,
        ">",
        0,
        f"expected the router to report errors in these failure situations, saw none: {errors}",
    )


# --- ERR-002 ---


@covers("ERR-002")
@requires(Capability.ERROR_MODEL)
def test_a_type_at_any_depth_is_read(adapter: Adapter) -> None:
    with adapter.open(TargetConfig()) as target:

        @given(
            wrappers=st.lists(links, max_size=24),
            label=labels,
            below=st.lists(links, max_size=3),
        )
        def check(wrappers: list[str | None], label: str, below: list[str | None]) -> None:
            chain = [*wrappers, label, *below]
            require(
                "ERR-002",
                target.match_error_chain(chain, [label], []),
                f"{label} at depth {len(wrappers)} of {show(chain)} is not matched by "
                f"include [{label}]",
            )
            untyped_outer = [*([None] * len(wrappers)), label, *below]
            expected = oracle.classify([label])
            observed = target.classify(spec_of(untyped_outer))
            require_equal(
                "ERR-002",
                observed,
                expected,
                f"{show(untyped_outer)} classifies as {observed}; the first typed link {label} "
                f"at depth {len(wrappers)} gives {expected}",
            )

        check()


# --- ERR-003, ERR-004 ---


@covers("ERR-003", "ERR-004")
@requires(Capability.ERROR_MODEL)
def test_each_type_has_its_class_and_default_reason(adapter: Adapter) -> None:
    with adapter.open(TargetConfig()) as target:
        for label in oracle.TYPE_LABELS:
            error_class, reason = target.classify(ErrorSpec(label, "boom"))
            require_equal(
                "ERR-003",
                error_class,
                oracle.CLASS_OF[label],
                f"{label} has class {error_class}, the table gives {oracle.CLASS_OF[label]}",
            )
            require_equal(
                "ERR-004",
                reason,
                oracle.DEFAULT_REASON[label],
                f"{label} without an explicit reason has reason {reason!r}, "
                f"expected the default {oracle.DEFAULT_REASON[label]!r}",
            )


@covers("ERR-003")
@requires(Capability.ERROR_MODEL)
def test_a_typed_error_takes_the_class_of_its_own_type(adapter: Adapter) -> None:
    with adapter.open(TargetConfig()) as target:

        @given(label=labels, causes=st.lists(links, max_size=6))
        def check(label: str, causes: list[str | None]) -> None:
            chain = [label, *causes]
            error_class, _ = target.classify(spec_of(chain))
            require_equal(
                "ERR-003",
                error_class,
                oracle.CLASS_OF[label],
                f"{show(chain)} has class {error_class}; its outer type {label} gives "
                f"{oracle.CLASS_OF[label]}",
            )

        check()


@covers("ERR-004")
@requires(Capability.ERROR_MODEL)
def test_reasons_are_short_machine_readable_and_defaulted(adapter: Adapter) -> None:
    with adapter.open(TargetConfig()) as target:

        @given(chain=chains)
        def check(chain: list[str | None]) -> None:
            _, reason = target.classify(spec_of(chain))
            require_compare(
                "ERR-004",
                oracle.REASON_PATTERN.fullmatch(reason),
                "is not",
                None,
                f"{show(chain)} has reason {reason!r}, not 1..128 characters of [a-z0-9._-]",
            )
            expected = oracle.classify(chain)[1]
            require_equal(
                "ERR-004",
                reason,
                expected,
                f"{show(chain)} has reason {reason!r}, expected default {expected!r}",
            )

        check()


@covers("ERR-004")
@requires(Capability.ERROR_MODEL)
@pytest.mark.parametrize(
    ("label", "reason", "allowed"),
    [
        ("Disconnected", "a" * 128, True),
        ("Disconnected", "a" * 129, False),
        ("Disconnected", "x", True),
        ("Disconnected", "", False),
        ("Disconnected", "Not.lower", False),
        ("Backend(EngineShutdown)", "has space", False),
        (None, "transport.disconnected", False),  # an untyped error has no reason of its own
    ],
    ids=["128-chars", "129-chars", "1-char", "empty", "upper-case", "space", "untyped"],
)
def test_an_explicit_reason_is_kept_only_if_it_is_one(
    target: Target, label: str | None, reason: str, allowed: bool
) -> None:
    """Both sides of ERR-004's bounds for a reason given explicitly: kept as given when it is
    1..128 characters of [a-z0-9._-] on a typed error, refused (``ValueError``) otherwise."""
    spec = ErrorSpec(label, "boom", reason=reason)
    try:
        observed: object = target.classify(spec)[1]
    except ValueError as refusal:
        observed = refusal
    shown = f"{label or 'an untyped error'} with reason {reason[:20]!r} ({len(reason)} chars)"
    if allowed:
        require_equal("ERR-004", observed, reason, f"{shown} should keep its reason")
    else:
        require(
            "ERR-004",
            isinstance(observed, ValueError),
            f"{shown} breaks ERR-004 and should be refused, but it was built with reason "
            f"{observed!r}",
        )


# --- ERR-005 ---


@covers("ERR-005")
@requires(Capability.ERROR_MODEL)
def test_an_untyped_error_takes_class_and_reason_from_its_chain(adapter: Adapter) -> None:
    with adapter.open(TargetConfig()) as target:

        @given(wrappers=st.integers(1, 6), rest=st.lists(links, max_size=6))
        @example(wrappers=1, rest=[])
        @example(wrappers=3, rest=[None, None])
        def check(wrappers: int, rest: list[str | None]) -> None:
            chain = [*([None] * wrappers), *rest]
            observed = target.classify(spec_of(chain))
            expected = oracle.classify(chain)
            require_equal(
                "ERR-005",
                observed,
                expected,
                f"the untyped error {show(chain)} classifies as {observed}, expected {expected} "
                "(first typed link, or Internal / runtime.unclassified)",
            )

        check()


# --- ERR-006 ---


def _repeat(unit: str, count: int, tail: str) -> str:
    return unit * count + tail


messages = st.one_of(
    st.text(max_size=40),
    st.builds(_repeat, st.text(min_size=1, max_size=3), st.integers(0, 4200), st.text(max_size=6)),
)


@covers("ERR-006")
@requires(Capability.ERROR_MODEL)
def test_messages_are_bounded(adapter: Adapter) -> None:
    with adapter.open(TargetConfig()) as target:

        @given(message=messages)
        @example(message="")
        @example(message="a" * 4096)
        @example(message="a" * 4097)
        @example(message="a" * 4095 + "é")  # 4097 bytes, the cut falls inside a character
        @example(message="a" * 4094 + "é")  # 4096 bytes exactly
        @example(message="€" * 1366)  # 4098 bytes of 3-byte characters
        @example(message="😀" * 5000)
        def check(message: str) -> None:
            bounded = target.bounded_message(message)
            problem = oracle.message_bound_violation(message, bounded)
            require_compare("ERR-006", problem, "is", None, str(problem))

        check()


@covers("ERR-006")
@requires(Capability.DIRECT, Capability.SCRIPT_FAILURES)
def test_a_worker_cannot_make_a_reported_message_unbounded(target: Target) -> None:
    worker = target.add_worker()
    long_message = "overload " * 2000
    target.script_worker(
        worker,
        FailBeforeStream(ErrorSpec("InvalidArgument", long_message, ErrorSpec("Unknown", "ok"))),
    )
    outcome = target.outcome(target.submit(Direct(worker)))
    require(
        "ERR-006",
        outcome is not None and outcome.error is not None,
        f"expected the injected failure to be reported, got {outcome}",
    )
    assert outcome is not None
    assert outcome.error is not None
    for label, message in outcome.error.links:
        size = len(message.encode())
        require_compare(
            "ERR-006",
            size,
            "<=",
            oracle.MAX_MESSAGE_BYTES,
            f"link {label} reached the caller with a {size}-byte message (> 4096)",
        )
    _, outer_message = outcome.error.links[0]
    require(
        "ERR-006",
        outer_message.endswith(oracle.TRUNCATION_MARKER),
        f"the {len(long_message)}-byte message was cut without the marker: "
        f"ends {outer_message[-30:]!r}",
    )


# --- ERR-007, ERR-008, ERR-009 ---


@covers("ERR-007")
@requires(Capability.ERROR_MODEL)
def test_untyped_links_neither_match_nor_veto(adapter: Adapter) -> None:
    with adapter.open(TargetConfig()) as target:

        @given(chain=chains, include=label_sets, exclude=label_sets, spacing=st.integers(1, 3))
        def check(
            chain: list[str | None], include: list[str], exclude: list[str], spacing: int
        ) -> None:
            with_wrappers = [link for label in chain for link in [*([None] * spacing), label]]
            stripped: list[str | None] = [*oracle.typed(chain)] or [None]
            results = {
                "as drawn": target.match_error_chain(chain, include, exclude),
                "untyped links removed": target.match_error_chain(stripped, include, exclude),
                "untyped links added": target.match_error_chain(with_wrappers, include, exclude),
            }
            expected = oracle.match_chain(chain, include, exclude)
            require_equal(
                "ERR-007",
                set(results.values()),
                {expected},
                f"{show(chain)} with include {include}, exclude {exclude}: {results}; "
                f"untyped links must not change the answer {expected}",
            )
            every_label = list(oracle.TYPE_LABELS)
            untyped_only = [None] * len(chain)
            for inc, exc in ((every_label, []), ([], every_label), (every_label, every_label)):
                require_false(
                    "ERR-007",
                    target.match_error_chain(untyped_only, inc, exc),
                    f"a chain of {len(chain)} untyped links matched include {len(inc)} types, "
                    f"exclude {len(exc)} types",
                )

        check()


@covers("ERR-008")
@requires(Capability.ERROR_MODEL)
def test_an_exclude_anywhere_vetoes_an_include(adapter: Adapter) -> None:
    with adapter.open(TargetConfig()) as target:

        @given(
            pair=st.lists(labels, min_size=2, max_size=2, unique=True),
            outer=st.lists(links, max_size=4),
            middle=st.lists(links, max_size=4),
            inner=st.lists(links, max_size=4),
            exclude_first=st.booleans(),
        )
        def check(
            pair: list[str],
            outer: list[str | None],
            middle: list[str | None],
            inner: list[str | None],
            exclude_first: bool,
        ) -> None:
            included, excluded = pair
            first, second = (excluded, included) if exclude_first else (included, excluded)
            chain = [*outer, first, *middle, second, *inner]
            require_false(
                "ERR-008",
                target.match_error_chain(chain, [included], [excluded]),
                f"{show(chain)} matched include [{included}] although {excluded} (excluded) "
                "is a link of the chain",
            )

        check()


@covers("ERR-009")
@requires(Capability.ERROR_MODEL)
def test_an_include_anywhere_matches(adapter: Adapter) -> None:
    with adapter.open(TargetConfig()) as target:

        @given(
            chain=chains,
            include=label_sets,
            exclude=label_sets,
            position=st.integers(0, 8),
            pick=st.integers(0, 4),
        )
        def check(
            chain: list[str | None],
            include: list[str],
            exclude: list[str],
            position: int,
            pick: int,
        ) -> None:
            # an include somewhere and no exclude anywhere: always a match
            allowed = [label for label in include if label not in exclude]
            if allowed:
                clean = [link for link in chain if link not in exclude]
                planted = allowed[pick % len(allowed)]
                clean.insert(min(position, len(clean)), planted)
                require(
                    "ERR-009",
                    target.match_error_chain(clean, include, exclude),
                    f"{show(clean)} has {planted} (included) and no excluded type "
                    f"{exclude}, yet did not match",
                )
            # and in general the answer is the oracle's
            expected = oracle.match_chain(chain, include, exclude)
            observed = target.match_error_chain(chain, include, exclude)
            vetoed = any(label in exclude for label in oracle.typed(chain))
            require_equal(
                "ERR-008" if vetoed else "ERR-009",
                observed,
                expected,
                f"{show(chain)} with include {include}, exclude {exclude}: {observed}, "
                f"expected {expected}",
            )

        check()


# --- ERR-010 ---


@covers("ERR-010")
@requires(Capability.ERROR_MODEL)
@pytest.mark.parametrize(
    ("position", "role", "matches"),
    [
        (64, "include", True),
        (65, "include", False),
        (64, "exclude", False),
        (65, "exclude", True),
    ],
    ids=["include-64th", "include-65th", "exclude-64th", "exclude-65th"],
)
def test_a_chain_is_read_to_its_64th_link(
    adapter: Adapter, position: int, role: str, matches: bool
) -> None:
    """Untyped wrappers fill the chain; one typed link sits at ``position`` (1 is the
    outermost). An exclude is tried against an include at the outermost link."""
    chain: list[str | None] = [None] * 65
    chain[position - 1] = "Disconnected"
    if role == "exclude":
        chain[0] = "CannotConnect"
    include = ["Disconnected"] if role == "include" else ["CannotConnect"]
    exclude = ["Disconnected"] if role == "exclude" else []
    with adapter.open(TargetConfig()) as target:
        found = target.match_error_chain(chain, include, exclude)
    require_equal(
        "ERR-010",
        found,
        matches,
        f"a 65-link chain with Disconnected at link {position} (as {role}"
        + (", CannotConnect outermost as include" if role == "exclude" else "")
        + f"): links past the 64th are not read, so the match should be {matches}",
    )
