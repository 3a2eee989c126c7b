"""The conformance matrix: reports in, one Markdown table out (conformance/matrix.py)."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from routespec.conformance.matrix import main, render
from routespec.conformance.registry import Requirement
from routespec.conformance.report import Report

REQUIREMENTS = {
    rid: Requirement(rid, f"title {rid}", level, status, "statement", "rationale", page)
    for rid, level, status, page in [
        ("DSP-001", "MUST", "stable", "dispatch.md"),
        ("DSP-002", "SHOULD", "provisional", "dispatch.md"),
        ("TRN-001", "MUST", "stable", "transport.md"),
        ("TRN-002", "MUST", "stable", "transport.md"),
    ]
}
# Characters Markdown would act on inside a table cell, to check the reason survives them.
STARTED = "2001-02-03T04:05:06Z"
AWKWARD = 'needs `a|b` [x](y) \\* {: #z } <tag> & "quoted"'


def _check(name: str, ids: list[str], outcome: str, detail: str = "", **extra: Any) -> Any:
    return {
        "check": f"conformance/test_x.py::{name}",
        "ids": ids,
        "outcome": outcome,
        "detail": detail,
        "violated": [],
        "duration_s": 0.1,
        "unexercised": [],
        **extra,
    }


def _write(path: Path, adapter: str, rows: list[tuple[str, str, list[Any]]]) -> Path:
    requirements = [
        {"id": rid, "level": "MUST", "result": result, "checks": checks}
        for rid, result, checks in rows
    ]
    document = {
        "run_info": {"adapter": adapter, "hypothesis_profile": "default", "started": STARTED},
        "summary": {},
        "requirements": requirements,
    }
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


@pytest.fixture
def reports(tmp_path: Path) -> list[Path]:
    first = _write(
        tmp_path / "alpha.json",
        "alpha",
        [
            ("DSP-001", "PASS", [_check("t1", ["DSP-001"], "passed")]),
            ("DSP-002", "XFAIL", [_check("t2", ["DSP-002"], "xfailed", "known bug #12")]),
            ("TRN-001", "SKIP", [_check("t3", ["TRN-001"], "skipped", AWKWARD)]),
            ("TRN-002", "NOT RUN", []),
        ],
    )
    second = _write(
        tmp_path / "beta.json",
        "beta",
        [
            ("DSP-001", "FAIL", [_check("t1", ["DSP-001"], "failed", "sent to w2")]),
            ("DSP-002", "SKIP", [_check("t2", ["DSP-002"], "passed", unexercised=["DSP-002"])]),
            ("XYZ-001", "PASS", [_check("t9", ["XYZ-001"], "passed")]),
        ],
    )
    return [first, second]


def _rows(page: str) -> dict[str, list[str]]:
    table = [line for line in page.splitlines() if line.startswith("| ") and "---" not in line]
    return {cells[0]: cells[1:] for cells in (_cells(line) for line in table)}


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _cell(report: str, rid: str, verdict: str, reason: str) -> str:
    return f'<a href="#why-{report}-{rid}" title="{reason}">{verdict}</a>'


def test_rows_columns_links_and_counts(reports: list[Path]) -> None:
    page = render([Report.load(path) for path in reports], REQUIREMENTS)
    assert page.startswith("# Conformance matrix\n")
    rows = _rows(page.split("## Requirements")[1].split("## Reasons")[0])
    assert rows.pop("requirement") == ["level", "`alpha`", "`beta`"]
    assert list(rows) == [
        "[DSP-001](spec/dispatch.md#DSP-001)",
        "[DSP-002](spec/dispatch.md#DSP-002)",
        "[TRN-001](spec/transport.md#TRN-001)",
        "[TRN-002](spec/transport.md#TRN-002)",
        "`XYZ-001` (not in the spec)",
        "**total**",
    ]
    assert rows["[DSP-001](spec/dispatch.md#DSP-001)"] == [
        "MUST",
        "PASS",
        _cell("beta", "DSP-001", "FAIL", "conformance/test_x.py::t1: sent to w2"),
    ]
    dsp2 = rows["[DSP-002](spec/dispatch.md#DSP-002)"]
    assert dsp2[0] == "SHOULD · provisional"  # the spec, not the report, gives the level
    assert dsp2[1] == _cell(
        "alpha", "DSP-002", "XFAIL", "conformance/test_x.py::t2: expected failure (known bug #12)"
    )
    assert dsp2[2].startswith('<a href="#why-beta-DSP-002" title="conformance/test_x.py::t2: pass')
    assert rows["[TRN-002](spec/transport.md#TRN-002)"] == [
        "MUST",
        _cell("alpha", "TRN-002", "NOT RUN", "no check that ran cites it"),
        "—",
    ]
    assert rows["`XYZ-001` (not in the spec)"] == ["MUST", "—", "PASS"]
    assert rows["**total**"] == [
        "",
        "XFAIL 1 · PASS 1 · SKIP 1 · NOT RUN 1 · — 1",
        "FAIL 1 · PASS 1 · SKIP 1 · — 2",
    ]


def test_the_totals_come_first(reports: list[Path]) -> None:
    page = render([Report.load(path) for path in reports], REQUIREMENTS)
    assert page.index("## Totals") < page.index("## Requirements") < page.index("## Reasons")
    totals = _rows(page.split("## Totals")[1].split("## Requirements")[0])
    assert totals["adapter"] == [
        "Hypothesis profile",
        "FAIL",
        "XFAIL",
        "PASS",
        "SKIP",
        "NOT RUN",
        "—",
    ]
    assert totals["`alpha`"] == ["`default`", "0", "1", "1", "1", "1", "1"]
    assert totals["`beta`"] == ["`default`", "1", "0", "1", "1", "0", "2"]


def test_every_reason_is_on_the_page(reports: list[Path]) -> None:
    page = render([Report.load(path) for path in reports], REQUIREMENTS)
    reasons = page.split("## Reasons")[1]
    alpha, beta = reasons.split("### `alpha`")[1].split("### `beta`")
    assert '<a id="why-beta-DSP-001"></a>' in beta
    assert "**FAIL**: `conformance/test_x.py::t1`: sent to w2" in beta
    assert "**XFAIL**: `conformance/test_x.py::t2`: expected failure (known bug #12)" in alpha
    assert "**NOT RUN**: no check that ran cites it" in alpha
    assert "t1" not in alpha.split("DSP-002")[0]  # a PASS has no reason listed


def test_column_order_follows_the_arguments(reports: list[Path]) -> None:
    page = render([Report.load(path) for path in reversed(reports)], REQUIREMENTS)
    assert _rows(page.split("## Requirements")[1])["requirement"] == ["level", "`beta`", "`alpha`"]


def test_the_page_is_the_same_for_the_same_reports(reports: list[Path]) -> None:
    loaded = [Report.load(path) for path in reports]
    assert render(loaded, REQUIREMENTS) == render(loaded, REQUIREMENTS)
    assert STARTED not in render(loaded, REQUIREMENTS)


class _Rendered(HTMLParser):
    """The link titles and the text of the list items of a rendered page."""

    def __init__(self) -> None:
        super().__init__()
        self.titles: list[str | None] = []
        self.items: list[str] = []
        self._in_item = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a" and "title" in dict(attrs):
            self.titles.append(dict(attrs)["title"])
        if tag == "li":
            self._in_item = True
            self.items.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "li":
            self._in_item = False

    def handle_data(self, data: str) -> None:
        if self._in_item:
            self.items[-1] += data


def test_a_reason_survives_markdown(reports: list[Path]) -> None:
    markdown = pytest.importorskip("markdown")
    page = render([Report.load(reports[0])], REQUIREMENTS)
    rendered = _Rendered()
    rendered.feed(markdown.markdown(page, extensions=["tables", "attr_list"]))
    assert f"conformance/test_x.py::t3: {AWKWARD}" in rendered.titles
    assert f"TRN-001 SKIP: conformance/test_x.py::t3: {AWKWARD}" in rendered.items


def test_the_command_writes_the_page(
    reports: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "docs" / "matrix.md"
    assert main([*map(str, reports), "--output", str(output)]) == 0
    page = output.read_text(encoding="utf-8")
    assert "| [DSP-001](spec/dispatch.md#DSP-001) |" in page  # the real spec defines DSP-001
    assert "wrote" in capsys.readouterr().out


def test_an_unreadable_report_is_a_usage_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{", encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        main([str(broken), "--output", str(tmp_path / "matrix.md")])
    assert exit_info.value.code == 2


def test_a_mutation_summary_is_shown_beside_the_totals(reports: list[Path], tmp_path: Path) -> None:
    summary = tmp_path / "mutation-score.json"
    summary.write_text(
        json.dumps(
            {
                "target": "reference/routespec (specified layers)",
                "commit": "0123456789abcdef",
                "score": 0.934,
                "killed": 239,
                "judged": 256,
                "not_checked": 10,
                "mutants": 276,
            }
        ),
        encoding="utf-8",
    )
    output = tmp_path / "matrix.md"
    assert main([*map(str, reports), "--output", str(output), "--mutation", str(summary)]) == 0
    totals = output.read_text(encoding="utf-8").split("## Totals")[1].split("## Requirements")[0]
    assert "a mutation score of **93.4 %**" in totals
    assert "239 of 256 checked non-equivalent mutants killed" in totals
    assert "`0123456789ab`" in totals


def test_an_unreadable_mutation_summary_is_a_usage_error(
    reports: list[Path], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*map(str, reports), "--output", str(tmp_path / "m.md"), "--mutation", "nope.json"])
    assert exit_info.value.code == 2
