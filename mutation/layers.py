"""What is mutated: the reference's specified layers, as paths under reference/routespec."""

from __future__ import annotations

from fnmatch import fnmatch

SPECIFIED = (
    "errors.py",
    "migration.py",
    "discovery/*.py",
    "routing/*.py",
    "transport/*.py",
    "host/*.py",
)
"""Globs relative to reference/routespec: the layers the spec states behaviour for."""

EXCLUDED = ("discovery/etcd_store.py",)
"""Deployment tooling inside a specified folder: tests/ exercise it, the suite does not."""


def is_specified(module: str) -> bool:
    """``module`` is a path relative to reference/routespec, such as ``routing/selection.py``."""
    if any(fnmatch(module, glob) for glob in EXCLUDED):
        return False
    return any(fnmatch(module, glob) for glob in SPECIFIED)
