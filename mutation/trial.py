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

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
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
    for name in ("pyproject.toml", "conftest.py"):  # the stage's, as a run copies them in
        shutil.copyfile(stage / name, into / name)
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


def run(
    stage: Path, adapter: str, names: Sequence[str], checks: Sequence[str]
) -> dict[str, tuple[str, float]]:
    """The outcome and seconds for the unmutated reference (key ``""``) and each mutant."""
    outcomes: dict[str, tuple[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="trial-", dir=stage.parent) as temporary:
        scratch = _scratch(stage, Path(temporary) / "tree")
        environment = mutmut_driver.environment(stage)
        src = str((scratch / "src").resolve())
        environment["PYTHONPATH"] = os.pathsep.join(
            [src, *[p for p in environment["PYTHONPATH"].split(os.pathsep) if "mutants" not in p]]
        )
        command = [*mutmut_driver.without_mode_override(), sys.executable, "-m", "pytest"]
        command += ["-x", "-q", *pytest_args(adapter)]
        command += [_staged_path(a) for a in checks]
        for name in ["", *names]:
            if name:
                environment["MUTANT_UNDER_TEST"] = name
            started = time.monotonic()
            done = subprocess.run(
                command, cwd=scratch, env=environment, check=False, capture_output=True, text=True
            )
            outcome = OUTCOMES.get(done.returncode, f"exit {done.returncode}")
            lines = done.stdout.strip().splitlines()
            shown = f"{outcome} ({lines[-1] if lines else done.stderr.strip()[-200:]})"
            outcomes[name] = (shown, time.monotonic() - started)
    return outcomes


def record_kills(stage: Path, killed: Mapping[str, float]) -> int:
    """Write kills into the stage's meta files as a run would (mutmut's exit code 1, with
    the seconds the checks took); returns how many were written. A kill by some of the
    suite's checks is a kill by the suite. Refused while mutmut runs in the stage: it
    rewrites the meta files from memory and would drop them."""
    if _mutmut_running_in(stage):
        raise SystemExit(f"mutmut is running in {stage}: record the kills after it ends")
    written = 0
    for _module, meta_path in mutmut_driver.meta_files(stage):
        data = json.loads(meta_path.read_text())
        found = [name for name in killed if name in data["exit_code_by_key"]]
        for name in found:
            data["exit_code_by_key"][name] = 1
            data["durations_by_key"][name] = round(killed[name], 3)
        if found:
            meta_path.write_text(json.dumps(data, indent=4))
            written += len(found)
    return written


def _mutmut_running_in(stage: Path) -> bool:
    mutants = (stage / "mutants").resolve()
    for process in Path("/proc").glob("[0-9]*"):
        try:
            cwd = (process / "cwd").resolve()
            command = (process / "cmdline").read_bytes()
        except OSError:
            continue
        if cwd == mutants and b"mutmut" in command:
            return True
    return False
