"""MkDocs hook: publish spec/*.md under ``spec/`` and generate ``spec/requirements.md`` and
``seed003.md``.

The spec stays where it is (``spec/`` at the repository root, outside ``docs_dir``); this hook
adds each page to the site as a generated file, and builds the requirement index from the
project's own registry (``routespec.conformance.registry``), the same code the conformance
suite uses. ``seed003.md`` is the upstream suite's coverage table, rendered by
``routespec.conformance.seed_map``.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.livereload import LiveReloadServer
from mkdocs.structure.files import File, Files

if TYPE_CHECKING:
    from routespec.conformance.registry import CheckCitation, Requirement

ROOT = Path(__file__).resolve().parent.parent
SPEC_DIR = ROOT / "spec"
SPEC_PREFIX = "spec/"
INDEX_URI = SPEC_PREFIX + "requirements.md"
SEED_URI = "seed003.md"
NONE = "—"

_AREA = re.compile(r"^(?P<area>[A-Z]{2,4})-\d{3}$")
_AREA_CODE = re.compile(r"`(?P<area>[A-Z]{2,4})`")
_PAGE_TITLE = re.compile(r"^# (?P<title>.+?)(?: \(`[A-Z]{2,4}`(?:, `[A-Z]{2,4}`)*\))?\s*$", re.M)


def _conformance(module: str) -> ModuleType:
    """``routespec.conformance.<module>`` (the docs build runs with routespec installed)."""
    return importlib.import_module(f"routespec.conformance.{module}")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for page in sorted(SPEC_DIR.glob("*.md")):
        _add(files, File.generated(config, SPEC_PREFIX + page.name, abs_src_path=str(page)))
    _add(files, File.generated(config, INDEX_URI, content=requirement_index()))
    _add(files, File.generated(config, SEED_URI, content=_conformance("seed_map").page()))
    return files


def on_serve(
    server: LiveReloadServer, config: MkDocsConfig, builder: Callable[..., Any]
) -> LiveReloadServer:
    """Rebuild when the spec, the checks or the reference code change."""
    for watched in (SPEC_DIR, ROOT / "conformance", ROOT / "reference" / "routespec"):
        server.watch(str(watched))
    return server


def _add(files: Files, file: File) -> None:
    existing = files.get_file_from_path(file.src_uri)
    if existing is not None:
        files.remove(existing)
    files.append(file)


# --- the requirement index ---


def requirement_index() -> str:
    registry = _conformance("registry")
    requirements: Mapping[str, Requirement] = registry.load_requirements()
    citations: list[CheckCitation] = registry.scan_checks()
    implementations: Mapping[str, list[str]] = registry.scan_implementations()

    checks_by_id: dict[str, list[str]] = {}
    for citation in citations:
        for rid in citation.ids:
            checks_by_id.setdefault(rid, []).append(citation.check)

    by_area: dict[str, list[Requirement]] = {}
    for rid in sorted(requirements):
        by_area.setdefault(_area(rid), []).append(requirements[rid])

    lines = [
        "# Requirement index",
        "",
        "Generated from the spec pages at build time: every requirement ID, where the reference",
        "code names it (`reference/routespec/…:line`) and which conformance checks cite it with",
        "`@covers`. A requirement that no check cites yet shows —.",
        "",
        _summary(requirements, checks_by_id),
        "",
    ]
    for area in _area_order(by_area):
        members = by_area[area]
        lines += [
            f"## {area} · {_area_title(members[0].page)}",
            "",
            "| ID | level | title | statement | reference code | checks |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for requirement in members:
            lines.append(
                "| "
                + " | ".join(
                    [
                        f"[{requirement.id}]({requirement.page}#{requirement.id})",
                        _level(requirement.level, requirement.status),
                        _cell(requirement.title),
                        _cell(requirement.statement),
                        _codes(implementations.get(requirement.id, [])),
                        _codes(checks_by_id.get(requirement.id, [])),
                    ]
                )
                + " |"
            )
        lines.append("")

    lines += ["## Checks", ""]
    if not citations:
        lines += ["No check cites a requirement yet.", ""]
    else:
        lines += ["| check | requirements |", "| --- | --- |"]
        for citation in sorted(citations, key=lambda c: c.check):
            links = ", ".join(_id_link(rid, requirements) for rid in citation.ids)
            lines.append(f"| `{_cell(citation.check)}` | {links} |")
        lines.append("")
    return "\n".join(lines)


def _summary(requirements: Mapping[str, Requirement], checks_by_id: Mapping[str, list[str]]) -> str:
    levels = [r.level for r in requirements.values()]
    unchecked = sorted(
        rid for rid, r in requirements.items() if r.status != "retired" and rid not in checks_by_id
    )
    text = (
        f"{len(requirements)} requirements ({levels.count('MUST')} MUST, "
        f"{levels.count('SHOULD')} SHOULD); {len(requirements) - len(unchecked)} cited by a check"
    )
    return text + (f", {len(unchecked)} not yet." if unchecked else ".")


def _area(rid: str) -> str:
    match = _AREA.match(rid)
    return match["area"] if match else rid.split("-")[0]


def _area_order(areas: Iterable[str]) -> list[str]:
    """Areas in the order spec/index.md introduces them; any others after, alphabetically."""
    index = SPEC_DIR / "index.md"
    text = index.read_text(encoding="utf-8") if index.exists() else ""
    known = list(dict.fromkeys(m["area"] for m in _AREA_CODE.finditer(text)))
    present = set(areas)
    return [a for a in known if a in present] + sorted(present - set(known))


def _area_title(page: str) -> str:
    path = SPEC_DIR / page
    match = _PAGE_TITLE.search(path.read_text(encoding="utf-8")) if path.exists() else None
    return match["title"] if match else page.removesuffix(".md")


def _level(level: str, status: str) -> str:
    return level if status == "stable" else f"{level} · {status}"


def _cell(text: str) -> str:
    """Table-cell safe: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _codes(items: Iterable[str]) -> str:
    rendered = [f"`{_cell(item)}`" for item in items]
    return "<br>".join(rendered) if rendered else NONE


def _id_link(rid: str, requirements: Mapping[str, Requirement]) -> str:
    requirement = requirements.get(rid)
    return f"[{rid}]({requirement.page}#{rid})" if requirement else f"`{rid}` (unknown)"
