"""Conformance reports (conformance/report.py, written by conformance/plugin.py): each verdict
shows the detail of a check that produced it, violations are structured and whole, a report
says what produced it and how to replay a failure, and a filtered run keeps a full report.

The unit tests build reports from check results; the others run pytest on a few small checks
written into a temporary directory (and, once, the suite's own checks through the
``routespec conformance`` command), as a user of the installed kit would.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from pathlib import Path

import pytest

from routespec.conformance.checks import (
    RequirementViolation,
    require,
    require_compare,
    require_equal,
    require_false,
)
from routespec.conformance.matrix import render
from routespec.conformance.registry import Requirement, load_requirements
from routespec.conformance.report import (
    CheckResult,
    Outcome,
    Report,
    RunInfo,
    Violation,
    filtered_path,
)
from routespec.deploy.cli.conformance import shipped_adapters
from routespec.deploy.cli.main import main

REQUIREMENTS = {
    rid: Requirement(rid, f"title {rid}", "MUST", "stable", f"sentence of {rid}", "why", "x.md")
    for rid in ("DSP-001", "DSP-002", "DSP-005", "SEL-006")
}
SKIP_REASON = "adapter toy lacks capability time:mock-clock"
LONG = "w" * 5000  # an actual value far longer than any shortened line


def _violation(rid: str, detail: str, expected: str | None, actual: str | None) -> Violation:
    return Violation(rid, f"sentence of {rid}", detail, expected, actual, ("add_worker() -> 1",), 1)


def _check(
    name: str,
    ids: Sequence[str],
    outcome: Outcome,
    detail: str = "",
    violations: Sequence[Violation] = (),
    unexercised: Sequence[str] = (),
) -> CheckResult:
    return CheckResult(
        f"conformance/test_x.py::{name}",
        tuple(ids),
        outcome,
        detail,
        tuple(v.requirement_id for v in violations),
        0.1,
        tuple(unexercised),
        tuple(violations),
        f"python -m pytest --pyargs routespec.conformance.test_x::{name} --adapter toy"
        if outcome == "failed"
        else None,
    )


def _report(*results: CheckResult) -> Report:
    return Report.build(RunInfo("toy", adapter_option="toy"), REQUIREMENTS, results)


def _mixed() -> Report:
    """The situations the old report got wrong: a skip beside a failure, a check failing on
    another requirement than one it cites, a pass beside a skip."""
    return _report(
        _check("skipped", ["DSP-002"], "skipped", SKIP_REASON),
        _check(
            "fails_dsp_002",
            ["DSP-002"],
            "failed",
            "reached the wrong worker",
            [_violation("DSP-002", "reached the wrong worker", "{1}", "{2}")],
        ),
        _check(
            "fails_dsp_005",
            ["DSP-005", "SEL-006"],
            "failed",
            "DSP-005 went wrong",
            [_violation("DSP-005", "DSP-005 went wrong", "0", LONG)],
        ),
        _check("passes_sel_006", ["SEL-006"], "passed"),
        _check("skipped_too", ["DSP-001"], "skipped", SKIP_REASON),
        _check("passes_dsp_001", ["DSP-001"], "passed"),
    )


def test_a_fail_shows_the_failing_checks_detail_not_a_skip() -> None:
    row = _mixed().requirement("DSP-002")
    assert row is not None
    assert row.verdict == "FAIL"
    assert row.reason() == (
        "conformance/test_x.py::fails_dsp_002: reached the wrong worker (expected {1}, actual {2})"
    )
    assert "lacks capability" not in row.brief()


def test_a_check_failing_on_another_requirement_is_not_its_reason() -> None:
    report = _mixed()
    sel = report.requirement("SEL-006")
    assert sel is not None
    assert (sel.verdict, sel.reason()) == ("PASS", "")
    alone = _report(report.failed_checks()[1]).requirement("SEL-006")
    assert alone is not None
    assert alone.verdict == "NOT RUN"
    assert "DSP-005 went wrong" not in alone.reason()
    assert "stopped first" in alone.reason()


def test_a_pass_carries_no_reason_anywhere() -> None:
    report = _mixed()
    dsp1 = report.requirement("DSP-001")
    assert dsp1 is not None
    assert (dsp1.verdict, dsp1.reason(), dsp1.brief()) == ("PASS", "", "")
    assert not any(SKIP_REASON in line for line in report.terminal_lines() if "DSP-001" in line)
    (markdown_row,) = [line for line in report.markdown().splitlines() if "| DSP-001 |" in line]
    assert markdown_row.endswith("| PASS | 2 |  |")
    cells = render([report], REQUIREMENTS)
    assert "why-toy-DSP-001" not in cells


def test_skip_and_xfail_reasons_come_from_their_checks() -> None:
    report = _report(
        _check("unexercised", ["DSP-001"], "passed", unexercised=["DSP-001"]),
        _check("declared", ["DSP-002"], "xfailed", "known divergence #7"),
    )
    dsp1, dsp2 = report.requirement("DSP-001"), report.requirement("DSP-002")
    assert dsp1 is not None
    assert dsp2 is not None
    assert dsp1.verdict == "SKIP"
    assert dsp1.reason().startswith("conformance/test_x.py::unexercised: passed without evaluating")
    assert (dsp2.verdict, dsp2.reason()) == (
        "XFAIL",
        "conformance/test_x.py::declared: expected failure (known divergence #7)",
    )


def test_shortened_lines_keep_the_actual_value_and_json_keeps_everything(tmp_path: Path) -> None:
    report = _mixed()
    dsp5 = report.requirement("DSP-005")
    assert dsp5 is not None
    assert dsp5.brief(80).endswith(f"(actual {LONG})")
    assert LONG in "\n".join(report.terminal_lines())
    assert f"  Actual:      {LONG}" in report.violation_blocks()
    assert LONG in report.markdown()
    path = tmp_path / "toy.json"
    report.write(path)
    document = json.loads(path.read_text(encoding="utf-8"))
    (row,) = [r for r in document["requirements"] if r["id"] == "DSP-005"]
    (violation,) = row["checks"][0]["violations"]
    assert violation == {
        "requirement_id": "DSP-005",
        "statement": "sentence of DSP-005",
        "detail": "DSP-005 went wrong",
        "expected": "0",
        "actual": LONG,
        "steps": ["add_worker() -> 1"],
        "steps_recorded": 1,
        "example": None,
    }
    assert Report.load(path) == report
    assert Report.load(path).summary == {"FAIL": 2, "XFAIL": 0, "PASS": 2, "SKIP": 0, "NOT RUN": 0}


def test_violations_print_requirement_expected_actual() -> None:
    blocks = _mixed().violation_blocks()
    start = blocks.index("FAIL DSP-002 · conformance/test_x.py::fails_dsp_002")
    assert blocks[start + 1 : start + 5] == [
        "  Requirement: sentence of DSP-002",
        "  Expected:    {1}",
        "  Actual:      {2}",
        "  Observed:    reached the wrong worker",
    ]
    assert any(line.startswith("  Rerun:       python -m pytest") for line in blocks)


def test_the_structured_requires_keep_their_conditions() -> None:
    require_equal("DSP-001", [1], [1], "equal")
    require_compare("DSP-001", 1, "in", {1}, "in")
    require_false("DSP-001", [], "empty")
    with pytest.raises(RequirementViolation) as equal:
        require_equal("DSP-001", {2}, {1}, "reached w2")
    assert (equal.value.expected, equal.value.actual, equal.value.detail) == (
        "{1}",
        "{2}",
        "reached w2",
    )
    assert str(equal.value).splitlines()[0] == "DSP-001: reached w2"
    with pytest.raises(RequirementViolation) as compared:
        require_compare("DSP-001", 3, "<=", 1, "too many")
    assert (compared.value.expected, compared.value.actual) == ("<= 1", "3")
    with pytest.raises(RequirementViolation) as none:
        require_compare("DSP-001", "x", "is", None, "not None")
    assert (none.value.expected, none.value.actual) == ("None", "'x'")
    with pytest.raises(RequirementViolation) as falsy:
        require_false("DSP-001", [3], "not empty")
    assert falsy.value.actual == "[3]"
    with pytest.raises(RequirementViolation) as given:
        require("DSP-001", False, "words", expected="a free worker", actual=7)
    assert (given.value.expected, given.value.actual) == ("a free worker", "7")


def test_a_filtered_report_is_named_for_its_filter() -> None:
    path = Path("reports/reference.json")
    assert filtered_path(path, "DSP-001") == Path("reports/reference.req-DSP-001.json")
    assert filtered_path(path, "DSP-001, DSP-002") == Path(
        "reports/reference.req-DSP-001+DSP-002.json"
    )
    assert filtered_path(path, None, otherwise=True) == Path("reports/reference.partial.json")


def test_every_shipped_adapter_is_listed() -> None:
    listed = dict(shipped_adapters())
    assert {"reference", "reference-tcp", "mutants.direct-reselects"} <= set(listed)
    assert all(description for description in listed.values())


# pytest runs of small checks

CHECKS = """
from hypothesis import given, strategies as st

