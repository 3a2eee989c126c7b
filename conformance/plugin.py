"""The pytest plugin behind ``pytest conformance/ --adapter NAME``.

It loads the requirement registry from spec/, loads the adapter, skips checks whose
capabilities the adapter lacks, marks the adapter's expected failures strict-XFAIL, and
writes a per-requirement report (terminal, JSON, Markdown).
"""

from __future__ import annotations

import importlib
import json
import platform
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, Phase, settings

from routespec.conformance import seed_map
from routespec.conformance.checks import RequirementViolation, take_evidence
from routespec.conformance.registry import Requirement, SpecFormatError, load_requirements
from routespec.testing.target import Adapter, Target, TargetConfig

settings.register_profile(
    "default",
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)
settings.register_profile(
    "thorough",
    parent=settings.get_profile("default"),
    max_examples=1000,
    stateful_step_count=60,
)
settings.register_profile(
    "bounded",  # for slow adapters (real processes): few, short cases
    parent=settings.get_profile("default"),
    max_examples=15,
    stateful_step_count=15,
)
settings.load_profile("default")

RESULT_ORDER = ("FAIL", "XFAIL", "PASS", "SKIP", "NOT RUN")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("routespec conformance")
    group.addoption(
        "--adapter",
        default=None,
        help="target adapter: a module under adapters/ (e.g. reference, mutants.direct_reselects) "
        "or module:attr; default reference",
    )
    group.addoption(
        "--conformance-report",
        default=None,
        metavar="PATH",
        help="write the per-requirement report to PATH (JSON) and PATH with .md (Markdown)",
    )
    group.addoption(
        "--req",
        default=None,
        metavar="IDS",
        help="run only the checks citing one of these comma-separated requirement IDs",
    )


def load_adapter(spec: str) -> Adapter:
    """``reference`` -> routespec.adapters.reference:ADAPTER; ``pkg.mod:attr`` -> that attribute."""
    module_name, _, attribute = spec.partition(":")
    if not attribute:
        module_name, attribute = "routespec.adapters." + spec.replace("-", "_"), "ADAPTER"
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise pytest.UsageError(
            f"--adapter {spec}: cannot import {module_name}: {error}"
        ) from error
    adapter = getattr(module, attribute, None)
    if adapter is None:
        raise pytest.UsageError(f"--adapter {spec}: {module_name} has no attribute {attribute}")
    return adapter  # type: ignore[no-any-return]


@attrs.define
class CheckResult:
    check: str
    ids: tuple[str, ...]
    outcome: str  # passed | failed | skipped | xfailed
    detail: str
    violated: tuple[str, ...]
    duration_s: float
    unexercised: tuple[str, ...] = ()

    def outcome_for(self, requirement_id: str) -> str | None:
        """What this check says about one of its IDs; None when it says nothing."""
        if self.outcome == "failed" and self.violated and requirement_id not in self.violated:
            return None  # it failed on another requirement: no evidence for this one
        if self.outcome == "passed" and requirement_id in self.unexercised:
            return "skipped"  # passed without ever evaluating this requirement
        return self.outcome


@attrs.define
class ConformanceRun:
    config: pytest.Config
    requirements: dict[str, Requirement]
    adapter: Adapter
    explicit: bool
    results: list[CheckResult] = attrs.field(factory=list)
    started: float = attrs.field(factory=time.time)

    def requirement_results(self) -> dict[str, tuple[str, list[CheckResult]]]:
        by_id: dict[str, list[CheckResult]] = {rid: [] for rid in self.requirements}
        for result in self.results:
            for rid in {*result.ids, *result.violated}:
                by_id.setdefault(rid, []).append(result)
        return {rid: (self._verdict(rid, checks), checks) for rid, checks in by_id.items()}

    @staticmethod
    def _verdict(rid: str, checks: list[CheckResult]) -> str:
        outcomes = {check.outcome_for(rid) for check in checks}
        for outcome, verdict in (
            ("failed", "FAIL"),
            ("xfailed", "XFAIL"),
            ("passed", "PASS"),
            ("skipped", "SKIP"),
        ):
            if outcome in outcomes:
                return verdict
        return "NOT RUN"

    def ran_any(self) -> bool:
        return any(r.outcome in ("passed", "failed", "xfailed") for r in self.results)


