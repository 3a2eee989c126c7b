"""The part of a target that the real Dynamo client plays: calls, outcomes, settling.

Subclasses provide the workers: ``deliveries()`` (the dispatch log in the suite's request
ids), ``instance_id(worker_id)`` and ``stalled`` (suite request id -> worker holding it and
the items it sent before stalling). Everything the bindings cannot reach raises
``NotImplementedError`` naming the capability the adapter leaves undeclared.
"""

from __future__ import annotations

import contextlib
import itertools
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import attrs

from routespec.adapters.dynamo.driver import ClientDriver
from routespec.testing.target import (
    Call,
    Capability,
    Delivery,
    Direct,
    Generate,
    Outcome,
    Target,
    TargetConfig,
)
from routespec.testing.unsupported import Unsupported

MODES = {"round-robin": "round_robin", "random": "random", "kv": "kv", "direct": "direct_mode"}
SETTLE_LIMIT = 10.0


class DynamoClientTarget(Unsupported):
    """What the bindings cannot reach stays ``Unsupported`` (left out of the capabilities)."""

    def __init__(self, endpoint: str, store: Path) -> None:
        self.driver = ClientDriver(endpoint, store)
        self.stalled: dict[str, tuple[int, int]] = {}
        self._requests = itertools.count(1)

    def deliveries(self) -> Sequence[Delivery]:
        raise NotImplementedError

    def instance_id(self, worker_id: int) -> int:
        raise NotImplementedError

    # router operations

    def submit(
        self, call: Call, metadata: Mapping[str, str] | None = None, guarded: bool = False
    ) -> str:
        request_id = f"req-{next(self._requests)}"
        command: dict[str, object] = {"op": "submit", "id": request_id}
        command["payload"] = {"rid": request_id, "call": repr(call)}
        if metadata:
            command["metadata"] = dict(metadata)  # the control message's, via a Context
        if isinstance(call, Generate):
            command["mode"] = MODES[call.mode]
        elif isinstance(call, Direct):
            if call.payload is not None:
                import pytest

                pytest.skip(
                    "dynamo: a caller's own payload is not passed through the client driver "
                    "yet (its commands are JSON, which holds no set)"
                )
            command["mode"] = "direct"
            command["instance_id"] = self.instance_id(call.worker_id)
        else:
            raise NotImplementedError(f"{call} through Dynamo's Python bindings")
        self.driver.send(command)
        self.driver.wait_for(
            lambda: request_id in self.driver.outcomes or self.is_stalled(request_id),
            f"{request_id} to settle",
            SETTLE_LIMIT,
        )
        if worker_answered(self.driver.outcomes.get(request_id, {})):
            # A worker answered: its report of the delivery may still be on its way.
            self.driver.wait_for(
                lambda: any(d.request_id == request_id for d in self.deliveries()),
                f"the delivery of {request_id}",
                SETTLE_LIMIT,
            )
        return request_id

    def outcome(self, request_id: str) -> Outcome | None:
        return self.driver.outcome(request_id)

    def drop(self, request_id: str) -> None:
        self.driver.send({"op": "drop", "id": request_id})
        self.driver.wait_for(lambda: request_id in self.driver.outcomes, "the drop")

    def dispatch_log(self) -> Sequence[Delivery]:
        return tuple(self.deliveries())

    # settling

    def mark_stalled(self, request_id: str, worker_id: int, sent: int) -> None:
        with self.driver.changed:
            self.stalled[request_id] = (worker_id, sent)
            self.driver.changed.notify_all()

    def unstall(self, worker_id: int) -> None:
        with self.driver.changed:
            for request_id in [r for r, (w, _) in self.stalled.items() if w == worker_id]:
                del self.stalled[request_id]

    def is_stalled(self, request_id: str) -> bool:
        """Held by a Stall script, and the client has read every item sent before it."""
        held = self.stalled.get(request_id)
        return held is not None and self.driver.received.get(request_id, 0) >= held[1]

    def settle(self) -> None:
        """Wait (bounded) until every request that reached a worker has ended or stalls."""
        self.driver.wait_for(
            lambda: all(
                d.request_id in self.driver.outcomes or self.is_stalled(d.request_id)
                for d in self.deliveries()
            ),
            "open requests to settle",
            SETTLE_LIMIT,
        )


PROLOGUE_FAILURE = "Worker generate() failed before response stream"
"""The transport's text for a worker that failed before its stream: the request reached it."""


def worker_answered(ended: Mapping[str, object]) -> bool:
    """The outcome shows that a worker received the request: items, an error item, or the
    failure a worker's prologue carried."""
    error = ended.get("error")
    if ended.get("items") or (error and not ended.get("pre_stream")):
        return True
    return isinstance(error, dict) and PROLOGUE_FAILURE in str(error.get("text", ""))


def with_request_ids(items: tuple[object, ...], ids: Mapping[object, str]) -> tuple[object, ...]:
    """Items carry the worker's view of the request id; show the suite's."""
    return tuple(
        {**item, "request": ids[item["request"]]}
        if isinstance(item, dict) and item.get("request") in ids
        else item
        for item in items
    )


class RuntimeTarget(Target, Protocol):
    """A target this adapter can close, with everything it opened."""

    def close(self) -> None: ...


@attrs.frozen
class DynamoRuntimeAdapter:
    """Opens targets that talk to the real runtime, each in its own discovery directory."""

    name: str
    capabilities: frozenset[Capability]
    target_class: Callable[[Path], RuntimeTarget]
    expected_failures: Mapping[str, str] = attrs.field(factory=dict)

    @contextlib.contextmanager
    def open(self, config: TargetConfig) -> Iterator[Target]:
        with tempfile.TemporaryDirectory(prefix="routespec-dynamo-") as store:
            target = self.target_class(Path(store))
            try:
                yield target
            finally:
                target.close()
