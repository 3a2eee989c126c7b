"""The requirement registry, derived from the spec's Markdown (the single source of truth),
and the static maps from requirement IDs to checks and to reference code."""

from __future__ import annotations

import ast
import importlib.resources
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs

# Read through the installed package, so a wheel and a checkout give the same registry.
SPEC_DIR = Path(str(importlib.resources.files("routespec.spec")))
CONFORMANCE_DIR = Path(__file__).resolve().parent
REFERENCE_DIR = Path(str(importlib.resources.files("routespec")))
# The kit's parts inside the package (in a wheel) that are not the reference implementation.
KIT_PACKAGES = frozenset({"testing", "conformance", "adapters", "spec"})

ID_PATTERN = r"[A-Z]{2,4}-\d{3}"
_HEADING = re.compile(rf"^### (?P<id>{ID_PATTERN}) · (?P<title>.+?) \{{ #(?P<anchor>\S+) \}}$")
_LEVEL = re.compile(r"^\*\*(?P<level>MUST|SHOULD)\*\* · (?P<status>stable|provisional|retired)$")
_RATIONALE = "*Rationale.*"
# The Dynamo release every rule was checked against, and the optional verdict paragraph a
# block carries where that release does otherwise (spec/conventions.md).
DYNAMO_VERSION = "1.6.1"
DYNAMO_VERDICTS = ("strengthening", "changed", "not reachable")
_DYNAMO = re.compile(r"^\*Dynamo (?P<version>[0-9.]+): (?P<verdict>[a-z ]+)\.\*")
_ID_ANYWHERE = re.compile(rf"\b{ID_PATTERN}\b")


class SpecFormatError(ValueError):
    """A requirement block that does not follow spec/conventions.md."""


@attrs.frozen
class Requirement:
    id: str
    title: str
    level: str
    status: str
    statement: str
    rationale: str
    page: str  # spec page file name, e.g. "dispatch.md"
    dynamo: str | None = None  # a DYNAMO_VERDICTS entry; None: no divergence from Dynamo

    @property
    def checked(self) -> bool:
        return self.status != "retired"


def load_requirements(spec_dir: Path = SPEC_DIR) -> dict[str, Requirement]:
    """Every requirement block of every spec page, by ID; malformed blocks raise."""
    found: dict[str, Requirement] = {}
    for page in sorted(spec_dir.glob("*.md")):
        for requirement in _parse_page(page):
            if requirement.id in found:
                raise SpecFormatError(
                    f"{page.name}: {requirement.id} is already defined in "
                    f"{found[requirement.id].page}"
                )
            found[requirement.id] = requirement
    return found


def _parse_page(page: Path) -> Iterator[Requirement]:
    lines = page.read_text(encoding="utf-8").splitlines()
    in_fence = False
    for number, line in enumerate(lines):
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence or not line.startswith("### "):
            continue
        heading = _HEADING.match(line)
        if heading is None:
            if _ID_ANYWHERE.match(line[4:]):
                raise SpecFormatError(f"{page.name}:{number + 1}: malformed requirement heading")
            continue
        if heading["anchor"] != heading["id"]:
            raise SpecFormatError(f"{page.name}:{number + 1}: anchor must be #{heading['id']}")
        paragraphs = _paragraphs(lines[number + 1 :])
        if len(paragraphs) < 3:
            raise SpecFormatError(f"{page.name}: {heading['id']} needs level, sentence, rationale")
        level = _LEVEL.match(paragraphs[0])
        if level is None:
            raise SpecFormatError(
                f"{page.name}: {heading['id']} level line must be '**MUST|SHOULD** · status'"
            )
        statement, rationale = paragraphs[1], paragraphs[2]
        if not rationale.startswith(_RATIONALE):
            raise SpecFormatError(f"{page.name}: {heading['id']} rationale must start {_RATIONALE}")
        yield Requirement(
            heading["id"],
            heading["title"],
            level["level"],
            level["status"],
            statement,
            rationale.removeprefix(_RATIONALE).strip(),
            page.name,
            _dynamo_verdict(page.name, heading["id"], paragraphs[3:]),
        )


