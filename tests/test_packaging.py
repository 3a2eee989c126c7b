"""The wheel is the kit: pyproject's package list and data globs cover every folder of it.

setuptools takes an explicit package list (the folders are mapped, not found), so a new
subpackage that is not listed would silently be missing from the wheel. .ci/run builds the
wheel and runs the suite from it; this test names the gap before that.
"""

from __future__ import annotations

import importlib
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
SETUPTOOLS = CONFIG["tool"]["setuptools"]


def _folder(package: str) -> Path:
    """Where setuptools takes ``package`` from, by the longest package-dir prefix."""
    mapping: dict[str, str] = SETUPTOOLS["package-dir"]
    for prefix in sorted(mapping, key=len, reverse=True):
        if prefix and (package == prefix or package.startswith(prefix + ".")):
            rest = package.removeprefix(prefix).lstrip(".")
            return (
                ROOT / mapping[prefix] / Path(*rest.split(".")) if rest else ROOT / mapping[prefix]
            )
    return ROOT / mapping[""] / Path(*package.split("."))


def test_every_package_folder_is_listed() -> None:
    roots = {"routespec": ROOT / "reference" / "routespec"} | {
        package: ROOT / folder for package, folder in SETUPTOOLS["package-dir"].items() if package
    }
    found = set()
    for package, folder in roots.items():
        for init in folder.rglob("__init__.py"):
            relative = init.parent.relative_to(folder)
            found.add(".".join((package, *relative.parts)) if relative.parts else package)
    assert found == set(SETUPTOOLS["packages"])


def test_every_listed_package_exists_where_it_is_mapped() -> None:
    missing = [p for p in SETUPTOOLS["packages"] if not (_folder(p) / "__init__.py").is_file()]
    assert not missing


def test_every_data_file_is_covered_by_a_glob() -> None:
    data: dict[str, list[str]] = SETUPTOOLS["package-data"]
    uncovered = []
    for package in SETUPTOOLS["packages"]:
        folder = _folder(package)
        for path in folder.iterdir():
            shipped = path.is_file() and path.suffix in (".md", ".toml", ".typed")
            if shipped and not any(path.match(glob) for glob in data.get(package, [])):
                uncovered.append(str(path.relative_to(ROOT)))
    assert not uncovered, f"files the wheel would leave out: {uncovered}"


def test_the_pytest_plugin_is_an_entry_point() -> None:
    assert CONFIG["project"]["entry-points"]["pytest11"] == {
        "routespec": "routespec.conformance.plugin"
    }


def test_an_adapter_author_needs_neither_httpx_nor_prometheus() -> None:
    core = " ".join(CONFIG["project"]["dependencies"])
    assert "httpx" not in core
    assert "prometheus" not in core


def test_the_old_target_module_is_a_deprecated_alias() -> None:
    sys.modules.pop("routespec.target", None)
    with pytest.warns(DeprecationWarning, match="routespec.testing.target"):
        old = importlib.import_module("routespec.target")
    from routespec.testing import target

    assert old.Capability is target.Capability
    assert old.Adapter is target.Adapter
