"""The staged tree mutmut runs in: ``src/routespec`` laid out as the wheel lays it out.

mutmut 3 imports the code under test from ``mutants/src`` and names each mutant by its file
path, so the package must sit under ``src/`` with file paths equal to import names; the
repository maps conformance/, adapters/ and spec/ into ``routespec`` with setuptools'
package-dir instead. One stage per adapter (``build/mutation/<adapter>``): mutmut keeps its
results and its test-to-function map per directory, and the test command differs.
"""

from __future__ import annotations

import filecmp
import json
import shutil
from importlib.metadata import entry_points
from pathlib import Path

from mutation.layers import EXCLUDED, SPECIFIED
from mutation.mutmut_driver import CHECK_SECONDS, TIMEOUT_MULTIPLIER
from mutation.report import git_commit

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = {  # the pyproject's [tool.setuptools.package-dir], as staged paths
    "": ROOT / "reference" / "routespec",
    "conformance": ROOT / "conformance",
    "adapters": ROOT / "adapters",
    "spec": ROOT / "spec",
}
SKIP_PARTS = {"__pycache__", ".hypothesis", ".pytest_cache", ".mypy_cache"}
PROFILE = "mutation"
STATS = "mutmut-stats.json"  # mutmut's map from tests to the functions they reach
STAGED_AT = "staged-at"  # the commit the staged sources came from: what a verdict judged

CONFTEST = f'''"""Written by mutation/stage.py: the bounded profile, derandomized, with no
example database, so a mutant's verdict depends on no seed and no earlier run."""

from collections.abc import Generator

import pytest
from hypothesis import settings

import routespec.conformance.plugin  # noqa: F401  # registers the "bounded" profile

settings.register_profile(
    "{PROFILE}",
    parent=settings.get_profile("bounded"),
    derandomize=True,
    database=None,
)


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session) -> Generator[None, None, None]:
    # The kit's plugin reports a run that checked nothing as "ran nothing" (exit 5). mutmut
    # lists the tests with --collect-only, and a lane's clean run or a mutant's may select
    # only checks its adapter skips: checks that were found and judged nothing are a pass.
    yield
    if session.testscollected and session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK
'''


def _toml_list(items: list[str]) -> str:
    return json.dumps(items)  # a JSON list of strings is a TOML array


MACHINES = "*_machine.py"  # the stateful machines' modules: search, not coverage (issue 16)


def pytest_args(adapter: str, without_machines: bool = False) -> list[str]:
    """What every check run of ``adapter``'s lane is given; ``without_machines`` leaves the
    stateful machines out, so only the deterministic checks judge the mutants."""
    args = ["--adapter", adapter, "--hypothesis-profile", PROFILE, "-p", "no:cacheprovider"]
    if without_machines:
        args.append(f"--ignore-glob={MACHINES}")
    # thread: at the limit the whole process exits, which kills the mutant. A signal fails
    # only the check, and the target's teardown then waited on the same stuck trio thread
    # until mutmut's own limit, minutes later.
    args += [f"--timeout={CHECK_SECONDS}", "--timeout-method=thread"]
    if not _plugin_installed():
        args += ["-p", "routespec.conformance.plugin"]
    return args


def pyproject(adapter: str, without_machines: bool = False) -> str:
    only = [f"src/routespec/{glob}" for glob in SPECIFIED]
    excluded = [f"src/routespec/{path}" for path in EXCLUDED]
    return f"""# Written by mutation/stage.py; edit that file instead.
[tool.mutmut]
source_paths = ["src"]
only_mutate = {_toml_list(only)}
do_not_mutate = {_toml_list(excluded)}
pytest_add_cli_args_test_selection = ["src/routespec/conformance"]
pytest_add_cli_args = {_toml_list(pytest_args(adapter, without_machines))}
also_copy = ["conftest.py"]
use_git_change_detection = false
# mutmut's default is 15: a mutant that hangs a check (a stuck watcher, a lost wake-up) then
# holds a child for minutes; 5 times a check's recorded time is still far above any slowdown
# a loaded machine causes.
timeout_multiplier = {TIMEOUT_MULTIPLIER}

[tool.pytest.ini_options]
testpaths = ["src/routespec/conformance"]
addopts = ["--strict-markers", "--strict-config"]
trio_mode = true
filterwarnings = ["error"]
xfail_strict = true
"""


