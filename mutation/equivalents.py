"""Equivalent mutants: ``mutation/equivalents.toml`` names each one with a one-line reason.

They leave the score's denominator and are listed on the page. An entry may pin mutmut's
hash of the function (``function_hash``): mutmut numbers a function's mutants in order, so
once the function changes the same name may be a different mutant, and the entry is
reported stale (and counted by its verdict) until someone looks again.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
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


def entry(name: str, reason: str, function_hash: str) -> str:
    """One entry of the file, in its format (a TOML table keyed by the mutant's name)."""
    if not reason.strip() or "\n" in reason:
        raise ValueError(f"{name}: the reason must be one non-empty line")
    quoted = json.dumps(reason, ensure_ascii=False)  # a JSON string is a TOML basic string
    return f'\n["{name}"]\nreason = {quoted}\nfunction_hash = "{function_hash}"\n'


def add(hashes: Mapping[str, str], reason: str, path: Path = FILE) -> list[str]:
    """Append an entry for each mutant in ``hashes`` (name to its function's current hash)
    not yet listed; returns the names added."""
    listed = load(path)
    added = [name for name in hashes if name not in listed]
    text = "".join(entry(name, reason, hashes[name]) for name in added)
    with path.open("a", encoding="utf-8") as out:
        out.write(text)
    load(path)  # what was written must read back
    return added