_RUN = pytest.StashKey[ConformanceRun]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "covers(*ids): requirement IDs a check tests")
    config.addinivalue_line("markers", "requires(*capabilities): adapter capabilities needed")
    try:
        requirements = load_requirements()
    except SpecFormatError as error:
        raise pytest.UsageError(f"spec/ is malformed: {error}") from error
    explicit = config.getoption("adapter") is not None
    adapter = load_adapter(config.getoption("adapter") or "reference")
    config.stash[_RUN] = ConformanceRun(config, requirements, adapter, explicit)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run = config.stash[_RUN]
    wanted = config.getoption("req")
    wanted_ids = {i.strip() for i in wanted.split(",")} if wanted else None
    for unknown in (wanted_ids or set()) - run.requirements.keys():
        raise pytest.UsageError(f"--req {unknown}: no requirement has this ID")
    kept, dropped = [], []
    for item in items:
        ids = _cited_ids(item)
        for rid in ids:
            if rid not in run.requirements:
                raise pytest.UsageError(f"{item.nodeid} cites unknown requirement {rid}")
        if wanted_ids is not None and not wanted_ids & set(ids):
            dropped.append(item)
            continue
        kept.append(item)
        if not ids:
            continue
        missing = [
            cap.value
            for marker in item.iter_markers("requires")
            for cap in marker.args
            if cap not in run.adapter.capabilities
        ]
        if missing:
            reason = f"adapter {run.adapter.name} lacks capability {', '.join(missing)}"
            item.add_marker(pytest.mark.skip(reason=reason))
        expected = run.adapter.expected_failures
        evidence = expected.get(item.nodeid, expected.get(_check_name(item)))
        if evidence is not None:
            item.add_marker(pytest.mark.xfail(reason=evidence, strict=True))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _cited_ids(item: pytest.Item) -> tuple[str, ...]:
    return tuple(i for marker in item.iter_markers("covers") for i in marker.args)


def _check_name(item: pytest.Item) -> str:
    return item.nodeid.split("[")[0]


@pytest.fixture(scope="session")
def adapter(pytestconfig: pytest.Config) -> Adapter:
    return pytestconfig.stash[_RUN].adapter


OpenTarget = Callable[[TargetConfig], AbstractContextManager[Target]]


@pytest.fixture
def open_target(adapter: Adapter) -> OpenTarget:
    """Open a target with a given config (for checks that vary it)."""
    return adapter.open


@pytest.fixture
def target(adapter: Adapter) -> Iterator[Target]:
    """A target with the default config, closed after the check."""
    with adapter.open(TargetConfig()) as opened:
        yield opened


