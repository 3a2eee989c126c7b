"""Expected failures of an adapter, kept in a TOML file beside it with their evidence.

Each entry names a check (a pytest node id, with or without its parameters), the requirement
it fails and what the runtime did instead. The suite runs such checks as strict XFAIL: a
divergence that goes away fails the run until its entry is removed.
"""

from __future__ import annotations

import tomllib
from pathlib import Path


def load_expectations(path: Path) -> dict[str, str]:
    """``{check: "REQ-ID: evidence"}``; a malformed entry is an error naming the file."""
    entries = tomllib.loads(path.read_text()).get("expected_failure", [])
    expectations: dict[str, str] = {}
    for number, entry in enumerate(entries, 1):
        try:
            check, requirement, evidence = entry["check"], entry["requirement"], entry["evidence"]
        except (KeyError, TypeError):
            message = f"{path}: entry {number} needs check, requirement and evidence"
            raise ValueError(message) from None
        expectations[str(check)] = f"{requirement}: {evidence}"
    return expectations
