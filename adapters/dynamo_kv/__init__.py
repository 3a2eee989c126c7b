"""Adapter ``dynamo-kv``: the real Dynamo 1.6.1 ``KvRouter`` (``dynamo._core``) as the host.

Real Dynamo token workers (``dynamo_frontend.worker_process``, scripted per check) behind
real ``KvRouter``s held in one router process (``router_process``), everything on 127.0.0.1
with file discovery. It reaches what the HTTP frontend hides: query-only and booking
selection, bookings, ``free``. See ``target`` for the mapping and
``dynamo_kv_expectations.toml`` for the divergences found.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs

from routespec.adapters.dynamo.expectations import load_expectations
from routespec.testing.target import Capability, Target, TargetConfig

EXPECTATIONS = Path(__file__).resolve().parent.with_name("dynamo_kv_expectations.toml")

CAPABILITIES = frozenset(
    {
        Capability.ROUTING_HOST,
        Capability.SCRIPT_FAILURES,
        Capability.SCRIPT_STALL,
        Capability.REMOVE_WORKER,
        Capability.KILL_WORKER,
        Capability.VANISH_WORKER,  # a SIGKILLed worker stays listed for ~10 s (target.py)
    }
)


@attrs.frozen
class DynamoKvAdapter:
    name: str = "dynamo-kv"
    capabilities: frozenset[Capability] = CAPABILITIES
    expected_failures: Mapping[str, str] = attrs.field(factory=dict)

    @contextlib.contextmanager
    def open(self, config: TargetConfig) -> Iterator[Target]:
        from routespec.adapters.dynamo_frontend.deployment import deployment
        from routespec.adapters.dynamo_kv.router import router
        from routespec.adapters.dynamo_kv.target import KvTarget

        shared = deployment()
        target = KvTarget(config, shared, router(shared.store, shared.root))
        try:
            yield target
        finally:
            target.close()


def _expectations() -> dict[str, str]:
    return load_expectations(EXPECTATIONS) if EXPECTATIONS.exists() else {}


ADAPTER = DynamoKvAdapter(expected_failures=_expectations())
