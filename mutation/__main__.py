"""``python -m mutation``: mutation testing of the reference with the conformance suite.

python -m mutation run                          # every specified module (hours)
python -m mutation run --module routing/selection.py --module routing/worker_sets.py
python -m mutation run --sample 100 --seed 1    # the CI lane: prints the kill rate
python -m mutation run --sample 100 --without-machines   # the deterministic checks alone
python -m mutation run --rerun-alive --module migration.py   # after adding checks
python -m mutation report                       # rebuild report and page, run nothing
python -m mutation equivalent NAME... --reason "one line: why no check can tell"
python -m mutation try NAME... --adapter reference-tcp -- conformance/test_transport.py -k frame
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mutation import campaign, equivalents, mutmut_driver, report, trial

ROOT = Path(__file__).resolve().parent.parent
ADAPTERS = ("reference", "reference-tcp")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mutation", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run mutants, then write the report")
    run.add_argument(
        "--module",
        action="append",
        default=[],
        metavar="PATH",
        help="a module under reference/routespec (routing/selection.py); repeatable; "
        "default every specified module",
    )
    run.add_argument("--sample", type=int, metavar="N", help="a seeded random sample of N mutants")
    run.add_argument("--seed", type=int, default=1, help="the sample's seed (default 1)")
    run.add_argument(
        "--rerun", action="store_true", help="run mutants that already have a verdict again"
    )
    run.add_argument(
        "--rerun-alive",
        action="store_true",
        help="run again the mutants no check has killed yet (after adding checks)",
    )
    run.add_argument(
        "--without-machines",
        action="store_true",
        help="with --sample: leave the stateful machines (*_machine.py) out of the test "
        "command, so only deterministic checks judge (issue 16: machines add search, not "
        "coverage)",
    )
    run.add_argument(
        "--fail-under",
        type=float,
        metavar="RATE",
        help="exit 1 if the kill rate (0..1) is below RATE",
    )
    report_command = commands.add_parser("report", help="rebuild the report from stored verdicts")
    equivalent = commands.add_parser(
        "equivalent",
        help="list mutants as equivalent in mutation/equivalents.toml, pinned to the hash of "
        "their function in the last run's stage",
    )
    equivalent.add_argument("names", nargs="+", metavar="NAME", help="mutmut's mutant names")
    equivalent.add_argument(
        "--reason", required=True, help="one line: why no conforming observation differs"
    )
    try_command = commands.add_parser(
        "try",
        usage="python -m mutation try NAME... [--adapter A] -- PYTEST_ARGUMENTS",
        help="run checks of the working tree against mutants of the last run's stage (the "
        "unmutated reference first): does a new check kill them?",
    )
    try_command.add_argument("names", nargs="+", metavar="NAME", help="mutmut's mutant names")
    try_command.add_argument("--adapter", default=ADAPTERS[0], help="the lane (default reference)")
    try_command.add_argument(
        "--stage",
        help="the lane whose staged mutants to take (default the adapter's; every lane's "
        "mutants are the same, but a lane's stage is regenerated only when its run reaches it)",
    )
    try_command.add_argument(
        "--record",
        action="store_true",
        help="write the kills into the lane's verdicts (only if the checks pass unmutated)",
    )
    for command in (equivalent, try_command):
        command.add_argument(
            "--out", type=Path, help="the run's state directory (default build/mutation)"
        )
    for command in (run, report_command):
        command.add_argument(
            "--adapters",
            default=",".join(ADAPTERS),
            help="the lanes in order, comma-separated (default reference,reference-tcp)",
        )
        command.add_argument(
            "--out",
            type=Path,
            help="state and report directory (default build/mutation, build/mutation-sample "
            "for --sample)",
        )
        command.add_argument(
            "--docs",
            type=Path,
            help="the page to write (default docs/mutation.md; none for --sample)",
        )
        command.add_argument(
            "--max-children", type=int, default=1, help="mutants run at once (default 1)"
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    checks = argv[argv.index("--") + 1 :] if "--" in argv else []  # try: pytest's arguments
    args = _parser().parse_args(argv[: len(argv) - len(checks) - (1 if checks else 0)])
    if args.command == "equivalent":
        return _list_equivalent(args.names, args.reason, args.out or ROOT / "build" / "mutation")
    if args.command == "try":
        out = args.out or ROOT / "build" / "mutation"
        lane = out / args.adapter
        stage = out / args.stage if args.stage else lane
        return _try(args.names, args.adapter, checks, stage, lane if args.record else None)
    adapters = [a for a in args.adapters.split(",") if a]
    sample = getattr(args, "sample", None)
    without_machines = getattr(args, "without_machines", False)
    default_out = "mutation-sample" + ("-without-machines" if without_machines else "")
    out = (args.out or ROOT / "build" / (default_out if sample else "mutation")).resolve()
    docs = args.docs or (None if sample else ROOT / "docs" / "mutation.md")
    if args.command == "run":
        plan = campaign.Plan(
            adapters=adapters,
            modules=args.module,
            sample=sample,
            seed=args.seed,
            children=args.max_children,
            rerun=args.rerun,
            rerun_alive=args.rerun_alive,
            out=out,
            without_machines=without_machines,
        )
        result = campaign.execute(plan)
    else:
        result = campaign.report_only(adapters, out)
    report.write_json(result, out / "report.json")
    if docs is not None:
        reports = [ROOT / "reports" / f"{adapter}.json" for adapter in adapters]
        docs.write_text(report.markdown(result, report.requirement_coverage(reports)))
        report.write_json(report.summary(result), docs.with_name("mutation-score.json"))
    _print_summary(result, out / "report.json", docs)
    rate = result["overall"]["score"]
    fail_under = getattr(args, "fail_under", None)
    return 1 if fail_under is not None and (rate is None or rate < fail_under) else 0


def _list_equivalent(names: list[str], reason: str, out: Path) -> int:
    known = mutmut_driver.verdicts(out / ADAPTERS[0]) if (out / ADAPTERS[0]).exists() else {}
    unknown = [name for name in names if name not in known]
    if unknown:
        print(f"not a mutant of the stage in {out / ADAPTERS[0]}: {', '.join(unknown)}")
        return 1
    added = equivalents.add({name: known[name].function_hash for name in names}, reason)
    for name in names:
        print(("listed " if name in added else "already listed ") + name)
    return 0


def _try(
    names: list[str], adapter: str, checks: list[str], stage: Path, record_in: Path | None
) -> int:
    """``record_in``: the lane whose verdicts take the kills (None: record nothing)."""
    if not (stage / "mutants" / "src").exists():
        print(f"no stage in {stage}: run python -m mutation run first")
        return 1
    outcomes = trial.run(stage, adapter, names, checks)
    unmutated, _ = outcomes.pop("")
    print(f"unmutated reference: {unmutated.replace('survived', 'passed', 1)}")
    for name, (outcome, _seconds) in outcomes.items():
        print(f"{name}: {outcome}")
    killed = {n: seconds for n, (o, seconds) in outcomes.items() if o.startswith("killed")}
    if record_in is not None and unmutated.startswith("survived") and killed:
        written = trial.record_kills(record_in, killed)
        print(f"recorded {written} kills in the {adapter} lane (python -m mutation report)")
    return 0 if len(killed) == len(outcomes) else 1


def _print_summary(result: dict[str, Any], path: Path, docs: Path | None) -> None:
    for module, figures in result["modules"].items():
        print(f"{module:40} {_line(figures)}")
    overall = result["overall"]
    print(f"{'all':40} {_line(overall)}")
    rate = overall["score"]
    detected = overall["killed"] + overall["timeout"]
    judged = detected + overall["survived"] + overall["no tests"] + overall["suspicious"]
    shown = "n/a" if rate is None else f"{100 * rate:.1f} %"
    judges = (
        " by the deterministic checks alone (no stateful machine)"
        if result.get("selection", {}).get("without_machines")
        else ""
    )
    print(f"kill rate{judges}: {detected}/{judged} = {shown} (commit {result['commit'][:12]})")
    if overall["no tests"]:
        reached = overall["score_reached"]
        print(
            f"kill rate over the mutants a check reached: {detected}/{judged - overall['no tests']}"
            f" = {'n/a' if reached is None else f'{100 * reached:.1f} %'}; "
            f"{overall['no tests']} reached by no check of lanes {', '.join(result['adapters'])}"
        )
    print(f"report: {path}" + (f" and {docs}" if docs else ""))


def _line(figures: dict[str, Any]) -> str:
    shown = [f"{figures['mutants']} mutants"]
    shown += [f"{figures[b]} {b}" for b in (*report.BUCKETS, "equivalent") if figures[b]]
    return ", ".join(shown)


if __name__ == "__main__":
    raise SystemExit(main())
