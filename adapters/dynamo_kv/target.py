"""The target: real Dynamo token workers behind the real in-process ``dynamo._core.KvRouter``.

Workers are ``dynamo_frontend.worker_process`` processes (real Dynamo workers whose handlers
follow the suite's scripts). A routing host is a fresh endpoint ``rsk<target>h<n>`` that
every worker registers (``register_model`` with the host's block size) and a ``KvRouter``
over it in the router process, so each host starts with an empty index and no bookings.

How the spec's host operations map onto the 1.6.1 KvRouter API:

- a request: ``generate_from_request`` (explicit worker and dp rank as routing hints);
- a preview: ``best_worker(tokens)``, query-only; a plan: ``best_worker(tokens,
  request_id=…)``, the booking selection; aborting a plan: ``free(request_id)``;
  dispatching a plan: ``generate`` pinned to the plan's worker (the KvRouter has no call that
  hands a ``best_worker`` booking to a request: the caller owns it until ``free``);
- bookings: ``get_potential_loads``' ``active_requests`` per worker;
- counters: the router process's ``/metrics``, ``dynamo_component_router_requests_started_total``
  and ``…_requests_total``, their growth since the host was opened (``router_counters``).

What the API has no surface for is SKIP with the reason (``unreachable``).
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import pytest

from routespec.adapters.dynamo.driver import observed_error
from routespec.adapters.dynamo_frontend.deployment import WAIT_LIMIT, Deployment, WorkerProcess
from routespec.adapters.dynamo_frontend.target import encode_script
from routespec.adapters.dynamo_kv.host import KvHost
from routespec.adapters.dynamo_kv.router import RouterProcess, wait_until
from routespec.adapters.dynamo_kv.unreachable import SESSION_PROBE, unreachable
from routespec.testing.target import (
    Call,
    Delivery,
    FailBeforeStream,
    FailMidStream,
    HostConfig,
    HostRoute,
    ObservedError,
    Outcome,
    RoutingHostTarget,
    TargetConfig,
    WorkerScript,
)
from routespec.testing.unsupported import Unsupported

SETTLE_LIMIT = 30.0
BATCH = 4
_TARGETS = itertools.count(1)


def encode(script: WorkerScript) -> dict[str, object]:
    """The worker process's script format (shared with ``dynamo-frontend``)."""
    try:
        return encode_script(script)
    except pytest.skip.Exception as skip:
        unreachable(str(skip.msg).removeprefix("dynamo-frontend: "))


@attrs.define
class Pending:
    """A request the suite started through a host."""

    suite_id: str
    prompt: int
    items: list[dict[str, object]] = attrs.field(factory=list)
    rids: set[str] = attrs.field(factory=set)  # Dynamo's request ids, as workers saw them
    done: bool = False
    error: ObservedError | None = None
    dropped: bool = False
    loads_at_error: list[Mapping[str, Any]] | None = None


