"""Render several adapters' JSON conformance reports as one docs page.

``python -m routespec.conformance.matrix REPORT.json [REPORT.json ...] --output docs/matrix.md``
writes a Markdown page: the verdict totals per adapter, then a table with a row per
requirement (linked to its block in the rendered spec) and a column per report in the order
given, each cell that adapter's verdict, then the reason for every verdict that is not a
pass. The page carries no timestamps, so the same reports always give the same page.
"""

from __future__ import annotations

import argparse
import html
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from routespec.conformance.registry import Requirement, load_requirements
from routespec.conformance.report import VERDICTS, Report, RequirementResult

DEFAULT_OUTPUT = Path("docs/matrix.md")
# Where docs/hooks.py publishes spec/*.md in the site, relative to docs/matrix.md.
SPEC_BASE = "spec/"
MISSING = "—"
# Characters Python-Markdown acts on before it sets inline HTML aside (and the cell separator).
_MARKDOWN_SIGNIFICANT = {ord(c): f"&#{ord(c)};" for c in "|`\\[]{}"}
# Characters Python-Markdown acts on in running text, escaped with a backslash.
_BACKSLASHED = {ord(c): f"\\{c}" for c in "\\`*_{}[]"}
TITLE_LIMIT = 200


def cell(report: Report, rid: str) -> tuple[str, str]:
    """The verdict of ``report`` for ``rid`` (— when absent) and, for anything but a pass,
    the reason: the check that produced that verdict and what it saw."""
    row = report.requirement(rid)
    if row is None:
        return MISSING, ""
    return row.verdict, row.reason()


def render(
    reports: Sequence[Report],
    requirements: Mapping[str, Requirement],
    spec_base: str = SPEC_BASE,
    mutation: Mapping[str, Any] | None = None,
) -> str:
    """The Markdown page for ``reports`` (columns in this order); ``mutation``, a mutation
    tool's summary (``python -m mutation`` writes docs/mutation-score.json), is shown beside
    the totals: how much of the implementation the suite's verdicts pin down."""
    rows = [{row.id: row for row in report.requirements} for report in reports]
    ids = sorted({*requirements, *(rid for by_id in rows for rid in by_id)})
    anchors = _anchors(reports)
    tallies: list[dict[str, int]] = [{} for _ in reports]
    table: list[str] = []
    reasons: list[list[str]] = [[] for _ in reports]
    for rid in ids:
        cells = []
        for index, by_id in enumerate(rows):
            row = by_id.get(rid)
            verdict = row.verdict if row is not None else MISSING
            tallies[index][verdict] = tallies[index].get(verdict, 0) + 1
            if row is None or row.verdict == "PASS":
                cells.append(verdict)
                continue
            anchor = f"why-{anchors[index]}-{rid}"
            title = _attribute(row.brief(TITLE_LIMIT))
            cells.append(f'<a href="#{anchor}" title="{title}">{verdict}</a>')
            reasons[index].append(_reason_item(anchor, row, requirements, spec_base))
        table.append(
            f"| {_link(rid, requirements, spec_base)} | {_level(rid, requirements, rows)} | "
            + " | ".join(cells)
            + " |"
        )
    lines = [
        "# Conformance matrix",
        "",
        "The verdict totals of each adapter report, then one row per requirement, linked to its",
        "text in the specification, and one column per report, in the order the reports were",
        "given. A cell is that adapter's verdict",
        "([what each verdict means](index.md#reading-the-report)); anything but a pass links to",
        f"its reason, listed below the table. {MISSING} means the report has no entry for the",
        "requirement.",
        "",
        "Regenerate it from the reports of `--conformance-report` runs:",
        "`python -m routespec.conformance.matrix reports/reference.json …",
        "--output docs/matrix.md`.",
        "It holds no run times, so the same reports give the same page.",
        "",
        "## Totals",
        "",
        "| adapter | Hypothesis profile | " + " | ".join([*VERDICTS, MISSING]) + " |",
        "| --- | --- |" + " ---: |" * (len(VERDICTS) + 1),
    ]
    for report, tally in zip(reports, tallies, strict=True):
        counts = " | ".join(str(tally.get(v, 0)) for v in [*VERDICTS, MISSING])
        info = report.run_info
        lines.append(f"| `{info.adapter}` | `{info.hypothesis_profile}` | {counts} |")
    if mutation is not None:
        lines += ["", *_mutation_lines(mutation)]
    lines += [
        "",
        "## Requirements",
        "",
        "| requirement | level | " + " | ".join(f"`{r.run_info.adapter}`" for r in reports) + " |",
        "| --- | --- |" + " --- |" * len(reports),
        *table,
        "| **total** | | " + " | ".join(_counts(tally) for tally in tallies) + " |",
        "",
        "## Reasons",
        "",
        "Why each verdict that is not a pass is what it is: the check that produced it and what",
        "it observed.",
    ]
    for report, listed in zip(reports, reasons, strict=True):
        lines += ["", f"### `{report.run_info.adapter}`", ""]
        lines += listed or ["Every requirement in this report passed."]
    return "\n".join(lines) + "\n"


