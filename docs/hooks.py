"""MkDocs hook: publish the spec with links to its checks and its reference code.

- ``spec/*.md`` stays where it is (``spec/`` at the repository root, outside ``docs_dir``);
  each page is added to the site as a generated file, and under every requirement block the
  hook adds a line "Checked by: … · Implemented in: …" that links to the checks citing the
  requirement with ``@covers`` and to the reference lines naming its ID. The spec files
  themselves are not changed, so the registry keeps parsing them as they are.
- ``spec/requirements.md``, the requirement index, is built from the project's own registry
  (``routespec.conformance.registry``), the same code the conformance suite uses.
- ``source/…`` holds one rendered page per conformance check module and per reference source
  file, with an anchor on every line (``#L-42``), so the links above work offline. These
  pages are not in the nav and not in the search index.
- ``seed003.md`` is the upstream suite's coverage table, rendered by
  ``routespec.conformance.seed_map``.
"""

from __future__ import annotations

import ast
import importlib
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.livereload import LiveReloadServer
from mkdocs.structure.files import File, Files, InclusionLevel
from mkdocs.structure.pages import Page
from pygments import highlight  # type: ignore[import-untyped]
from pygments.formatters import HtmlFormatter  # type: ignore[import-untyped]
from pygments.lexers import PythonLexer  # type: ignore[import-untyped]

if TYPE_CHECKING:
    from routespec.conformance.registry import Requirement

ROOT = Path(__file__).resolve().parent.parent
SPEC_DIR = ROOT / "spec"
SPEC_PREFIX = "spec/"
INDEX_URI = SPEC_PREFIX + "requirements.md"
SEED_URI = "seed003.md"
SOURCE_PREFIX = "source/"
CSS_URI = "assets/routespec.css"
CHECKS_PREFIX = "conformance/"  # how the registry names check modules
CODE_PREFIX = "reference/routespec/"  # how the registry names reference files
LINE_ANCHOR = "L"  # a source page's line 42 is #L-42
NONE = "—"
NOT_IN_NAV = InclusionLevel.NOT_IN_NAV  # the source pages: reached by links, not by the nav
MAX_ALSO = 3  # places shown where a state machine asserts a requirement
CODE_PLACEHOLDER = "<!-- routespec: source code -->"

_AREA = re.compile(r"^(?P<area>[A-Z]{2,4})-\d{3}$")
_AREA_CODE = re.compile(r"`(?P<area>[A-Z]{2,4})`")
_PAGE_TITLE = re.compile(r"^# (?P<title>.+?)(?: \(`[A-Z]{2,4}`(?:, `[A-Z]{2,4}`)*\))?\s*$", re.M)
_LINENO = re.compile(r'<span class="normal"> *(\d+)</span>')

CSS = """\
.md-typeset .rs-links {
  font-size: .7rem;
  color: var(--md-default-fg-color--light);
  border-left: .15rem solid var(--md-default-fg-color--lightest);
  padding-left: .6rem;
}
.md-typeset .rs-meta { color: var(--md-default-fg-color--light); }
.md-typeset .rs-source .linenos a { color: inherit; }
.md-typeset .rs-source [id^="L-"] { scroll-margin-top: 4.8rem; }
.md-typeset .rs-source [id^="L-"]:target {
  display: inline-block;
  width: 100%;
  background-color: var(--md-code-hl-color);
}
"""


def _conformance(module: str) -> ModuleType:
    """``routespec.conformance.<module>`` (the docs build runs with routespec installed)."""
    return importlib.import_module(f"routespec.conformance.{module}")


# --- what links to what ---


@dataclass(frozen=True)
class Place:
    """One line of a source file, named as the registry names it (``reference/routespec/…``)."""

    path: str
    line: int

    @property
    def label(self) -> str:
        return f"{self.path.removeprefix(CODE_PREFIX)}:{self.line}"


@dataclass(frozen=True)
class Check:
    """A check function (or class) and the requirement IDs its ``@covers`` cites."""

    path: str  # "conformance/test_errors.py"
    name: str
    line: int  # where the check starts: its first decorator
    ids: tuple[str, ...]
    # For a check whose own body does not name a covered ID (a state machine's test function):
    # the lines of its module, outside any check, that do — the rule or invariant asserting it.
    also: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def node_id(self) -> str:
        return f"{self.path}::{self.name}"

    @property
    def label(self) -> str:
        """The function name as words: ``test_a_type_is_read`` reads "a type is read"."""
        return self.name.removeprefix("test_").removeprefix("Test").replace("_", " ").strip()


