"""Does a check kill a mutant? Run checks of the working tree against chosen mutants.

A run judges mutants with the suite as it was staged; while triaging a survivor one wants the
new or sharpened check of the working tree, against that mutant only, without editing the
reference by hand (other work may be running tests on it) and without disturbing a run in
progress. A trial copies a stage's mutated sources into a scratch directory, lays the
working tree's suite, adapters and spec over them, and runs pytest there once unmutated
(the check must pass) and once per mutant (mutmut's trampolines pick the mutant named by
``MUTANT_UNDER_TEST``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from mutation import mutmut_driver
from mutation.layers import is_specified
from mutation.stage import PACKAGE_DIRS, SKIP_PARTS, pytest_args

# pytest's exit codes: what each says of the mutant
OUTCOMES = {0: "survived", 1: "killed", 2: "interrupted", 3: "internal error", 5: "no checks ran"}


def _scratch(stage: Path, into: Path) -> Path:
    mutated = stage / "mutants"
    shutil.copytree(
        mutated,
        into,
        ignore=shutil.ignore_patterns(*SKIP_PARTS, "*.meta", "*.spans", "mutmut-stats.json"),
    )
    package = into / "src" / "routespec"
    for subpackage, source in PACKAGE_DIRS.items():
        if not subpackage:
            _overlay_unmutated(source, package)  # the mutated modules stay as staged
            continue
        target = package / subpackage
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target, ignore=shutil.ignore_patterns(*SKIP_PARTS))
    return into


def _overlay_unmutated(source: Path, package: Path) -> None:
    """The working tree's test kit and tooling (``testing/``, ``deploy/``, ...): a new check
    may need a target-protocol change made since the stage."""
    for path in source.rglob("*"):
        relative = path.relative_to(source)
        if path.is_dir() or SKIP_PARTS & set(relative.parts) or is_specified(relative.as_posix()):
            continue
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, package / relative)


def _staged_path(argument: str) -> str:
    """``conformance/test_x.py::check`` as the scratch tree lays it out."""
    for prefix in ("conformance/", "adapters/"):
        if argument.startswith(prefix):
            return "src/routespec/" + argument
    return argument


def run(stage: Path, adapter: str, names: Sequence[str], checks: Sequence[str]) -> dict[str, str]:
    """The outcome for the unmutated reference (key ``""``) and for each mutant."""
    outcomes: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="trial-", dir=stage.parent) as temporary:
        scratch = _scratch(stage, Path(temporary) / "tree")
        environment = mutmut_driver.environment(stage)
        src = str((scratch / "src").resolve())
        environment["PYTHONPATH"] = os.pathsep.join(
            [src, *[p for p in environment["PYTHONPATH"].split(os.pathsep) if "mutants" not in p]]
        )
        command = [sys.executable, "-m", "pytest", "-x", "-q", *pytest_args(adapter)]
        command += [_staged_path(a) for a in checks]
        for name in ["", *names]:
            if name:
                environment["MUTANT_UNDER_TEST"] = name
            done = subprocess.run(
                command, cwd=scratch, env=environment, check=False, capture_output=True, text=True
            )
            outcome = OUTCOMES.get(done.returncode, f"exit {done.returncode}")
            lines = done.stdout.strip().splitlines()
            outcomes[name] = f"{outcome} ({lines[-1] if lines else done.stderr.strip()[-200:]})"
    return outcomes
