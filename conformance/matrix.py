"""Render several adapters' JSON conformance reports as one docs page.

``python -m routespec.conformance.matrix REPORT.json [REPORT.json ...] --output docs/matrix.md``
writes
a Markdown table: a row per requirement (linked to its block in the rendered spec), a column
per report in the order given, each cell that adapter's verdict. The page carries no
timestamps, so the same reports always give the same page.
"""

from __future__ import annotations

import argparse
import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from routespec.conformance.plugin import RESULT_ORDER, CheckResult
from routespec.conformance.registry import Requirement, load_requirements

DEFAULT_OUTPUT = Path("docs/matrix.md")
# Where docs/hooks.py publishes spec/*.md in the site, relative to docs/matrix.md.
SPEC_BASE = "spec/"
MISSING = "—"
# Characters Python-Markdown acts on before it sets inline HTML aside (and the cell separator).
_MARKDOWN_SIGNIFICANT = {ord(c): f"&#{ord(c)};" for c in "|`\\[]{}"}
# What the plugin says when a check passed without ever evaluating the requirement.
_UNEXERCISED = "no step could exercise it with this adapter's capabilities"
_OUTCOME = {"FAIL": "failed", "SKIP": "skipped", "XFAIL": "xfailed"}


@attrs.frozen
class Report:
    """One adapter's report: its name, profile and each requirement's row."""

    adapter: str
    profile: str
    rows: Mapping[str, Mapping[str, Any]]

    @classmethod
    def load(cls, path: Path) -> Report:
        """Read a report written by ``--conformance-report``."""
        document = json.loads(path.read_text(encoding="utf-8"))
        info = document["run_info"]
        rows = {row["id"]: row for row in document["requirements"]}
        return cls(str(info["adapter"]), str(info.get("hypothesis_profile", "?")), rows)

    def cell(self, rid: str) -> tuple[str, str]:
        """The verdict for ``rid`` (— when absent) and why, for anything but a pass."""
        row = self.rows.get(rid)
        if row is None:
            return MISSING, ""
        verdict = str(row["result"])
        for check in map(_check, row.get("checks", [])):
            if verdict in _OUTCOME and check.outcome_for(rid) == _OUTCOME[verdict]:
                return verdict, f"{check.check}: {check.detail or _UNEXERCISED}"
        return verdict, ""


def _check(fields: Mapping[str, Any]) -> CheckResult:
    """A report's check entry as the plugin's ``CheckResult`` (JSON lists back to tuples)."""
    known = {field.name for field in attrs.fields(CheckResult)}
    kwargs: dict[str, Any] = {
        name: tuple(value) if isinstance(value, list) else value
        for name, value in fields.items()
        if name in known
    }
    return CheckResult(**kwargs)


def render(
    reports: Sequence[Report],
    requirements: Mapping[str, Requirement],
    spec_base: str = SPEC_BASE,
) -> str:
    """The Markdown page for ``reports`` (columns in this order)."""
    ids = sorted({*requirements, *(rid for report in reports for rid in report.rows)})
    lines = [
        "# Conformance matrix",
        "",
        "One row per requirement, linked to its text in the specification; one column per",
        "adapter report, in the order the reports were given. A cell is that adapter's verdict",
        "([what each verdict means](index.md#reading-the-report)); for anything but a pass, hover",
        f"it for the first relevant check and why. {MISSING} means the report has no entry for",
        "the requirement. The last row counts the verdicts per adapter.",
        "",
        "Regenerate it from the reports of `--conformance-report` runs:",
        "`python -m routespec.conformance.matrix reports/reference.json …",
        "--output docs/matrix.md`.",
        "It holds no run times, so the same reports give the same page.",
        "",
    ]
    lines += [f"- `{r.adapter}`: Hypothesis profile `{r.profile}`" for r in reports]
    lines += [
        "",
        "| requirement | level | " + " | ".join(f"`{r.adapter}`" for r in reports) + " |",
        "| --- | --- |" + " --- |" * len(reports),
    ]
    counts: list[dict[str, int]] = [{} for _ in reports]
    for rid in ids:
        cells = []
        for report, tally in zip(reports, counts, strict=True):
            verdict, why = report.cell(rid)
            tally[verdict] = tally.get(verdict, 0) + 1
            cells.append(_verdict(verdict, why))
        lines.append(
            f"| {_link(rid, requirements, spec_base)} | {_level(rid, requirements, reports)} | "
            + " | ".join(cells)
            + " |"
        )
    lines.append("| **total** | | " + " | ".join(_counts(tally) for tally in counts) + " |")
    return "\n".join(lines) + "\n"


def _link(rid: str, requirements: Mapping[str, Requirement], spec_base: str) -> str:
    requirement = requirements.get(rid)
    if requirement is None:
        return f"`{rid}` (not in the spec)"
    return f"[{rid}]({spec_base}{requirement.page}#{rid})"


def _level(rid: str, requirements: Mapping[str, Requirement], reports: Sequence[Report]) -> str:
    requirement = requirements.get(rid)
    if requirement is not None:
        status = requirement.status
        return requirement.level if status == "stable" else f"{requirement.level} · {status}"
    levels = [str(r.rows[rid]["level"]) for r in reports if r.rows.get(rid, {}).get("level")]
    return levels[0] if levels else MISSING


def _verdict(verdict: str, why: str) -> str:
    if not why:
        return verdict
    title = html.escape(" ".join(why.split()), quote=True).translate(_MARKDOWN_SIGNIFICANT)
    return f'<abbr title="{title}">{verdict}</abbr>'


def _counts(tally: Mapping[str, int]) -> str:
    order = [*RESULT_ORDER, *sorted(set(tally) - {*RESULT_ORDER, MISSING}), MISSING]
    return " · ".join(f"{verdict} {tally[verdict]}" for verdict in order if tally.get(verdict))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: read the reports, write the page."""
    parser = argparse.ArgumentParser(
        prog="python -m routespec.conformance.matrix", description=__doc__
    )
    parser.add_argument("reports", nargs="+", type=Path, metavar="REPORT.json")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, metavar="PATH")
    parser.add_argument(
        "--spec-base", default=SPEC_BASE, help="link prefix of the spec pages from the output"
    )
    args = parser.parse_args(argv)
    reports = []
    for path in args.reports:
        try:
            reports.append(Report.load(path))
        except (OSError, ValueError, KeyError, TypeError) as error:
            parser.error(f"{path}: not a conformance report ({type(error).__name__}: {error})")
    page = render(reports, load_requirements(), args.spec_base)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(page, encoding="utf-8")
    print(f"wrote {args.output}: {len(reports)} adapters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