def _mutation_lines(summary: Mapping[str, Any]) -> list[str]:
    score = summary["score"]
    shown = "n/a" if score is None else f"{100 * score:.1f} %"
    return [
        f"**The suite's power:** a mutation score of **{shown}** on `{summary['target']}` "
        f"({summary['killed']} of {summary['judged']} checked non-equivalent mutants killed, "
        f"{summary['not_checked']} of {summary['mutants']} not checked yet; commit "
        f"`{summary['commit'][:12]}`): [per module and every survivor](mutation.md).",
    ]


def _anchors(reports: Sequence[Report]) -> list[str]:
    """An HTML-id-safe, unique slug per report."""
    slugs: list[str] = []
    for report in reports:
        slug = re.sub(r"[^A-Za-z0-9_-]+", "-", report.run_info.adapter).strip("-") or "report"
        unique, number = slug, 2
        while unique in slugs:
            unique, number = f"{slug}-{number}", number + 1
        slugs.append(unique)
    return slugs


def _reason_item(
    anchor: str, row: RequirementResult, requirements: Mapping[str, Requirement], base: str
) -> str:
    reason = row.reason()
    check = row.deciding_check()
    if check is not None and reason.startswith(f"{check.check}: "):
        reason = _code(check.check) + ": " + _text(reason.removeprefix(f"{check.check}: "))
    else:
        reason = _text(reason)
    link = _link(row.id, requirements, base)
    return f'- <a id="{anchor}"></a>{link} **{row.verdict}**: {reason}'


def _link(rid: str, requirements: Mapping[str, Requirement], spec_base: str) -> str:
    requirement = requirements.get(rid)
    if requirement is None:
        return f"`{rid}` (not in the spec)"
    return f"[{rid}]({spec_base}{requirement.page}#{rid})"


def _level(
    rid: str,
    requirements: Mapping[str, Requirement],
    rows: Sequence[Mapping[str, RequirementResult]],
) -> str:
    requirement = requirements.get(rid)
    if requirement is not None:
        status = requirement.status
        return requirement.level if status == "stable" else f"{requirement.level} · {status}"
    levels = [by_id[rid].level for by_id in rows if rid in by_id and by_id[rid].level]
    return str(levels[0]) if levels else MISSING


def _attribute(text: str) -> str:
    """``text`` as a quoted HTML attribute value inside a Markdown table cell."""
    return html.escape(" ".join(text.split()), quote=True).translate(_MARKDOWN_SIGNIFICANT)


def _text(text: str) -> str:
    """``text`` shown literally in Markdown running text (one line, no markup)."""
    return html.escape(" ".join(text.split()), quote=False).translate(_BACKSLASHED)


def _code(text: str) -> str:
    """``text`` as a Markdown code span."""
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    padding = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{padding}{text}{padding}{fence}"


def _counts(tally: Mapping[str, int]) -> str:
    order = [*VERDICTS, *sorted(set(tally) - {*VERDICTS, MISSING}), MISSING]
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
    parser.add_argument(
        "--mutation", type=Path, metavar="SCORE.json", help="a mutation summary to show too"
    )
    args = parser.parse_args(argv)
    reports = []
    for path in args.reports:
        try:
            reports.append(Report.load(path))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            parser.error(f"{path}: not a conformance report ({type(error).__name__}: {error})")
    mutation = None
    if args.mutation is not None:
        try:
            mutation = json.loads(args.mutation.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            parser.error(f"{args.mutation}: not a mutation summary ({error})")
    page = render(reports, load_requirements(), args.spec_base, mutation)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(page, encoding="utf-8")
    print(f"wrote {args.output}: {len(reports)} adapters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
