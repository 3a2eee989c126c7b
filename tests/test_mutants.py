"""Every mutant under adapters/mutants/ is rejected by the suite on the IDs it violates."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = sorted(
    path.stem for path in (ROOT / "adapters" / "mutants").glob("*.py") if path.stem != "__init__"
)


def test_there_are_mutants() -> None:
    assert len(MUTANTS) >= 8


@pytest.mark.parametrize("mutant", MUTANTS)
def test_mutant_is_rejected_on_its_requirement(mutant: str, tmp_path: Path) -> None:
    violates: tuple[str, ...] = importlib.import_module(
        f"routespec.adapters.mutants.{mutant}"
    ).VIOLATES
    report = tmp_path / "report.json"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "conformance/",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--adapter=mutants.{mutant}",
            f"--req={','.join(violates)}",
            f"--conformance-report={report}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONHASHSEED": "0"},
        check=False,
    )
    assert completed.returncode == 1, completed.stdout[-3000:] + completed.stderr[-3000:]
    results = {row["id"]: row["result"] for row in json.loads(report.read_text())["requirements"]}
    for requirement_id in violates:
        assert results[requirement_id] == "FAIL", (
            requirement_id,
            results,
            completed.stdout[-3000:],
        )
