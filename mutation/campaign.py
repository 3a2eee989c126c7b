"""One mutation run: stage each adapter's lane, pick the mutants, run the lanes in turn (a
lane runs only what the lanes before it left alive), and build the report."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from mutation import equivalents, mutmut_driver, report, verdict_store
from mutation.layers import is_specified
from mutation.mutmut_driver import Verdict
from mutation.stage import stage, staged_at

ALIVE = ("survived", "no tests", "suspicious", "not checked")


@attrs.frozen
class Plan:
    adapters: Sequence[str]
    modules: Sequence[str]  # empty: every specified module
    sample: int | None
    seed: int
    children: int
    rerun: bool
    out: Path
    rerun_alive: bool = False  # run again what no check killed yet (after adding checks)
    without_machines: bool = False  # judge with the deterministic checks alone (a sample)


def _glob(module: str) -> str:
    return "routespec." + module.removesuffix(".py").replace("/", ".") + ".*"


def _patterns(todo: list[str], everything: Mapping[str, Verdict]) -> list[str]:
    """Names to hand mutmut; a module wholly in ``todo`` as one glob (mutmut matches every
    name against every pattern)."""
    by_module: dict[str, set[str]] = {}
    for verdict in everything.values():
        by_module.setdefault(verdict.module, set()).add(verdict.name)
    wanted = set(todo)
    patterns: list[str] = []
    for module, names in sorted(by_module.items()):
        if names <= wanted:
            patterns.append(_glob(module))
        else:
            patterns += sorted(names & wanted)
    return patterns


def _of_the_same_source(
    current: Mapping[str, Verdict], first: Mapping[str, Verdict]
) -> dict[str, Verdict]:
    """A lane's verdicts, less those its stage holds for an older source of the function:
    a later lane's stage is regenerated only when mutmut runs there, so until then a mutant
    of an edited function would carry the verdict of the mutant that had its number."""
    return {
        name: verdict
        for name, verdict in current.items()
        if name in first and verdict.function_hash == first[name].function_hash
    }


def execute(plan: Plan) -> dict[str, Any]:
    if plan.without_machines and plan.sample is None:
        raise SystemExit("--without-machines judges a sample only: its verdicts are not stored")
    stages = {
        adapter: stage(plan.out / adapter, adapter, plan.without_machines)
        for adapter in plan.adapters
    }
    first = stages[plan.adapters[0]]
    mutmut_driver.generate(first, plan.children)
    keep = plan.sample is None  # a sample judges the suite as it is now: it stores nothing
    everything = {n: v for n, v in mutmut_driver.verdicts(first).items() if is_specified(v.module)}
    known_modules = {v.module for v in everything.values()}
    unknown = sorted(set(plan.modules) - known_modules)
    if unknown:
        raise SystemExit(f"not a mutated module: {', '.join(unknown)} (paths under routespec/)")
    scope_modules = set(plan.modules) or known_modules
    listed = equivalents.load()
    candidates = sorted(
        n for n, v in everything.items() if v.module in scope_modules and n not in listed
    )
    if plan.sample is not None:
        candidates = sorted(
            random.Random(plan.seed).sample(candidates, min(plan.sample, len(candidates)))
        )
    rerun = plan.rerun or plan.sample is not None
    lanes: dict[str, Mapping[str, Verdict]] = {}
    lane_seconds: dict[str, float] = {}
    log = plan.out / "mutmut.log"
    for adapter, directory in stages.items():
        if lanes:
            mutmut_driver.seed_from(directory, first)
        if keep:
            _restored(directory, adapter)
        current = _of_the_same_source(mutmut_driver.verdicts(directory), everything)
        todo = [
            n
            for n in candidates
            if all(lane[n].status in ALIVE for lane in lanes.values())
            and (
                rerun
                or current.get(n) is None
                or current[n].status == "not checked"
                or (plan.rerun_alive and current[n].status in ALIVE)
            )
        ]
        if todo:
            print(f"{adapter}: {len(todo)} mutants", flush=True)
            started = time.monotonic()
            code = mutmut_driver.run(directory, _patterns(todo, everything), plan.children, log)
            lane_seconds[adapter] = time.monotonic() - started
            if code != 0:
                raise SystemExit(f"mutmut run failed in {directory} (exit {code}); see {log}")
        lanes[adapter] = mutmut_driver.verdicts(directory)
    if keep:
        verdict_store.save(stages, staged_at(first))
    names = candidates if plan.sample is not None else sorted(everything)
    selection = {
        "modules": sorted(plan.modules),
        "sample": plan.sample,
        "seed": plan.seed,
        "without_machines": plan.without_machines,
    }
    return build_report(plan.out, stages, names, lanes, selection, lane_seconds)


def build_report(
    out: Path,
    stages: Mapping[str, Path],
    names: Sequence[str],
    lanes: Mapping[str, Mapping[str, Verdict]],
    selection: Mapping[str, Any],
    lane_seconds: Mapping[str, float],
) -> dict[str, Any]:
    listed = equivalents.load()
    first_stage = next(iter(stages.values()))
    first_lane = next(iter(lanes.values()))
    diffs = _cached_diffs(out)
    alive = [
        n
        for n in names
        if all(lane.get(n) is None or lane[n].status in ALIVE for lane in lanes.values())
        and first_lane[n].status != "not checked"
    ]
    missing = {
        name: first_lane[name].module
        for name in alive
        if f"{name}@{first_lane[name].function_hash}" not in diffs
    }
    for name, shown in mutmut_driver.diffs(first_stage, missing).items():
        diffs[f"{name}@{first_lane[name].function_hash}"] = shown
    (out / "diffs.json").write_text(json.dumps(diffs, indent=1, ensure_ascii=False))
    by_name = {n: diffs.get(f"{n}@{first_lane[n].function_hash}", "") for n in names}
    built = report.build(
        names, {a: lanes[a] for a in lanes}, listed, by_name, selection, lane_seconds
    )
    if selection.get("sample") is None:
        built["judged_at"] = verdict_store.judged_at()
    return built


def _cached_diffs(out: Path) -> dict[str, str]:
    path = out / "diffs.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _generated(directory: Path) -> bool:
    return (directory / "mutants" / "src").exists()


def _restored(directory: Path, adapter: str) -> None:
    restored = verdict_store.restore(directory, adapter)
    if restored:
        print(f"{adapter}: {restored} verdicts taken from {verdict_store.STORE.name}", flush=True)


def report_only(adapters: Sequence[str], out: Path) -> dict[str, Any]:
    """The report from the stored verdicts (the stages', then the repository's), running no
    mutant; a fresh clone generates the mutants first, to name them and show their diffs."""
    stages = {a: out / a if _generated(out / a) else stage(out / a, a) for a in adapters}
    first = stages[adapters[0]]
    if not _generated(first):
        mutmut_driver.generate(first, 1)
    for adapter, directory in stages.items():
        mutmut_driver.seed_from(directory, first)
        _restored(directory, adapter)
    verdict_store.save(stages, staged_at(first))
    lanes = {a: mutmut_driver.verdicts(d) for a, d in stages.items()}
    first_lane = next(iter(lanes.values()))
    names = sorted(n for n, v in first_lane.items() if is_specified(v.module))
    return build_report(out, stages, names, lanes, {"modules": [], "sample": None}, {})