def _plugin_installed() -> bool:
    """An installed routespec registers the plugin itself (pytest11); naming it again with
    ``-p`` would register the module twice."""
    return any(ep.value == "routespec.conformance.plugin" for ep in entry_points(group="pytest11"))


def _sync_tree(source: Path, target: Path) -> tuple[set[Path], bool]:
    """Copy into ``target`` the files of ``source`` that differ from it; returns the
    relative paths present, and whether any file was copied.

    mutmut regenerates a file's mutants only when its source is newer than them, so a copied
    file is stamped with the time of the copy: its own mtime (the edit) can be older than
    mutants generated from an earlier version."""
    present: set[Path] = set()
    copied = False
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if path.is_dir() or SKIP_PARTS & set(relative.parts):
            continue
        present.add(relative)
        destination = target / relative
        if destination.exists() and filecmp.cmp(path, destination, shallow=False):
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, destination)  # its mtime is now: newer than any mutants
        copied = True
    return present, copied


def stage(directory: Path, adapter: str, without_machines: bool = False) -> Path:
    """Write the stage for ``adapter`` into ``directory`` and return it."""
    src = directory / "src" / "routespec"
    present: set[Path] = set()
    changed = False
    for subpackage, source in PACKAGE_DIRS.items():
        target = src / subpackage if subpackage else src
        prefix = Path(subpackage) if subpackage else Path()
        synced, copied = _sync_tree(source, target)
        present |= {prefix / p for p in synced}
        changed |= copied
    for stale in [p for p in src.rglob("*") if p.is_file()]:
        relative = stale.relative_to(src)
        if relative not in present and not SKIP_PARTS & set(relative.parts):
            stale.unlink()
            changed = True
    # A changed test selection maps other checks to the functions they reach, too.
    changed |= _write_if_changed(directory / "pyproject.toml", pyproject(adapter, without_machines))
    if changed:
        # mutmut maps only new tests to the functions they reach; a changed check, adapter
        # or source can reach other functions, so the whole map is collected again
        (directory / "mutants" / STATS).unlink(missing_ok=True)
    commit, dirty = git_commit()
    label = commit[:12] + (" (with uncommitted changes)" if dirty else "")
    _write_if_changed(directory / STAGED_AT, label + "\n")
    _write_if_changed(directory / "conftest.py", CONFTEST)
    _refresh_mutants_copy(directory, present)
    return directory


def staged_at(directory: Path) -> str:
    path = directory / STAGED_AT
    return path.read_text().strip() if path.exists() else "unknown"


def _write_if_changed(path: Path, text: str) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    path.write_text(text)
    return True


def _refresh_mutants_copy(directory: Path, present: set[Path]) -> None:
    """mutmut rewrites every .py file of ``mutants/`` on each run but copies other files
    (the spec pages, the expectation TOML) only once: refresh those, drop removed files."""
    mutated = directory / "mutants" / "src" / "routespec"
    if not mutated.exists():
        return
    staged = directory / "src" / "routespec"
    for relative in present:
        if relative.suffix != ".py":
            copy = mutated / relative
            if not copy.exists() or not filecmp.cmp(staged / relative, copy, shallow=False):
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(staged / relative, copy)
    for path in [p for p in mutated.rglob("*") if p.is_file()]:
        relative = path.relative_to(mutated)
        if SKIP_PARTS & set(relative.parts):
            continue
        base = relative.with_suffix("") if relative.suffix in (".meta", ".spans") else relative
        if base not in present:
            path.unlink()
    for name in ("pyproject.toml", "conftest.py"):
        shutil.copy2(directory / name, directory / "mutants" / name)
