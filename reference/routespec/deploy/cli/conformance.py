"""``routespec conformance``: run the conformance suite against an adapter, show its progress,
and print a summary read from the report it writes.

The suite runs as ``python -m pytest --pyargs routespec.conformance`` in a child process, so
it needs only the installed package (with the ``test`` extra), never a checkout; inside a
checkout pytest finds the checkout's configuration, as ``pytest conformance/`` does.

This subcommand is the kit's door: the one product module allowed to import the conformance
kit (its report and registry; tests/test_layers.py), and only when it runs, since the kit
needs the ``test`` extra.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import os
import pkgutil
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from routespec.deploy.cli.usage import UsageError, missing_extra

ADAPTERS_PACKAGE = "routespec.adapters"
PROFILES = {
    "default": "60 examples of up to 30 steps per state machine",
    "thorough": "1000 examples of up to 60 steps: long, for release checks",
    "bounded": "15 examples of up to 15 steps: for slow adapters that start processes",
}
REPORTS = Path("reports")
# pytest's exit codes, and what they mean for a conformance run
FAILED, INTERRUPTED, INTERNAL, USAGE, NO_TESTS = 1, 2, 3, 4, 5
USAGE_EXIT = 2
# a line of pytest -q progress: outcome letters, then the share done
_PROGRESS_CHARS = frozenset(".sFEXxp")
DESCRIPTION = """\
Run the conformance suite against an adapter (the shipped adapters by short name, or your
own as module:attr), show its progress, and print a summary: the verdict counts and, for
each FAIL, the requirement's sentence, the expected and the actual value, and a command
that reruns the failing check. The whole report goes to --report (JSON) and next to it
as Markdown.

It runs 'python -m pytest --pyargs routespec.conformance', so it works wherever routespec is
installed with its test extra (pip install 'routespec[test]'); every pytest option of the
suite is available there too.

exit status: 0 every check that ran passed; 1 a requirement is FAIL (or a check errored);
2 a bad option; 5 no check ran (the adapter's capabilities let none run, or --req selected
none); 3 pytest failed internally."""
EXAMPLE = """\
examples:
  routespec conformance --adapter reference
  routespec conformance --adapter mypackage.routing:ADAPTER --req DSP-001,DSP-002
  routespec conformance --list-adapters"""


def add_parser(commands: argparse._SubParsersAction[Any]) -> None:
    """Add the ``conformance`` subcommand to ``commands`` (the ``routespec`` subparsers)."""
    suite = commands.add_parser(
        "conformance",
        help="run the conformance suite against an adapter of your runtime",
        description=DESCRIPTION,
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    suite.add_argument(
        "--adapter",
        metavar="NAME|module:attr",
        help="the target: a shipped adapter's short name (reference, reference-tcp, "
        "mutants.direct-reselects; see --list-adapters) or module:attr naming your "
        "adapter object",
    )
    suite.add_argument(
        "--req",
        metavar="IDS",
        help="run only the checks citing one of these comma-separated requirement IDs "
        "(DSP-001,DSP-002); the report then goes to REPORT.req-IDS.json, so a full "
        "report is never replaced by a filtered one",
    )
    suite.add_argument(
        "--hypothesis-profile",
        choices=list(PROFILES),
        default="default",
        help="how long the state machines run: "
        + "; ".join(f"{name}: {text}" for name, text in PROFILES.items())
        + " (default: %(default)s)",
    )
    suite.add_argument(
        "--hypothesis-seed",
        metavar="SEED",
        help="run Hypothesis with this seed (as a failing check's rerun command says)",
    )
    suite.add_argument(
        "--report",
        type=Path,
        metavar="PATH",
        help="where the JSON report goes, with the Markdown next to it "
        "(default reports/ADAPTER.json)",
    )
    suite.add_argument(
        "--verbose", action="store_true", help="show pytest's whole output, not only progress"
    )
    suite.add_argument(
        "--list-adapters",
        action="store_true",
        help="print the shipped adapters, one per line with its description, and exit",
    )
    suite.set_defaults(run=run_conformance)


def run_conformance(args: argparse.Namespace) -> int:
    if args.list_adapters:
        listed = shipped_adapters()
        width = max((len(name) for name, _ in listed), default=0) + 2
        for name, description in listed:
            print(f"{name:{width}}{description}")
        return 0
    if not args.adapter:
        raise UsageError(
            "--adapter", "required: a shipped adapter (see --list-adapters) or module:attr"
        )
    for module in ("pytest", "hypothesis"):
        if importlib.util.find_spec(module) is None:
            raise missing_extra("conformance", "test")
    _check_adapter(args.adapter)
    _check_req(args.req)
    report = _report_path(args)
    before = _stamp(report)
    command = [sys.executable, "-m", "pytest", "--pyargs", "routespec.conformance"]
    command += ["--adapter", args.adapter, "-p", "no:cacheprovider"]
    command += ["--conformance-report", str(report)]
    command += ["--hypothesis-profile", args.hypothesis_profile]
    command += ["--req", args.req] if args.req else []
    command += ["--hypothesis-seed", args.hypothesis_seed] if args.hypothesis_seed else []
    command += [] if args.verbose else ["-q"]
    status, output = _run(command, echo_all=args.verbose)
    if status == USAGE:
        raise _usage_error(output)
    if status == INTERRUPTED:
        raise KeyboardInterrupt
    fresh = report.is_file() and _stamp(report) != before
    if fresh:
        from routespec.conformance.report import Report

        print("\n".join(Report.load(report).overview()))
        print(f"report: {report} and {report.with_suffix('.md')}")
    print(_verdict(status, fresh, output), file=sys.stderr if status else sys.stdout)
    return int(status)


def _verdict(status: int, fresh: bool, output: str) -> str:
    """Why the run ended as it did, in words."""
    if status == 0:
        return "conformance: every check that ran passed"
    if status == FAILED:
        return (
            "conformance: FAIL: the adapter violates the requirements marked FAIL above"
            if fresh
            else "conformance: checks failed before a report was written: " + _last_error(output)
        )
    if status == NO_TESTS:
        if fresh:
            return "conformance: no check ran: the adapter's capabilities let no check run"
        return "conformance: no check ran: none was collected (see --req)"
    return f"conformance: pytest stopped with an internal error (exit {status}): " + _last_error(
        output
    )


def _run(command: Sequence[str], *, echo_all: bool) -> tuple[int, str]:
    """Run ``command``: its output is kept, and shown as it comes (only pytest -q's progress
    lines unless ``echo_all``). Returns the exit status and the whole output."""
    kept: list[str] = []
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    ) as process:
        assert process.stdout is not None
        try:
            kept.extend(_echo_progress(process.stdout, sys.stdout, echo_all))
        except KeyboardInterrupt:
            process.wait()  # pytest got the Ctrl-C too: let it stop
            raise
        return process.wait(), "".join(kept)


def _echo_progress(source: IO[bytes], sink: IO[str], echo_all: bool) -> Iterator[str]:
    """Yield ``source``'s text as it arrives, writing it to ``sink``: everything when
    ``echo_all``, else the progress characters of pytest -q until its first other line."""
    progress = True
    line = ""
    while chunk := os.read(source.fileno(), 4096):
        text = chunk.decode("utf-8", "replace")
        yield text
        if echo_all:
            sink.write(text)
            sink.flush()
            continue
        shown = []
        for char in text:
            if not progress:
                break
            if char == "\n":
                if line:
                    shown.append(char)
                line = ""
                continue
            if not line and char not in _PROGRESS_CHARS:
                progress = False
                break
            line += char
            shown.append(char)
        if shown:
            sink.write("".join(shown))
            sink.flush()


def _usage_error(output: str) -> UsageError:
    """pytest's usage error, blamed on the option it names."""
    message = next(
        (line.removeprefix("ERROR: ") for line in output.splitlines() if "ERROR" in line),
        output.strip().splitlines()[-1] if output.strip() else "pytest refused the options",
    )
    for option in ("--req", "--adapter", "--hypothesis-seed", "--hypothesis-profile"):
        if message.startswith(f"{option} ") or f"argument {option}" in message:
            return UsageError(option, message.removeprefix(f"{option} ").strip())
    return UsageError("conformance", message)


