"""The mutation report: verdicts of the lanes combined per mutant, counted per module and
overall, as JSON and as the docs page ``docs/mutation.md``."""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from mutation.equivalents import Equivalent
from mutation.mutmut_driver import CHECK_SECONDS, TIMEOUT_MULTIPLIER, Verdict

ROOT = Path(__file__).resolve().parent.parent
BUCKETS = ("killed", "timeout", "survived", "no tests", "suspicious", "skipped", "not checked")
"""The report's columns besides ``equivalent``; the score is (killed + timeout) over the
mutants that were checked and are not equivalent."""

_RANK = {status: rank for rank, status in enumerate(BUCKETS)}
_BUCKET_OF = {  # mutmut's words -> the report's
    "segfault": "timeout",  # -9: SIGKILL at the hard CPU limit
    "caught by type check": "killed",
    "check was interrupted by user": "not checked",
}


def combine(lanes: Iterable[Verdict | None]) -> str:
    """A mutant's verdict over the lanes: killed by any lane is killed; otherwise the most
    telling of the lanes' verdicts (timeout, survived, no tests, ...), except that a mutant
    left alive by one lane and not yet judged by another (a run done in parts) is not
    checked yet."""
    verdicts = list(lanes)
    buckets = [_BUCKET_OF.get(v.status, v.status) for v in verdicts if v is not None]
    buckets = [b if b in _RANK else "suspicious" for b in buckets]
    best = min(buckets, key=_RANK.__getitem__, default="not checked")
    pending = len(buckets) < len(verdicts) or "not checked" in buckets
    return "not checked" if best in ("survived", "no tests") and pending else best


def git_commit() -> tuple[str, bool]:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip()

    dirty = bool(git("status", "--porcelain", "--", "reference", "conformance", "adapters", "spec"))
    return git("rev-parse", "HEAD") or "unknown", dirty


def _detected(counts: Mapping[str, int]) -> int:
    return counts["killed"] + counts["timeout"]


def _judged(counts: Mapping[str, int]) -> int:
    """The score's denominator: checked, not equivalent, not skipped."""
    return _detected(counts) + counts["survived"] + counts["no tests"] + counts["suspicious"]


def score(counts: Mapping[str, int]) -> float | None:
    judged = _judged(counts)
    return None if judged == 0 else round(_detected(counts) / judged, 4)


def build(
    names: Iterable[str],
    lanes: Mapping[str, Mapping[str, Verdict]],
    equivalents: Mapping[str, Equivalent],
    diffs: Mapping[str, str],
    selection: Mapping[str, Any],
    lane_seconds: Mapping[str, float],
) -> dict[str, Any]:
    """The report over ``names``; ``lanes`` maps an adapter to its verdicts by mutant name."""
    per_module: dict[str, Counter[str]] = {}
    survivors: list[dict[str, Any]] = []
    listed_equivalents: list[dict[str, Any]] = []
    stale: list[dict[str, Any]] = []
    seconds: list[float] = []
    ordered = sorted(names)  # read twice: per mutant, then for entries naming none of them
    for name in ordered:
        verdicts = {adapter: lane.get(name) for adapter, lane in lanes.items()}
        first = next(v for v in verdicts.values() if v is not None)
        status = combine(verdicts.values())
        seconds += [v.seconds for v in verdicts.values() if v is not None and v.seconds]
        equivalent = equivalents.get(name)
        if equivalent is not None:
            pinned = equivalent.function_hash
            if pinned is not None and pinned != first.function_hash:
                stale.append({"name": name, "reason": equivalent.reason, "status": status})
            elif status == "killed" or status == "timeout":
                stale.append({"name": name, "reason": "listed equivalent but " + status})
            else:
                listed_equivalents.append(
                    {"name": name, "module": first.module, "reason": equivalent.reason}
                )
                status = "equivalent"
        per_module.setdefault(first.module, Counter())[status] += 1
        if status in ("survived", "no tests", "suspicious"):
            survivors.append(
                {
                    "name": name,
                    "module": first.module,
                    "status": status,
                    "lanes": {a: (v.status if v else None) for a, v in verdicts.items()},
                    "diff": diffs.get(name, ""),
                }
            )
    if not selection.get("sample"):
        stale += _unmatched(equivalents, set(ordered), set(per_module))
    modules = {module: _figures(counts) for module, counts in sorted(per_module.items())}
    overall = _figures(sum(per_module.values(), Counter()))
    commit, dirty = git_commit()
    return {
        "tool": _tool(),
        "commit": commit,
        "dirty": dirty,
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "adapters": list(lanes),
        "selection": dict(selection),
        "lane_seconds": {lane: round(s, 1) for lane, s in lane_seconds.items()},
        "seconds_per_mutant": round(sum(seconds) / len(seconds), 2) if seconds else None,
        "overall": overall,
        "modules": modules,
        "survivors": survivors,
        "equivalents": listed_equivalents,
        "stale_equivalents": stale,
    }


