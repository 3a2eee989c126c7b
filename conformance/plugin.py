"""The pytest plugin behind ``pytest conformance/ --adapter NAME`` (and ``python -m pytest
--pyargs routespec.conformance --adapter NAME`` where only the wheel is installed).

It loads the requirement registry from the spec, loads the adapter, skips checks whose
capabilities the adapter lacks, marks the adapter's expected failures strict-XFAIL, records
what each check observed (its evidence, its violations, the calls it made on its target) and
builds the run's ``Report`` (``report.py``), which it prints and writes.

The plugin is registered for every pytest session of an environment where routespec is
installed (a ``pytest11`` entry point), so it stays inert in a session that collects no
check citing a requirement: it loads no adapter and changes no exit status there.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import platform
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, Phase, settings

from routespec.conformance import seed_map
from routespec.conformance.checks import (
    RecordingAdapter,
    RequirementViolation,
    take_evidence,
    take_steps,
)
from routespec.conformance.registry import (
    CONFORMANCE_DIR,
    SPEC_DIR,
    Requirement,
    SpecFormatError,
    load_requirements,
    scan_checks,
)
from routespec.conformance.report import (
    RESULT_ORDER,
    CheckResult,
    Outcome,
    Report,
    RunInfo,
    Violation,
    filtered_path,
)
from routespec.testing.target import Adapter, Target, TargetConfig

__all__ = ["RESULT_ORDER", "CheckResult", "OpenTarget", "load_adapter"]

settings.register_profile(
    "default",
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    print_blob=True,  # a failure's report carries its @reproduce_failure line
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
PROFILES = ("default", "thorough", "bounded")
DEFAULT_ADAPTER = "reference"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("routespec conformance")
    group.addoption(
        "--adapter",
        default=None,
        help="the target adapter of the conformance checks: a shipped adapter's short name "
        "(reference, reference-tcp, mutants.direct_reselects: a module under "
        "routespec.adapters, '-' read as '_') or module:attr; default reference",
    )
    group.addoption(
        "--conformance-report",
        default=None,
        metavar="PATH",
        help="write the per-requirement report to PATH (JSON) and PATH with .md (Markdown). "
        "A filtered run (--req, -k, -m, or only some of the checks) never replaces the "
        "report of a full run: if PATH holds one, the filtered report goes next to it as "
        "STEM.req-IDS.json (or STEM.partial.json) and the summary says so",
    )
    group.addoption(
        "--req",
        default=None,
        metavar="IDS",
        help="run only the checks citing one of these comma-separated requirement IDs "
        "(DSP-001,DSP-002); an unknown ID is a usage error",
    )


def load_adapter(spec: str) -> Adapter:
    """``reference`` -> routespec.adapters.reference:ADAPTER (``-`` read as ``_``);
    ``pkg.mod:attr`` -> that attribute. A bad value is a ``pytest.UsageError``."""
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
class ConformanceRun:
    """The plugin's state for one session; ``active`` once a check cites a requirement (or
    ``--adapter``/``--req`` was given)."""

    config: pytest.Config
    adapter_option: str
    explicit: bool
    wanted: frozenset[str] | None
    active: bool = False
    requirements: dict[str, Requirement] = attrs.field(factory=dict)
    adapter: Adapter | None = None
    results: list[CheckResult] = attrs.field(factory=list)
    selection: str | None = None
    deselected: int = 0
    started: float = attrs.field(factory=time.time)
    report: Report | None = None
    report_path: Path | None = None
    report_note: str = ""

    def activate(self) -> None:
        if self.active:
            return
        try:
            self.requirements = load_requirements()
        except SpecFormatError as error:
            raise pytest.UsageError(f"the spec is malformed: {error}") from error
        self.adapter = load_adapter(self.adapter_option)
        self.active = True

    def loaded_adapter(self) -> Adapter:
        self.activate()
        assert self.adapter is not None
        return self.adapter

    def ran_any(self) -> bool:
        return any(r.outcome in ("passed", "failed", "xfailed") for r in self.results)

    def run_info(self) -> RunInfo:
        adapter = self.loaded_adapter()
        seed = self.config.getoption("hypothesis_seed", default=None)
        return RunInfo(
            adapter=adapter.name,
            duration_s=round(time.time() - self.started, 3),
            adapter_option=self.adapter_option,
            capabilities=tuple(sorted(cap.value for cap in adapter.capabilities)),
            routespec_version=routespec_version(),
            spec_digest=spec_digest(),
            git_commit=git_commit(),
            hypothesis_profile=settings.get_current_profile_name(),
            hypothesis_seed=None if seed is None else str(seed),
            req_filter=self.config.getoption("req"),
            selection=self.selection,
            python=platform.python_version(),
            started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
        )


_RUN = pytest.StashKey[ConformanceRun]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "covers(*ids): requirement IDs a check tests")
    config.addinivalue_line("markers", "requires(*capabilities): adapter capabilities needed")
    option = config.getoption("adapter")
    wanted = config.getoption("req")
    config.stash[_RUN] = ConformanceRun(
        config,
        option or DEFAULT_ADAPTER,
        explicit=option is not None,
        wanted=frozenset(i.strip() for i in wanted.split(",")) if wanted else None,
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run = config.stash[_RUN]
    cited = [item for item in items if _cited_ids(item)]
    if not (cited or run.explicit or run.wanted is not None):
        return  # not a conformance session: stay out of the way
    run.activate()
    if config.getoption("hypothesis_profile", None) is None:
        # Only a conformance session takes the suite's profile: a user's own tests keep theirs.
        settings.load_profile("default")
    adapter = run.loaded_adapter()
    for unknown in sorted((run.wanted or set()) - run.requirements.keys()):
        raise pytest.UsageError(f"--req {unknown}: no requirement has this ID")
    kept, dropped = [], []
    for item in items:
        ids = _cited_ids(item)
        for rid in ids:
            if rid not in run.requirements:
                raise pytest.UsageError(f"{item.nodeid} cites unknown requirement {rid}")
        if run.wanted is not None and not run.wanted & set(ids):
            dropped.append(item)
            continue
        kept.append(item)
        if not ids:
            continue
        item.user_properties.extend(("requirement", rid) for rid in ids)
        missing = [
            cap.value
            for marker in item.iter_markers("requires")
            for cap in marker.args
            if cap not in adapter.capabilities
        ]
        if missing:
            reason = f"adapter {adapter.name} lacks capability {', '.join(missing)}"
            item.add_marker(pytest.mark.skip(reason=reason))
        evidence = expected_failure(adapter, item)
        if evidence is not None:
            item.add_marker(pytest.mark.xfail(reason=evidence, strict=True))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        run = items[0].config.stash[_RUN]
        run.deselected += sum(1 for item in items if _cited_ids(item))


def pytest_collection_finish(session: pytest.Session) -> None:
    run = session.config.stash[_RUN]
    if run.active:
        run.selection = _selection(run, session.items)


def _selection(run: ConformanceRun, items: list[pytest.Item]) -> str | None:
    """How this run narrowed the suite's checks, or None for all of them."""
    option = run.config.option
    narrowed = [f"--req {run.config.getoption('req')}"] if run.wanted is not None else []
    narrowed += [f"-k {option.keyword}"] if getattr(option, "keyword", "") else []
    narrowed += [f"-m {option.markexpr}"] if getattr(option, "markexpr", "") else []
    collected = {check_name(item).partition("[")[0] for item in items if _cited_ids(item)}
    declared = {citation.check for citation in scan_checks()}
    if not narrowed and (run.deselected or declared - collected):
        ran = len(declared & collected)
        narrowed.append(f"a subset of the checks ({ran} of {len(declared)} check functions)")
    return "; ".join(narrowed) or None


