"""``routespec conformance``: run the suite (``pytest conformance/``) against an adapter and
print a short summary from its report."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from routespec.deploy.cli.usage import UsageError

SUITE = Path("conformance")
SHOWN_RESULTS = ("FAIL", "XFAIL")


def run_conformance(args: argparse.Namespace) -> int:
    if not (SUITE / "plugin.py").is_file():
        raise UsageError("--adapter", "run from a routespec checkout: no conformance/ here")
    report = Path(args.report or f"reports/{re.sub(r'[^A-Za-z0-9_.-]', '_', args.adapter)}.json")
    report.unlink(missing_ok=True)
    command = [sys.executable, "-m", "pytest", str(SUITE), "--adapter", args.adapter]
    command += ["-q", "-p", "no:cacheprovider", "--conformance-report", str(report)]
    command += ["--hypothesis-profile", args.hypothesis_profile]
    if args.req:
        command += ["--req", args.req]
    done = subprocess.run(command, capture_output=not args.verbose, text=True, check=False)
    if not report.is_file():  # pytest stopped before the suite ran: show why
        output = (done.stdout or "") + (done.stderr or "")
        reason = next(
            (line for line in reversed(output.splitlines()) if "error" in line.lower()),
            f"pytest exited {done.returncode}",
        )
        raise UsageError("--adapter", reason.strip().removeprefix("ERROR: "))
    print(summary(json.loads(report.read_text(encoding="utf-8")), report))
    return done.returncode


def summary(document: dict[str, object], report: Path) -> str:
    info, counts, rows = document["run_info"], document["summary"], document["requirements"]
    assert isinstance(info, dict)
    assert isinstance(counts, dict)
    assert isinstance(rows, list)
    lines = [
        f"conformance of adapter {info['adapter']!r} ({info['duration_s']} s): "
        f"{len(rows)} requirements, "
        + ", ".join(f"{result} {count}" for result, count in counts.items() if count)
    ]
    for row in rows:
        if row["result"] in SHOWN_RESULTS:
            detail = next((c["detail"] for c in row["checks"] if c["detail"]), "")
            lines.append(f"  {row['result']:5} {row['id']}  {detail[:100]}")
    lines.append(f"report: {report} and {report.with_suffix('.md')}")
    return "\n".join(lines)
