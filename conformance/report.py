"""The conformance report: what a run found, per requirement, as typed, frozen objects.

The pytest plugin (``plugin.py``) builds a ``Report`` from the checks' results and writes it
as JSON and Markdown; the conformance matrix and the ``routespec conformance`` summary read
it back with ``Report.load``. The JSON holds every text in full; the Markdown and the
terminal may shorten a check's words but always keep the actual value.

A requirement's verdict comes from the checks that cite it (or that reported a violation of
it): FAIL if one of them failed on it, else XFAIL, PASS, SKIP, and NOT RUN when none gave
evidence. A check that failed on *another* requirement says nothing about this one; a check
that passed without ever evaluating the requirement counts as SKIP for it.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs

from routespec.conformance.registry import Requirement

if TYPE_CHECKING:
    from attrs import AttrsInstance

Outcome = Literal["passed", "failed", "skipped", "xfailed"]
Verdict = Literal["FAIL", "XFAIL", "PASS", "SKIP", "NOT RUN"]
VERDICTS: Final[tuple[Verdict, ...]] = ("FAIL", "XFAIL", "PASS", "SKIP", "NOT RUN")
RESULT_ORDER: Final = VERDICTS  # the older name
# Which check outcome produces each verdict, strongest first.
_PRODUCED_BY: Final[tuple[tuple[Outcome, Verdict], ...]] = (
    ("failed", "FAIL"),
    ("xfailed", "XFAIL"),
    ("passed", "PASS"),
    ("skipped", "SKIP"),
)
_OUTCOME_OF: Final[Mapping[Verdict, Outcome]] = {v: o for o, v in _PRODUCED_BY}
# What a check that passed without evaluating a requirement says about it.
UNEXERCISED: Final = "passed without evaluating it: no step could exercise it with this adapter"


def one_line(text: str) -> str:
    """``text`` with its line breaks and runs of spaces collapsed."""
    return " ".join(text.split())


def shorten(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    flat = one_line(text)
    return flat if len(flat) <= limit else flat[: max(limit - 1, 0)].rstrip() + "…"


@attrs.frozen
class Violation:
    """A check observed behaviour that contradicts one requirement."""

    requirement_id: str
    statement: str  # the requirement's sentence, from the spec
    detail: str  # the check's own words
    expected: str | None = None
    actual: str | None = None
    # The calls the check made on its target ("method(args) -> result"), the last ones of
    # ``steps_recorded`` in all.
    steps: tuple[str, ...] = ()
    steps_recorded: int = 0
    # Hypothesis's failing example (its printed steps or arguments), when it gave one.
    example: str | None = None

    def outcome_text(self) -> str:
        """``expected E, actual A`` (whichever the check stated), else ''."""
        parts = []
        if self.expected is not None:
            parts.append(f"expected {one_line(self.expected)}")
        if self.actual is not None:
            parts.append(f"actual {one_line(self.actual)}")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return _as_json(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Violation:
        return cls(
            str(data["requirement_id"]),
            str(data.get("statement") or ""),
            str(data.get("detail") or ""),
            _optional(data.get("expected")),
            _optional(data.get("actual")),
            tuple(map(str, data.get("steps") or ())),
            int(data.get("steps_recorded") or 0),
            _optional(data.get("example")),
        )


@attrs.frozen
class CheckResult:
    """What one check (one test item) did."""

    check: str  # "conformance/test_x.py::test_name[params]"
    ids: tuple[str, ...]  # the requirement IDs it cites
    outcome: Outcome
    # For a failure the check's words (or the error), for a skip its reason, for an
    # expected failure the adapter's evidence; "" for a pass.
    detail: str
    violated: tuple[str, ...]  # the requirement IDs of the violations it raised
    duration_s: float
    unexercised: tuple[str, ...] = ()  # cited IDs a passing check never evaluated
    violations: tuple[Violation, ...] = ()
    rerun: str | None = None  # a command that runs this check again

    def outcome_for(self, requirement_id: str) -> Outcome | None:
        """What this check says about one of its IDs; None when it says nothing."""
        failed = self.outcome in ("failed", "xfailed")
        if failed and self.violated and requirement_id not in self.violated:
            return None  # it failed on another requirement: no evidence for this one
        if self.outcome == "passed" and requirement_id in self.unexercised:
            return "skipped"  # passed without ever evaluating this requirement
        return self.outcome

    def violation_of(self, requirement_id: str) -> Violation | None:
        return next((v for v in self.violations if v.requirement_id == requirement_id), None)

    def reason_for(self, requirement_id: str) -> str:
        """One line: this check's name and what it says about ``requirement_id``."""
        outcome = self.outcome_for(requirement_id)
        if outcome == "passed" or outcome is None:
            return ""
        if self.outcome == "passed":  # passed, but never evaluated this requirement
            return f"{self.check}: {UNEXERCISED}"
        violation = self.violation_of(requirement_id)
        words = violation.detail if violation is not None else self.detail
        if outcome == "xfailed":
            words = f"expected failure ({one_line(self.detail)})" + (
                f": {violation.detail}" if violation is not None else ""
            )
        stated = violation.outcome_text() if violation is not None else ""
        return one_line(f"{self.check}: {words}" + (f" ({stated})" if stated else ""))

    def brief_for(self, requirement_id: str, limit: int) -> str:
        """``reason_for`` cut to about ``limit`` characters; the actual value is kept whole."""
        reason = self.reason_for(requirement_id)
        violation = self.violation_of(requirement_id)
        if len(reason) <= limit or violation is None or violation.actual is None:
            return shorten(reason, limit)
        actual = f" (actual {one_line(violation.actual)})"
        return shorten(reason.removesuffix(f" ({violation.outcome_text()})"), limit) + actual

    def to_json(self) -> dict[str, Any]:
        return _as_json(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckResult:
        return cls(
            str(data["check"]),
            tuple(map(str, data.get("ids") or ())),
            _outcome(data["outcome"]),
            str(data.get("detail") or ""),
            tuple(map(str, data.get("violated") or ())),
            float(data.get("duration_s") or 0.0),
            tuple(map(str, data.get("unexercised") or ())),
            tuple(Violation.from_json(v) for v in data.get("violations") or ()),
            _optional(data.get("rerun")),
        )


@attrs.frozen
class RequirementResult:
    """One requirement's verdict and the checks that gave evidence about it."""

    id: str
    level: str | None  # MUST | SHOULD; None for an ID the spec does not define
    verdict: Verdict
    statement: str  # the requirement's sentence
    title: str | None = None
    page: str | None = None
    spec_status: str | None = None
    checks: tuple[CheckResult, ...] = ()

    def deciding_check(self) -> CheckResult | None:
        """The first check whose outcome produced this verdict (None for NOT RUN)."""
        if self.verdict == "NOT RUN":
            return None
        wanted = _OUTCOME_OF[self.verdict]
        return next((c for c in self.checks if c.outcome_for(self.id) == wanted), None)

    def reason(self) -> str:
        """One line: for anything but PASS, the check that produced this verdict and its
        words (with the expected and actual value when the check stated them); '' for PASS."""
        if self.verdict == "PASS":
            return ""
        if self.verdict == "NOT RUN":
            return self._not_run()
        check = self.deciding_check()
        return check.reason_for(self.id) if check is not None else ""

    def brief(self, limit: int = 160) -> str:
        """``reason()`` shortened to about ``limit`` characters, keeping the actual value."""
        if self.verdict in ("PASS", "NOT RUN"):
            return shorten(self.reason(), limit)
        check = self.deciding_check()
        return check.brief_for(self.id, limit) if check is not None else ""

    def violations(self) -> Iterator[tuple[CheckResult, Violation]]:
        """Each violation of this requirement, with the check that observed it."""
        for check in self.checks:
            if check.outcome == "failed":
                violation = check.violation_of(self.id)
                if violation is not None:
                    yield check, violation

    def _not_run(self) -> str:
        stopped = [c for c in self.checks if c.outcome in ("failed", "xfailed") and c.violated]
        if stopped:
            names = "; ".join(f"{c.check} on {', '.join(c.violated)}" for c in stopped)
            return f"no check evaluated it: the checks citing it stopped first ({names})"
        if not self.checks:
            return "no check that ran cites it"
        return "no check gave evidence for it"

    def to_json(self) -> dict[str, Any]:
        data = _as_json(self)
        data["result"] = data.pop("verdict")
        data["reason"] = self.reason()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequirementResult:
        return cls(
            str(data["id"]),
            _optional(data.get("level")),
            _verdict(data["result"]),
            str(data.get("statement") or ""),
            _optional(data.get("title")),
            _optional(data.get("page")),
            _optional(data.get("spec_status")),
            tuple(CheckResult.from_json(c) for c in data.get("checks") or ()),
        )


@attrs.frozen
class RunInfo:
    """What produced a report, so that it can be compared and replayed."""

    adapter: str  # the adapter's name
    duration_s: float = 0.0
    adapter_option: str | None = None  # --adapter as given (NAME or module:attr)
    capabilities: tuple[str, ...] = ()
    routespec_version: str | None = None
    spec_digest: str | None = None  # sha256 over spec/*.md, see plugin.spec_digest
    git_commit: str | None = None  # when run from a checkout
    hypothesis_profile: str | None = None
    hypothesis_seed: str | None = None  # --hypothesis-seed, None when Hypothesis chose
    req_filter: str | None = None  # --req
    # None for a run of the whole suite; else how the checks were narrowed
    # ("--req DSP-001", "-k …", "a subset of the checks").
    selection: str | None = None
    python: str | None = None
    started: str | None = None

    @property
    def filtered(self) -> bool:
        return self.selection is not None

    def to_json(self) -> dict[str, Any]:
        return _as_json(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunInfo:
        known = {field.name for field in attrs.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["adapter"] = str(data["adapter"])
        values["duration_s"] = float(data.get("duration_s") or 0.0)
        values["capabilities"] = tuple(map(str, data.get("capabilities") or ()))
        if values.get("hypothesis_seed") is not None:
            values["hypothesis_seed"] = str(values["hypothesis_seed"])
        return cls(**values)


@attrs.frozen
class Report:
    """One conformance run of one adapter."""

    run_info: RunInfo
    summary: dict[str, int]  # verdict -> how many requirements have it (every verdict)
    requirements: tuple[RequirementResult, ...]
    seed003: tuple[Mapping[str, Any], ...] = ()  # the upstream suite's map (seed_map.py)

    @classmethod
    def build(
        cls,
        run_info: RunInfo,
        registry: Mapping[str, Requirement],
        results: Iterable[CheckResult],
        seed003: Sequence[Mapping[str, Any]] = (),
    ) -> Report:
        """The report of ``results``: a row for every requirement of ``registry`` and every
        other ID a check cited or violated, sorted by ID."""
        by_id: dict[str, list[CheckResult]] = {rid: [] for rid in registry}
        for result in results:
            for rid in dict.fromkeys((*result.ids, *result.violated)):
                by_id.setdefault(rid, []).append(result)
        rows = []
        for rid, checks in sorted(by_id.items()):
            requirement = registry.get(rid)
            rows.append(
                RequirementResult(
                    rid,
                    requirement.level if requirement else None,
                    verdict_of(rid, checks),
                    requirement.statement if requirement else "",
                    requirement.title if requirement else None,
                    requirement.page if requirement else None,
                    requirement.status if requirement else None,
                    tuple(checks),
                )
            )
        return cls(run_info, count_verdicts(rows), tuple(rows), tuple(seed003))

    def requirement(self, requirement_id: str) -> RequirementResult | None:
        return next((r for r in self.requirements if r.id == requirement_id), None)

    def failed_checks(self) -> list[CheckResult]:
        """Each check that failed, once, in report order."""
        seen: dict[str, CheckResult] = {}
        for row in self.requirements:
            for check in row.checks:
                if check.outcome == "failed":
                    seen.setdefault(check.check, check)
        return list(seen.values())

    # reading and writing

    @classmethod
    def load(cls, path: Path) -> Report:
        """Read a report written by ``--conformance-report`` (ValueError, KeyError or
        TypeError when the file is not one)."""
        return cls.from_json(json.loads(path.read_text(encoding="utf-8")))

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> Report:
        rows = tuple(RequirementResult.from_json(row) for row in document["requirements"])
        return cls(
            RunInfo.from_json(document["run_info"]),
            count_verdicts(rows),  # what the rows say, whatever the file's summary claims
            rows,
            tuple(document.get("seed003") or ()),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "run_info": self.run_info.to_json(),
            "summary": dict(self.summary),
            "requirements": [row.to_json() for row in self.requirements],
            "seed003": [dict(entry) for entry in self.seed003],
        }

    def write(self, path: Path, extra_markdown: str = "") -> None:
        """Write ``path`` (JSON) and ``path`` with ``.md`` (Markdown, then ``extra_markdown``)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
        markdown = self.markdown() + ("\n" + extra_markdown if extra_markdown else "")
        path.with_suffix(".md").write_text(markdown, encoding="utf-8")

    # rendering

    def counts_text(self) -> str:
        """``FAIL 1, PASS 140, …`` (the verdicts that occur)."""
        return ", ".join(f"{v} {n}" for v, n in self.summary.items() if n)

    def terminal_lines(self, limit: int = 160) -> list[str]:
        """A line per requirement, the count line, then each violation in full."""
        lines = [
            f"{row.verdict:8} {row.id} {row.level or '?':6} {len(row.checks):2} checks  "
            f"{row.brief(limit)}".rstrip()
            for row in self.requirements
        ]
        lines.append(f"requirements: {len(self.requirements)}; {self.counts_text()}")
        return lines

    def overview(self, shown: Sequence[str] = ("FAIL", "XFAIL"), limit: int = 160) -> list[str]:
        """A short summary (``routespec conformance`` prints it): the counts, a line per
        requirement whose verdict is in ``shown``, then each violation in full."""
        info = self.run_info
        lines = [
            f"conformance of adapter {info.adapter!r} ({info.duration_s} s): "
            f"{len(self.requirements)} requirements, {self.counts_text()}"
        ]
        if info.selection:
            lines.append(f"  selection: {info.selection}")
        lines += [
            f"  {row.verdict:5} {row.id}  {row.brief(limit)}"
            for row in self.requirements
            if row.verdict in shown
        ]
        blocks = self.violation_blocks()
        return lines + (["", *blocks] if blocks else [])

    def violation_blocks(self, limit: int = 400) -> list[str]:
        """Each FAIL, h2spec-style: Requirement / Expected / Actual, then the check's words,
        its last steps and the command that reruns it. Only ``Actual`` is never shortened."""
        lines: list[str] = []
        for row in self.requirements:
            if row.verdict != "FAIL":
                continue
            found = list(row.violations())
            if not found:  # failed with an error rather than a violation
                check = row.deciding_check()
                if check is not None:
                    lines += [f"FAIL {row.id} · {check.check}"]
                    lines += [f"  Requirement: {shorten(row.statement, limit)}"]
                    lines += [f"  Error:       {shorten(check.detail, limit)}"]
                    lines += _rerun_lines(check)
                continue
            for check, violation in found:
                lines.append(f"FAIL {row.id} · {check.check}")
                lines.append(f"  Requirement: {shorten(row.statement, limit)}")
                if violation.expected is not None:
                    lines.append(f"  Expected:    {shorten(violation.expected, limit)}")
                if violation.actual is not None:
                    lines.append(f"  Actual:      {one_line(violation.actual)}")
                lines.append(f"  Observed:    {shorten(violation.detail, limit)}")
                if violation.steps:
                    shown = violation.steps[-8:]
                    lines.append(
                        f"  Steps:       last {len(shown)} of {violation.steps_recorded} "
                        "target calls (all in the JSON report)"
                    )
                    lines += [f"    {shorten(step, limit)}" for step in shown]
                if violation.example:
                    lines += _example_lines(violation.example, limit)
                lines += _rerun_lines(check)
        return lines

    def markdown(self) -> str:
        info = self.run_info
        lines = [
            f"# Conformance report: adapter `{info.adapter}`",
            "",
            f"Started {info.started}, {info.duration_s} s; {len(self.requirements)} "
            f"requirements: {self.counts_text()}.",
            "",
            "| run | |",
            "| --- | --- |",
        ]
        for label, value in _run_facts(info):
            lines.append(f"| {label} | {_cell(value)} |")
        lines += [
            "",
            "| requirement | level | result | checks | reason |",
            "| --- | --- | --- | --- | --- |",
        ]
        for row in self.requirements:
            lines.append(
                f"| {row.id} | {row.level} | {row.verdict} | {len(row.checks)} | "
                f"{_cell(row.brief(200))} |"
            )
        failures = [row for row in self.requirements if row.verdict == "FAIL"]
        if failures:
            lines += ["", "## Failures", ""]
        for row in failures:
            lines += _markdown_failure(row)
        return "\n".join(lines) + "\n"


def filtered_path(path: Path, req_filter: str | None, otherwise: bool = False) -> Path:
    """Where the report of a filtered run goes instead of ``path``: ``STEM.req-IDS.json``
    for ``--req IDS`` (``.partial`` added when ``otherwise`` narrowed further), or
    ``STEM.partial.json`` for a run narrowed only ``otherwise`` (-k, -m, some files)."""
    tag = "partial"
    if req_filter:
        ids = [re.sub(r"[^A-Za-z0-9_-]", "_", i.strip()) for i in req_filter.split(",")]
        tag = "req-" + ("+".join(ids) if len(ids) <= 4 else "+".join(ids[:4]) + "+more")
        tag += ".partial" if otherwise else ""
    return path.with_name(f"{path.stem}.{tag}{path.suffix or '.json'}")


def verdict_of(requirement_id: str, checks: Iterable[CheckResult]) -> Verdict:
    """The verdict the checks give about one requirement."""
    outcomes = {check.outcome_for(requirement_id) for check in checks}
    return next((v for o, v in _PRODUCED_BY if o in outcomes), "NOT RUN")


def count_verdicts(rows: Iterable[RequirementResult]) -> dict[str, int]:
    counts: dict[str, int] = dict.fromkeys(VERDICTS, 0)
    for row in rows:
        counts[row.verdict] = counts.get(row.verdict, 0) + 1
    return counts


def _run_facts(info: RunInfo) -> list[tuple[str, str]]:
    return [
        ("adapter", f"`{info.adapter}` (`--adapter {info.adapter_option}`)"),
        ("routespec", str(info.routespec_version)),
        ("spec digest", f"`{info.spec_digest}`"),
        ("git commit", f"`{info.git_commit}`" if info.git_commit else "not a checkout"),
        ("Hypothesis profile", f"`{info.hypothesis_profile}`"),
        ("Hypothesis seed", str(info.hypothesis_seed or "random (no --hypothesis-seed)")),
        ("selection", info.selection or "the whole suite"),
        ("python", str(info.python)),
        ("capabilities", ", ".join(f"`{c}`" for c in info.capabilities)),
    ]


def _example_lines(example: str, limit: int) -> list[str]:
    """Hypothesis's example in brief: its first line, its size, its replay decorator."""
    text = [line for line in example.splitlines() if line.strip()]
    lines = [f"  Example:     {shorten(text[0], limit)} ({len(text)} lines in the report)"]
    blob = next((line for line in text if "@reproduce_failure(" in line), None)
    if blob is not None:
        lines.append(f"    {one_line(blob)}")
    return lines


def _rerun_lines(check: CheckResult) -> list[str]:
    return [f"  Rerun:       {check.rerun}"] if check.rerun else []


def _markdown_failure(row: RequirementResult) -> list[str]:
    lines = [f"### {row.id} · {row.title or ''}".rstrip(), ""]
    lines += [f"**Requirement** ({row.level}): {row.statement}", ""]
    found = list(row.violations())
    if not found:
        check = row.deciding_check()
        if check is not None:
            lines += [f"Check `{check.check}` failed with an error:", ""]
            lines += _fenced(check.detail) + _markdown_rerun(check)
        return lines
    for check, violation in found:
        lines += [f"Check `{check.check}`:", ""]
        if violation.expected is not None:
            lines += ["- **Expected:**", "", *_indent(_fenced(violation.expected))]
        if violation.actual is not None:
            lines += ["- **Actual:**", "", *_indent(_fenced(violation.actual))]
        lines += ["- **Observed:** " + _cell(violation.detail), ""]
        if violation.steps:
            shown = len(violation.steps)
            which = "all" if shown == violation.steps_recorded else f"the last {shown} of"
            lines += [
                f"- **Steps** ({which} {violation.steps_recorded} calls on the target):",
                "",
                *_indent(_fenced("\n".join(violation.steps))),
            ]
        if violation.example:
            lines += ["- **Hypothesis example:**", "", *_indent(_fenced(violation.example))]
        lines += _markdown_rerun(check)
    return lines


def _markdown_rerun(check: CheckResult) -> list[str]:
    if not check.rerun:
        return []
    return ["- **Rerun:**", "", *_indent(_fenced(check.rerun, "sh"))]


def _fenced(text: str, language: str = "") -> list[str]:
    fence = "```"
    while fence in text:
        fence += "`"
    return [fence + language, *text.splitlines(), fence, ""]


def _indent(lines: list[str]) -> list[str]:
    return [textwrap.indent(line, "  ") if line else line for line in lines]


def _cell(text: str) -> str:
    """Table-cell and one-line safe."""
    return one_line(text).replace("|", "\\|")


def _optional(value: object) -> str | None:
    return None if value is None else str(value)


def _as_json(instance: AttrsInstance) -> dict[str, Any]:
    return attrs.asdict(instance)


def _outcome(value: object) -> Outcome:
    for outcome, _ in _PRODUCED_BY:
        if value == outcome:
            return outcome
    raise ValueError(f"unknown check outcome {value!r}")


def _verdict(value: object) -> Verdict:
    for verdict in VERDICTS:
        if value == verdict:
            return verdict
    raise ValueError(f"unknown verdict {value!r}")
