"""The registry's integrity: one source (spec/), every MUST checked, no unknown citations,
and every requirement leads to the reference code that implements it."""

from __future__ import annotations

import importlib.resources
import re
import tomllib
from pathlib import Path

import pytest

from routespec.conformance.registry import (
    ID_PATTERN,
    SpecFormatError,
    load_requirements,
    scan_checks,
    scan_implementations,
)

REQUIREMENTS = load_requirements()
CITATIONS = scan_checks()


def test_the_spec_defines_requirements() -> None:
    assert len(REQUIREMENTS) >= 25


def test_every_must_has_a_check() -> None:
    cited = {rid for citation in CITATIONS for rid in citation.ids}
    unchecked = [
        rid
        for rid, requirement in REQUIREMENTS.items()
        if requirement.level == "MUST" and requirement.checked and rid not in cited
    ]
    assert unchecked == []


def test_no_check_cites_an_unknown_id() -> None:
    unknown = [(c.check, rid) for c in CITATIONS for rid in c.ids if rid not in REQUIREMENTS]
    assert unknown == []


def test_every_requirement_names_its_reference_code() -> None:
    places = scan_implementations()
    missing = [rid for rid, r in REQUIREMENTS.items() if r.checked and rid not in places]
    assert missing == []


def test_reference_code_cites_only_known_ids() -> None:
    unknown = {
        rid: where for rid, where in scan_implementations().items() if rid not in REQUIREMENTS
    }
    assert unknown == {}


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "page.md").write_text(text, encoding="utf-8")
    return tmp_path


GOOD_BLOCK = """### ABC-001 · A title {{ #ABC-001 }}

{level}

One sentence.

*Rationale.* Because.
"""


def test_a_well_formed_block_parses(tmp_path: Path) -> None:
    spec = _write(tmp_path, GOOD_BLOCK.format(level="**SHOULD** · provisional"))
    requirement = load_requirements(spec)["ABC-001"]
    assert (requirement.level, requirement.status, requirement.statement) == (
        "SHOULD",
        "provisional",
        "One sentence.",
    )
    assert requirement.rationale == "Because."


@pytest.mark.parametrize(
    "text",
    [
        GOOD_BLOCK.format(level="**MAY** · stable"),
        GOOD_BLOCK.format(level="**MUST** · stable").replace("{ #ABC-001 }", "{ #abc }"),
        GOOD_BLOCK.format(level="**MUST** · stable").replace("*Rationale.* ", ""),
        "### ABC-002 missing separator { #ABC-002 }\n",
        GOOD_BLOCK.format(level="**MUST** · stable") * 2,
        "### ABC-003 · Too short { #ABC-003 }\n\n**MUST** · stable\n",
    ],
    ids=["bad-level", "bad-anchor", "no-rationale", "bad-heading", "duplicate", "incomplete"],
)
def test_a_malformed_block_is_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(SpecFormatError):
        load_requirements(_write(tmp_path, text))


def test_every_requirement_has_a_deterministic_check() -> None:
    """Issue 16: no verdict may depend on a machine's or Hypothesis's random seed alone, so
    every requirement has a scenario check, or a ``@given`` check pinned by an ``@example``."""
    pinned = {rid for citation in CITATIONS if citation.deterministic for rid in citation.ids}
    unpinned = [rid for rid, r in REQUIREMENTS.items() if r.checked and rid not in pinned]
    assert unpinned == []


SCANNED = """
from hypothesis import example, given, strategies as st
import hypothesis


@covers("ABC-001")
def test_scenario(target): ...


@covers("ABC-002")
@given(st.integers())
def test_fuzz_only(target, n): ...


@covers("ABC-003")
@hypothesis.given(st.integers())
@hypothesis.example(0)
def test_fuzz_pinned(target, n): ...


@covers("ABC-004")
@pytest.mark.parametrize("n", [1, 2])
def test_parametrized(target, n): ...
"""

MACHINE = """
@covers("ABC-005")
class Machine(RuleBasedStateMachine): ...


@covers("ABC-006")
def test_in_a_machine_module(target): ...
"""


def test_the_scan_tells_deterministic_checks_apart(tmp_path: Path) -> None:
    (tmp_path / "test_scanned.py").write_text(SCANNED, encoding="utf-8")
    (tmp_path / "test_scanned_machine.py").write_text(MACHINE, encoding="utf-8")
    found = {c.ids: c.deterministic for c in scan_checks(tmp_path)}
    assert found == {
        ("ABC-001",): True,
        ("ABC-002",): False,
        ("ABC-003",): True,
        ("ABC-004",): True,
        ("ABC-005",): False,
        ("ABC-006",): False,
    }


# Issue 13: a divergence the Dynamo lanes expect (a strict XFAIL with evidence) must be
# labelled in the spec, so the spec never silently disagrees with Dynamo 1.6.1.
EXPECTATION_FILES = sorted(
    Path(str(importlib.resources.files("routespec.adapters"))).glob("*_expectations.toml")
)


def _expected_divergences() -> dict[str, list[str]]:
    """``{requirement ID: [file: check, ...]}`` for every expected failure of every adapter;
    an entry's ``requirement`` may name several IDs ("TMO-003, TMO-009")."""
    found: dict[str, list[str]] = {}
    for path in EXPECTATION_FILES:
        for entry in tomllib.loads(path.read_text(encoding="utf-8")).get("expected_failure", []):
            for rid in re.findall(ID_PATTERN, str(entry["requirement"])):
                found.setdefault(rid, []).append(f"{path.name}: {entry['check']}")
    return found


def test_the_expectation_files_are_found() -> None:
    assert len(EXPECTATION_FILES) >= 4
    assert _expected_divergences()


def test_every_expected_divergence_is_labelled_in_the_spec() -> None:
    """A requirement a Dynamo lane fails on purpose carries a ``strengthening`` or ``changed``
    paragraph (spec/conventions.md, "Dynamo version"); ``not reachable`` or none is wrong."""
    unlabelled = {
        rid: (REQUIREMENTS[rid].dynamo if rid in REQUIREMENTS else "unknown ID", checks)
        for rid, checks in sorted(_expected_divergences().items())
        if rid not in REQUIREMENTS or REQUIREMENTS[rid].dynamo not in {"strengthening", "changed"}
    }
    assert unlabelled == {}
