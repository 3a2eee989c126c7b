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
import json
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
    user_inotify_instances,
)
from routespec.adapters.dynamo_frontend.http_client import (
    CompletionRequest,
    StreamCall,
    error_from_body,
    metric,
    metrics,
    post_completion,
    wait_for_model,
)
from routespec.adapters.dynamo_frontend.tiny_model import BARE_MARK, LOAD_MARK, data_item
from routespec.testing.target import (
    Call,
    CancelThenFail,
    Delivery,
    Direct,
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
INHIBITED_FOR = 5.0
"""How long the 1.6.1 frontend keeps a worker that failed a request out of its rotation
(probed: round-robin over 3 workers skipped the failed one for the next 6 requests, and
used it again 6 s later)."""
QUERY_ONLY = "query_instance_id:"
"""The ``nvext.annotations`` entry that asks the KV router for its choice without routing
the request (the frontend answers with ``nvext.worker_id`` and reaches no worker)."""
BARE_BUDGET = 64
"""A bare call's ``max_tokens``: more than any script's item count (the script decides)."""
BUSY_TOKENS = 1024
"""Every KV model's ``active_prefill_tokens_threshold``: a worker whose prompts not yet
prefilled exceed it is busy. The suite's own prompts stay far below it."""
LOAD_TOKENS = 2048
"""The prompt of the adapter's load request, which makes a worker busy (mark_overloaded)."""
NOT_KV_BUSY = (
    "an overloaded worker under a non-KV policy: the 1.6.1 frontend applies its busy "
    "threshold (RouterConfig active_prefill_tokens_threshold) only in its KV router (probed: "
    "with a 2048-token request held on worker 1 and threshold 1024, a KV model avoided worker "
    "1 and refused a pin to it 'Service temporarily overloaded', while round-robin went on "
    "rotating through 1, 2, 3 and least-loaded served a pin to it)"
)
INTERNAL = "internal:"
"""Owner prefix of the adapter's own requests (reporting a worker down): not the suite's,
so they stay out of its dispatch log."""
_PINGS = itertools.count(1)  # report barriers, numbered across targets
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
            "items_after": script.items_after,
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

    @property
    def lora(self) -> bool:
        return bool(self.router.get("lora"))


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
    bare: bool = False  # a bare call: its items are the suite's convention, not tokens
    rids: set[str] = attrs.field(factory=set)
    outcome: Outcome | None = None
    flushed: bool = False  # every worker's reports up to its end have been read


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
        # per Dynamo request id (every attempt of a migrated request shares it)
        self.delivered_n: dict[str, int] = {}
        self.ended_n: dict[str, int] = {}
        self.last_how: dict[str, str] = {}
        self.pending: dict[str, Pending] = {}
        self.generations: dict[tuple[object, ...], Generation] = {}
        self.default_generation: Generation | None = None
        self.frontends_used: set[Frontend] = set()
        self.batch: list[WorkerProcess] = []
        self.listed: set[tuple[int, str]] = set()
        self.scripts: dict[int, dict[str, object]] = {}  # the last script sent per worker
        self.down: dict[int, float] = {}  # worker -> when the suite reported it down
        self.vanishing: set[int] = set()  # killed before the next request (vanish_worker)
        self.vanished: set[int] = set()
        self.overloaded: set[int] = set()
        self.loads: dict[int, list[tuple[str, StreamCall]]] = {}  # worker -> load requests
        self.loaded: set[str] = set()
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
            self.delivered_n[rid] = self.delivered_n.get(rid, 0) + 1
            if not owner.startswith(INTERNAL):
                self.log.append(Delivery(owner, worker.worker_id, None, payload))
            pending = self.pending.get(owner)
            if pending is not None:
                pending.rids.add(rid)
        elif op == "loaded":
            self.loaded.add(rid)
        elif op == "stalled":
            self.stalled[rid] = int(message.get("sent", 0))
        elif op == "ended":
            self.ended.add(rid)
            self.ended_n[rid] = self.ended_n.get(rid, 0) + 1
            self.last_how[rid] = str(message.get("how"))

    def _flush_reports(self, pending: Pending) -> None:
        """Once per finished request, read every report the workers wrote so far: each
        answers a ping on the same pipe, after them. An attempt that failed on a slow worker
        process is reported there, and its report can trail the HTTP answer another worker
        completed."""
        if pending.flushed:
            return
        pending.flushed = True
        number = next(_PINGS)  # never reused: a spare keeps its last pong across targets
        alive = [worker for worker in self.workers.values() if worker.alive()]
        for worker in alive:
            worker.send({"op": "ping", "n": number})
        if not self.wait_for(
            lambda: all(w.last_pong >= number or not w.alive() for w in alive), SETTLE_LIMIT
        ):
            silent = [w.worker_id for w in alive if w.last_pong < number and w.alive()]
            raise RuntimeError(f"adapter fault: workers {silent} did not answer a ping")

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
        worker.send({"op": "name", "worker": worker_id})
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
        if self.config.fault_detection is False and fails(script):
            unreachable(
                "fault detection cannot be turned off: the 1.6.1 frontend locally inhibits a "
                "worker that failed a request for ~5 s, and no flag or router setting disables it"
            )
        encoded = encode_script(script)
        self.scripts[worker_id] = encoded
        self.workers[worker_id].used = True
        self.workers[worker_id].send({"op": "script", "script": encoded})
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
        # a stream the dead worker was serving is held (stalled) until the frontend sees the
        # connection close, which takes longer on a loaded machine: wait for it to end
        # (or until it migrates: delivered again to another worker)
        before = len(self.log)
        served = {d.request_id for d in self.log if d.worker_id == worker_id}
        for pending in list(self.pending.values()):
            call, suite_id = pending.call, pending.suite_id
            if call is None or suite_id not in served:
                continue

            def ended_or_moved(call: Any = call, suite_id: str = suite_id) -> bool:
                return call.done.is_set() or any(
                    d.request_id == suite_id and d.worker_id != worker_id for d in self.log[before:]
                )

            self.wait_for(ended_or_moved, SETTLE_LIMIT)
        self.settle()

    def vanish_worker(self, worker_id: int) -> None:
        """SIGKILL without deregistering: the frontend keeps listing the instance for 10-15 s
        (file discovery's lease) while its request-plane port is closed. The kill happens
        just before the suite's next request, so a host opened meanwhile still registers its
        model on the worker, as the router over a discovered-but-gone worker would see it."""
        self.workers[worker_id].used = True
        self.vanishing.add(worker_id)

    def _vanish_now(self) -> None:
        for worker_id in sorted(self.vanishing):
            self.workers[worker_id].kill()
            self.vanished.add(worker_id)
        self.vanishing.clear()

    def report_down(self, worker_id: int) -> None:
        """Make the frontend inhibit the worker locally, the way it learns a worker is down:
        one request pinned to it, which it fails with ``EngineShutdown`` (probed: the
        frontend answers 503 and round-robin skips the worker for ~5 s). Inhibition is per
        router, so each of this target's models and frontends gets one such request, and a
        model registered within the next ``INHIBITED_FOR`` seconds gets it when it is."""
        self.down[worker_id] = time.monotonic()
        for generation in list(self.generations.values()):
            if generation.refusal is None:
                self._inhibit(worker_id, generation)

    def _inhibit(self, worker_id: int, generation: Generation) -> None:
        worker = self.workers[worker_id]
        if not worker.alive() or generation.endpoint not in worker.served:
            return
        if worker_id in self.overloaded and generation.router["policy"] == "kv":
            unreachable(
                "a worker both overloaded and reported down: the pinned request that reports "
                "it down is refused before it reaches a busy worker (probed: 'Service "
                "temporarily overloaded', class CapacityExhausted), and a pin to an inhibited "
                "worker is refused too (HTTP 500), so the two states cannot be set together"
            )
        error = {"type": "Backend(EngineShutdown)", "message": "reported down"}
        worker.send({"op": "script", "script": {"kind": "fail-before", "error": error}})
        time.sleep(0.02)
        try:
            for frontend in {self.shared.frontend(0), *self.frontends_used}:
                self.ready(frontend, generation)
                rid = str(uuid.uuid4())
                with self.changed:
                    self.rid_owner[rid] = f"{INTERNAL}report-down"
                nvext = {"backend_instance_id": self.instance_id(worker_id)}
                # the base model's pinned failure: a LoRA model on the same endpoint sees the
                # inhibition too (probed: a pinned failure for the LoRA then got HTTP 500)
                request = CompletionRequest(
                    generation.model, (1,), 1, nvext=nvext, headers={"x-dynamo-request-id": rid}
                )
                call = StreamCall(frontend.host, frontend.port, request, self._notify)
                call.done.wait(SETTLE_LIMIT)
                self.wait_for(lambda rid=rid: rid in self.ended, 2.0)
                if call.error is None or rid not in self.ended:
                    raise RuntimeError(
                        f"reporting worker {worker_id} down: its pinned failure did not reach "
                        f"it or did not fail ({call.items}, {call.error})"
                    )
        finally:
            worker.send({"op": "script", "script": self.scripts.get(worker_id, {"kind": "serve"})})
            time.sleep(0.02)

    def mark_overloaded(self, worker_id: int, overloaded: bool) -> None:
        """Busy through Dynamo's own threshold: every KV model carries
        ``active_prefill_tokens_threshold`` ``BUSY_TOKENS``, and an overloaded worker holds one
        load request per KV model and frontend whose prompt (``LOAD_TOKENS``) exceeds it, out
        of the dispatch log. Not overloaded: the worker ends its load requests."""
        if not overloaded:
            self.overloaded.discard(worker_id)
            self.workers[worker_id].send({"op": "unload"})
            loads = self.loads.pop(worker_id, [])
            self.wait_for(lambda: all(call.done.is_set() for _, call in loads), WAIT_LIMIT)
            return
        self.overloaded.add(worker_id)
        for generation in list(self.generations.values()):
            if generation.refusal is None and generation.router["policy"] == "kv":
                self._load(worker_id, generation)

    def _load(self, worker_id: int, generation: Generation) -> None:
        worker = self.workers[worker_id]
        if not worker.alive() or generation.endpoint not in worker.served:
            return
        prompt = (LOAD_MARK, *range(LOAD_TOKENS - 1))
        for frontend in {self.shared.frontend(0), *self.frontends_used}:
            self.ready(frontend, generation)
            rid = str(uuid.uuid4())
            with self.changed:
                self.rid_owner[rid] = f"{INTERNAL}load"
            nvext = {"backend_instance_id": self.instance_id(worker_id)}
            request = CompletionRequest(
                generation.model, prompt, 1, nvext=nvext, headers={"x-dynamo-request-id": rid}
            )
            call = StreamCall(frontend.host, frontend.port, request, self._notify)
            self.loads.setdefault(worker_id, []).append((rid, call))
            arrived = lambda rid=rid, call=call: rid in self.loaded or call.done.is_set()  # noqa: E731
            if not self.wait_for(arrived):
                raise RuntimeError(f"the load request on worker {worker_id} never arrived")
            if call.done.is_set():
                raise RuntimeError(f"the load request on worker {worker_id} ended: {call.error}")
            time.sleep(0.05)  # the router books it as the request is sent

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
        if router["policy"] == "kv":
            router = {**router, "busy_prefill_tokens": BUSY_TOKENS}
        key = (tuple(sorted(router.items())), block_size)
        found = self.generations.get(key)
        if found is not None:
            return found
        namespace = f"rs{self.number}g{next(self._generation_numbers)}x{uuid.uuid4().hex[:6]}"
        generation = Generation(namespace, router, block_size, affinity)
        self.generations[key] = generation
        if not any(w.alive() for w in self.workers.values()):
            generation.refusal = card_refusal(router)
            if generation.refusal is None and generation.lora:
                generation.refusal = self._probe_lora_card(generation)
        if generation.refusal is None:
            self._serve(list(self.workers.values()), generation)
            for worker_id, when in list(self.down.items()):
                if time.monotonic() - when < INHIBITED_FOR:
                    self._inhibit(worker_id, generation)
            if router["policy"] == "kv":
                for worker_id in sorted(self.overloaded):
                    self._load(worker_id, generation)
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
        frontend = self._frontend(0, lora=True) if generation.lora else self.shared.frontend(0)
        if generation.lora and workers:
            generation.refusal = self._lora_refusal(frontend, generation)
            if generation.refusal is not None:
                return
        if workers and not wait_for_model(frontend.host, frontend.port, generation.model, 5.0):
            generation.refusal = ObservedError(
                ((None, f"the frontend never listed model {generation.model}"),),
                True,
                types_observed=False,
            )
            return
        time.sleep(0.3)  # every instance's registration reaches the frontend's watch
        self.listed.add((frontend.port, generation.model))

    def _lora_refusal(self, frontend: Frontend, generation: Generation) -> ObservedError | None:
        """A LoRA frontend refuses a model whose router cannot filter by LoRA when it builds
        the model's engine: the model is never listed and its frontend logs why (probed:
        ``build_preprocessed_routing: LoRA serving (DYN_LORA_ENABLED) is not supported with
        router mode LeastLoaded; …``, retried with backoff, requests get 404). No client sees
        a typed error, so the refusal is the log line, untyped."""
        deadline = time.monotonic() + WAIT_LIMIT
        while time.monotonic() < deadline:
            if wait_for_model(frontend.host, frontend.port, generation.model, 0.2):
                return None
            log = frontend.log_path.read_text(errors="replace")
            for line in re.sub(r"\x1b\[[0-9;]*m", "", log).splitlines():
                if f'"{generation.model}"' in line and "build_preprocessed_routing" in line:
                    reason = re.search(r'error="build_preprocessed_routing: ([^"]*)"', line)
                    text = reason.group(1) if reason else line[-300:]
                    return ObservedError(((None, text),), True, types_observed=False)
        return None

    def _probe_lora_card(self, generation: Generation) -> ObservedError | None:
        """With no worker yet, whether the LoRA frontend builds this model: a spare worker
        process (not one of the target's) registers the card, then quits."""
        spares = self.shared.spare_workers(1)
        if not spares:
            raise RuntimeError("no spare worker process to register the LoRA host's card")
        probe = spares[0]
        probe.attach(0, self.changed, None)
        try:
            self._serve([probe], generation)
            return generation.refusal
        finally:
            probe.close()

    def lora_model(self, generation: Generation, adapter: str) -> str:
        """The served name of the suite's adapter on this host (unique in the shared store)."""
        return f"{generation.model}-{adapter}"

    # --- requests ---

    def _frontend(
        self, limit: int | None, max_seq_len: int | None = None, lora: bool = False
    ) -> Frontend:
        try:
            frontend = self.shared.frontend(limit or 0, max_seq_len, lora)
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
        if self.overloaded and generation.router["policy"] != "kv":
            unreachable(NOT_KV_BUSY)
        self.ready(frontend, generation)
        suite_id = f"req-{next(self._requests)}"
        rid = str(uuid.uuid4())
        with self.changed:
            self.rid_owner[rid] = suite_id
            pending = Pending(
                suite_id, None, len(request.prompt), generation.router["policy"] in BOOKING
            )
            self.pending[suite_id] = pending
        request = attrs.evolve(request, headers={**request.headers, "x-dynamo-request-id": rid})
        self._vanish_now()
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
            # the workers' reports of this request may still be on their way: every attempt
            # reported has ended, and a request that completed has an attempt that did not
            # fail (a migrated request's earlier attempts end first)
            completed = call.error is None and bool(call.items)

            def reported() -> bool:
                balanced = all(
                    self.ended_n.get(rid, 0) >= self.delivered_n.get(rid, 0) for rid in pending.rids
                )
                finished = any(self.last_how.get(rid) != "raised" for rid in pending.rids)
                return balanced and (not completed or (bool(pending.rids) and finished))

            self.wait_for(reported, 2.0)
            self._flush_reports(pending)

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
        if isinstance(call, Direct):
            if call.payload is not None:
                unreachable("a caller's own payload: the frontend's HTTP API takes its own")
            return self.direct(call)
        if not isinstance(call, Migrate):
            unreachable(
                f"{type(call).__name__}: the frontend's HTTP API takes token requests only; "
                "the bare client's calls are the dynamo and dynamo-wire adapters'"
            )
        if call.form != "tokens":
            unreachable(
                f"a {call.form} request: the frontend tokenizes every prompt, so its migration "
                "only ever sees token requests"
            )
        if call.stopped or call.stop_after is not None:
            unreachable(
                "a caller context stopped before an attempt: an HTTP client can only go away, "
                "and then it reads nothing"
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

    def direct(self, call: Direct) -> str:
        """A bare call to one worker: ``nvext.backend_instance_id`` on a one-token request
        whose prompt (``BARE_MARK``) tells the worker to answer with the script's own item
        count, each data item spelled as a token that names its worker and index. The
        control-message metadata a bare client sends has no HTTP counterpart; the checks that
        observe it need ``transport:dynamo-wire``."""
        if call.worker_id not in self.workers:
            unreachable(
                f"a bare call to id {call.worker_id}, which no worker ever had: the frontend "
                "first validates nvext.backend_instance_id against the workers it discovered "
                "(HTTP 400 'does not identify a known worker', the routing host's HST-004), so "
                "the transport's own answer to an unknown instance never shows over HTTP"
            )
        generation = self.generation({"policy": "round-robin"}, 16, False)
        nvext = {"backend_instance_id": self.instance_id(call.worker_id)}
        request = CompletionRequest(generation.model, (BARE_MARK,), BARE_BUDGET, nvext=nvext)
        suite_id = self.start(generation, request, self._frontend(0))
        self.pending[suite_id].bare = True
        return suite_id

    def outcome(self, request_id: str) -> Outcome | None:
        pending = self.pending.get(request_id)
        if pending is None or pending.call is None:
            return None
        call = pending.call
        if not call.done.is_set():
            return None
        if call.error is None:
            # A worker served the answer, and its reports (delivered, ended) travel on its
            # own pipe, apart from the HTTP response: on a loaded machine they can arrive
            # after it, so wait for them before the suite reads the dispatch log.
            self.wait_for(lambda: bool(pending.rids) and pending.rids <= self.ended, SETTLE_LIMIT)
        self._flush_reports(pending)
        if call.error is None and not call.dropped and not pending.rids:
            raise RuntimeError(
                f"adapter fault: the frontend answered {request_id} ({len(call.items)} "
                f"items), yet no worker reported receiving it within {SETTLE_LIMIT} s; "
                f"inotify instances held by this user: {user_inotify_instances()}"
            )
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
        if pending.bare:
            return Outcome(self.bare_items(request_id, call.items), error, call.dropped)
        return Outcome(tuple(dict(item) for item in call.items), error, call.dropped)

    @staticmethod
    def bare_items(request_id: str, items: Sequence[Mapping[str, object]]) -> tuple[object, ...]:
        """A bare call's data items, read back from their tokens (the finish is not an item)."""
        found: list[object] = []
        for item in items:
            tokens = item.get("token_ids")
            for token in tokens if isinstance(tokens, list) else []:
                decoded = data_item(int(token))
                if decoded is None:
                    found.append({"request": request_id, "token": token})  # not the convention
                else:
                    found.append({"worker": decoded[0], "request": request_id, "index": decoded[1]})
        return tuple(found)

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
        if config.max_affinity_entries not in (None, MAX_AFFINITY_ENTRIES):
            unreachable(
                "the affinity table's cap is not configurable in 1.6.1 (no flag, no "
                "RouterConfig field)"
            )
        if config.kv_index_blocks is not None:
            unreachable(
                "the KV index's per-worker block cap: 1.6.1's approximate index expires "
                "blocks by age (KvRouterConfig router_ttl_secs=120.0, "
                "router_approximate_cache_policy='ttl') "
                "and has no count bound"
            )
        router: dict[str, object] = {"policy": config.policy, "temperature": config.temperature}
        if config.affinity_ttl is not None:
            ttl = config.affinity_ttl
            router["affinity_ttl"] = int(ttl) if float(ttl).is_integer() else ttl
            if config.affinity_mode is not None:  # else Dynamo's own default
                router["affinity_mode"] = config.affinity_mode
        if config.lora:
            router["lora"] = True  # its own model, served by a frontend with DYN_LORA_ENABLED
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
        self._plans = itertools.count(1)

    def route(self, route: HostRoute) -> str:
        request = self.request(route)
        frontend = self.target._frontend(route.migration_limit, lora=self.generation.lora)
        return self.target.start(self.generation, request, frontend)

    def request(self, route: HostRoute) -> CompletionRequest:
        """The HTTP request that carries ``route`` (SKIP for what no request field sets)."""
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
        model = self.generation.model
        if route.lora is not None:
            if not self.generation.lora:
                unreachable("a LoRA request on a host without LoRA filtering")
            model = target.lora_model(self.generation, route.lora)
        if route.excluded:
            unreachable("a retry's excluded workers are migration's state, not a request field")
        if route.allowed is not None:
            unreachable("no HTTP request field restricts the eligible workers in 1.6.1")
        nvext: dict[str, object] = {}
        for field in ("backend_instance_id", "decode_worker_id", "prefill_worker_id"):
            value = getattr(route, field)
            if value is not None:
                worker = target.workers.get(value)
                if (
                    value in target.vanished
                    and worker is not None
                    and self.generation.endpoint not in worker.served
                ):
                    unreachable(
                        f"worker {value} vanished before this host's model was registered, so "
                        "the model never listed it (its process was already gone)"
                    )
                nvext[field] = target.instance_id(value)
        if route.dp_rank is not None:
            nvext["dp_rank"] = route.dp_rank
        if route.required_taints:
            unreachable(TAINTS)
        headers = {} if route.session is None else {"x-session-id": route.session}
        return CompletionRequest(
            model, route.tokens, route.max_tokens, nvext=nvext, headers=headers
        )

    def stop(self, request_id: str) -> None:
        unreachable("an HTTP client cannot stop its request and keep reading")

    def preview(self, route: HostRoute) -> PlanView | ObservedError:
        """The router's choice without routing: the request with the annotation
        ``query_instance_id:`` (probed on a KV host: 20 queries over two idle workers chose
        both, and a worker's cached prefix then drew all 10; none reached a worker). On a
        host of another policy the frontend does not refuse it: it routes and serves the
        request and names the worker, and that delivery is in the dispatch log."""
        target = self.target
        request = self.request(route)
        if target.overloaded and self.generation.router["policy"] != "kv":
            unreachable(NOT_KV_BUSY)
        frontend = target._frontend(route.migration_limit, lora=self.generation.lora)
        target.ready(frontend, self.generation)
        target._vanish_now()
        rid = str(uuid.uuid4())
        with target.changed:
            target.rid_owner[rid] = f"preview:{rid[:8]}"
        annotations = [*list(request.nvext.get("annotations") or []), QUERY_ONLY]  # type: ignore[call-overload]
        request = attrs.evolve(
            request,
            nvext={**request.nvext, "annotations": annotations},
            headers={**request.headers, "x-dynamo-request-id": rid},
        )
        status, body = post_completion(frontend.host, frontend.port, request)
        if status != 200:
            error = error_from_body(status, body, pre_stream=True)
            return attrs.evolve(
                error, links=tuple((t, target.suite_text(m)) for t, m in error.links)
            )
        document = json.loads(body)
        chosen = ((document.get("nvext") or {}).get("worker_id") or {}).get("decode_worker_id")
        if not isinstance(chosen, int):
            raise AssertionError(f"the frontend's answer names no worker: {body[:300]!r}")
        worker = next((w for w, p in target.workers.items() if p.instance_id == chosen), chosen)
        if any(choice.get("text") for choice in document.get("choices") or []):
            target.wait_for(lambda: rid in target.ended, 2.0)  # it was served: see the report
        # the budget a plan would have left is not observable: NaN, never compared
        return PlanView(next(self._plans), worker, float("nan"))

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
        """The replica set is where the adapter is loaded: each member registers it
        (``register_model(…, lora_name=…, base_model_path=…)``), a former member unregisters
        it. The frontend's LoRA filter narrows to those workers (probed: 6 of 6 requests for
        a LoRA registered on one of three workers reached it, and none without
        DYN_LORA_ENABLED)."""
        target, generation = self.target, self.generation
        if not generation.lora:
            raise AssertionError("the host was built without LoRA filtering")
        name = target.lora_model(generation, adapter)
        command = {
            "endpoint": generation.endpoint,
            "lora": name,
            "block_size": generation.block_size,
            "router": generation.router,
        }
        for worker_id, worker in target.workers.items():
            if worker_id in workers:
                worker.send({"op": "lora", **command})
            elif name in worker.loras:
                worker.send({"op": "unlora", **command})
        target.wait_for(
            lambda: all(
                (name in w.loras) == (i in workers) or not w.alive()
                for i, w in target.workers.items()
            )
        )
        failed = {w.loras.get(name) for i, w in target.workers.items() if i in workers} - {None}
        if failed:
            raise RuntimeError(f"registering LoRA {name}: {sorted(map(str, failed))[0]}")
        if workers:
            frontend = target._frontend(0, lora=True)
            if not wait_for_model(frontend.host, frontend.port, name, WAIT_LIMIT):
                raise RuntimeError(f"the LoRA frontend never listed {name}")
            time.sleep(0.5)  # every replica's LoRA card reaches the frontend's filter

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
        unreachable(
            "LoRA inflight counts: the LoRA frontend's /metrics has no per-adapter count "
            "(probed with a LoRA request held open on its replica: the only LoRA series were "
            "dynamo_frontend_lora_churn_loads_total, _churn_unloads_total and "
            "_overflow_count, all 0 before, during and after; the wheel's "
            "lora_estimated_load gauge was not published)"
        )

    def inputs(self) -> HostView:
        unreachable("the inputs a policy builds are internal to the frontend's router")