_EVIDENCE = pytest.StashKey[set[str]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    take_evidence()
    try:
        return (yield)
    finally:
        item.stash[_EVIDENCE] = take_evidence()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    ids = _cited_ids(item)
    if not ids or not _is_final(report):
        return report
    outcome = "xfailed" if hasattr(report, "wasxfail") else report.outcome
    violated: tuple[str, ...] = ()
    detail = ""
    if report.failed and call.excinfo is not None:
        violated = tuple(_violations(call.excinfo.value))
        detail = str(call.excinfo.value).splitlines()[0] if str(call.excinfo.value) else ""
        detail = detail or call.excinfo.typename
    elif report.skipped and isinstance(report.longrepr, tuple):
        detail = str(report.longrepr[2]).removeprefix("Skipped: ")
    elif outcome == "xfailed":
        detail = str(getattr(report, "wasxfail", ""))
    unexercised: tuple[str, ...] = ()
    if outcome == "passed":
        evidence = item.stash.get(_EVIDENCE, set())
        unexercised = tuple(i for i in ids if i not in evidence)
    item.config.stash[_RUN].results.append(
        CheckResult(_check_name(item), ids, outcome, detail, violated, report.duration, unexercised)
    )
    return report


def _is_final(report: pytest.TestReport) -> bool:
    return report.when == "call" or (report.when == "setup" and not report.passed)


def _violations(error: BaseException) -> Iterator[str]:
    if isinstance(error, RequirementViolation):
        yield error.requirement_id
    elif isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _violations(inner)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    run = terminalreporter.config.stash[_RUN]
    if not run.results:
        return
    verdicts = run.requirement_results()
    terminalreporter.section(f"routespec conformance: adapter {run.adapter.name}")
    for rid, (verdict, checks) in sorted(verdicts.items()):
        requirement = run.requirements.get(rid)
        level = requirement.level if requirement else "?"
        note = _note(verdict, checks, rid)
        terminalreporter.write_line(f"{verdict:8} {rid} {level:6} {len(checks):2} checks  {note}")
    counts = {v: sum(1 for verdict, _ in verdicts.values() if verdict == v) for v in RESULT_ORDER}
    terminalreporter.write_line(
        f"requirements: {len(verdicts)}; " + ", ".join(f"{v} {n}" for v, n in counts.items() if n)
    )
    path = terminalreporter.config.getoption("conformance_report")
    if path:
        write_report(run, Path(path))
        terminalreporter.write_line(f"report: {path} and {Path(path).with_suffix('.md')}")


def _note(verdict: str, checks: list[CheckResult], rid: str) -> str:
    relevant = {"FAIL": "failed", "SKIP": "skipped", "XFAIL": "xfailed"}.get(verdict)
    for check in checks:
        if check.outcome_for(rid) == relevant:
            detail = check.detail or "no step could exercise it with this adapter's capabilities"
            return f"{check.check}: {detail}"[:160]
    return ""


def write_report(run: ConformanceRun, path: Path) -> None:
    verdicts = run.requirement_results()
    rows = []
    for rid, (verdict, checks) in sorted(verdicts.items()):
        requirement = run.requirements.get(rid)
        rows.append(
            {
                "id": rid,
                "level": requirement.level if requirement else None,
                "spec_status": requirement.status if requirement else None,
                "title": requirement.title if requirement else None,
                "page": requirement.page if requirement else None,
                "result": verdict,
                "checks": [attrs.asdict(check) for check in checks],
            }
        )
    document = {
        "run_info": {
            "adapter": run.adapter.name,
            "capabilities": sorted(cap.value for cap in run.adapter.capabilities),
            "hypothesis_profile": settings.get_current_profile_name(),
            "python": platform.python_version(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(run.started)),
            "duration_s": round(time.time() - run.started, 3),
        },
        "summary": {v: sum(1 for row in rows if row["result"] == v) for v in RESULT_ORDER},
        "requirements": rows,
    }
    document["seed003"], seed003_markdown = seed_map.report_section(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    markdown = _markdown(document) + "\n" + seed003_markdown
    path.with_suffix(".md").write_text(markdown, encoding="utf-8")


def _markdown(document: dict[str, object]) -> str:
    info = document["run_info"]
    assert isinstance(info, dict)
    lines = [
        f"# Conformance report: adapter `{info['adapter']}`",
        "",
        f"Started {info['started']}, {info['duration_s']} s, "
        f"Hypothesis profile `{info['hypothesis_profile']}`.",
        "",
        "| requirement | level | result | checks | detail |",
        "| --- | --- | --- | --- | --- |",
    ]
    rows = document["requirements"]
    assert isinstance(rows, list)
    for row in rows:
        checks = row["checks"]
        detail = next((c["detail"] for c in checks if c["detail"]), "")
        lines.append(
            f"| {row['id']} | {row['level']} | {row['result']} | {len(checks)} | "
            f"{detail.replace('|', '/')[:120]} |"
        )
    return "\n".join(lines) + "\n"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    run = session.config.stash[_RUN]
    if run.explicit and not run.ran_any() and exitstatus == pytest.ExitCode.OK:
        # A conformance run that checked nothing must not look like a pass.
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
