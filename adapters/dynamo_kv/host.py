"""A routing host of the ``dynamo-kv`` target: one real ``KvRouter`` over the host's own
endpoint (see ``target`` for how the spec's host operations map onto its API)."""

from __future__ import annotations

import itertools
import math
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from routespec.adapters.dynamo.driver import observed_error
from routespec.adapters.dynamo_frontend.deployment import WorkerProcess
from routespec.adapters.dynamo_kv.router import EXHAUSTED, RouterError, RouterProcess
from routespec.adapters.dynamo_kv.unreachable import SESSION_PROBE, unreachable
from routespec.testing.target import (
    HostConfig,
    HostRoute,
    HostView,
    ObservedError,
    PlanView,
    SessionView,
)

if TYPE_CHECKING:
    from routespec.adapters.dynamo_kv.target import KvTarget

EXHAUSTED_WAIT = 90.0
"""Seconds a host waits for the user's inotify instances to be freed before it gives up."""
PROBE = (
    "probe: python -c 'import dynamo._core as c; print([m for m in dir(c.KvRouter) if not "
    "m.startswith(\"_\")])' -> ['best_worker', 'dump_events', 'free', 'generate', "
    "'generate_from_request', 'get_overlap_scores', 'get_potential_loads', "
    "'mark_prefill_complete']"
)


def refusal(error: Exception) -> ObservedError:
    """A refusal at construction: a Python ``ValueError`` from the bindings is Dynamo's
    invalid-request class; anything else shows only its text."""
    if isinstance(error, RouterError):
        name, text = error.exception.rsplit(".", 1)[-1], error.text
    else:
        name, text = type(error).__name__, str(error)
    error_class = "InvalidRequest" if name in ("ValueError", "TypeError", "OverflowError") else None
    if error_class is None:
        return observed(error)
    return ObservedError(((None, text),), True, error_class=error_class, types_observed=False)


def observed(error: Exception) -> ObservedError:
    """A refusal of a call, as the class and text Dynamo's bindings show."""
    if isinstance(error, RouterError):
        return observed_error({"exception": error.exception, "text": error.text}, pre_stream=True)
    return observed_error({"exception": type(error).__name__, "text": str(error)}, pre_stream=True)


@attrs.define
class Plan:
    request_id: str
    tokens: tuple[int, ...]
    worker: int  # instance id


