"""Busy-threshold validation by Dynamo 1.6.1's own ``LoadThresholdConfig`` (spec: SET-006)."""

from __future__ import annotations

import json
import subprocess
import sys

import attrs

from routespec.testing.target import LoadThresholds, ObservedError

# A fresh interpreter, so the adapter's process never imports the runtime's extension.
_CONSTRUCT = """
import json, sys
from dynamo._core import LoadThresholdConfig
try:
    LoadThresholdConfig(**json.loads(sys.stdin.read()))
except Exception as error:
    print(json.dumps({"exception": type(error).__name__, "text": str(error)}))
else:
    print("null")
"""

# What the bindings raise for a refused argument: Dynamo's invalid-request class.
_INVALID = frozenset({"ValueError", "TypeError", "OverflowError"})


def check_load_thresholds(thresholds: LoadThresholds) -> ObservedError | None:
    """Construct ``dynamo._core.LoadThresholdConfig`` (what ``RouterConfig`` and ``KvRouter``
    take) with the set fields: None when built, else the refusal as class and text."""
    kwargs = {name: value for name, value in attrs.asdict(thresholds).items() if value is not None}
    done = subprocess.run(
        [sys.executable, "-c", _CONSTRUCT],
        input=json.dumps(kwargs),  # NaN and ±inf travel as JSON's NaN/Infinity
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    refused = json.loads(done.stdout)
    if refused is None:
        return None
    error_class = "InvalidRequest" if refused["exception"] in _INVALID else None
    text = f"{refused['exception']}: {refused['text']}"
    return ObservedError(((None, text),), True, error_class=error_class, types_observed=False)
