"""The mutation tool's bookkeeping (mutation/): how lanes combine, what the score counts,
when an equivalent entry stops counting, and what the stage mutates."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mutation import campaign, equivalents, report, stage, trial, verdict_store
from mutation.equivalents import Equivalent, load
from mutation.layers import is_specified
from mutation.mutmut_driver import Verdict

NAME = "routespec.routing.selection.xǁSelectorǁselect__mutmut_1"


def _verdict(status: str, name: str = NAME, function_hash: str = "abc") -> Verdict:
    return Verdict(name, "routing/selection.py", status, 1.0, function_hash)


@pytest.mark.parametrize(
    ("first", "second", "combined"),
    [
        ("survived", "killed", "killed"),
        ("killed", "not checked", "killed"),
        ("no tests", "survived", "survived"),
        ("no tests", "timeout", "timeout"),
        ("survived", "not checked", "not checked"),  # the second lane has not run it yet
        ("no tests", "not checked", "not checked"),
        ("segfault", "not checked", "timeout"),
        ("what is this", "not checked", "suspicious"),
    ],
)
def test_a_lane_that_kills_decides(first: str, second: str, combined: str) -> None:
    assert report.combine([_verdict(first), _verdict(second)]) == combined


def test_nothing_checked_is_not_checked() -> None:
    assert report.combine([None, _verdict("not checked")]) == "not checked"


def _build(status: str, equivalents: dict[str, Equivalent]) -> dict[str, object]:
    lanes = {"reference": {NAME: _verdict(status)}}
    return report.build([NAME], lanes, equivalents, {}, {"modules": []}, {})


def test_an_equivalent_survivor_leaves_the_score() -> None:
    built = _build("survived", {NAME: Equivalent(NAME, "same", "abc")})
    overall = built["overall"]
    assert isinstance(overall, dict)
    assert (overall["equivalent"], overall["survived"], overall["score"]) == (1, 0, None)
    assert built["survivors"] == []


def test_an_equivalent_entry_for_a_changed_function_is_stale() -> None:
    built = _build("survived", {NAME: Equivalent(NAME, "same", "old")})
    overall = built["overall"]
    assert isinstance(overall, dict)
    assert (overall["equivalent"], overall["survived"], overall["score"]) == (0, 1, 0.0)
    assert [e["name"] for e in built["stale_equivalents"]] == [NAME]  # type: ignore[attr-defined]


def test_a_killed_mutant_listed_equivalent_is_flagged_and_counted_killed() -> None:
    built = _build("killed", {NAME: Equivalent(NAME, "same", None)})
    overall = built["overall"]
    assert isinstance(overall, dict)
    assert (overall["killed"], overall["equivalent"], overall["score"]) == (1, 0, 1.0)
    assert len(built["stale_equivalents"]) == 1  # type: ignore[arg-type]


def test_an_equivalent_entry_naming_no_generated_mutant_is_stale() -> None:
    gone = NAME.replace("mutmut_1", "mutmut_99")
    elsewhere = "routespec.routing.worker_sets.x_other__mutmut_1"
    listed = {n: Equivalent(n, "same", "abc") for n in (NAME, gone, elsewhere)}
    lanes = {"reference": {NAME: _verdict("survived")}}
    whole = report.build(iter([NAME]), lanes, listed, {}, {"modules": []}, {})  # read once
    # worker_sets.py was not part of the run, so its entry is not judged
    assert [e["name"] for e in whole["stale_equivalents"]] == [gone]
    sampled = report.build([NAME], lanes, listed, {}, {"sample": 1, "seed": 1}, {})
    assert sampled["stale_equivalents"] == []  # a sample sees only part of each module


def test_a_mutants_name_gives_its_module() -> None:
    assert report.module_of(NAME) == "routing/selection.py"
    assert report.module_of("routespec.errors.x_f__mutmut_2") == "errors.py"


def test_the_score_leaves_out_unchecked_and_skipped() -> None:
    counts = dict.fromkeys((*report.BUCKETS, "equivalent"), 0)
    counts |= {"killed": 3, "timeout": 1, "survived": 1, "not checked": 50, "skipped": 2}
    assert report.score(counts) == 0.8


def test_the_shipped_equivalents_file_reads() -> None:
    for name, entry in load().items():
        assert name.startswith("routespec.")
        assert "__mutmut_" in name
        assert entry.reason


@pytest.mark.parametrize(
    ("module", "mutated"),
    [
        ("errors.py", True),
        ("routing/selection.py", True),
        ("discovery/file_store.py", True),
        ("discovery/etcd_store.py", False),
        ("deploy/cli/main.py", False),
        ("testing/target.py", False),
        ("target.py", False),
        ("__main__.py", False),
    ],
)
def test_only_the_specified_layers_are_mutated(module: str, mutated: bool) -> None:
    assert is_specified(module) is mutated


def test_the_stage_is_the_wheel_layout(tmp_path: Path) -> None:
    staged = stage.stage(tmp_path / "reference", "reference")
    package = staged / "src" / "routespec"
    for path in ("routing/selection.py", "conformance/plugin.py", "adapters/reference.py"):
        assert (package / path).is_file(), path
    assert (package / "spec" / "selection.md").is_file()
    config = (staged / "pyproject.toml").read_text()
    assert '"--adapter", "reference"' in config
    assert 'do_not_mutate = ["src/routespec/discovery/etcd_store.py"]' in config


def test_a_changed_tree_makes_mutmut_map_its_tests_again(tmp_path: Path) -> None:
    staged = stage.stage(tmp_path / "reference", "reference")
    stats = staged / "mutants" / stage.STATS
    stats.parent.mkdir(parents=True)
    stats.write_text("{}")
    stage.stage(tmp_path / "reference", "reference")
    assert stats.exists(), "an unchanged tree keeps the map"
    copy = staged / "src" / "routespec" / "routing" / "selection.py"
    copy.write_text("# edited\n")
    os.utime(copy, (0, 0))
    mutants = staged / "mutants" / "src" / "routespec" / "routing" / "selection.py"
    mutants.parent.mkdir(parents=True)
    mutants.write_text("# mutants of an earlier version\n")
    stage.stage(tmp_path / "reference", "reference")
    assert not stats.exists(), "a file the stage had to copy again drops the map"
    assert copy.stat().st_mtime > mutants.stat().st_mtime, "mutmut must see it as newer"


def test_a_lane_without_machines_maps_its_checks_anew(tmp_path: Path) -> None:
    """Issue 16: the deterministic checks alone judge a sample; switching the selection on an
    existing stage must drop the map of which checks reach which function."""
    staged = stage.stage(tmp_path / "reference", "reference")
    assert "--ignore-glob" not in (staged / "pyproject.toml").read_text()
    stats = staged / "mutants" / stage.STATS
    stats.parent.mkdir(parents=True)
    stats.write_text("{}")
    stage.stage(tmp_path / "reference", "reference", without_machines=True)
    assert f'"--ignore-glob={stage.MACHINES}"' in (staged / "pyproject.toml").read_text()
    assert not stats.exists(), "another selection of checks drops the map"


def test_the_summary_and_the_page_show_requirement_coverage(tmp_path: Path) -> None:
    built = _build("killed", {})
    summary = report.summary(built)
    assert (summary["killed"], summary["judged"], summary["score"]) == (1, 1, 1.0)
    conformance = tmp_path / "reference.json"
    conformance.write_text(
        '{"requirements": [{"id": "A-001", "result": "PASS"}, {"id": "A-002", "result": "SKIP"}]}'
    )
    coverage = report.requirement_coverage([conformance, tmp_path / "absent.json"])
    assert coverage == {"reference": (1, 2)}
    assert "`reference` PASS 1 of 2 requirements" in report.markdown(built, coverage)


def _stage(root: Path, codes: dict[str, int | None], hashes: dict[str, str]) -> Path:
    """A stage with one mutated module, ``routing/selection.py``, as mutmut lays it out."""
    meta = root / "mutants" / "src" / "routespec" / "routing" / "selection.py.meta"
    meta.parent.mkdir(parents=True, exist_ok=True)
    meta.write_text(
        json.dumps(
            {
                "exit_code_by_key": {f"{MODULE}.{n}": c for n, c in codes.items()},
                "hash_by_function_name": hashes,
                "type_check_error_by_key": {},
                "durations_by_key": {f"{MODULE}.{n}": 1.5 for n, c in codes.items() if c},
                "estimated_durations_by_key": {},
            }
        )
    )
    return root


def _codes(stage_root: Path) -> dict[str, int | None]:
    meta = stage_root / "mutants" / "src" / "routespec" / "routing" / "selection.py.meta"
    found = json.loads(meta.read_text())["exit_code_by_key"]
    return {name.removeprefix(f"{MODULE}."): code for name, code in found.items()}


MODULE = "routespec.routing.selection"
SELECT, FOLLOW = "xǁSelectorǁselect", "xǁSelectorǁfollow"


def test_stored_verdicts_come_back_to_a_fresh_stage_of_the_same_code(tmp_path: Path) -> None:
    store = tmp_path / "verdicts.json"
    hashes = {SELECT: "aaa", FOLLOW: "bbb"}
    judged = {f"{SELECT}__mutmut_1": 1, f"{SELECT}__mutmut_2": 0, f"{FOLLOW}__mutmut_1": None}
    verdict_store.save({"reference": _stage(tmp_path / "old", judged, hashes)}, "c1", store)
    fresh = _stage(tmp_path / "new", dict.fromkeys(judged), hashes)
    assert verdict_store.restore(fresh, "reference", store) == 2
    assert _codes(fresh) == judged
    assert verdict_store.restore(fresh, "reference-tcp", store) == 0  # lanes stay apart


def test_an_edited_function_is_judged_again(tmp_path: Path) -> None:
    store = tmp_path / "verdicts.json"
    judged: dict[str, int | None] = {f"{SELECT}__mutmut_1": 1, f"{FOLLOW}__mutmut_1": 0}
    verdict_store.save(
        {"reference": _stage(tmp_path / "old", judged, {SELECT: "a", FOLLOW: "b"})}, "c1", store
    )
    edited = _stage(tmp_path / "new", dict.fromkeys(judged), {SELECT: "a2", FOLLOW: "b"})
    assert verdict_store.restore(edited, "reference", store) == 1
    assert _codes(edited) == {f"{SELECT}__mutmut_1": None, f"{FOLLOW}__mutmut_1": 0}
    # saving the edited stage drops the old function's verdicts and keeps the other's
    verdict_store.save({"reference": edited}, "c2", store)
    kept = verdict_store.load(store)["reference"]["routing/selection.py"]
    assert set(kept) == {FOLLOW}


def test_a_part_run_adds_to_what_is_stored(tmp_path: Path) -> None:
    store = tmp_path / "verdicts.json"
    hashes = {SELECT: "a"}
    first = {f"{SELECT}__mutmut_1": 1, f"{SELECT}__mutmut_2": None}
    verdict_store.save({"reference": _stage(tmp_path / "one", first, hashes)}, "c1", store)
    second = {f"{SELECT}__mutmut_1": None, f"{SELECT}__mutmut_2": 0}
    verdict_store.save({"reference": _stage(tmp_path / "two", second, hashes)}, "c2", store)
    fresh = _stage(tmp_path / "three", dict.fromkeys(first), hashes)
    assert verdict_store.restore(fresh, "reference", store) == 2
    assert _codes(fresh) == {f"{SELECT}__mutmut_1": 1, f"{SELECT}__mutmut_2": 0}
    assert verdict_store.judged_at(store) == {"c1": 1, "c2": 1}


def test_an_added_equivalent_reads_back_pinned_to_its_function(tmp_path: Path) -> None:
    path = tmp_path / "equivalents.toml"
    path.write_text('["a__mutmut_1"]\nreason = "old"\n')
    reason = 'Only the message text changes ("quoted"); the spec leaves it unchecked.'
    added = equivalents.add({"a__mutmut_1": "0", "b__mutmut_2": "abc123"}, reason, path)
    assert added == ["b__mutmut_2"]
    assert load(path)["b__mutmut_2"] == Equivalent("b__mutmut_2", reason, "abc123")
    assert load(path)["a__mutmut_1"].reason == "old"
    with pytest.raises(ValueError, match="one non-empty line"):
        equivalents.add({"c__mutmut_3": "1"}, "two\nlines", path)


def test_a_trial_runs_the_working_trees_checks_at_their_staged_paths() -> None:
    assert trial._staged_path("conformance/test_x.py::check") == (
        "src/routespec/conformance/test_x.py::check"
    )
    assert trial._staged_path("-k") == "-k"
    assert "--timeout=30" in stage.pytest_args("reference-tcp")


def test_a_recorded_kill_is_a_verdict_of_the_lane(tmp_path: Path) -> None:
    meta = tmp_path / "mutants" / "src" / "routespec" / "routing" / "selection.py.meta"
    meta.parent.mkdir(parents=True)
    names = {"a__mutmut_1": 0, "a__mutmut_2": None}
    meta.write_text(json.dumps({"exit_code_by_key": names, "durations_by_key": {}}))
    assert trial.record_kills(tmp_path, {"a__mutmut_2": 1.25, "elsewhere__mutmut_1": 2.0}) == 1
    data = json.loads(meta.read_text())
    assert data["exit_code_by_key"] == {"a__mutmut_1": 0, "a__mutmut_2": 1}
    assert data["durations_by_key"] == {"a__mutmut_2": 1.25}


def test_a_later_lane_forgets_verdicts_of_an_older_source() -> None:
    """A later lane's stage still holds the verdicts of the function as it was before an
    edit (mutmut regenerates it only when it runs there): the same mutant name then means
    another mutant, so its verdict is dropped and the mutant judged again."""
    first = {NAME: _verdict("no tests", function_hash="new")}
    later = {NAME: _verdict("killed", function_hash="old")}
    assert campaign._of_the_same_source(later, first) == {}
    same = {NAME: _verdict("killed", function_hash="new")}
    assert campaign._of_the_same_source(same, first) == same