def _last_error(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    found = [line for line in lines if "Error" in line or "ERROR" in line]
    return (found or lines or ["no output"])[-1].strip()


def _report_path(args: argparse.Namespace) -> Path:
    path: Path = args.report or REPORTS / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', args.adapter)}.json"
    if args.req:  # never replace a full report with a filtered one
        from routespec.conformance.report import filtered_path

        return filtered_path(path, args.req)
    return path


def _stamp(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _check_adapter(spec: str) -> None:
    """Refuse a shipped adapter's name that names no module, before pytest starts. A
    module:attr is left to the suite: pytest's ``python -m`` finds modules in the current
    directory, which this command's interpreter does not search."""
    if ":" in spec:
        return
    module = f"{ADAPTERS_PACKAGE}.{spec.replace('-', '_')}"
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise UsageError(
            "--adapter", f"no shipped adapter {spec}; see --list-adapters, or give module:attr"
        )


def _check_req(req: str | None) -> None:
    if req is None:
        return
    ids = [i.strip() for i in req.split(",")]
    if not all(ids):
        raise UsageError("--req", f"expected comma-separated requirement IDs, got {req!r}")
    from routespec.conformance.registry import load_requirements

    known = load_requirements()
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise UsageError("--req", f"no requirement has the ID {', '.join(unknown)}")


def shipped_adapters() -> list[tuple[str, str]]:
    """Each adapter module under routespec.adapters (one that defines or imports ``ADAPTER``)
    as (short name for --adapter, first paragraph of its docstring), without importing it."""
    package = importlib.util.find_spec(ADAPTERS_PACKAGE)
    if package is None or not package.submodule_search_locations:
        return []
    found: dict[str, str] = {}
    for info in pkgutil.walk_packages(package.submodule_search_locations, ADAPTERS_PACKAGE + "."):
        if any(info.name.startswith(f"{adapter}.") for adapter in found):
            continue  # a part of an adapter package, not an adapter of its own
        spec = importlib.util.find_spec(info.name)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
        if _defines_adapter(tree):
            found[info.name] = _description(ast.get_docstring(tree) or "")
    listed = [
        (module.removeprefix(ADAPTERS_PACKAGE + ".").replace("_", "-"), description)
        for module, description in found.items()
    ]
    return sorted(listed, key=lambda entry: (entry[0].count("."), entry[0]))


def _defines_adapter(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(_is_name(t, "ADAPTER") for t in node.targets):
            return True
        if isinstance(node, ast.AnnAssign) and _is_name(node.target, "ADAPTER"):
            return True
        if isinstance(node, ast.ImportFrom) and any(
            (alias.asname or alias.name) == "ADAPTER" for alias in node.names
        ):
            return True
    return False


def _is_name(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _description(docstring: str) -> str:
    """The docstring's first paragraph on one line, without a leading ``Adapter ``name``:``."""
    first = " ".join(docstring.split("\n\n")[0].split())
    first = re.sub(r"^Adapter ``[^`]+``:\s*", "", first)
    return first.replace("``", "`")
