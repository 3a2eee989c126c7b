"""The target: real Dynamo token workers behind the real Dynamo HTTP frontend.

A check's workers are worker processes started for its target. A routing host
(``open_host``) is a *generation*: every worker registers a model of its own name
(``rs<target>g<n>``) whose card advertises the host's router configuration (policy, KV
settings, session affinity), so one frontend serves every configuration and each host
starts with fresh router state. Requests are streamed ``/v1/completions`` whose prompt is
the route's token ids; a frontend per migration limit carries migration.

What the suite observes: the HTTP outcome (tokens, finish reasons, the error's status
class and text); the workers' own reports of each request they receive (the dispatch log,
with the prompt and budgets each attempt received, matched to the suite's request by the
``x-dynamo-request-id`` the adapter sends); the session bindings the frontend publishes on
its affinity replica-sync channel; and the frontend's ``/metrics`` counters.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import attrs
import pytest

from routespec.adapters.dynamo_frontend.deployment import (
    U32_MAX,
    WAIT_LIMIT,
    Deployment,
    Frontend,
    WorkerProcess,
    refusal_to_start,
)
from routespec.adapters.dynamo_frontend.http_client import (
    CompletionRequest,
    StreamCall,
    metric,
    metrics,
    wait_for_model,
)
from routespec.testing.target import (
    Call,
    CancelThenFail,
    Delivery,
    ErrorSpec,
    FailBeforeStream,
    FailMidStream,
    HostConfig,
    HostRoute,
    HostView,
    Migrate,
    ObservedError,
    Outcome,
    PlanView,
    RoutingHostTarget,
    Serve,
    SessionView,
    Stall,
    TargetConfig,
    TerminalFlood,
    TerminalThen,
    WorkerScript,
)
from routespec.testing.unsupported import Unsupported

SETTLE_LIMIT = 30.0
RAISABLE = frozenset(
    {
        "InvalidArgument", "Backend(InvalidArgument)", "CannotConnect", "Backend(CannotConnect)",
        "Disconnected", "Backend(Disconnected)", "ConnectionTimeout",
        "Backend(ConnectionTimeout)", "Cancelled", "Backend(Cancelled)",
        "Backend(EngineShutdown)", "Backend(StreamIncomplete)", "WorkerUnavailable", "Unknown",
        "Backend(Unknown)",
    }
)  # fmt: skip
"""Error types a Python handler can raise on 1.6.1: ``dynamo._core`` has a class for each."""

POLICIES = frozenset(
    {
        "round-robin",
        "random",
        "power-of-two-choices",
        "least-loaded",
        "device-aware-weighted",
        "direct",
        "kv",
    }
)
TAINTS = (
    "taints: a probe (update_model_taints on one of two workers, then requests with "
    "nvext.routing_constraints.required_taints) saw the requests alternate between the "
    "tainted and the untainted worker, so the adapter cannot show that a taint reaches the "
    "frontend's router"
)
BOOKING = frozenset({"least-loaded", "kv"})
"""Policies whose load input is bookings; the frontend does not expose them."""
MAX_AFFINITY_ENTRIES = 65_536
BATCH = 4
_TARGETS = itertools.count(1)


def unreachable(what: str) -> NoReturn:
    """This step has no public surface in the 1.6.1 wheels: the check is SKIP, with why."""
    pytest.skip(f"dynamo-frontend: {what}")


def encode_error(error: ErrorSpec) -> dict[str, object]:
    if error.cause is not None:
        unreachable(
            f"a Python handler raises one typed exception, not a cause chain ({error.chain()})"
        )
    if error.type is not None and error.type not in RAISABLE:
        unreachable(
            f"dynamo._core 1.6.1 has no exception class a handler can raise for {error.type}"
        )
    return {"type": error.type, "message": error.message}


def fails(script: WorkerScript) -> bool:
    """The script makes the worker fail a request (a typed error or an untyped one)."""
    if isinstance(script, (FailBeforeStream, FailMidStream, CancelThenFail)):
        return True
    return isinstance(script, TerminalThen) and script.error is not None


def encode_script(script: WorkerScript) -> dict[str, object]:
    if isinstance(script, Serve):
        return {"kind": "serve", "items": script.items}
    if isinstance(script, Stall):
        return {"kind": "stall", "items": script.items, "items_after": script.items_after}
    if isinstance(script, FailBeforeStream):
        return {"kind": "fail-before", "error": encode_error(script.error)}
    if isinstance(script, FailMidStream):
        return {"kind": "fail-mid", "items": script.items, "error": encode_error(script.error)}
    if isinstance(script, CancelThenFail):
        return {
            "kind": "cancel-then-fail",
            "items": script.items,
            "error": encode_error(script.error),
        }
    if isinstance(script, TerminalThen):
        return {
            "kind": "terminal-then",
            "items": script.items,
            "finish": script.finish,
            "stall": script.stall,
            "error": None if script.error is None else encode_error(script.error),
        }
    if isinstance(script, TerminalFlood):
        return {"kind": "terminal-flood", "interval": script.interval}
    unreachable(
        f"{type(script).__name__}: a Python handler cannot answer at the transport level "
        "(rejection ACKs and wire faults are the request plane's, not the handler's)"
    )


def refusal_of(text: str) -> ObservedError:
    """A router configuration the runtime refused, as the class-only error it shows."""
    error_class = "InvalidRequest" if re.match(r"(Value|Type|Overflow)Error", text) else None
    return ObservedError(((None, text),), True, error_class=error_class, types_observed=False)


def card_refusal(router: dict[str, object]) -> ObservedError | None:
    """With no worker to register the card, the runtime's own validation of the router
    configuration (``RouterConfig``/``KvRouterConfig`` construction, as a worker's
    ``register_model`` call would do it), run in this process."""
    from routespec.adapters.dynamo_frontend.worker_process import router_config

    try:
        router_config(router)
    except Exception as error:  # the runtime's refusal, reported as the outcome
        return refusal_of(f"{type(error).__name__}: {error}")
    return None


@attrs.define
class Generation:
    """One model registered on every worker, with one router configuration in its card."""

    namespace: str
    router: dict[str, object]
    block_size: int
    affinity: bool
    refusal: ObservedError | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.namespace}.backend.generate"

    @property
    def model(self) -> str:
        return self.namespace


class Refused:
    """A request whose frontend would not start (its migration limit): over before any HTTP
    exchange, with the frontend's own refusal as the error."""

    def __init__(self, error: ObservedError) -> None:
        self.items: list[dict[str, object]] = []
        self.error: ObservedError | None = error
        self.dropped = False
        self.done = threading.Event()
        self.done.set()

    def drop(self) -> None:
        """Nothing is open."""


