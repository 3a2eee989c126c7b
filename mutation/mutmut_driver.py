"""Driving mutmut 3 (pinned: 3.8.1) in a stage: generate the mutants, run some, read results.

mutmut keeps each source file's verdicts in ``mutants/<file>.meta`` (JSON: exit code and
seconds per mutant name); those files are what this module reads.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs

# Generation only: the first step of ``mutmut run`` (mutmut has no command for it alone), so
# that mutant names can be listed and sampled before any test runs.
_GENERATE = """
import os, sys
from mutmut.__main__ import copy_also_copy_files, copy_src_dir, create_mutants
os.makedirs("mutants", exist_ok=True)
copy_src_dir()
copy_also_copy_files()
stats = create_mutants(int(sys.argv[1]))
print(f"{stats.mutated} files mutated, {stats.ignored} copied, {stats.unmodified} unchanged")
"""


TIMEOUT_MULTIPLIER = 5.0  # a mutant times out after this times (its checks' seconds + 1)
# Wall seconds one check may take under a mutant (pytest-timeout; the slowest check takes
# under 4 s unmutated). mutmut's limit above is per mutant, several times the seconds of every
# check reaching the function: a hung watcher held a child for 2.5 minutes.
CHECK_SECONDS = 30


@attrs.frozen
class Verdict:
    name: str
    module: str  # path under reference/routespec, such as routing/selection.py
    status: str  # mutmut's words: killed, survived, timeout, suspicious, no tests, ...
    seconds: float | None
    function_hash: str  # mutmut's hash of the mutated function's source


def mutmut_command() -> list[str]:
    beside = Path(sys.executable).parent / "mutmut"
    found = str(beside) if beside.exists() else shutil.which("mutmut")
    if found is None:
        raise SystemExit("mutmut is not installed: pip install 'mutmut==3.8.1'")
    return [*without_mode_override(), found]


ROOT_ONLY_CAPABILITIES = "-dac_override,-dac_read_search,-net_bind_service"


def without_mode_override() -> list[str]:
    """A prefix that runs a command as root without the capabilities an ordinary user lacks:
    reading and listing files whatever their mode (checks of an unreadable record or directory,
    DSC-011 and DSC-014, skip where modes do not bind, so as plain root their mutants would
    survive) and binding ports under 1024 (a listener on a fixed low port works as root)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return []
    caps = ROOT_ONLY_CAPABILITIES
    return ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", "--"]


def environment(stage: Path) -> dict[str, str]:
    """Processes a check starts (reference-tcp's drill workers) import the mutated copy too."""
    env = dict(os.environ)
    mutated = str((stage / "mutants" / "src").resolve())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [mutated, env.get("PYTHONPATH")]))
    env.setdefault("NO_COLOR", "1")
    return env


def generate(stage: Path, children: int) -> None:
    subprocess.run(
        [sys.executable, "-c", _GENERATE, str(children)],
        cwd=stage,
        env=environment(stage),
        check=True,
        stdout=subprocess.DEVNULL,
    )


def seed_from(stage: Path, other: Path) -> None:
    """Start ``stage``'s mutants from ``other``'s (same sources, so the same mutants), with
    no verdicts: generation is the slowest fixed cost of a lane."""
    if (stage / "mutants" / "src").exists() or not (other / "mutants" / "src").exists():
        return
    shutil.copytree(
        other / "mutants" / "src", stage / "mutants" / "src", copy_function=shutil.copy2
    )
    for meta in (stage / "mutants" / "src").rglob("*.py.meta"):
        data = json.loads(meta.read_text())
        data["exit_code_by_key"] = dict.fromkeys(data["exit_code_by_key"])
        data["durations_by_key"] = {}
        data["estimated_durations_by_key"] = {}
        meta.write_text(json.dumps(data, indent=4))


def run(stage: Path, names: list[str], children: int, log: Path) -> int:
    """``mutmut run`` on ``names`` (mutant names or globs); mutmut's output goes to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        done = subprocess.run(
            [*mutmut_command(), "run", "--max-children", str(children), *names],
            cwd=stage,
            env=environment(stage),
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    return done.returncode


def meta_files(stage: Path) -> Iterator[tuple[str, Path]]:
    """Each mutated file's ``.meta`` in the stage, with its module (routing/selection.py)."""
    root = stage / "mutants" / "src" / "routespec"
    for meta in sorted(root.rglob("*.py.meta")):
        yield meta.relative_to(root).with_suffix("").as_posix(), meta


def verdicts(stage: Path) -> dict[str, Verdict]:
    """Every mutant of the stage by name, with its last verdict (``not checked`` if none)."""
    # mutmut's own words for its exit codes; imported here so the report needs no mutmut
    from mutmut.stats import status_by_exit_code
    from mutmut.utils.format_utils import mangled_name_from_mutant_name

    found: dict[str, Verdict] = {}
    for module, meta in meta_files(stage):
        data = json.loads(meta.read_text())
        durations = data.get("durations_by_key", {})
        hashes = data.get("hash_by_function_name", {})
        for name, code in data["exit_code_by_key"].items():
            function = mangled_name_from_mutant_name(name).rpartition(".")[2]
            status = status_by_exit_code[code]
            found[name] = Verdict(
                name, module, status, durations.get(name), hashes.get(function, "")
            )
    return found


# The mutants' diffs as ``mutmut show`` prints them, for many mutants in one process (a
# ``mutmut show`` per mutant costs a second of start-up each; a full run has thousands).
_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
found = {}
for name, path in json.load(sys.stdin):
    found[name] = get_diff_for_mutant(name, path=path)
json.dump(found, sys.stdout)
"""


def diffs(stage: Path, mutants: Mapping[str, str]) -> dict[str, str]:
    """Each mutant's change (a unified diff of its function), by name; ``mutants`` maps a
    name to its module (a path under reference/routespec, as ``Verdict.module``)."""
    if not mutants:
        return {}
    pairs = [[name, f"src/routespec/{module}"] for name, module in mutants.items()]
    shown = subprocess.run(
        [sys.executable, "-c", _DIFFS],
        cwd=stage,
        env=environment(stage),
        input=json.dumps(pairs),
        capture_output=True,
        text=True,
        check=True,
    )
    found: dict[str, str] = json.loads(shown.stdout)
    return {
        name: "\n".join(line for line in text.splitlines() if line.startswith(("-", "+", "@", " ")))
        for name, text in found.items()
    }