class KvHost:
    """A routing host: one real ``KvRouter`` over the host's own endpoint."""

    def __init__(self, target: KvTarget, config: HostConfig, name: str) -> None:
        self.target = target
        self.config = config
        self.name = name
        self.plans: dict[int, Plan] = {}
        self.previews: dict[int, tuple[int, ...]] = {}
        self._plans = itertools.count(1)
        self.baseline = router_counters(target.router)

    @property
    def endpoint(self) -> str:
        return f"{self.name}.backend.generate"

    def serve(self, workers: list[WorkerProcess]) -> None:
        # the card's block size must be valid for register_model; the router's own
        # block size (the setting under test) is passed to KvRouter itself
        command = {
            "op": "serve",
            "endpoint": self.endpoint,
            "model": self.name,
            "block_size": self.config.block_size if self.config.block_size >= 1 else 16,
            "router": None,
        }
        for worker in workers:
            worker.used = True
            worker.send(command)
        self.target.wait_for(
            lambda: all(self.endpoint in w.served or not w.alive() for w in workers)
        )

    def open(self) -> ObservedError | None:
        expect = [w.instance_id for w in self.target.workers.values() if w.alive()]
        self.target.router.hosts_opened += 1
        deadline = time.monotonic() + EXHAUSTED_WAIT
        while True:
            try:
                self.target.router.call(
                    "open",
                    host=self.name,
                    endpoint=self.endpoint,
                    block_size=self.config.block_size,
                    temperature=self.config.temperature,
                    expect=expect,
                )
            except RouterError as error:
                # the machine's inotify limit, shared with other processes, is not Dynamo's
                # answer to the settings: wait for instances to be freed
                if EXHAUSTED in error.text and time.monotonic() < deadline:
                    time.sleep(2.0)
                    continue
                if EXHAUSTED in error.text:
                    raise RuntimeError(f"building a KvRouter: {error.text}") from error
                return refusal(error)
            return None

    def _unsupported_fields(self, route: HostRoute) -> None:
        if route.phase != "aggregated":
            unreachable(
                f"a {route.phase} leg: KvRouter.generate serves one aggregated request; the "
                "phase comes from the registered worker types, not from the request"
            )
        if route.stopped or route.staged_kv:
            unreachable(
                "a caller context stopped before routing (or a staged-KV decode leg): "
                "KvRouter.generate/generate_from_request take no context to stop"
            )
        if route.session is not None:
            unreachable(f"a session id: no KvRouter request field carries one ({SESSION_PROBE})")
        if route.lora is not None:
            unreachable("LoRA requests: not a KvRouter routing input reachable here")
        if route.excluded or route.allowed is not None:
            unreachable("excluded/allowed workers are migration's state, not a KvRouter input")
        if route.required_taints:
            unreachable("routing constraints (taints) are not wired in this adapter yet")
        if route.migration_limit is not None:
            unreachable("migration: the KvRouter makes one attempt (no migration limit)")
        if route.decode_worker_id is not None or route.prefill_worker_id is not None:
            unreachable("prefill/decode worker fields: an aggregated KvRouter has one worker")

    def route(self, route: HostRoute) -> str:
        self._unsupported_fields(route)
        pin = None
        if route.backend_instance_id is not None:
            pin = self.target.instance_id(route.backend_instance_id)
        return self.target.start(self, route, pin)

    def stop(self, request_id: str) -> None:
        unreachable("KvRouter.generate takes no context: the caller cannot stop and keep reading")

    def _best(self, tokens: Sequence[int], request_id: str | None) -> PlanView | ObservedError:
        try:
            worker, _, _ = self.target.router.call(
                "best", host=self.name, tokens=list(tokens), request_id=request_id
            )
        except RouterError as error:
            return observed(error)
        plan_id = next(self._plans)
        if request_id is not None:
            self.plans[plan_id] = Plan(request_id, tuple(tokens), int(worker))
        else:
            self.previews[plan_id] = tuple(tokens)
        # the KvRouter has no cleanup budget: nothing expires a booking but free()
        return PlanView(plan_id, self.target.suite_worker(int(worker)), math.inf)

    def preview(self, route: HostRoute) -> PlanView | ObservedError:
        self._unsupported_fields(route)
        if route.backend_instance_id is not None:
            unreachable("best_worker takes no explicit worker")
        return self._best(route.tokens, None)

    def plan(self, preview_id: int) -> PlanView | ObservedError:
        tokens = self.previews[preview_id]
        return self._best(tokens, f"{self.target.key('plan')}-{uuid.uuid4().hex[:8]}")

    def dispatch_plan(self, plan_id: int, *, stop_first: bool = False) -> str:
        if stop_first:
            unreachable("KvRouter.generate takes no context: a stopped caller cannot be shown")
        plan = self.plans[plan_id]
        return self.target.start(self, HostRoute(tokens=plan.tokens), plan.worker)

    def abort_plan(self, plan_id: int) -> ObservedError | None:
        plan = self.plans[plan_id]
        try:
            self.target.router.call("free", host=self.name, request_id=plan.request_id)
        except RouterError as error:
            return observed(error)
        return None

    def prefill_busy(self, route: HostRoute, threshold: float) -> bool:
        unreachable(f"the prefill-busy probe: the Python KvRouter has no such call ({PROBE})")

    def bind_session(self, session: str, worker_id: int, dp_rank: int | None = None) -> None:
        unreachable(f"session affinity: no KvRouter request field carries one ({SESSION_PROBE})")

    def hold_session(self, session: str) -> None:
        unreachable(f"session affinity: no KvRouter request field carries one ({SESSION_PROBE})")

    def release_session(self, session: str) -> None:
        unreachable(f"session affinity: no KvRouter request field carries one ({SESSION_PROBE})")

    def session(self, session: str) -> SessionView:
        return SessionView("disabled")  # open_host refuses affinity, so none is configured

    def configure_worker(
        self, worker_id: int, *, taints: frozenset[str] = frozenset(), dp_size: int = 1
    ) -> None:
        unreachable("a worker's taints and dp size are not wired in this adapter yet")

    def forget_worker_config(self, worker_id: int) -> None:
        unreachable("a config-watch gap cannot be produced from outside the KvRouter")

    def set_lora_replicas(self, adapter: str, workers: frozenset[int]) -> None:
        unreachable("LoRA filtering is not a KvRouter setting")

    def bookings(self) -> Mapping[int, int]:
        loads = self.target.router.call("loads", host=self.name, tokens=[0])
        return {worker: count for worker, count in self.target.booked(loads).items() if count}

    def counters(self) -> tuple[int, int]:
        started, completed = router_counters(self.target.router)
        return started - self.baseline[0], completed - self.baseline[1]

    def lora_inflight(self) -> Mapping[str, int]:
        unreachable("LoRA filtering is not a KvRouter setting")

    def inputs(self) -> HostView:
        unreachable("the inputs the KvRouter builds are internal to it")


def router_counters(router: RouterProcess) -> tuple[int, int]:
    """(requests started, requests ended) over every KvRouter of the router process: 1.6.1
    registers these counters once per process, labelled with the first router's namespace
    (probed: a second host's requests raised the first host's series from 1 to 3), so a
    host reads the growth since it was opened; the suite runs one check at a time."""
    text = router.metrics()
    return (
        _sum(text, "dynamo_component_router_requests_started_total"),
        _sum(text, "dynamo_component_router_requests_total"),
    )


def _sum(text: str, name: str) -> int:
    pattern = re.compile(rf"^{name}(\{{[^}}]*\}})? ([0-9.eE+-]+)$")
    total = 0.0
    for line in text.splitlines():
        found = pattern.match(line)
        if found:
            total += float(found.group(2))
    return int(total)