def module_of(name: str) -> str:
    """The module (a path under reference/routespec) a mutant's name belongs to:
    ``routespec.routing.selection.xǁSelectorǁselect__mutmut_1`` is routing/selection.py."""
    dotted = name.rsplit(".", 1)[0].removeprefix("routespec.")
    return dotted.replace(".", "/") + ".py"


def _unmatched(
    equivalents: Mapping[str, Equivalent], names: set[str], modules: set[str]
) -> list[dict[str, Any]]:
    # An entry in a module this run saw whole that names no mutant it generated: the function
    # shrank or was renamed, so the entry explains nothing any more.
    return [
        {"name": name, "reason": "listed equivalent but no longer generated"}
        for name in sorted(equivalents)
        if name not in names and module_of(name) in modules
    ]


def _judged_at(commits: Mapping[str, int] | None) -> list[str]:
    if not commits:
        return []
    shown = ", ".join(f"`{commit}` ({count})" for commit, count in commits.items())
    return [
        "- Verdicts are kept in `mutation/verdicts.json` between runs and machines; a "
        "function's verdicts stand while its source is unchanged (an edit judges its mutants "
        f"again). Lane verdicts by the commit that judged them: {shown}"
    ]


def _tool() -> str:
    # Reports are rebuilt (and unit-tested) where the `mutation` extra is not installed.
    try:
        return f"mutmut {version('mutmut')}"
    except PackageNotFoundError:
        return "mutmut (not installed here)"


def _figures(counts: Counter[str]) -> dict[str, Any]:
    figures: dict[str, Any] = {"mutants": sum(counts.values())}
    figures |= {bucket: counts[bucket] for bucket in (*BUCKETS, "equivalent")}
    figures["score"] = score(figures)
    # over the mutants some check reached: what a one-lane sample can speak for
    figures["score_reached"] = score(figures | {"no tests": 0})
    return figures


def write_json(report: Mapping[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


def _last_run(selection: Mapping[str, Any], lane_seconds: Mapping[str, float]) -> str:
    if not lane_seconds:
        return "none; the page was rebuilt from stored verdicts (`python -m mutation report`)"
    shown = ", ".join(f"`{m}`" for m in selection.get("modules") or []) or "every module"
    if selection.get("sample"):
        shown += f", a sample of {selection['sample']} (seed {selection['seed']})"
    return shown


def summary(report: Mapping[str, Any]) -> dict[str, Any]:
    """The figures other pages show beside requirement coverage (docs/mutation-score.json,
    read by ``routespec.conformance.matrix --mutation``)."""
    overall = report["overall"]
    return {
        "target": "reference/routespec (specified layers)",
        "commit": report["commit"],
        "score": overall["score"],
        "killed": _detected(overall),
        "judged": _judged(overall),
        "not_checked": overall["not checked"],
        "mutants": overall["mutants"],
    }


def requirement_coverage(paths: Iterable[Path]) -> dict[str, tuple[int, int]]:
    """Per conformance report found: (requirements passed, requirements listed)."""
    found = {}
    for path in paths:
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))["requirements"]
        except (OSError, ValueError, KeyError):
            continue
        passed = sum(1 for row in rows if row.get("result") == "PASS")
        found[path.stem] = (passed, len(rows))
    return found


