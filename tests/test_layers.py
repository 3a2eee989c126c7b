"""The spec's layers are the reference's packages, and imports only run downward.

Layer order (errors first): a module may import its own layer and those before it. The
product (every layer) never imports the kit: ``routespec.testing``, ``routespec.conformance``
or ``routespec.adapters``. The caller side of the transport never imports the worker side.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "reference" / "routespec"
LAYERS = ("errors", "discovery", "routing", "transport", "migration", "host", "deploy")
KIT = ("testing", "conformance", "adapters")
KIT_DOOR = "routespec.deploy.cli.conformance"
DOOR_READS = ("routespec.conformance.registry", "routespec.conformance.report")
CALLER_SIDE = ("request_plane", "response_plane", "response_stream", "tcp_dispatch")


def _layer(module: str) -> str:
    """``routespec.routing.selection`` -> ``routing``; the package root is ``errors``' peer."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "root"


def _imports(source: Path) -> list[str]:
    tree = ast.parse(source.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return [name for name in found if name.split(".")[0] == "routespec"]


def _modules() -> list[tuple[str, Path]]:
    return [
        ("routespec." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts), p)
        for p in sorted(PACKAGE.rglob("*.py"))
    ]


PRODUCT = [(name, path) for name, path in _modules() if _layer(name) in LAYERS]


def test_every_product_module_sits_in_a_layer() -> None:
    strays = [
        name
        for name, _ in _modules()
        if _layer(name) not in (*LAYERS, *KIT, "__init__", "__main__", "target")
    ]
    assert not strays, f"modules outside the layer packages: {strays}"


@pytest.mark.parametrize(("module", "path"), PRODUCT, ids=[name for name, _ in PRODUCT])
def test_imports_only_run_downward(module: str, path: Path) -> None:
    rank = LAYERS.index(_layer(module))
    upward = [
        imported
        for imported in _imports(path)
        if _layer(imported) in LAYERS and LAYERS.index(_layer(imported)) > rank
    ]
    assert not upward, f"{module} (layer {LAYERS[rank]}) imports later layers: {upward}"


@pytest.mark.parametrize(("module", "path"), PRODUCT, ids=[name for name, _ in PRODUCT])
def test_the_product_never_imports_the_kit(module: str, path: Path) -> None:
    allowed = DOOR_READS if module == KIT_DOOR else ()
    kit = [
        imported
        for imported in _imports(path)
        if _layer(imported) in KIT and not imported.startswith(allowed)
    ]
    assert not kit, f"{module} imports the test kit: {kit}"


@pytest.mark.parametrize("side", CALLER_SIDE)
def test_the_caller_side_never_imports_the_worker_side(side: str) -> None:
    imported = _imports(PACKAGE / "transport" / f"{side}.py")
    assert not [i for i in imported if "worker_server" in i], f"{side} imports the worker side"


def test_the_package_root_imports_only_product_layers() -> None:
    imported = _imports(PACKAGE / "__init__.py")
    assert all(_layer(i) in LAYERS for i in imported), imported
