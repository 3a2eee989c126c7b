"""The verdicts kept in the repository (``mutation/verdicts.json``), so that a whole run can be
done in parts, on different machines, and its report rebuilt anywhere.

mutmut keeps its verdicts in the stage under ``build/``, which a fresh clone lacks. After a
run, each lane's decided verdicts are merged into the store; before a run, a new stage takes
back every stored verdict whose function still has the hash it had when judged (mutmut's own
rule: an edited function's mutants are judged again). A verdict says what the suite did at
that time: after adding checks, ``--rerun-alive`` judges the survivors again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mutation.mutmut_driver import meta_files

STORE = Path(__file__).with_name("verdicts.json")
MUTMUT = "3.8.1"

# lane -> module -> function -> {"hash": ..., "mutants": {number: [exit code, seconds, commit]}}
Functions = dict[str, dict[str, Any]]


def _split(name: str) -> tuple[str, str]:
    """``routespec.m.xǁCǁf__mutmut_3`` -> (``xǁCǁf``, ``3``)."""
    qualified, _, number = name.rpartition("__mutmut_")
    return qualified.rpartition(".")[2], number


def load(path: Path = STORE) -> dict[str, dict[str, Functions]]:
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    if data.get("mutmut") != MUTMUT:  # another mutmut may name or number mutants otherwise
        return {}
    lanes: dict[str, dict[str, Functions]] = data["lanes"]
    return lanes


def restore(stage: Path, lane: str, path: Path = STORE) -> int:
    """Give the stage's undecided mutants their stored verdicts where the function is
    unchanged; returns how many were restored."""
    stored = load(path).get(lane, {})
    restored = 0
    for module, meta_path in meta_files(stage):
        functions = stored.get(module)
        if not functions:
            continue
        meta = json.loads(meta_path.read_text())
        hashes = meta["hash_by_function_name"]
        changed = False
        for name, code in meta["exit_code_by_key"].items():
            function, number = _split(name)
            entry = functions.get(function)
            if code is not None or entry is None or entry["hash"] != hashes.get(function):
                continue
            kept = entry["mutants"].get(number)
            if kept is None:
                continue
            meta["exit_code_by_key"][name], seconds, _ = kept
            if seconds is not None:
                meta["durations_by_key"][name] = seconds
            restored += 1
            changed = True
        if changed:
            meta_path.write_text(json.dumps(meta, indent=4))
    return restored


def _merged(old: Functions, meta: Mapping[str, Any], commit: str) -> Functions:
    """``old``'s verdicts for functions unchanged since, updated with the stage's; a verdict
    the stage repeats keeps the commit that first judged it."""
    hashes = meta["hash_by_function_name"]
    durations = meta.get("durations_by_key", {})
    kept = {f: e for f, e in old.items() if hashes.get(f) == e["hash"]}
    for name, code in meta["exit_code_by_key"].items():
        if code is None:
            continue
        function, number = _split(name)
        entry = kept.setdefault(function, {"hash": hashes.get(function, ""), "mutants": {}})
        previous = entry["mutants"].get(number)
        if previous is not None and previous[0] == code:
            continue
        seconds = durations.get(name)
        entry["mutants"][number] = [code, None if seconds is None else round(seconds, 2), commit]
    return dict(sorted(kept.items()))


def save(stages: Mapping[str, Path], commit: str, path: Path = STORE) -> None:
    """Merge the stages' decided verdicts, judged at ``commit``, into the store. A function
    whose hash differs from the stored one keeps only the new verdicts (the old ones judged
    other code)."""
    lanes = load(path)
    for lane, stage in stages.items():
        modules = lanes.setdefault(lane, {})
        for module, meta_path in meta_files(stage):
            merged = _merged(modules.get(module, {}), json.loads(meta_path.read_text()), commit)
            if merged:
                modules[module] = merged
            else:
                modules.pop(module, None)
        lanes[lane] = dict(sorted(modules.items()))
    path.write_text(_dump(lanes))


def _dump(lanes: Mapping[str, Mapping[str, Functions]]) -> str:
    """The store as JSON with one line per function, so that a run's change to the file is
    a line per function it judged again."""

    def block(items: list[tuple[str, str]], indent: str) -> str:
        inner = ",\n".join(
            f"{indent} {json.dumps(key, ensure_ascii=False)}: {value}" for key, value in items
        )
        return "{\n" + inner + "\n" + indent + "}" if items else "{}"

    def compact(value: object) -> str:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    lane_blocks = [
        (
            lane,
            block(
                [
                    (module, block([(f, compact(e)) for f, e in functions.items()], "   "))
                    for module, functions in modules.items()
                ],
                "  ",
            ),
        )
        for lane, modules in lanes.items()
    ]
    return block([("mutmut", json.dumps(MUTMUT)), ("lanes", block(lane_blocks, " "))], "") + "\n"


def judged_at(path: Path = STORE) -> dict[str, int]:
    """How many stored verdicts each commit judged, over all lanes, most first."""
    counts: dict[str, int] = {}
    for modules in load(path).values():
        for functions in modules.values():
            for entry in functions.values():
                for _, _, commit in entry["mutants"].values():
                    counts[commit] = counts.get(commit, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: -item[1]))