def markdown(
    report: Mapping[str, Any], coverage: Mapping[str, tuple[int, int]] | None = None
) -> str:
    columns = ("mutants", *BUCKETS, "equivalent")
    head = "| module | " + " | ".join(columns) + " | score |"
    rule = "|" + "---|" * (len(columns) + 2)

    def row(label: str, figures: Mapping[str, Any]) -> str:
        cells = " | ".join(str(figures[c]) for c in columns)
        return f"| {label} | {cells} | {_percent(figures['score'])} |"

    dirty = " (with uncommitted changes)" if report["dirty"] else ""
    lanes = ", ".join(f"{a} {s} s" for a, s in report["lane_seconds"].items()) or "n/a"
    selection = report["selection"]
    overall = report["overall"]
    lines = [
        "# Mutation testing",
        "",
        "How much of the reference's specified behaviour the conformance suite pins down: "
        "a standard tool (mutmut) seeds small changes (mutants) into the reference's "
        "specified layers and runs the suite against each; a mutant the suite fails on is "
        "*killed*. The score is killed (or timed out) over the mutants checked, equivalent "
        "mutants left out.",
        "",
        f"- **Score: {_percent(overall['score'])}** ({_detected(overall)} of "
        f"{_judged(overall)} checked non-equivalent mutants killed; "
        f"{overall['not checked']} of {overall['mutants']} not checked yet)",
        *(
            [
                "- Beside it, requirement coverage of the same suite: "
                + "; ".join(
                    f"`{name}` PASS {passed} of {total} requirements"
                    for name, (passed, total) in coverage.items()
                )
                + " ([matrix](matrix.md))"
            ]
            if coverage
            else []
        ),
        f"- Commit `{report['commit']}`{dirty}, {report['tool']}, written {report['written']}",
        f"- Test command: the conformance suite, adapters {', '.join(report['adapters'])} "
        "(the second runs only what the first left alive), Hypothesis profile `bounded`, "
        "derandomized",
        f"- Last run: {_last_run(selection, report['lane_seconds'])}",
        f"- Lane wall time: {lanes}; {report['seconds_per_mutant']} s per mutant on average",
        *_judged_at(report.get("judged_at")),
        "",
        "Run it with `python -m mutation run [--module routing/selection.py ...]` "
        "(see `python -m mutation --help`); the CI sample lane is `.ci/mutation-sample` "
        "(a seeded 100 of the mutants, both lanes, failing below 95 %; then the same sample "
        "judged by the deterministic checks alone, `--without-machines`, also failing below "
        "95 %). "
        "Triage a survivor with `python -m mutation try NAME --adapter A -- CHECKS` (the "
        "working tree's checks against that mutant, the unmutated reference first; "
        "`--record` writes its kills into the lane's verdicts) and, "
        "when no check can tell it apart, `python -m mutation equivalent NAME --reason "
        '"..."`.',
        "",
        "## How it runs",
        "",
        "- Why mutmut (not cosmic-ray): mutmut records which checks reach each function and "
        "runs a mutant against those checks only, in a process forked from a warmed one; "
        "cosmic-ray runs its configured test command whole for every mutant. The suite over "
        "both reference adapters takes about 5 minutes, so whole runs would cost about 20 days "
        "for this reference's mutants, where mutmut averages the seconds per mutant shown above.",
        "- Mutated: `errors.py`, `migration.py`, `discovery/` (not `etcd_store.py`), "
        "`routing/`, `transport/`, `host/` under `reference/routespec` "
        "(`mutation/layers.py`); not the deployment tooling, the test kit or the checks.",
        "- mutmut imports the code from `src/`, so `mutation/stage.py` lays the package "
        "out as the wheel does under `build/mutation/<adapter>/src/routespec` and writes "
        "mutmut's configuration there; mutmut copies it to `mutants/` and rewrites each "
        "function into a trampoline that calls the mutant named by `MUTANT_UNDER_TEST`.",
        "- A first run of the suite records which checks reach each function; each mutant "
        "then runs only those checks (`-x`), in a process forked from a warmed one. A "
        f"mutant times out after {TIMEOUT_MULTIPLIER:g} times (its checks' recorded seconds "
        f"+ 1) of wall time, and a single check fails after {CHECK_SECONDS} s (pytest-timeout: "
        "a check a mutant hangs kills it in seconds, where mutmut's own limit took minutes).",
        "- Lanes: `reference` first, then `reference-tcp` on what the first left alive "
        "(survived or reached by no check); a mutant killed by either lane is killed.",
        "- The stateful machines add search, not coverage: `run --sample N --without-machines` "
        "leaves `*_machine.py` out of the test command, so a sample is judged by the "
        "deterministic checks alone, and a mutant only a machine kills shows as a survivor.",
        "- Equivalent mutants (`mutation/equivalents.toml`) are not run; an entry pins the "
        "function's hash, so an edit to the function marks it stale.",
        "- As root, the lanes run without the capabilities an ordinary user lacks "
        "(`setpriv`, `-dac_override,-dac_read_search,-net_bind_service`), so the checks of "
        "an unreadable record or directory (DSC-011, DSC-014) run rather than skip, and a "
        "listener on a fixed low port fails as it would for a user.",
        "- Not seen: code that runs only inside a drill worker process of `reference-tcp` "
        "counts as reached by no check (mutmut records reach in its own process), though "
        "the process does import the mutated copy.",
        "",
        "## Per module",
        "",
        head,
        rule,
        *(row(f"`{module}`", figures) for module, figures in report["modules"].items()),
        row("**all**", report["overall"]),
        "",
        "## Survivors",
        "",
    ]
    if not report["survivors"]:
        lines.append("None.")
    for survivor in report["survivors"]:
        lanes_seen = ", ".join(f"{a}: {s}" for a, s in survivor["lanes"].items())
        lines += [
            f'??? note "`{survivor["name"]}` — {survivor["status"]} ({lanes_seen})"',
            "    ```diff",
            *("    " + line for line in survivor["diff"].splitlines()),
            "    ```",
            "",
        ]
    lines += ["", "## Equivalent mutants", ""]
    lines.append(
        "Listed in `mutation/equivalents.toml`, each with why no behaviour can tell it apart."
    )
    lines.append("")
    if report["equivalents"]:
        lines += ["| mutant | reason |", "|---|---|"]
        lines += [f"| `{e['name']}` | {e['reason']} |" for e in report["equivalents"]]
    else:
        lines.append("None in this run.")
    if report["stale_equivalents"]:
        lines += ["", "Entries to look at again (the function changed, or the mutant is killed):"]
        lines += [f"- `{e['name']}`: {e['reason']}" for e in report["stale_equivalents"]]
    return "\n".join(lines) + "\n"