from routespec.conformance.checks import covers, require_equal, requires
from routespec.testing.target import Capability, Target


@covers("DSP-002")
@requires(Capability.WIRE_TRANSPORT)  # the reference adapter lacks it
def test_a_skip(target: Target) -> None:
    pass


@covers("DSP-002")
def test_b_fail(target: Target) -> None:
    require_equal("DSP-002", target.add_worker(), 7, "the first worker is not 7")


@covers("DSP-005", "SEL-006")
def test_c_fails_on_dsp_005(target: Target) -> None:
    require_equal("DSP-005", target.add_worker(), 2, "DSP-005 went wrong")


@covers("SEL-006", "DSP-001")
def test_d_pass(target: Target) -> None:
    require_equal("SEL-006", target.add_worker(), 1, "the first worker is 1")
    require_equal("DSP-001", 1, 1, "one")


@covers("DSP-001")
@requires(Capability.WIRE_TRANSPORT)
def test_e_skip(target: Target) -> None:
    pass


@covers("SEL-001")
@given(st.integers(0, 10))
def test_f_hypothesis(n: int) -> None:
    require_equal("SEL-001", n < 5, True, f"n is {n}")
"""


def _pytest(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The small checks against the reference, with a seed, a report and JUnit XML."""
    where = tmp_path_factory.mktemp("small")
    (where / "test_small.py").write_text(CHECKS, encoding="utf-8")
    done = _pytest(
        where,
        "test_small.py",
        "--adapter=reference",
        "--hypothesis-seed=12345",
        f"--conformance-report={where / 'reports' / 'small.json'}",
        f"--junitxml={where / 'junit.xml'}",
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    return where, done.stdout


def test_each_verdict_shows_its_own_check(small_run: tuple[Path, str]) -> None:
    where, stdout = small_run
    report = Report.load(where / "reports" / "small.json")
    verdicts = {row.id: (row.verdict, row.reason()) for row in report.requirements}
    assert verdicts["DSP-001"] == ("PASS", "")
    assert verdicts["SEL-006"] == ("PASS", "")
    assert verdicts["DSP-002"] == (
        "FAIL",
        "test_small.py::test_b_fail: the first worker is not 7 (expected 7, actual 1)",
    )
    assert verdicts["DSP-005"][0] == "FAIL"
    assert "DSP-005 went wrong" in verdicts["DSP-005"][1]
    row_line = re.compile(r"^(?:FAIL|XFAIL|PASS|SKIP|NOT RUN) +([A-Z]{2,4}-\d{3}) ")
    lines = {found[1]: line for line in stdout.splitlines() if (found := row_line.match(line))}
    assert "lacks capability" not in lines["DSP-002"]
    assert lines["DSP-001"].rstrip().endswith("checks")  # a pass: no reason beside it
    assert lines["SEL-006"].rstrip().endswith("checks")
    assert "  Requirement: " + load_requirements()["DSP-002"].statement in stdout
    assert "  Expected:    7" in stdout
    assert "  Actual:      1" in stdout


def test_a_violation_carries_its_sentence_values_and_steps(small_run: tuple[Path, str]) -> None:
    where, _ = small_run
    report = Report.load(where / "reports" / "small.json")
    row = report.requirement("DSP-002")
    assert row is not None
    ((check, violation),) = list(row.violations())
    assert violation.statement == load_requirements()["DSP-002"].statement
    assert (violation.expected, violation.actual) == ("7", "1")
    assert violation.steps[0].startswith("open(TargetConfig(")
    assert violation.steps[1:] == ("add_worker() -> 1",)
    assert violation.steps_recorded == 2
    assert (
        check.rerun == "python -m pytest test_small.py::test_b_fail --adapter reference "
        "--hypothesis-seed 12345"
    )


def test_a_report_says_what_produced_it(small_run: tuple[Path, str]) -> None:
    where, _ = small_run
    info = Report.load(where / "reports" / "small.json").run_info
    assert info.adapter == info.adapter_option == "reference"
    assert info.routespec_version
    assert info.spec_digest is not None
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", info.spec_digest)
    assert info.hypothesis_profile == "default"
    assert info.hypothesis_seed == "12345"
    assert info.req_filter is None
    assert info.selection is not None  # not the whole suite
    assert info.python == f"{sys.version_info.major}.{sys.version_info.minor}." + str(
        sys.version_info.micro
    )
    in_checkout = (Path(__file__).parents[1] / ".git").exists()
    assert (info.git_commit is not None) == in_checkout


def test_a_hypothesis_failure_carries_its_example_and_replays(small_run: tuple[Path, str]) -> None:
    where, _ = small_run
    report = Report.load(where / "reports" / "small.json")
    row = report.requirement("SEL-001")
    assert row is not None
    ((check, violation),) = list(row.violations())
    assert violation.example is not None
    assert "n=5" in violation.example
    assert "@reproduce_failure(" in violation.example
    assert check.rerun is not None
    assert "--hypothesis-seed 12345" in check.rerun
    replay = subprocess.run(
        [sys.executable, *shlex.split(check.rerun)[1:], "-p", "no:cacheprovider"],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert replay.returncode == 1, replay.stdout[-2000:]
    assert "SEL-001: n is 5" in replay.stdout


def test_junit_xml_carries_the_requirement_ids(small_run: tuple[Path, str]) -> None:
    where, _ = small_run
    tree = ElementTree.parse(where / "junit.xml")
    properties = {
        case.get("name"): [(p.get("name"), p.get("value")) for p in case.iter("property")]
        for case in tree.iter("testcase")
    }
    assert properties["test_c_fails_on_dsp_005"] == [
        ("requirement", "DSP-005"),
        ("requirement", "SEL-006"),
    ]
    assert properties["test_a_skip"] == [("requirement", "DSP-002")]


def test_a_filtered_run_keeps_a_full_report(tmp_path: Path) -> None:
    (tmp_path / "test_small.py").write_text(CHECKS, encoding="utf-8")
    full = tmp_path / "reports" / "reference.json"
    _report(_check("passes_dsp_001", ["DSP-001"], "passed")).write(full)
    kept = full.read_bytes()
    done = _pytest(tmp_path, "test_small.py", "--req=DSP-001", f"--conformance-report={full}")
    assert done.returncode == 0, done.stdout[-3000:]
    assert full.read_bytes() == kept
    filtered = Report.load(tmp_path / "reports" / "reference.req-DSP-001.json")
    assert filtered.run_info.selection == "--req DSP-001"
    assert filtered.run_info.req_filter == "DSP-001"
    assert "holds a full run's report and is kept" in done.stdout
    assert "report: " + str(tmp_path / "reports" / "reference.req-DSP-001.json") in done.stdout


def test_the_plugin_stays_out_of_other_sessions(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text(
        "import sys\n\n\ndef test_plain() -> None:\n"
        "    assert 'routespec.adapters.reference' not in sys.modules\n",
        encoding="utf-8",
    )
    report = tmp_path / "r.json"
    done = _pytest(tmp_path, "test_plain.py", f"--conformance-report={report}")
    assert done.returncode == 0, done.stdout
    assert "routespec conformance" not in done.stdout
    assert not report.exists()
    (tmp_path / "test_other.py").write_text("def test_other() -> None:\n    pass\n")
    explicit = _pytest(tmp_path, "test_other.py", "--adapter=reference")
    assert explicit.returncode == 5  # an explicit conformance run that checked nothing
    bad = _pytest(tmp_path, "test_other.py", "--adapter=no-such-adapter")
    assert bad.returncode == 4
    assert "--adapter no-such-adapter" in bad.stderr


def test_a_bad_req_is_blamed_on_req(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "--adapter", "reference", "--req", "DSP-001,NOPE-001"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("routespec: error: --req: ")
    assert "NOPE-001" in line


def test_the_command_names_stable_checks_and_replays_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """From an unrelated directory: check names as in a checkout, a rerun command that fails
    again, and the adapter's expected failures found by those names."""
    monkeypatch.chdir(tmp_path)
    argv = ["conformance", "--adapter", "mutants.direct-reselects", "--req", "DSP-001"]
    argv += ["--hypothesis-seed", "0"]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert "  Requirement: " in out
    assert "  Actual:      " in out
    assert "violates the requirements marked FAIL" in err
    report = Report.load(tmp_path / "reports" / "mutants.direct-reselects.req-DSP-001.json")
    failed = report.failed_checks()
    assert failed
    assert all(re.fullmatch(r"conformance/test_\w+\.py::\w+(\[.*\])?", c.check) for c in failed)
    first = next(c for c in failed if "machine" not in c.check)
    assert first.rerun is not None
    assert "--pyargs routespec.conformance.test_" in first.rerun
    replay = subprocess.run(
        [sys.executable, *shlex.split(first.rerun)[1:], "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert replay.returncode == 1, replay.stdout[-2000:]
    expected = {check.check: "known" for check in failed}
    (tmp_path / "declared.py").write_text(
        "import attrs\n\n"
        "from routespec.adapters.mutants.direct_reselects import ADAPTER as MUTANT\n\n"
        f"ADAPTER = attrs.evolve(MUTANT, expected_failures={expected!r})\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    argv[2] = "declared:ADAPTER"
    assert main(argv) == 0, capsys.readouterr()
    declared = Report.load(tmp_path / "reports" / "declared_ADAPTER.req-DSP-001.json")
    row = declared.requirement("DSP-001")
    assert row is not None
    assert row.verdict == "XFAIL"
