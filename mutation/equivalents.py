"""Equivalent mutants: ``mutation/equivalents.toml`` names each one with a one-line reason.

They leave the score's denominator and are listed on the page. An entry may pin mutmut's
hash of the function (``function_hash``): mutmut numbers a function's mutants in order, so
once the function changes the same name may be a different mutant, and the entry is
reported stale (and counted by its verdict) until someone looks again.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import attrs

FILE = Path(__file__).resolve().parent / "equivalents.toml"


@attrs.frozen
class Equivalent:
    name: str
    reason: str
    function_hash: str | None


def load(path: Path = FILE) -> dict[str, Equivalent]:
    if not path.exists():
        return {}
    table = tomllib.loads(path.read_text())
    found: dict[str, Equivalent] = {}
    for name, entry in table.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("reason"), str):
            raise ValueError(f"{path}: {name!r} needs reason = '...'")
        pinned = entry.get("function_hash")
        found[name] = Equivalent(name, entry["reason"], pinned if isinstance(pinned, str) else None)
    return found
