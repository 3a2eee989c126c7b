"""The registry's integrity: one source (spec/), every MUST checked, no unknown citations,
and every requirement leads to the reference code that implements it."""

from __future__ import annotations

from pathlib import Path

import pytest

from routespec.conformance.registry import (
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