def _cited_ids(item: pytest.Item) -> tuple[str, ...]:
    return tuple(i for marker in item.iter_markers("covers") for i in marker.args)


@functools.cache
def _in_the_suite(path: Path) -> bool:
    return path.resolve().parent == CONFORMANCE_DIR


def check_name(item: pytest.Item) -> str:
    """``conformance/<file>.py::<test>[params]`` for a check of the suite, however pytest was
    invoked (a checkout's ``pytest conformance/`` or ``--pyargs`` from elsewhere, where
    node IDs are paths relative to the rootdir); other items keep their node ID."""
    _, _, rest = item.nodeid.partition("::")
    if rest and _in_the_suite(item.path):
        return f"conformance/{item.path.name}::{rest}"
    return item.nodeid


def expected_failure(adapter: Adapter, item: pytest.Item) -> str | None:
    """The adapter's evidence for an expected failure of ``item``: keyed by the check name,
    with or without its parameters (or, for older adapters, by the node ID)."""
    expected = adapter.expected_failures
    name = check_name(item)
    for key in (name, item.nodeid, name.partition("[")[0]):
        if key in expected:
            return expected[key]
    return None


def rerun_command(item: pytest.Item, run: ConformanceRun, seed: str | None) -> str:
    """A command that runs ``item`` again, from any directory where routespec is installed
    (an item outside the suite: from the rootdir)."""
    _, _, rest = item.nodeid.partition("::")
    if rest and _in_the_suite(item.path):
        target = ["--pyargs", f"routespec.conformance.{item.path.stem}::{rest}"]
    else:
        target = [item.nodeid]
    command = ["python", "-m", "pytest", *target, "--adapter", run.adapter_option]
    profile = settings.get_current_profile_name()
    if profile != "default":
        command += ["--hypothesis-profile", profile]
    if seed is not None:
        command += ["--hypothesis-seed", seed]
    return shlex.join(command)


