"""Deprecated alias of :mod:`routespec.testing.target`, kept for one release so that adapters
written against routespec 0.1 keep importing; new code imports ``routespec.testing.target``."""

import warnings

from routespec.testing.target import *  # noqa: F403

warnings.warn(
    "routespec.target moved to routespec.testing.target; the alias goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)
