"""Seed 003, Dynamo's routing-host test suite, mapped to requirement IDs.

``conformance/seed003.toml`` lists every test function of the seed in file order, each with
the requirement IDs whose checks cover it or the reason it is not covered. This module loads
and validates that file and renders it as a Markdown table: seed test → requirement IDs
(linked to their blocks in the spec) → the checks citing them (the static ``@covers`` scan).
docs/hooks.py publishes the table as a page; the conformance plugin adds it to each report.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from routespec.conformance.registry import (
    CONFORMANCE_DIR,
    SPEC_DIR,
    CheckCitation,
    Requirement,
    load_requirements,
    scan_checks,
)

SEED_MAP = CONFORMANCE_DIR / "seed003.toml"
TITLE = "Upstream suite coverage (seed 003)"
# Where docs/hooks.py publishes spec/*.md in the site, relative to the generated page.
SPEC_BASE = "spec/"
NONE = "—"
_KEYS = {"name", "requirements", "not_covered"}


class SeedMapError(ValueError):
    """A seed map entry that is malformed, repeated, or cites an ID no spec block defines."""


@attrs.frozen
class SeedTest:
    """One test function of the seed: the IDs covering it, or why none does."""

    name: str
    requirements: tuple[str, ...] = ()
    not_covered: str | None = None

    @property
    def ids(self) -> frozenset[str]:
        return frozenset(self.requirements)


@attrs.frozen
class SeedRow:
    """A seed test with the checks that cite any of its requirements."""

    test: SeedTest
    checks: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.test.name,
            "requirements": list(self.test.requirements),
            "checks": list(self.checks),
            "not_covered": self.test.not_covered,
        }


def load_seed_map(
    path: Path = SEED_MAP, requirements: Mapping[str, Requirement] | None = None
) -> list[SeedTest]:
    """The seed's tests in file order; raises SeedMapError on any invalid entry."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise SeedMapError(f"{path.name}: {error}") from error
    entries = document.get("test")
    if set(document) != {"test"} or not isinstance(entries, list):
        raise SeedMapError(f"{path.name}: expected only [[test]] tables")
    known = load_requirements() if requirements is None else requirements
    tests = [_entry(path.name, number, entry, known) for number, entry in enumerate(entries, 1)]
    seen: set[str] = set()
    for test in tests:
        if test.name in seen:
            raise SeedMapError(f"{path.name}: {test.name} is listed twice")
        seen.add(test.name)
    return tests


def _entry(source: str, number: int, entry: object, known: Mapping[str, Requirement]) -> SeedTest:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
        raise SeedMapError(f"{source}: test #{number} needs a name")
    where = f"{source}: {entry['name']}"
    if extra := set(entry) - _KEYS:
        raise SeedMapError(f"{where}: unknown keys {sorted(extra)}")
    ids, reason = entry.get("requirements"), entry.get("not_covered")
    if (ids is None) == (reason is None):
        raise SeedMapError(f"{where}: needs exactly one of requirements and not_covered")
    if reason is not None:
        if not isinstance(reason, str) or not reason.strip():
            raise SeedMapError(f"{where}: not_covered must be a non-empty reason")
        return SeedTest(entry["name"], not_covered=reason.strip())
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise SeedMapError(f"{where}: requirements must be a non-empty list of IDs")
    if len(set(ids)) != len(ids):
        raise SeedMapError(f"{where}: an ID is listed twice")
    if unknown := [i for i in ids if i not in known]:
        raise SeedMapError(f"{where}: no requirement has ID {', '.join(unknown)}")
    return SeedTest(entry["name"], tuple(ids))


def rows(tests: Iterable[SeedTest], citations: Iterable[CheckCitation]) -> list[SeedRow]:
    """Each test with the checks citing any of its requirements, sorted."""
    citations = list(citations)
    return [
        SeedRow(test, tuple(sorted({c.check for c in citations if set(c.ids) & test.ids})))
        for test in tests
    ]


def render(
    seed_rows: Sequence[SeedRow],
    requirements: Mapping[str, Requirement],
    spec_base: str = SPEC_BASE,
    level: int = 1,
) -> str:
    """The Markdown table under a heading of ``level`` (1 for a page, 2 for a section)."""
    mapped = [row for row in seed_rows if row.test.requirements]
    ids = {rid for row in mapped for rid in row.test.requirements}
    lines = [
        f"{'#' * level} {TITLE}",
        "",
        "Seed 003 is the Rust test suite of Dynamo's routing host (dynamo-llm 1.5.1). One row per",
        "test function, in file order: the requirements whose checks cover it, linked to their",
        "text in the specification, and the conformance checks citing those requirements with",
        f"`@covers` ({NONE} when none does yet). Generated from `conformance/seed003.toml`.",
        "",
        f"{len(seed_rows)} tests: {len(mapped)} mapped to {len(ids)} requirements, "
        f"{len(seed_rows) - len(mapped)} not covered.",
        "",
        "| seed test | requirements | checks |",
        "| --- | --- | --- |",
    ]
    for row in seed_rows:
        if row.test.not_covered is not None:
            covered = f"not covered: {_cell(row.test.not_covered)}"
        else:
            covered = ", ".join(
                _link(rid, requirements, spec_base) for rid in row.test.requirements
            )
        checks = "<br>".join(f"`{_cell(check)}`" for check in row.checks) or NONE
        lines.append(f"| `{_cell(row.test.name)}` | {covered} | {checks} |")
    return "\n".join(lines) + "\n"


def page(spec_base: str = SPEC_BASE) -> str:
    """The docs page: the whole table, validated against the spec."""
    requirements = load_requirements()
    return render(
        rows(load_seed_map(requirements=requirements), scan_checks()), requirements, spec_base
    )


def report_section(report_path: Path) -> tuple[list[dict[str, Any]], str]:
    """For a conformance report written to ``report_path``: its ``seed003`` JSON entries and
    its Markdown section, with spec links relative to the report."""
    requirements = load_requirements()
    seed_rows = rows(load_seed_map(requirements=requirements), scan_checks())
    base = Path(os.path.relpath(SPEC_DIR, report_path.resolve().parent)).as_posix() + "/"
    return [row.as_json() for row in seed_rows], render(seed_rows, requirements, base, level=2)


def _link(rid: str, requirements: Mapping[str, Requirement], spec_base: str) -> str:
    requirement = requirements.get(rid)
    if requirement is None:
        return f"`{rid}` (not in the spec)"
    return f"[{rid}]({spec_base}{requirement.page}#{rid})"


def _cell(text: str) -> str:
    """Table-cell safe: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")