# Run facts


def routespec_version() -> str | None:
    try:
        return importlib.metadata.version("routespec")
    except importlib.metadata.PackageNotFoundError:
        return None


def spec_digest(spec_dir: Path = SPEC_DIR) -> str:
    """``sha256:`` over the spec pages in sorted order: each file's name, NUL, its bytes, NUL."""
    digest = hashlib.sha256()
    for page in sorted(spec_dir.glob("*.md")):
        digest.update(page.name.encode() + b"\0" + page.read_bytes() + b"\0")
    return f"sha256:{digest.hexdigest()}"


def git_commit(spec_dir: Path = SPEC_DIR) -> str | None:
    """HEAD of the git checkout the spec is read from; None when it is not in one (an
    installed wheel, even inside a checkout's virtual environment) or git is missing."""
    try:
        tracked = subprocess.run(
            ["git", "-C", str(spec_dir), "ls-files", "--", "*.md"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        if tracked.returncode != 0 or not tracked.stdout.strip():
            return None
        head = subprocess.run(
            ["git", "-C", str(spec_dir), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = head.stdout.strip()
    return commit if head.returncode == 0 and re.fullmatch(r"[0-9a-f]{40,64}", commit) else None


# Fixtures


@pytest.fixture(scope="session")
def adapter(pytestconfig: pytest.Config) -> Adapter:
    """The adapter under test; the targets it opens record the calls made on them."""
    return RecordingAdapter(pytestconfig.stash[_RUN].loaded_adapter())


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


# Results

_EVIDENCE = pytest.StashKey[set[str]]()
_STEPS = pytest.StashKey[tuple[int, tuple[str, ...]]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    take_steps()  # the calls made while setting up this check count as its steps
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    take_evidence()
    try:
        return (yield)
    finally:
        item.stash[_EVIDENCE] = take_evidence()
        item.stash[_STEPS] = take_steps()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    run = item.config.stash[_RUN]
    ids = _cited_ids(item)
    if run.active and ids and _is_final(report):
        run.results.append(_result(item, call, report, run, ids))
    return report


def _is_final(report: pytest.TestReport) -> bool:
    return report.when == "call" or (report.when == "setup" and not report.passed)


def _result(
    item: pytest.Item,
    call: pytest.CallInfo[None],
    report: pytest.TestReport,
    run: ConformanceRun,
    ids: tuple[str, ...],
) -> CheckResult:
    outcome: Outcome = "xfailed" if hasattr(report, "wasxfail") else report.outcome
    error = call.excinfo.value if call.excinfo is not None else None
    steps = item.stash.get(_STEPS, None) or take_steps()
    example = _hypothesis_example(error, report) if error is not None else None
    violations = tuple(
        Violation(
            found.requirement_id,
            run.requirements[found.requirement_id].statement
            if found.requirement_id in run.requirements
            else "",
            found.detail,
            found.expected,
            found.actual,
            steps[1],
            steps[0],
            example,
        )
        for found in _violations(error)
    )
    detail = ""
    if outcome == "xfailed":
        detail = str(getattr(report, "wasxfail", ""))
    elif report.failed and error is not None:
        detail = _error_detail(error)
    elif report.failed:  # a strict expected failure that passed
        detail = f"passed, but the adapter declares it an expected failure: {report.longrepr}"
    elif report.skipped and isinstance(report.longrepr, tuple):
        detail = str(report.longrepr[2]).removeprefix("Skipped: ")
    unexercised: tuple[str, ...] = ()
    if outcome == "passed":
        evidence = item.stash.get(_EVIDENCE, set())
        unexercised = tuple(i for i in ids if i not in evidence)
    rerun = None
    if outcome == "failed":
        seed = _printed_seed(example) or run.config.getoption("hypothesis_seed", default=None)
        rerun = rerun_command(item, run, None if seed is None else str(seed))
    return CheckResult(
        check_name(item),
        ids,
        outcome,
        detail,
        tuple(dict.fromkeys(v.requirement_id for v in violations)),
        report.duration,
        unexercised,
        violations,
        rerun,
    )


def _violations(error: BaseException | None) -> Iterator[RequirementViolation]:
    if isinstance(error, RequirementViolation):
        yield error
    elif isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _violations(inner)


def _error_detail(error: BaseException) -> str:
    found = list(_violations(error))
    if len(found) == 1 and found[0] is error:
        return found[0].detail
    if found:
        return "; ".join(f"{v.requirement_id}: {v.detail}" for v in found)
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _hypothesis_example(error: BaseException, report: pytest.TestReport) -> str | None:
    """What Hypothesis printed about the failing example: its notes on the error (the
    falsifying example or state machine steps, the ``@reproduce_failure`` line)."""
    notes = [str(note) for note in getattr(error, "__notes__", ())]
    notes += [text for title, text in report.sections if "hypothesis" in title.lower()]
    text = "\n".join(notes).strip()
    return text or None


def _printed_seed(example: str | None) -> str | None:
    found = re.search(r"--hypothesis-seed=(\S+?)\.?(?:\s|$)", example or "")
    return found[1] if found else None


# Reporting


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    run = session.config.stash[_RUN]
    if run.explicit and not run.ran_any() and exitstatus == pytest.ExitCode.OK:
        # A conformance run that checked nothing must not look like a pass.
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
    if not (run.active and run.results):
        return
    run.report = Report.build(
        run.run_info(),
        run.requirements,
        run.results,
    )
    path = session.config.getoption("conformance_report")
    if path:
        run.report_path, run.report_note = report_destination(Path(path), run.report.run_info)
        seed003, seed003_markdown = seed_map.report_section(run.report_path)
        report = attrs.evolve(run.report, seed003=tuple(seed003))
        report.write(run.report_path, seed003_markdown)


def report_destination(requested: Path, info: RunInfo) -> tuple[Path, str]:
    """Where a report goes, and why not to ``requested``: a filtered run's report never
    replaces a full run's report; it goes next to it (``report.filtered_path``)."""
    if info.selection is None or not _holds_a_full_report(requested):
        return requested, ""
    otherwise = info.selection != f"--req {info.req_filter}"
    destination = filtered_path(requested, info.req_filter, otherwise)
    return destination, (
        f"filtered run ({info.selection}): {requested} holds a full run's report and is kept"
    )


def _holds_a_full_report(path: Path) -> bool:
    try:
        return not Report.load(path).run_info.filtered
    except (OSError, ValueError, KeyError, TypeError):
        return False


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    run = terminalreporter.config.stash[_RUN]
    if run.report is None:
        return
    terminalreporter.section(f"routespec conformance: adapter {run.report.run_info.adapter}")
    for line in run.report.terminal_lines():
        terminalreporter.write_line(line)
    blocks = run.report.violation_blocks()
    if blocks:
        terminalreporter.write_line("")
        for line in blocks:
            terminalreporter.write_line(line)
    if run.report.run_info.selection:
        terminalreporter.write_line(f"selection: {run.report.run_info.selection}")
    if run.report_note:
        terminalreporter.write_line(run.report_note)
    if run.report_path is not None:
        terminalreporter.write_line(
            f"report: {run.report_path} and {run.report_path.with_suffix('.md')}"
        )
