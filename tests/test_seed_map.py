"""The seed 003 map (conformance/seed003.toml): valid, complete, and rendered as a table."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from routespec.conformance.registry import CheckCitation, Requirement, load_requirements
from routespec.conformance.seed_map import (
    SEED_MAP,
    SeedMapError,
    SeedTest,
    load_seed_map,
    render,
    rows,
)

REQUIREMENTS = load_requirements()
# The seed lives next to the repository in the project's workspace; CI clones elsewhere.
SEEDS = sorted((Path(__file__).resolve().parents[2] / "shared" / "seeds").glob("003_*.txt"))
_TEST_FN = re.compile(r"^#\[(?:tokio::)?test(?:\(.*\))?\]\s*$")
_FN = re.compile(r"^\s*(?:pub\s+)?(?:async\s+)?fn\s+(?P<name>\w+)")


def test_the_map_parses() -> None:
    document = tomllib.loads(SEED_MAP.read_text(encoding="utf-8"))
    assert set(document) == {"test"}
    assert len(document["test"]) >= 40


def test_every_mapped_id_exists() -> None:
    unknown = [
        (entry["name"], rid)
        for entry in tomllib.loads(SEED_MAP.read_text(encoding="utf-8"))["test"]
        for rid in entry.get("requirements", [])
        if rid not in REQUIREMENTS
    ]
    assert unknown == []


def test_names_are_unique() -> None:
    names = [test.name for test in load_seed_map(requirements=REQUIREMENTS)]
    assert len(names) == len(set(names))


def test_every_test_is_mapped_or_says_why_not() -> None:
    for test in load_seed_map(requirements=REQUIREMENTS):
        assert bool(test.requirements) != (test.not_covered is not None), test.name


@pytest.mark.skipif(not SEEDS, reason="seed 003 is not at ../shared/seeds/ (a CI clone)")
def test_the_map_lists_every_test_fn_of_the_seed_in_file_order() -> None:
    assert [test.name for test in load_seed_map(requirements=REQUIREMENTS)] == _seed_tests(SEEDS[0])


def _seed_tests(seed: Path) -> list[str]:
    """The names of the seed's ``#[test]`` and ``#[tokio::test]`` functions, in file order."""
    names: list[str] = []
    pending = False
    for line in seed.read_text(encoding="utf-8").splitlines():
        if _TEST_FN.match(line.strip()):
            pending = True
        elif pending and (match := _FN.match(line)):
            names.append(match["name"])
            pending = False
    return names


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('requirements = ["HST-001"]\nnot_covered = "x"', "exactly one"),
        ("", "exactly one"),
        ("requirements = []", "non-empty list"),
        ('requirements = ["ZZZ-999"]', "ZZZ-999"),
        ('requirements = ["HST-001", "HST-001"]', "twice"),
        ('not_covered = " "', "non-empty reason"),
        ('requirements = ["HST-001"]\nrequirement = ["HST-002"]', "unknown keys"),
    ],
)
def test_an_invalid_entry_is_refused(tmp_path: Path, entry: str, message: str) -> None:
    path = tmp_path / "seed.toml"
    path.write_text(f'[[test]]\nname = "a"\n{entry}\n', encoding="utf-8")
    with pytest.raises(SeedMapError, match=message):
        load_seed_map(path, _requirements("HST-001", "HST-002"))


def test_a_repeated_name_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "seed.toml"
    path.write_text('[[test]]\nname = "a"\nnot_covered = "x"\n' * 2, encoding="utf-8")
    with pytest.raises(SeedMapError, match="listed twice"):
        load_seed_map(path, {})


def test_the_table_links_ids_and_lists_the_checks_citing_them() -> None:
    requirements = _requirements("HST-001", "MON-001")
    seed_rows = rows(
        [SeedTest("first", ("HST-001", "MON-001")), SeedTest("second", not_covered="a | b")],
        [
            CheckCitation("conformance/test_a.py::test_z", ("MON-001",)),
            CheckCitation("conformance/test_a.py::test_y", ("HST-001", "MON-001")),
            CheckCitation("conformance/test_b.py::test_x", ("SEL-001",)),
        ],
    )
    assert [row.checks for row in seed_rows] == [
        ("conformance/test_a.py::test_y", "conformance/test_a.py::test_z"),
        (),
    ]
    page = render(seed_rows, requirements, "../spec/", level=2)
    assert page.startswith("## Upstream suite coverage (seed 003)\n")
    assert "2 tests: 1 mapped to 2 requirements, 1 not covered." in page
    assert (
        "| `first` | [HST-001](../spec/page.md#HST-001), [MON-001](../spec/page.md#MON-001) | "
        "`conformance/test_a.py::test_y`<br>`conformance/test_a.py::test_z` |"
    ) in page
    assert "| `second` | not covered: a \\| b | — |" in page


def _requirements(*ids: str) -> dict[str, Requirement]:
    return {rid: Requirement(rid, "t", "MUST", "stable", "s", "r", "page.md") for rid in ids}