class KvTarget(Unsupported):
    """What this target does not reach stays ``Unsupported``."""

    def __init__(self, config: TargetConfig, shared: Deployment, router: RouterProcess) -> None:
        self.config = config
        self.shared = shared
        self.router = router
        self.number = next(_TARGETS)
        self.changed = router.changed
        self.workers: dict[int, WorkerProcess] = {}
        self.log: list[Delivery] = []
        self.rid_owner: dict[str, str] = {}  # Dynamo's request id -> the suite's
        self.stalled: dict[str, int] = {}
        self.ended: set[str] = set()
        self.pending: dict[str, Pending] = {}
        self.hosts: list[KvHost] = []
        self.default_host: KvHost | None = None
        self.batch: list[WorkerProcess] = []
        self._ids = itertools.count(1)
        self._requests = itertools.count(1)
        self._hosts = itertools.count(1)

    # --- workers ---

    def _report(self, worker: WorkerProcess, message: Mapping[str, Any]) -> None:
        """Called with ``changed`` held, from a worker's reader thread."""
        op = message.get("op")
        rid = str(message.get("rid"))
        if op == "delivered":
            payload = message.get("payload")
            tags = payload.get("annotations") if isinstance(payload, dict) else None
            owner = next(
                (t.removeprefix("routespec:") for t in tags or [] if t.startswith("routespec:")),
                f"unknown:{rid}",
            )
            owner = owner.split("/", 1)[-1]
            self.rid_owner[rid] = owner
            self.log.append(Delivery(owner, worker.worker_id, None, payload))
            pending = self.pending.get(owner)
            if pending is not None:
                pending.rids.add(rid)
        elif op == "stalled":
            self.stalled[rid] = int(message.get("sent", 0))
        elif op == "ended":
            self.ended.add(rid)

    def wait_for(self, condition: Any, limit: float = WAIT_LIMIT) -> bool:
        return wait_until(self.changed, condition, limit)

    def add_worker(self, *, device: str = "cuda") -> int:
        worker_id = next(self._ids)
        if not self.batch and worker_id == 1:
            self.batch = sorted(self.shared.spare_workers(BATCH), key=lambda w: w.instance_id or 0)
        if self.batch:
            worker = self.batch.pop(0)
        else:
            (worker,) = self.shared.spare_workers(1)
        worker.attach(worker_id, self.changed, self._report)
        self.workers[worker_id] = worker
        for host in self.hosts:
            host.serve([worker])
        return worker_id

    def instance_id(self, worker_id: int) -> int:
        worker = self.workers.get(worker_id)
        if worker is None or worker.instance_id is None:
            return worker_id  # an id the suite made up passes as is
        return worker.instance_id

    def suite_worker(self, instance_id: int) -> int:
        found = [w for w, p in self.workers.items() if p.instance_id == instance_id]
        return found[0] if found else instance_id

    def suite_text(self, text: str) -> str:
        for worker_id, worker in self.workers.items():
            if worker.instance_id is not None:
                text = text.replace(str(worker.instance_id), str(worker_id))
        return text

    def script_worker(self, worker_id: int, script: WorkerScript) -> None:
        if self.config.fault_detection is False and isinstance(
            script, (FailBeforeStream, FailMidStream)
        ):
            unreachable(
                "fault detection cannot be turned off: the KvRouter's push router inhibits a "
                "worker that failed for ~5 s, and KvRouterConfig has no switch for it"
            )
        # a script alone does not use a worker up: close() resets it and keeps it as a spare
        self.workers[worker_id].send({"op": "script", "script": encode(script)})
        time.sleep(0.02)  # the worker reads its stdin between requests

    def release_stalled(self, worker_id: int) -> None:
        worker = self.workers[worker_id]
        held = [rid for rid in self.stalled if self._worker_of(rid) == worker_id]
        worker.send({"op": "release"})
        for rid in held:
            self.stalled.pop(rid, None)
        self.settle()

    def _worker_of(self, rid: str) -> int | None:
        owner = self.rid_owner.get(rid)
        found = [d.worker_id for d in self.log if d.request_id == owner]
        return found[-1] if found else None

    def kill_worker(self, worker_id: int) -> None:
        self.workers[worker_id].used = True
        self.workers[worker_id].kill()
        self.settle()

    def vanish_worker(self, worker_id: int) -> None:
        """SIGKILL the worker process: its request-plane port is gone at once, while its
        discovery record stays until another process reaps it (~10 s on the file store),
        so the KvRouter still lists and selects it."""
        self.workers[worker_id].used = True
        self.workers[worker_id].kill()

    def remove_worker(self, worker_id: int) -> None:
        worker = self.workers[worker_id]
        worker.used = True
        for endpoint in list(worker.served):
            worker.send({"op": "unserve", "endpoint": endpoint})
        if worker.served:
            time.sleep(0.6)  # the router's discovery watch drops the instance
        worker.served.clear()

    def close(self) -> None:
        for pending in list(self.pending.values()):
            if not pending.done:
                self.drop(pending.suite_id)
        unused = [w for w in self.workers.values() if not w.used and not w.served and w.alive()]
        for worker in unused:
            worker.send({"op": "script", "script": {"kind": "serve"}})
        self.shared.return_spares(self.batch + unused)
        self.batch = []
        for worker in [w for w in self.workers.values() if w not in unused]:
            worker.close()

    # --- requests ---

    def key(self, suite_id: str) -> str:
        """The request's name in the router process, unique over the run."""
        return f"t{self.number}/{suite_id}"

    def _event(self, message: Mapping[str, Any]) -> None:
        """A router-process report about one of this target's requests (``changed`` held)."""
        pending = self.pending.get(str(message["rid"]).split("/", 1)[-1])
        if pending is None:
            return
        if message.get("op") == "item":
            item = message.get("item")
            if isinstance(item, dict):
                pending.items.append(
                    {"token_ids": item.get("token_ids"), "finish_reason": item.get("finish_reason")}
                )
        elif message.get("op") == "outcome":
            error = message.get("error")
            if isinstance(error, dict):
                observed = observed_error(error, pre_stream=bool(message.get("pre_stream")))
                pending.error = attrs.evolve(
                    observed, links=tuple((t, self.suite_text(m)) for t, m in observed.links)
                )
            pending.dropped = bool(message.get("dropped"))
            loads = message.get("loads_at_error")
            pending.loads_at_error = loads if isinstance(loads, list) else None
            pending.done = True

    def start(self, host: KvHost, route: HostRoute, pin: int | None = None) -> str:
        suite_id = f"req-{next(self._requests)}"
        pending = Pending(suite_id, len(route.tokens))
        with self.changed:
            self.pending[suite_id] = pending
            self.router.listeners[self.key(suite_id)] = self._event
        command: dict[str, object] = {
            "host": host.name,
            "rid": self.key(suite_id),
            "model": host.name,
            "tokens": list(route.tokens),
            "max_tokens": route.max_tokens,
        }
        if pin is not None:
            command["backend_instance_id"] = pin
        if route.dp_rank is not None:
            command["dp_rank"] = route.dp_rank
        self.router.call("route", **command)
        self._settle_request(pending)
        return suite_id

    def _held(self, pending: Pending) -> bool:
        """A worker holds the request (a stall) and the caller has read what it sent first."""
        received = 0
        for item in pending.items:
            found = item.get("token_ids")
            received += len(found) if isinstance(found, list) else 0
        return any(rid in self.stalled and received >= self.stalled[rid] for rid in pending.rids)

    def _settle_request(self, pending: Pending) -> None:
        self.wait_for(lambda: pending.done or self._held(pending), SETTLE_LIMIT)
        if pending.done:
            # the workers' reports travel apart from the router's: an answered request was
            # delivered somewhere, a failed one may have been (a worker reports before raising)
            self.wait_for(lambda: bool(pending.rids), 2.0 if pending.items else 0.3)
            self.wait_for(lambda: all(rid in self.ended for rid in pending.rids), 2.0)

    def settle(self) -> None:
        for pending in list(self.pending.values()):
            if not pending.done:
                self._settle_request(pending)

    def submit(
        self, call: Call, metadata: Mapping[str, str] | None = None, guarded: bool = False
    ) -> str:
        if isinstance(call, HostRoute) and self.default_host is not None:
            return self.default_host.route(call)
        unreachable(
            f"{type(call).__name__}: the KvRouter takes token requests through a KV host only; "
            "the bare client's calls are the dynamo and dynamo-wire adapters'"
        )

    def outcome(self, request_id: str) -> Outcome | None:
        pending = self.pending.get(request_id)
        if pending is None or not pending.done:
            return None
        at_error = None
        if pending.error is not None and not pending.error.pre_stream:
            at_error = self.booked(pending.loads_at_error or [])
        return Outcome(tuple(pending.items), pending.error, pending.dropped, at_error)

    def booked(self, loads: Sequence[Mapping[str, Any]]) -> dict[int, int]:
        found: dict[int, int] = {}
        for row in loads:
            worker = self.suite_worker(int(row["worker_id"]))
            found[worker] = found.get(worker, 0) + int(row["active_requests"])
        return found

    def drop(self, request_id: str) -> None:
        pending = self.pending[request_id]
        self.router.call("drop", rid=self.key(request_id))
        self.wait_for(lambda: pending.done, 5.0)
        self.wait_for(lambda: all(rid in self.ended for rid in pending.rids), 5.0)

    def dispatch_log(self) -> Sequence[Delivery]:
        with self.changed:
            return tuple(self.log)

    # --- the routing host ---

    def open_host(self, config: HostConfig) -> RoutingHostTarget | ObservedError:
        if config.policy != "kv":
            unreachable(
                f"policy {config.policy!r}: dynamo._core.KvRouter is the KV policy only "
                "(the other policies are the dynamo-frontend adapter's)"
            )
        if config.lora:
            unreachable("LoRA filtering is not a KvRouter setting")
        if config.kv_index_blocks is not None:
            unreachable(
                "the KV index's per-worker block cap: 1.6.1's approximate index expires "
                "blocks by age (KvRouterConfig router_ttl_secs=120.0, "
                "router_approximate_cache_policy='ttl') "
                "and has no count bound"
            )
        if config.affinity_ttl is not None:
            unreachable(
                "session affinity: KvRouter(session_affinity_ttl_secs=60) accepts a TTL, but no "
                f"request field carries a session ({SESSION_PROBE})"
            )
        host = KvHost(self, config, f"rsk{self.number}h{next(self._hosts)}x{uuid.uuid4().hex[:6]}")
        self.hosts.append(host)
        host.serve(list(self.workers.values()))
        built = host.open()
        if built is not None:
            self.hosts.remove(host)
            return built
        self.default_host = host
        return host