@dataclass
class Site:
    requirements: Mapping[str, Requirement]
    checks: list[Check]
    sources: dict[str, Path]  # registry path -> file: one rendered page each
    checks_by_id: dict[str, list[Check]] = field(default_factory=dict)
    code_by_id: dict[str, list[Place]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for check in self.checks:
            for rid in check.ids:
                self.checks_by_id.setdefault(rid, []).append(check)


def collect() -> Site:
    registry = _conformance("registry")
    id_anywhere = re.compile(rf"\b{registry.ID_PATTERN}\b")
    sources: dict[str, Path] = {}
    for module in sorted(Path(registry.CONFORMANCE_DIR).glob("test_*.py")):
        sources[CHECKS_PREFIX + module.name] = module
    reference = Path(registry.REFERENCE_DIR)
    for source in sorted(reference.rglob("*.py")):
        relative = source.relative_to(reference)
        if relative.parts[0] not in registry.KIT_PACKAGES:
            sources[CODE_PREFIX + relative.as_posix()] = source

    citations: dict[str, dict[str, tuple[str, ...]]] = {}
    for citation in registry.scan_checks():
        path, _, name = citation.check.partition("::")
        citations.setdefault(path, {})[name] = tuple(citation.ids)
    checks: list[Check] = []
    for path, cited in sorted(citations.items()):
        checks += _checks_of(sources[path], path, cited, id_anywhere)

    site = Site(registry.load_requirements(), checks, sources)
    for rid, places in registry.scan_implementations().items():
        for place in places:
            path, _, line = place.rpartition(":")
            site.code_by_id.setdefault(rid, []).append(Place(path, int(line)))
    return site


def _checks_of(
    module: Path, path: str, cited: Mapping[str, tuple[str, ...]], id_anywhere: re.Pattern[str]
) -> list[Check]:
    """Where each cited check of one module starts, and where the module asserts its IDs."""
    text = module.read_text(encoding="utf-8")
    nodes: dict[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef] = {}
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        if node.name in cited and node.decorator_list:
            nodes.setdefault(node.name, node)
    spans = [(_start(node), node.end_lineno or node.lineno) for node in nodes.values()]
    mentions: dict[str, list[int]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        for rid in id_anywhere.findall(line):
            mentions.setdefault(rid, []).append(number)

    checks = []
    for name, ids in cited.items():
        node = nodes[name]
        body = range(node.body[0].lineno, (node.end_lineno or node.lineno) + 1)
        also = {
            rid: tuple(
                n
                for n in mentions.get(rid, [])
                if not any(start <= n <= end for start, end in spans)
            )[:MAX_ALSO]
            for rid in ids
            if not any(n in body for n in mentions.get(rid, []))
        }
        checks.append(Check(path, name, _start(node), ids, {k: v for k, v in also.items() if v}))
    return sorted(checks, key=lambda c: c.line)


def _start(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> int:
    return min([node.lineno, *(d.lineno for d in node.decorator_list)])


def source_uri(path: str) -> str:
    """The rendered page of a source file: ``source/conformance/test_errors.py.md``."""
    return f"{SOURCE_PREFIX}{path}.md"


def _relative(target: str, page_uri: str) -> str:
    return posixpath.relpath(target, posixpath.dirname(page_uri) or ".")


# --- the MkDocs events ---

_site: Site | None = None


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    if CSS_URI not in config.extra_css:
        config.extra_css.append(CSS_URI)
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    global _site
    _site = site = collect()
    for page in sorted(SPEC_DIR.glob("*.md")):
        _add(files, File.generated(config, SPEC_PREFIX + page.name, abs_src_path=str(page)))
    _add(files, File.generated(config, INDEX_URI, content=requirement_index(site)))
    _add(files, File.generated(config, SEED_URI, content=_conformance("seed_map").page()))
    for path in site.sources:
        content = source_page(site, path)
        uri = source_uri(path)
        _add(files, File.generated(config, uri, content=content, inclusion=NOT_IN_NAV))
    _add(files, File.generated(config, CSS_URI, content=CSS))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    uri = page.file.src_uri
    if _site is None or not uri.startswith(SPEC_PREFIX) or uri == INDEX_URI:
        return markdown
    return annotate_spec_page(_site, markdown, uri)


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if _site is None or not page.file.src_uri.startswith(SOURCE_PREFIX):
        return html
    return fill_source_page(_site, html, page)


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


# --- links under each requirement block ---


def annotate_spec_page(site: Site, markdown: str, page_uri: str) -> str:
    """Add the links line at the end of each requirement block (before the next heading)."""
    heading = re.compile(r"^### (?P<id>[A-Z]{2,4}-\d{3}) · ")
    out: list[str] = []
    current: str | None = None
    in_fence = False

    def close() -> None:
        if current is not None and current in site.requirements:
            while out and not out[-1].strip():
                out.pop()
            out.extend(["", links_line(site, current, page_uri), ""])

    for line in markdown.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if not in_fence and line.startswith("#"):
            close()
            match = heading.match(line)
            current = match["id"] if match else None
        out.append(line)
    close()
    return "\n".join(out) + "\n"


def links_line(site: Site, rid: str, page_uri: str) -> str:
    requirement = site.requirements[rid]
    checks = site.checks_by_id.get(rid, [])
    if requirement.status == "retired":
        checked = "retired, not checked"
    else:
        checked = ", ".join(_check_link(site, c, rid, page_uri) for c in checks) or "no check yet"
    code = _code_links(site, site.code_by_id.get(rid, []), page_uri) or "no reference line names it"
    return f"**Checked by:** {checked} · **Implemented in:** {code}\n{{: .rs-links }}"


def _check_link(site: Site, check: Check, rid: str, page_uri: str) -> str:
    if check.path not in site.sources:
        return f"`{check.node_id}`"
    target = _relative(source_uri(check.path), page_uri)
    link = f'[{check.label}]({target}#{LINE_ANCHOR}-{check.line} "{check.node_id}")'
    also = check.also.get(rid, ())
    if also:
        lines = ", ".join(f"[{n}]({target}#{LINE_ANCHOR}-{n})" for n in also)
        link += f" (see line{'s' if len(also) > 1 else ''} {lines})"
    return link


def _code_links(site: Site, places: Sequence[Place], page_uri: str) -> str:
    return ", ".join(_code_link(site, place, page_uri) for place in places)


def _code_link(site: Site, place: Place, page_uri: str) -> str:
    if place.path not in site.sources:
        return place.label
    target = _relative(source_uri(place.path), page_uri)
    return f"[{place.label}]({target}#{LINE_ANCHOR}-{place.line})"


# --- the rendered source pages ---


def source_page(site: Site, path: str) -> str:
    uri = source_uri(path)
    index = _relative(INDEX_URI, uri)
    front = ["---", "search:", "  exclude: true", "hide:", "  - toc", "---"]
    lines = [*front, "", f"# {path}", ""]
    if path.startswith(CHECKS_PREFIX):
        checks = [c for c in site.checks if c.path == path]
        lines += [
            f"The conformance checks in this module and the requirements each cites with "
            f"`@covers` (see the [requirement index]({index})):",
            "",
        ]
        for check in checks:
            ids = ", ".join(_spec_link(site, rid, uri) for rid in check.ids)
            lines.append(f"- [{check.label}](#{LINE_ANCHOR}-{check.line}) · {ids}")
    else:
        named = {
            rid: [p.line for p in places if p.path == path]
            for rid, places in sorted(site.code_by_id.items())
        }
        named = {rid: numbers for rid, numbers in named.items() if numbers}
        if named:
            lines += [f"Requirements this file names (see the [requirement index]({index})):", ""]
            for rid, numbers in named.items():
                at = ", ".join(f"[{n}](#{LINE_ANCHOR}-{n})" for n in numbers)
                title = site.requirements[rid].title if rid in site.requirements else ""
                lines.append(f"- {_spec_link(site, rid, uri)} {_cell(title)} · line {at}")
        else:
            lines.append(f"This file names no requirement (see the [requirement index]({index})).")
    lines += ["", CODE_PLACEHOLDER, ""]
    return "\n".join(lines)


def fill_source_page(site: Site, html: str, page: Page) -> str:
    """Put the highlighted code in place of the placeholder, and declare its line anchors.

    The code goes in after Markdown has run: a few thousand lines of raw HTML would otherwise
    triple the build's time in Markdown's and MkDocs' HTML parsers. MkDocs validates anchor
    links only after every page is rendered, so the anchors declared here count.
    """
    path = page.file.src_uri.removeprefix(SOURCE_PREFIX).removesuffix(".md")
    code = site.sources[path].read_text(encoding="utf-8")
    if page.present_anchor_ids is not None:
        count = len(code.splitlines())
        page.present_anchor_ids |= {f"{LINE_ANCHOR}-{n}" for n in range(1, count + 1)}
    return html.replace(CODE_PLACEHOLDER, _highlighted(code), 1)


def _highlighted(code: str) -> str:
    """Python as HTML, every line a ``#L-n`` anchor and every line number a link to it."""
    formatter = HtmlFormatter(linenos="table", linespans=LINE_ANCHOR, wrapcode=True)
    rendered: str = highlight(code, PythonLexer(stripnl=False), formatter)
    numbers, _, rest = rendered.partition('<td class="code">')
    numbers = _LINENO.sub(
        lambda m: f'<span class="normal"><a href="#{LINE_ANCHOR}-{m[1]}">{m[1]}</a></span>', numbers
    )
    return f'<div class="rs-source">{numbers}<td class="code">{rest}</div>'


def _spec_link(site: Site, rid: str, page_uri: str) -> str:
    requirement = site.requirements.get(rid)
    if requirement is None:
        return f"`{rid}` (unknown)"
    return f"[{rid}]({_relative(SPEC_PREFIX + requirement.page, page_uri)}#{rid})"


# --- the requirement index ---


def requirement_index(site: Site | None = None) -> str:
    site = site or collect()
    requirements = site.requirements
    by_area: dict[str, list[Requirement]] = {}
    for rid in sorted(requirements):
        by_area.setdefault(_area(rid), []).append(requirements[rid])

    lines = [
        "# Requirement index",
        "",
        "Generated from the spec pages at build time: every requirement with its level, the",
        "conformance checks that cite it with `@covers` and the reference code that names its",
        "ID. Check and code links open the source at that line; the same links follow each",
        "requirement on its spec page.",
        "",
        _summary(site),
        "",
    ]
    for area in _area_order(by_area):
        members = by_area[area]
        lines += [f"## {area} · {_area_title(members[0].page)}", ""]
        lines += [_index_entry(site, r) for r in members]
        lines.append("")

    lines += ["## Checks", ""]
    if not site.checks:
        lines += ["No check cites a requirement yet.", ""]
    for path in sorted({c.path for c in site.checks}):
        page = _relative(source_uri(path), INDEX_URI)
        lines += [f"### {path.removeprefix(CHECKS_PREFIX)}", "", f"Source: [{path}]({page})", ""]
        for check in (c for c in site.checks if c.path == path):
            ids = ", ".join(_spec_link(site, rid, INDEX_URI) for rid in check.ids)
            link = f"{page}#{LINE_ANCHOR}-{check.line}"
            lines.append(f'- [{check.label}]({link} "{check.node_id}") · {ids}')
        lines += ["", ""]
    return "\n".join(lines)


def _index_entry(site: Site, requirement: Requirement) -> str:
    rid = requirement.id
    checks = site.checks_by_id.get(rid, [])
    count = f"{len(checks)} check{'s' if len(checks) != 1 else ''}"
    check_links = (
        ", ".join(_check_link(site, c, rid, INDEX_URI) for c in checks)
        if requirement.status != "retired"
        else "retired, not checked"
    )
    code = _code_links(site, site.code_by_id.get(rid, []), INDEX_URI) or NONE
    # Dynamo's agreement is the default; a divergence is named (spec/conventions.md)
    version = _conformance("registry").DYNAMO_VERSION
    dynamo = f" · Dynamo {version}: {requirement.dynamo}" if requirement.dynamo else ""
    return (
        f"- **[{rid}]({requirement.page}#{rid})** {_cell(requirement.title)}"
        f' <span class="rs-meta">· {_level(requirement.level, requirement.status)}'
        f"{dynamo}</span><br>"
        f"{count}: {check_links or NONE}<br>"
        f"code: {code}"
    )


def _summary(site: Site) -> str:
    requirements = site.requirements
    levels = [r.level for r in requirements.values()]
    unchecked = sorted(
        rid
        for rid, r in requirements.items()
        if r.status != "retired" and rid not in site.checks_by_id
    )
    text = (
        f"{len(requirements)} requirements ({levels.count('MUST')} MUST, "
        f"{levels.count('SHOULD')} SHOULD); {len(requirements) - len(unchecked)} cited by a "
        f"check"
    )
    text += f", {len(unchecked)} not yet." if unchecked else "."
    modules = len({c.path for c in site.checks})
    return text + f" {len(site.checks)} checks in {modules} modules."


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
    """One line."""
    return " ".join(text.split())
