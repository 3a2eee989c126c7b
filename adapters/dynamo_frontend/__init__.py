"""Adapter ``dynamo-frontend``: the real Dynamo 1.6.1 routing host and migration over HTTP.

Real Dynamo token workers (``worker_process``, scripted per check) behind the real
``python -m dynamo.frontend`` (``make_engine`` + ``run_input``), everything on 127.0.0.1
with file discovery. See ``target`` for what the suite can control and observe through it,
and ``dynamo_frontend_expectations.toml`` for the divergences found.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs

from routespec.adapters.dynamo.expectations import load_expectations
from routespec.testing.target import Capability, Target, TargetConfig

EXPECTATIONS = Path(__file__).resolve().parent.with_name("dynamo_frontend_expectations.toml")

CAPABILITIES = frozenset(
    {
        Capability.ROUTING_HOST,
        Capability.MIGRATION,
        Capability.SCRIPT_FAILURES,
        Capability.SCRIPT_STALL,
        Capability.REMOVE_WORKER,
        Capability.KILL_WORKER,
        Capability.DIRECT,  # nvext.backend_instance_id on a bare-call request
        Capability.REPORT_DOWN,  # a pinned request the worker fails: ~5 s local inhibition
        Capability.VANISH_WORKER,  # SIGKILL: still discovered for 10-15 s, port closed
        Capability.MARK_OVERLOADED,  # KV models only: Dynamo's busy threshold, a held load
    }
)


@attrs.frozen
class DynamoFrontendAdapter:
    name: str = "dynamo-frontend"
    capabilities: frozenset[Capability] = CAPABILITIES
    expected_failures: Mapping[str, str] = attrs.field(factory=dict)

    @contextlib.contextmanager
    def open(self, config: TargetConfig) -> Iterator[Target]:
        from routespec.adapters.dynamo_frontend.deployment import deployment
        from routespec.adapters.dynamo_frontend.target import FrontendTarget

        shared = deployment()
        shared.recycle()
        target = FrontendTarget(config, shared)
        try:
            yield target
        finally:
            target.close()


def _expectations() -> dict[str, str]:
    return load_expectations(EXPECTATIONS) if EXPECTATIONS.exists() else {}


ADAPTER = DynamoFrontendAdapter(expected_failures=_expectations())