def _dynamo_verdict(page: str, rid: str, paragraphs: list[str]) -> str | None:
    """The block's ``*Dynamo 1.6.1: <verdict>.*`` paragraph, if it has one."""
    for paragraph in paragraphs:
        if not paragraph.startswith("*Dynamo"):
            continue
        found = _DYNAMO.match(paragraph)
        if (
            found is None
            or found["version"] != DYNAMO_VERSION
            or found["verdict"] not in DYNAMO_VERDICTS
        ):
            raise SpecFormatError(
                f"{page}: {rid} Dynamo line must start '*Dynamo {DYNAMO_VERSION}: "
                f"{'|'.join(DYNAMO_VERDICTS)}.*'"
            )
        return found["verdict"]
    return None


def _paragraphs(lines: list[str]) -> list[str]:
    """The paragraphs up to the next heading, each joined into one line."""
    paragraphs: list[str] = []
    current: list[str] = []
    for line in lines:
        if line.startswith("#"):
            break
        if line.strip():
            current.append(line.strip())
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    return paragraphs


@attrs.frozen
class CheckCitation:
    """A check (test function) and the requirement IDs it cites with ``@covers``."""

    check: str  # "conformance/test_x.py::test_name"
    ids: tuple[str, ...]
    deterministic: bool = True
    """Its verdict depends on no random seed: not in a ``*_machine.py`` module (a stateful
    machine), and not a Hypothesis ``@given`` test unless at least one ``@example`` pins it."""


def scan_checks(conformance_dir: Path = CONFORMANCE_DIR) -> list[CheckCitation]:
    """Read ``@covers("ID", ...)`` decorators statically, so docs need not run pytest."""
    citations: list[CheckCitation] = []
    for module in sorted(conformance_dir.glob("test_*.py")):
        tree = ast.parse(module.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            ids = tuple(i for decorator in node.decorator_list for i in _covered_ids(decorator))
            if ids:
                name = f"conformance/{module.name}::{node.name}"
                deterministic = not module.stem.endswith("_machine") and _pinned(node)
                citations.append(CheckCitation(name, ids, deterministic))
    return citations


def _decorator_name(decorator: ast.expr) -> str | None:
    """``given`` for ``@given(...)``, ``@hypothesis.given(...)`` or ``@given``."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(target, ast.Name):
        return target.id
    return target.attr if isinstance(target, ast.Attribute) else None


def _pinned(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> bool:
    """Not a Hypothesis ``@given`` test, or one with at least one ``@example``: a fixed
    input runs on every seed (issue 16: no verdict may depend on a seed alone)."""
    names = {_decorator_name(decorator) for decorator in node.decorator_list}
    return "given" not in names or "example" in names


def _covered_ids(decorator: ast.expr) -> list[str]:
    if not (
        isinstance(decorator, ast.Call)
        and isinstance(decorator.func, ast.Name)
        and decorator.func.id == "covers"
    ):
        return []
    ids = []
    for arg in decorator.args:
        if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
            raise SpecFormatError(f"@covers takes string literals only, got {ast.unparse(arg)}")
        ids.append(arg.value)
    return ids


def scan_implementations(reference_dir: Path = REFERENCE_DIR) -> Mapping[str, list[str]]:
    """Where the reference code names each requirement ID: ``{id: ["path:line", ...]}``."""
    places: dict[str, list[str]] = {}
    for source in sorted(reference_dir.rglob("*.py")):
        relative = source.relative_to(reference_dir)
        if relative.parts[0] in KIT_PACKAGES:
            continue
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            for found in _ID_ANYWHERE.findall(line):
                places.setdefault(found, []).append(
                    f"reference/routespec/{relative.as_posix()}:{number}"
                )
    return places