@attrs.define
class Pending:
    """A request the suite started: the HTTP call and what the workers reported of it."""

    suite_id: str
    call: StreamCall | Refused | None
    prompt: int
    books: bool = False
    rids: set[str] = attrs.field(factory=set)
    outcome: Outcome | None = None


class FrontendTarget(Unsupported):
    """What this target does not reach stays ``Unsupported``."""

    def __init__(self, config: TargetConfig, shared: Deployment) -> None:
        self.config = config
        self.shared = shared
        self.number = next(_TARGETS)
        self.changed = threading.Condition()
        self.workers: dict[int, WorkerProcess] = {}
        self.log: list[Delivery] = []
        self.rid_owner: dict[str, str] = {}  # Dynamo's request id -> the suite's
        self.stalled: dict[str, int] = {}  # Dynamo's request id -> data tokens sent first
        self.ended: set[str] = set()
        self.pending: dict[str, Pending] = {}
        self.generations: dict[tuple[object, ...], Generation] = {}
        self.default_generation: Generation | None = None
        self.frontends_used: set[Frontend] = set()
        self.batch: list[WorkerProcess] = []
        self.listed: set[tuple[int, str]] = set()
        self._ids = itertools.count(1)
        self._requests = itertools.count(1)
        self._generation_numbers = itertools.count(1)

    # --- workers ---

    def _report(self, worker: WorkerProcess, message: Mapping[str, Any]) -> None:
        """Called with ``changed`` held, from a worker's reader thread."""
        op = message.get("op")
        rid = str(message.get("rid"))
        if op == "delivered":
            owner = self.rid_owner.get(rid, f"unknown:{rid}")
            payload = message.get("payload")
            self.log.append(Delivery(owner, worker.worker_id, None, payload))
            pending = self.pending.get(owner)
            if pending is not None:
                pending.rids.add(rid)
        elif op == "stalled":
            self.stalled[rid] = int(message.get("sent", 0))
        elif op == "ended":
            self.ended.add(rid)

    def wait_for(self, condition: Any, limit: float = WAIT_LIMIT) -> bool:
        deadline = time.monotonic() + limit
        with self.changed:
            while not condition():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.changed.wait(min(remaining, 0.05))
        return True

    def add_worker(self, *, device: str = "cuda") -> int:
        """A worker process. The first ones come from a batch started together and are
        handed out in ascending instance id, so suite worker 1 has the lowest id: Dynamo's
        round-robin cycles through the sorted instance ids (upstream ``push_router.rs``)."""
        worker_id = next(self._ids)
        if not self.batch and worker_id == 1:
            self.batch = sorted(self.shared.spare_workers(BATCH), key=lambda w: w.instance_id or 0)
        if self.batch:
            worker = self.batch.pop(0)
        else:
            (worker,) = self.shared.spare_workers(1)
        worker.attach(worker_id, self.changed, self._report)
        self.workers[worker_id] = worker
        for generation in list(self.generations.values()):
            if generation.refusal is None:
                self._serve([worker], generation)
        return worker_id

    def add_worker_process(self, script: WorkerScript) -> int:
        worker_id = self.add_worker()
        self.script_worker(worker_id, script)
        return worker_id

    def instance_id(self, worker_id: int) -> int:
        worker = self.workers.get(worker_id)
        if worker is None or worker.instance_id is None:
            return worker_id  # an id the suite made up passes as is
        return worker.instance_id

    def suite_text(self, text: str) -> str:
        """Worker instance ids in a message, shown as the suite's worker ids."""
        for worker_id, worker in self.workers.items():
            if worker.instance_id is not None:
                text = text.replace(str(worker.instance_id), str(worker_id))
        return text

    def script_worker(self, worker_id: int, script: WorkerScript) -> None:
        if not self.config.fault_detection and fails(script):
            unreachable(
                "fault detection cannot be turned off: the 1.6.1 frontend locally inhibits a "
                "worker that failed a request for ~5 s, and no flag or router setting disables it"
            )
        self.workers[worker_id].used = True
        self.workers[worker_id].send({"op": "script", "script": encode_script(script)})
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
        found = [
            d.worker_id for d in self.log if d.request_id == owner and isinstance(d.payload, dict)
        ]
        return found[-1] if found else None

    def kill_worker(self, worker_id: int) -> None:
        self.workers[worker_id].used = True
        self.workers[worker_id].kill()
        self.settle()

    def remove_worker(self, worker_id: int) -> None:
        worker = self.workers[worker_id]
        worker.used = True
        for endpoint in list(worker.served):
            worker.send({"op": "unserve", "endpoint": endpoint})
        if worker.served:
            time.sleep(0.6)  # the frontend's discovery watch drops the instance
        worker.served.clear()

    def close(self) -> None:
        for call in [p.call for p in self.pending.values() if p.call is not None]:
            if not call.done.is_set():
                call.drop()
        unused = [w for w in self.workers.values() if not w.used and not w.served and w.alive()]
        self.shared.return_spares(self.batch + unused)
        self.batch = []
        for worker in unused:
            self.workers = {i: w for i, w in self.workers.items() if w is not worker}
        for worker in self.workers.values():
            worker.send({"op": "quit"})
        deadline = time.monotonic() + 1.5
        for worker in self.workers.values():
            with contextlib.suppress(Exception):
                worker.process.wait(max(0.0, deadline - time.monotonic()))
        for worker in self.workers.values():
            worker.close()

    # --- generations: one model per router configuration ---

    def generation(self, router: dict[str, object], block_size: int, affinity: bool) -> Generation:
        key = (tuple(sorted(router.items())), block_size)
        found = self.generations.get(key)
        if found is not None:
            return found
        namespace = f"rs{self.number}g{next(self._generation_numbers)}x{uuid.uuid4().hex[:6]}"
        generation = Generation(namespace, router, block_size, affinity)
        self.generations[key] = generation
        if not any(w.alive() for w in self.workers.values()):
            generation.refusal = card_refusal(router)
        if generation.refusal is None:
            self._serve(list(self.workers.values()), generation)
        return generation

    def _serve(self, workers: list[WorkerProcess], generation: Generation) -> None:
        command = {
            "op": "serve",
            "endpoint": generation.endpoint,
            "model": generation.model,
            "block_size": generation.block_size,
            "router": generation.router,
        }
        for worker in workers:
            worker.used = True
            worker.send(command)
        self.wait_for(
            lambda: all(generation.endpoint in w.served or not w.alive() for w in workers)
        )
        refusals = {w.served.get(generation.endpoint) for w in workers} - {None}
        if refusals:
            generation.refusal = refusal_of(sorted(str(r) for r in refusals)[0])
            return
        frontend = self.shared.frontend(0)
        if workers and not wait_for_model(frontend.host, frontend.port, generation.model, 5.0):
            generation.refusal = ObservedError(
                ((None, f"the frontend never listed model {generation.model}"),),
                True,
                types_observed=False,
            )
            return
        time.sleep(0.3)  # every instance's registration reaches the frontend's watch
        self.listed.add((frontend.port, generation.model))

    # --- requests ---

    def _frontend(self, limit: int | None, max_seq_len: int | None = None) -> Frontend:
        try:
            frontend = self.shared.frontend(limit or 0, max_seq_len)
        except ValueError as refusal:
            unreachable(str(refusal))
        self.frontends_used.add(frontend)
        return frontend

    def ready(self, frontend: Frontend, generation: Generation) -> None:
        """A frontend started after the model was registered discovers it first."""
        key = (frontend.port, generation.model)
        if key not in self.listed:
            wait_for_model(frontend.host, frontend.port, generation.model, 5.0)
            time.sleep(0.2)
            self.listed.add(key)

    def kv_load(self) -> dict[int, float]:
        """Per worker: active prefill tokens plus active decode blocks, over the frontends
        this target used (``dynamo_frontend_worker_active_*`` on ``/metrics``)."""
        load = dict.fromkeys(self.workers, 0.0)
        for frontend in list(self.frontends_used):
            samples = metrics(frontend.host, frontend.port)
            for worker_id, worker in self.workers.items():
                instance = str(worker.instance_id)
                for name in (
                    "dynamo_frontend_worker_active_prefill_tokens",
                    "dynamo_frontend_worker_active_decode_blocks",
                ):
                    load[worker_id] += metric(samples, name, worker_id=instance)
        return load

    def start(
        self,
        generation: Generation,
        request: CompletionRequest,
        frontend: Frontend,
    ) -> str:
        self.ready(frontend, generation)
        suite_id = f"req-{next(self._requests)}"
        rid = str(uuid.uuid4())
        with self.changed:
            self.rid_owner[rid] = suite_id
            pending = Pending(
                suite_id, None, len(request.prompt), generation.router["policy"] in BOOKING
            )
            self.pending[suite_id] = pending
        request = attrs.evolve(
            request,
            model=generation.model,
            headers={**request.headers, "x-dynamo-request-id": rid},
        )
        pending.call = StreamCall(frontend.host, frontend.port, request, self._notify)
        self._settle_request(pending)
        return suite_id

    def refused(self, limit: int) -> str:
        """The frontend that would carry this migration limit refuses to start: the request
        ends with that refusal, having reached no worker."""
        text = refusal_to_start(limit)
        if not text:
            unreachable(f"a frontend with --migration-limit {limit} started; no refusal to show")
        suite_id = f"req-{next(self._requests)}"
        error = ObservedError(((None, text),), True, error_class=None, types_observed=False)
        with self.changed:
            self.pending[suite_id] = Pending(suite_id, Refused(error), 0)
        return suite_id

    def _notify(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def _held(self, pending: Pending) -> bool:
        """A worker holds the request (a stall) and the client has read what it sent first."""
        call = pending.call
        if call is None:
            return False
        received = 0
        for item in list(call.items):
            found = item.get("token_ids")
            received += len(found) if isinstance(found, list) else 0
        for rid in pending.rids:
            if rid in self.stalled:
                attempt = [d for d in self.log if d.request_id == pending.suite_id]
                earlier = 0
                if attempt and isinstance(attempt[-1].payload, dict):
                    earlier = len(attempt[-1].payload.get("token_ids") or []) - pending.prompt
                if received >= earlier + self.stalled[rid]:
                    return True
        return False

    def _settle_request(self, pending: Pending) -> None:
        call = pending.call
        assert call is not None
        self.wait_for(lambda: call.done.is_set() or self._held(pending), SETTLE_LIMIT)
        if call.done.is_set():
            # the workers' reports of this request may still be on their way
            self.wait_for(lambda: all(rid in self.ended for rid in pending.rids), 2.0)

    def settle(self) -> None:
        for pending in list(self.pending.values()):
            call = pending.call
            if call is not None and not call.done.is_set():
                self._settle_request(pending)

    def submit(
        self, call: Call, metadata: Mapping[str, str] | None = None, guarded: bool = False
    ) -> str:
        if isinstance(call, HostRoute):
            if self.default_generation is None:
                raise AssertionError("open_host() first")
            return FrontendHost(self, HostConfig(), self.default_generation).route(call)
        if not isinstance(call, Migrate):
            unreachable(
                f"{type(call).__name__}: the frontend's HTTP API takes token requests only; "
                "the bare client's calls are the dynamo and dynamo-wire adapters'"
            )
        if call.stopped:
            unreachable(
                "a caller context stopped before the first attempt: an HTTP client can only "
                "go away, and then it reads nothing"
            )
        if call.mode not in POLICIES:
            unreachable(f"router mode {call.mode!r}")
        generation = self.generation({"policy": call.mode}, 16, False)
        if call.limit > U32_MAX:
            return self.refused(call.limit)
        frontend = self._frontend(call.limit, call.max_seq_len)
        nvext: dict[str, object] = {}
        extra: dict[str, object] = {}
        if call.pin is not None:
            nvext["backend_instance_id"] = self.instance_id(call.pin)
        if call.guided:
            extra["guided_choice"] = ["t1", "t2"]
        request = CompletionRequest(
            generation.model,
            tuple(range(call.prompt)),
            call.max_tokens,
            min_tokens=call.min_tokens or None,
            n=call.n if call.n != 1 else None,
            nvext=nvext,
            extra=extra,
        )
        return self.start(generation, request, frontend)

    def outcome(self, request_id: str) -> Outcome | None:
        pending = self.pending.get(request_id)
        if pending is None or pending.call is None:
            return None
        call = pending.call
        if not call.done.is_set():
            return None
        error = call.error
        if error is not None and not error.pre_stream and pending.books:
            unreachable(
                "the host's bookings at the moment the caller read the error item "
                "(Outcome.bookings_at_error): the frontend exposes no per-request bookings"
            )
        if error is not None:
            error = attrs.evolve(
                error, links=tuple((t, self.suite_text(m)) for t, m in error.links)
            )
        return Outcome(tuple(dict(item) for item in call.items), error, call.dropped)

    def drop(self, request_id: str) -> None:
        pending = self.pending[request_id]
        if pending.call is not None:
            pending.call.drop()
        self.wait_for(lambda: all(rid in self.ended for rid in pending.rids), 5.0)

    def dispatch_log(self) -> Sequence[Delivery]:
        with self.changed:
            return tuple(self.log)

    # --- the routing host ---

    def open_host(self, config: HostConfig) -> RoutingHostTarget | ObservedError:
        if config.policy not in POLICIES:
            return ObservedError(
                ((None, f"unknown router mode {config.policy!r}"),),
                True,
                error_class="InvalidRequest",
                types_observed=False,
            )
        if config.lora:
            unreachable("LoRA filtering is not a router setting a model card or flag selects")
        if config.max_affinity_entries != MAX_AFFINITY_ENTRIES:
            unreachable(
                "the affinity table's cap is not configurable in 1.6.1 (no flag, no "
                "RouterConfig field)"
            )
        router: dict[str, object] = {"policy": config.policy, "temperature": config.temperature}
        if config.affinity_ttl is not None:
            ttl = config.affinity_ttl
            router["affinity_ttl"] = int(ttl) if float(ttl).is_integer() else ttl
            router["affinity_mode"] = config.affinity_mode
        generation = self.generation(router, config.block_size, config.affinity_ttl is not None)
        if generation.refusal is not None:
            return generation.refusal
        self.default_generation = generation
        return FrontendHost(self, config, generation)


class FrontendHost:
    """A routing host: the frontend's router for one generation's model."""

    def __init__(self, target: FrontendTarget, config: HostConfig, generation: Generation):
        self.target = target
        self.config = config
        self.generation = generation
        self._binds = itertools.count(1)

    def route(self, route: HostRoute) -> str:
        target = self.target
        if route.phase != "aggregated":
            unreachable(
                f"a {route.phase} leg: the frontend derives a request's phase from the "
                "registered worker types, an HTTP request cannot choose it"
            )
        if route.stopped or route.staged_kv:
            unreachable(
                "a caller context stopped before routing (or a staged-KV decode leg): an "
                "HTTP client can only go away"
            )
        if route.lora is not None:
            unreachable("LoRA requests: see the LoRA findings")
        if route.excluded:
            unreachable("a retry's excluded workers are migration's state, not a request field")
        if route.allowed is not None:
            unreachable("no HTTP request field restricts the eligible workers in 1.6.1")
        nvext: dict[str, object] = {}
        for field in ("backend_instance_id", "decode_worker_id", "prefill_worker_id"):
            value = getattr(route, field)
            if value is not None:
                nvext[field] = target.instance_id(value)
        if route.dp_rank is not None:
            nvext["dp_rank"] = route.dp_rank
        if route.required_taints:
            unreachable(TAINTS)
        headers = {} if route.session is None else {"x-session-id": route.session}
        request = CompletionRequest(
            self.generation.model, route.tokens, route.max_tokens, nvext=nvext, headers=headers
        )
        return target.start(self.generation, request, target._frontend(route.migration_limit))

    def stop(self, request_id: str) -> None:
        unreachable("an HTTP client cannot stop its request and keep reading")

    def preview(self, route: HostRoute) -> PlanView | ObservedError:
        unreachable("route previews are not exposed by the frontend")

    def plan(self, preview_id: int) -> PlanView | ObservedError:
        unreachable("route plans are not exposed by the frontend")

    def dispatch_plan(self, plan_id: int, *, stop_first: bool = False) -> str:
        unreachable("route plans are not exposed by the frontend")

    def abort_plan(self, plan_id: int) -> ObservedError | None:
        unreachable("route plans are not exposed by the frontend")

    def prefill_busy(self, route: HostRoute, threshold: float) -> bool:
        unreachable("the prefill-busy probe is not exposed by the frontend")

    def bind_session(self, session: str, worker_id: int, dp_rank: int | None = None) -> None:
        """As a first request would: one request of the session pinned to the worker."""
        if not self.generation.affinity:
            raise AssertionError("the host was built without session affinity")
        request = self.route(
            HostRoute(session=session, backend_instance_id=worker_id, dp_rank=dp_rank)
        )
        outcome = self.target.outcome(request)
        if outcome is None or outcome.error is not None:
            raise AssertionError(f"binding {session!r} to {worker_id} failed: {outcome}")
        self.target.wait_for(lambda: self.session(session).state == "bound", 2.0)

    def hold_session(self, session: str) -> None:
        unreachable("a pending session initialization cannot be held open from outside")

    def release_session(self, session: str) -> None:
        unreachable("a pending session initialization cannot be held open from outside")

    def session(self, session: str) -> SessionView:
        if not self.generation.affinity:
            return SessionView("disabled")
        relay = self.target.shared.relay
        time.sleep(0.05)  # the frontend publishes a binding as it commits it
        with relay.changed:
            bound = relay.bindings.get((self.generation.namespace, session))
        if bound is None:
            return SessionView("unbound")
        worker = next(
            (w for w, p in self.target.workers.items() if p.instance_id == bound[0]), bound[0]
        )
        process = self.target.workers.get(worker)
        if process is None or not process.alive() or self.generation.endpoint not in process.served:
            unreachable(
                f"the session's binding after its worker {worker} left: the frontend publishes "
                "no session_affinity_events entry when it clears a binding (probed: Direct "
                "mode, the bound worker unregistered, the next request failed 503 and the one "
                "after it 400 'Invalid request' as unbound, with no event in between)"
            )
        return SessionView("bound", worker, bound[1])

    def configure_worker(
        self, worker_id: int, *, taints: frozenset[str] = frozenset(), dp_size: int = 1
    ) -> None:
        if dp_size != 1:
            unreachable("a worker's dp size is fixed when its model is registered")
        if taints:
            unreachable(TAINTS)
        worker = self.target.workers[worker_id]
        worker.send(
            {"op": "taints", "endpoint": self.generation.endpoint, "taints": sorted(taints)}
        )
        time.sleep(0.5)  # the frontend's config watch sees the new card

    def forget_worker_config(self, worker_id: int) -> None:
        unreachable("a config-watch gap cannot be produced from outside the frontend")

    def set_lora_replicas(self, adapter: str, workers: frozenset[int]) -> None:
        unreachable("LoRA filtering: see the LoRA findings")

    def bookings(self) -> Mapping[int, int]:
        unreachable(
            f"a {self.config.policy} host's bookings: /metrics shows per-worker KV load (active "
            "prefill tokens and decode blocks, KV router only, refreshed asynchronously: it "
            "read 0 with a request open), not admitted requests"
        )

    def counters(self) -> tuple[int, int]:
        self.target._frontend(0)
        model = self.generation.model
        started = completed = 0.0
        for frontend in list(self.target.frontends_used):
            samples = metrics(frontend.host, frontend.port)
            started += metric(samples, "dynamo_frontend_requests_started_total", model=model)
            completed += metric(
                samples, "dynamo_frontend_requests_total", model=model, status="success"
            )
        return int(started), int(completed)

    def lora_inflight(self) -> Mapping[str, int]:
        unreachable("LoRA filtering: see the LoRA findings")

    def inputs(self) -> HostView:
        unreachable("the inputs a policy builds are internal to the frontend's router")
